//! The module graph flows one way: vendor -> gather -> judge -> tune -> render, under one
//! run pipeline that the commands call. Every top-level module of src/ has a layer, and a
//! module may use only modules of lower layers, tests included.
//!
//! The code is parsed (syn), not read as text: every path counts, in `use` trees
//! (`use crate::{render::human, tune}`), in expressions and types, after `super::`
//! climbs out of the module (`super::super::super::render` from judge/nccl_env/x.rs),
//! and inside macro bodies (`crate::x` in a `format!`). Parsing also checks two
//! statements the code makes about itself: only `vendor` loads a library or declares a
//! vendor symbol, and `lib.rs`'s list of the modules that touch the host is the list
//! of those whose non-test code reaches the file system, processes, sockets, the
//! environment, raw syscalls or vendor libraries.

use super::support::{repo, rust_files};
use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use syn::visit::Visit;

/// (module, layer, what it is). Modules of one layer do not use each other.
const LAYERS: &[(&str, u32, &str)] = &[
    ("facts", 0, "what gather saw, plain data"),
    ("finding", 0, "finding types and the check-id registry"),
    ("remediation", 0, "fixes shared by checks and explain-log"),
    (
        "diagnostic",
        0,
        "lines to standard error that a closed stderr cannot break",
    ),
    ("units", 1, "sizes, limits and durations"),
    (
        "vendor",
        1,
        "the vendor libraries, each loaded once, typed, under a deadline",
    ),
    (
        "child",
        1,
        "a child process of this binary: one framed reply under a deadline",
    ),
    (
        "kube",
        1,
        "Kubernetes over HTTPS: TLS, bounded HTTP messages, the in-cluster API client",
    ),
    ("platform", 1, "known machine types"),
    (
        "layout",
        1,
        "the job's layout from the launcher's variables",
    ),
    ("nccl", 1, "how NCCL reads its variables"),
    ("topology", 1, "GPU and NIC topology from facts"),
    ("policy", 2, "what the user asked the judge to enforce"),
    ("predict", 2, "what NCCL will do, from the facts"),
    ("cli", 2, "flags"),
    (
        "config",
        3,
        "the configuration file, as the flags' defaults",
    ),
    ("gather", 3, "the host, read into facts"),
    ("judge", 3, "facts -> findings"),
    ("tune", 3, "facts -> settings"),
    ("explain", 3, "NCCL logs -> findings"),
    ("report", 4, "findings, settings and facts in one document"),
    ("output", 4, "writing files atomically"),
    ("render", 5, "report -> text"),
    ("run", 6, "the pipeline every command shares"),
    ("bench", 7, "measurements"),
    ("serve", 7, "the sidecar"),
    ("gang", 7, "the job across its pods"),
    ("webhook", 8, "the admission webhook"),
    ("commands", 9, "the subcommands"),
];

/// Test-only support that any module's tests may use, and that may use anything below `run`.
const TEST_SUPPORT: &str = "test_facts";

/// The only module that loads libraries or declares their symbols.
const VENDOR: &str = "vendor";

/// Paths whose use in an expression (a call, a function passed on) touches the host:
/// files, processes, sockets and name lookups, the environment, raw syscalls, vendor
/// libraries. Types and constants (`std::net::IpAddr`, `libc::O_NONBLOCK`, all-capital
/// last segments) touch nothing. Standard output and error are the commands' and
/// diagnostic's to write, not a reading of the host.
const HOST_PATHS: &[&str] = &[
    "std::fs",
    "std::process",
    "std::net::TcpStream",
    "std::net::TcpListener",
    "std::net::UdpSocket",
    "std::os::unix::net",
    "std::os::unix::fs",
    "std::env",
    "libc",
    "nix",
    "tempfile",
    "libloading",
    "nvml_wrapper",
    "nvml_wrapper_sys",
];

/// Methods that touch the host whatever their receiver's path (a DNS lookup).
const HOST_METHODS: &[&str] = &["to_socket_addrs"];

/// Paths only `vendor` may use: the loaders.
const VENDOR_PATHS: &[&str] = &["libloading", "nvml_wrapper", "nvml_wrapper_sys", "libc::dl"];

fn layer(module: &str) -> Option<u32> {
    LAYERS
        .iter()
        .find(|(m, _, _)| *m == module)
        .map(|(_, l, _)| *l)
}

/// What one file says, as parsed.
#[derive(Default)]
pub(super) struct Seen {
    /// Top-level modules its paths reach, other than its own.
    uses: BTreeSet<String>,
    /// Paths that reach the host outside `#[cfg(test)]` code.
    host: BTreeSet<String>,
    /// Loader paths, extern blocks and C function-pointer types.
    vendor: BTreeSet<String>,
    /// Glob imports of the crate root, which would hide the edges behind them.
    root_globs: usize,
    /// Modules declared `#[cfg(test)] mod name;` here: their files are test code.
    test_modules: BTreeSet<Vec<String>>,
}

/// Walks one file, tracking the module it is in (for `super::`) and whether the code
/// is test-only.
struct Walker<'a> {
    /// The module path of the current item: `["judge", "nccl_env", "tests"]`.
    module: Vec<String>,
    /// What each name a `use` brought in stands for (`fs` -> `std::fs`), file-wide.
    aliases: BTreeMap<String, Vec<String>>,
    /// Depth of `#[cfg(test)]` items around the current one.
    in_test: usize,
    seen: &'a mut Seen,
}

pub(super) fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl Walker<'_> {
    /// Records one path, given as its segments.
    fn path(&mut self, segments: &[String], glob: bool) {
        let Some(first) = segments.first() else {
            return;
        };
        let full = segments.join("::");
        if VENDOR_PATHS.iter().any(|v| full.starts_with(v)) {
            self.seen.vendor.insert(full.clone());
        }
        let target = match first.as_str() {
            "crate" => segments.get(1).cloned(),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                if ups >= self.module.len() {
                    // Climbed to the crate root: the next segment is a top-level module.
                    segments.get(ups).cloned()
                } else {
                    None
                }
            }
            _ => None,
        };
        match target {
            Some(t) => {
                if self.module.first() != Some(&t) {
                    self.seen.uses.insert(t);
                }
            }
            None => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let root = (first == "crate" && segments.len() == 1)
                    || (ups == segments.len() && ups >= self.module.len());
                if glob && root {
                    self.seen.root_globs += 1;
                }
            }
        }
    }

    /// `crate::x` and `super::x` sequences inside a macro's tokens, which syn leaves unparsed.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            if let TokenTree::Group(g) = &trees[i] {
                self.tokens(g.stream());
            }
            let mut segments = Vec::new();
            let mut j = i;
            while let Some(TokenTree::Ident(id)) = trees.get(j) {
                segments.push(id.to_string());
                let colons = matches!(
                    (trees.get(j + 1), trees.get(j + 2)),
                    (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                        if a.as_char() == ':' && b.as_char() == ':'
                );
                if !colons {
                    break;
                }
                j += 3;
            }
            if segments.len() > 1 && (segments[0] == "crate" || segments[0] == "super") {
                self.path(&segments, false);
                i = j + 1;
            } else {
                i += 1;
            }
        }
    }

    /// Records a path in an expression that touches the host (see HOST_PATHS).
    fn host(&mut self, path: &syn::Path) {
        let mut segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let Some(first) = segments.first() else {
            return;
        };
        if let Some(full) = self.aliases.get(first) {
            segments.splice(0..1, full.iter().cloned());
        }
        let last = segments.last().map_or("", String::as_str);
        let constant = last
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        let full = segments.join("::");
        if self.in_test == 0 && !constant && HOST_PATHS.iter().any(|h| starts_with_path(&full, h)) {
            self.seen.host.insert(full);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name == "self" {
                    if let Some(last) = prefix.last() {
                        self.aliases.insert(last.clone(), prefix.clone());
                    }
                    self.path(prefix, false);
                } else {
                    prefix.push(name.clone());
                    self.aliases.insert(name, prefix.clone());
                    self.path(prefix, false);
                    prefix.pop();
                }
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.aliases.insert(r.rename.to_string(), prefix.clone());
                self.path(prefix, false);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.path(prefix, true),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

/// Whether `full` is `prefix` or lies under it (`std::fs::File` under `std::fs`).
fn starts_with_path(full: &str, prefix: &str) -> bool {
    full == prefix || full.starts_with(&format!("{prefix}::"))
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => &[],
        };
        let test = is_cfg_test(attrs);
        self.in_test += usize::from(test);
        syn::visit::visit_item(self, item);
        self.in_test -= usize::from(test);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        if m.content.is_none() && self.in_test > 0 {
            self.seen.test_modules.insert(self.module.clone());
        }
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.path(&segments, false);
        syn::visit::visit_path(self, p);
    }

    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        self.host(&e.path);
        syn::visit::visit_expr_path(self, e);
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let name = m.method.to_string();
        if self.in_test == 0 && HOST_METHODS.contains(&name.as_str()) {
            self.seen.host.insert(format!(".{name}()"));
        }
        syn::visit::visit_expr_method_call(self, m);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    fn visit_item_foreign_mod(&mut self, f: &'ast syn::ItemForeignMod) {
        self.seen.vendor.insert("an extern block".into());
        syn::visit::visit_item_foreign_mod(self, f);
    }

    fn visit_type_bare_fn(&mut self, f: &'ast syn::TypeBareFn) {
        if f.abi.is_some() {
            self.seen
                .vendor
                .insert("an extern \"C\" function-pointer type".into());
        }
        syn::visit::visit_type_bare_fn(self, f);
    }
}

/// The module path of a file under src/: `judge/nccl_env/mod.rs` is `judge::nccl_env`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every file under `src` (main.rs and lib.rs left out), parsed, by path.
pub(super) fn parse_tree(src: &Path) -> BTreeMap<String, (Vec<String>, Seen)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap().to_path_buf();
        let mut module = module_of(&rel);
        if module[0] == "main" || module[0] == "lib" {
            // The crate root: only its `#[cfg(test)] mod x;` lines matter here.
            module.clear();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", rel.display()));
        let mut seen = Seen::default();
        let mut walker = Walker {
            module: module.clone(),
            aliases: BTreeMap::new(),
            in_test: 0,
            seen: &mut seen,
        };
        walker.visit_file(&ast);
        out.insert(rel.display().to_string(), (module, seen));
    }
    out
}

/// The files of `tree` that are not test code (a module under a `#[cfg(test)] mod x;`),
/// the crate root left out.
pub(super) fn production(
    tree: BTreeMap<String, (Vec<String>, Seen)>,
) -> impl Iterator<Item = (String, (Vec<String>, Seen))> {
    let test_modules: BTreeSet<Vec<String>> = tree
        .values()
        .flat_map(|(_, seen)| seen.test_modules.iter().cloned())
        .collect();
    tree.into_iter().filter(move |(_, (module, _))| {
        !module.is_empty() && !test_modules.iter().any(|t| module.starts_with(t))
    })
}

/// (module, dependency) edges that break the layering, and other uses the layering forbids.
fn back_edges(src: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for (rel, (module, seen)) in parse_tree(src) {
        let Some(module) = module.first() else {
            continue;
        };
        if seen.root_globs > 0 {
            bad.push(format!("{rel}: a glob import of the crate root"));
        }
        if module != VENDOR {
            for what in &seen.vendor {
                bad.push(format!("{rel}: {module} uses {what} (only vendor may)"));
            }
        }
        for dep in &seen.uses {
            if dep == TEST_SUPPORT {
                continue;
            }
            let allowed = if module == TEST_SUPPORT {
                layer(dep).is_some_and(|d| d < layer("run").unwrap())
            } else {
                match (layer(module), layer(dep)) {
                    (Some(m), Some(d)) => d < m,
                    (None, _) => {
                        bad.push(format!("{rel}: module {module} has no layer in LAYERS"));
                        continue;
                    }
                    (_, None) => false,
                }
            };
            if !allowed {
                bad.push(format!("{rel}: {module} uses crate::{dep}"));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

/// The top-level modules whose non-test code touches the host, each with one example path.
fn host_modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (_, (module, seen)) in production(parse_tree(src)) {
        if let Some(first) = seen.host.iter().next() {
            out.entry(module[0].clone())
                .or_insert_with(|| first.clone());
        }
    }
    out
}

/// The modules lib.rs's doc names on its `Touch the host:` line.
fn declared_host_modules(lib: &str) -> BTreeSet<String> {
    let line = lib
        .lines()
        .find_map(|l| l.strip_prefix("//! Touch the host: "))
        .expect("lib.rs names the modules that touch the host on a `//! Touch the host: ` line");
    line.trim_end_matches('.')
        .split(", ")
        .map(|m| m.trim_matches('`').to_string())
        .collect()
}

#[test]
fn modules_use_only_lower_layers() {
    let bad = back_edges(&repo().join("src"));
    assert!(bad.is_empty(), "back-edges:\n{}", bad.join("\n"));
}

#[test]
fn lib_rs_names_every_module_that_touches_the_host_and_no_other() {
    let src = repo().join("src");
    let found = host_modules(&src);
    let declared = declared_host_modules(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let found_names: BTreeSet<String> = found.keys().cloned().collect();
    assert_eq!(
        found_names, declared,
        "lib.rs's `Touch the host:` line differs from the code; what the code uses: {found:#?}"
    );
}

#[test]
fn a_back_edge_is_caught() {
    // judge uses tune (same layer) through a use group; gather uses render (higher)
    // inside a macro; judge/nccl_env/x.rs climbs to render with super::; tune reaches
    // the crate root by glob; serve declares a C symbol type.
    let dir = super::support::scratch("layering");
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("judge/nccl_env")).unwrap();
    let files = [
        (
            "judge/mod.rs",
            "use crate::{facts::Facts, tune::Setting}; // crate::render in a comment\n",
        ),
        (
            "judge/nccl_env/x.rs",
            "fn f() { super::super::super::render::human::render(); super::y(); }\n",
        ),
        (
            "gather.rs",
            "fn f() { let _ = format!(\"{}\", crate::render::human::render()); }\n",
        ),
        ("tune.rs", "use crate::facts::Facts;\nuse super::*;\n"),
        ("newthing.rs", "\n"),
        ("other.rs", "use crate::newthing::X;\n"),
        (
            "serve.rs",
            "type F = unsafe extern \"C\" fn() -> i32;\nfn g() { let _ = libloading::Library::new(\"x\"); }\n",
        ),
    ];
    for (path, text) in files {
        std::fs::write(src.join(path), text).unwrap();
    }
    let bad = back_edges(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        bad,
        [
            "gather.rs: gather uses crate::render",
            "judge/mod.rs: judge uses crate::tune",
            "judge/nccl_env/x.rs: judge uses crate::render",
            "other.rs: module other has no layer in LAYERS",
            "serve.rs: serve uses an extern \"C\" function-pointer type (only vendor may)",
            "serve.rs: serve uses libloading::Library::new (only vendor may)",
            "tune.rs: a glob import of the crate root",
        ]
    );
}

#[test]
fn host_paths_outside_tests_are_found_and_test_code_is_not() {
    let dir = super::support::scratch("layering-host");
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("judge")).unwrap();
    std::fs::write(
        src.join("judge/mod.rs"),
        "#[cfg(test)]\nmod tests { fn t() { std::fs::read(\"x\").unwrap(); } }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("render.rs"),
        "use std::{fs, io::Write};\nfn f() { fs::write(\"x\", \"\").unwrap(); let _: std::net::IpAddr; }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("tune.rs"),
        "use nix::unistd as u;\nfn f() { let _ = u::getpid(); let _ = libc::O_RDONLY; }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("units.rs"),
        "fn f(x: std::fs::File) -> u32 { libc::EINTR }\n",
    )
    .unwrap();
    let found = host_modules(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        [
            ("render".to_string(), "std::fs::write".to_string()),
            ("tune".to_string(), "nix::unistd::getpid".to_string()),
        ]
    );
    assert_eq!(
        declared_host_modules("//! x\n//! Touch the host: `a`, `b`.\n"),
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
}

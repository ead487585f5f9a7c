//! No `pub` item the compiler cannot see is dead (issue 29).
//!
//! The lib crate exists for main.rs, tests/integration and the doctests, so only the
//! modules they name are public (`pub mod` in lib.rs and down the path to what they
//! use); every other module is private to the crate. In a private module a `pub` item
//! is crate-visible, and rustc's dead_code lint (clippy `-D warnings` in CI) reports
//! it once nothing uses it. Two things keep that true, both checked here on the parsed
//! code (syn, as the layering test parses it):
//! - a module is public only if main.rs, a test or a doctest names a path through it,
//!   so a new module cannot escape the lint by being declared `pub`;
//! - what rustc cannot see, the items of the public modules and items used only where
//!   they are defined, is held by name: a `pub` item (function, method, constant,
//!   static, type, trait, field, module, re-export) whose name appears in no other file
//!   under src/ or tests/integration is dead, or belongs private to its file.

use super::layering::{parse_tree, production};
use super::support::{repo, rust_files};
use proc_macro2::{Delimiter, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use syn::visit::Visit;

/// `pub` items named only in their own file that stay `pub`, with why ("file: kind name").
const ALLOWED: &[(&str, &str)] = &[
    (
        "src/gang/fingerprint.rs: field gpu_model",
        FUNCTIONAL_UPDATE,
    ),
    (
        "src/gather/replay.rs: field mlock_allows",
        FUNCTIONAL_UPDATE,
    ),
    ("src/gather/replay.rs: field mlock_error", FUNCTIONAL_UPDATE),
    ("src/policy.rs: field ignore_all", FUNCTIONAL_UPDATE),
];

const FUNCTIONAL_UPDATE: &str =
    "another file builds the struct with `..` (functional update), which needs every field visible";

/// Files and folders whose items the name scan leaves out, with why.
const NOT_SCANNED: &[(&str, &str)] = &[];

/// Public modules that no outside user names and stay public, with why. Their
/// submodules are left out too.
const PUBLIC_SUBTREES: &[(&str, &str)] = &[];

/// One `pub` item: what it is and its name.
#[derive(Debug, PartialEq)]
struct PubItem {
    kind: &'static str,
    name: String,
}

/// Collects a file's `pub` items outside `#[cfg(test)]` code and inline modules (an
/// item there is `pub` for the rest of its file). Types (struct, enum, union, trait,
/// type alias) are left out: one named only in its file is still `pub` rightly when a
/// `pub` function returns it or a `pub` field holds it, and rustc's private_interfaces
/// lint would refuse it private. So are the fields of `#[repr(C)]` structs, which
/// mirror a C layout field by field.
#[derive(Default)]
struct Items {
    found: Vec<PubItem>,
    /// Depth of inline `mod x { }` around the current item.
    inline: usize,
}

fn is_repr_c(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().is_ident("repr") && a.parse_args::<syn::Ident>().is_ok_and(|r| r == "C"))
}

fn is_pub(vis: &syn::Visibility) -> bool {
    matches!(vis, syn::Visibility::Public(_))
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    super::layering::is_cfg_test(attrs)
}

impl Items {
    fn add(&mut self, kind: &'static str, ident: &syn::Ident) {
        let name = ident.to_string();
        let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
        if self.inline == 0 {
            self.found.push(PubItem { kind, name });
        }
    }

    /// The names a `pub use` brings in (a glob brings in none by name).
    fn use_tree(&mut self, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => self.use_tree(&p.tree),
            syn::UseTree::Name(n) => self.add("re-export", &n.ident),
            syn::UseTree::Rename(r) => self.add("re-export", &r.rename),
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(t)),
        }
    }

    /// The item's kind and name when it is `pub`.
    fn item(&mut self, item: &syn::Item) {
        let (kind, vis, ident) = match item {
            syn::Item::Fn(f) => ("function", &f.vis, &f.sig.ident),
            syn::Item::Const(c) => ("constant", &c.vis, &c.ident),
            syn::Item::Static(s) => ("static", &s.vis, &s.ident),
            syn::Item::Mod(m) => ("module", &m.vis, &m.ident),
            syn::Item::Use(u) => {
                if is_pub(&u.vis) {
                    self.use_tree(&u.tree);
                }
                return;
            }
            _ => return,
        };
        if is_pub(vis) {
            self.add(kind, ident);
        }
    }
}

impl<'ast> Visit<'ast> for Items {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Use(u) => &u.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        self.item(item);
        let inline = matches!(item, syn::Item::Mod(m) if m.content.is_some());
        self.inline += usize::from(inline);
        match item {
            syn::Item::Struct(s) if is_repr_c(&s.attrs) => {}
            _ => syn::visit::visit_item(self, item),
        }
        self.inline -= usize::from(inline);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        match item {
            syn::ImplItem::Fn(f) if is_pub(&f.vis) && !is_cfg_test(&f.attrs) => {
                self.add("method", &f.sig.ident)
            }
            syn::ImplItem::Const(c) if is_pub(&c.vis) => self.add("associated constant", &c.ident),
            syn::ImplItem::Type(t) if is_pub(&t.vis) => self.add("associated type", &t.ident),
            _ => {}
        }
        syn::visit::visit_impl_item(self, item);
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        if let (true, Some(ident)) = (is_pub(&field.vis), &field.ident) {
            self.add("field", ident);
        }
        syn::visit::visit_field(self, field);
    }
}

/// The `pub` items of one file's non-test code.
fn pub_items(text: &str) -> Vec<PubItem> {
    let ast = syn::parse_file(text).unwrap_or_else(|e| panic!("does not parse: {e}"));
    let mut items = Items::default();
    items.visit_file(&ast);
    items.found
}

/// Identifier-like words of a string: what a serde `with = "module"` names.
fn words(text: &str, out: &mut BTreeSet<String>) {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_alphabetic() || c == '_'))
        .for_each(|w| {
            out.insert(w.to_string());
        });
}

/// Every identifier a file's tokens name: code, macro bodies, attributes (the words of
/// their strings too, for serde's `with = "..."`) and the arguments a format string
/// names (`"{EXIT_TOOL_ERROR}"`). Doc comments name nothing: a mention is not a use.
fn idents(tokens: TokenStream, in_attr: bool, out: &mut BTreeSet<String>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tree) in trees.iter().enumerate() {
        match tree {
            TokenTree::Ident(id) => {
                let name = id.to_string();
                out.insert(name.strip_prefix("r#").unwrap_or(&name).to_string());
            }
            TokenTree::Group(g) => {
                let attr = g.delimiter() == Delimiter::Bracket
                    && matches!(i.checked_sub(1).map(|j| &trees[j]),
                        Some(TokenTree::Punct(p)) if p.as_char() == '#' || p.as_char() == '!');
                let doc = attr
                    && matches!(g.stream().into_iter().next(),
                        Some(TokenTree::Ident(id)) if id == "doc");
                if !doc {
                    idents(g.stream(), in_attr || attr, out);
                }
            }
            TokenTree::Literal(lit) => {
                let text = lit.to_string();
                if in_attr {
                    words(&text, out);
                } else {
                    // Inline format arguments: `{name}` and `{name:?}`.
                    text.split('{').skip(1).for_each(|s| {
                        let arg = s.split(['}', ':']).next().unwrap_or("");
                        if arg.chars().all(|c| c.is_alphanumeric() || c == '_') {
                            out.insert(arg.to_string());
                        }
                    });
                }
            }
            TokenTree::Punct(_) => {}
        }
    }
}

/// The identifiers of one file's text.
fn file_idents(text: &str) -> BTreeSet<String> {
    let tokens: TokenStream = text
        .parse()
        .unwrap_or_else(|e| panic!("does not lex: {e:?}"));
    let mut out = BTreeSet::new();
    idents(tokens, false, &mut out);
    out
}

/// "file: kind name" for each `pub` item of the production files under `src` whose
/// name appears in no other file of `src` or `users`.
fn lonely_pub_items(src: &Path, users: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    rust_files(users, &mut files);
    let mut named_in: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut texts = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(src.parent().unwrap()).unwrap();
        let rel = rel.display().to_string();
        for name in file_idents(&text) {
            named_in.entry(name).or_default().insert(rel.clone());
        }
        texts.insert(rel, text);
    }
    let mut lonely = Vec::new();
    for (rel, _) in production(parse_tree(src)) {
        let rel = format!("src/{rel}");
        if NOT_SCANNED.iter().any(|(n, _)| rel.starts_with(n)) {
            continue;
        }
        for item in pub_items(&texts[&rel]) {
            let elsewhere = named_in
                .get(&item.name)
                .is_some_and(|f| f.iter().any(|f| *f != rel));
            if !elsewhere {
                lonely.push(format!("{rel}: {} {}", item.kind, item.name));
            }
        }
    }
    lonely
}

/// The file of module `path` under `src`: `a/b.rs` or `a/b/mod.rs`.
fn module_file(src: &Path, path: &[String]) -> std::path::PathBuf {
    let dir = src.join(path.join("/"));
    if dir.join("mod.rs").exists() {
        dir.join("mod.rs")
    } else {
        dir.with_extension("rs")
    }
}

/// The lib's public modules, as paths (`nccl::catalog`): its `pub mod`s, and theirs.
fn public_modules(src: &Path, module: &[String], items: &[syn::Item], out: &mut Vec<Vec<String>>) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if !is_pub(&m.vis) || is_cfg_test(&m.attrs) {
            continue;
        }
        let mut path = module.to_vec();
        path.push(m.ident.to_string());
        out.push(path.clone());
        if let Some((_, inline)) = &m.content {
            public_modules(src, &path, inline, out);
            continue;
        }
        let file = module_file(src, &path);
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", file.display()));
        public_modules(src, &path, &ast.items, out);
    }
}

/// Whether `trees[i..]` starts with `::`.
fn colons_at(trees: &[TokenTree], i: usize) -> bool {
    matches!(
        (trees.get(i), trees.get(i + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && b.as_char() == ':'
    )
}

/// The paths into the lib that tokens name: `nccl_preflight::a::b`, use groups
/// (`nccl_preflight::x::{self, y::z}`) expanded, doctests' code in doc comments too.
fn lib_paths(tokens: TokenStream, out: &mut BTreeSet<Vec<String>>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tree) in trees.iter().enumerate() {
        match tree {
            TokenTree::Ident(id) if id == "nccl_preflight" && colons_at(&trees, i + 1) => {
                path_from(&trees[i + 3..], Vec::new(), out);
            }
            TokenTree::Group(g) => lib_paths(g.stream(), out),
            TokenTree::Literal(lit) => {
                let Ok(text) = syn::parse_str::<syn::LitStr>(&lit.to_string()) else {
                    continue;
                };
                // Doc comments arrive as string literals; a line that does not lex is prose.
                for line in text.value().lines() {
                    if let Ok(tokens) = line.trim_start_matches(['#', ' ']).parse() {
                        lib_paths(tokens, out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Follows one path from `prefix` through `trees`: `a::b::{c, d::e}`.
fn path_from(trees: &[TokenTree], mut prefix: Vec<String>, out: &mut BTreeSet<Vec<String>>) {
    let mut i = 0;
    while let Some(TokenTree::Ident(id)) = trees.get(i) {
        if id != "self" {
            prefix.push(id.to_string());
        }
        if !colons_at(trees, i + 1) {
            break;
        }
        i += 3;
    }
    if let Some(TokenTree::Group(g)) = trees.get(i)
        && g.delimiter() == Delimiter::Brace
    {
        let inner: Vec<TokenTree> = g.stream().into_iter().collect();
        for entry in inner.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ',')) {
            path_from(entry, prefix.clone(), out);
        }
    }
    out.insert(prefix);
}

/// What the lib shows and what outside users (main.rs, tests/integration, doctests) name.
struct Surface {
    /// The public modules, as paths.
    public: Vec<Vec<String>>,
    /// Paths into the lib that the users name, after `nccl_preflight::`.
    named: BTreeSet<Vec<String>>,
    /// Every identifier of main.rs and tests/integration.
    outside: BTreeSet<String>,
}

impl Surface {
    fn of(root: &Path) -> Surface {
        let src = root.join("src");
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        let mut public = Vec::new();
        public_modules(
            &src,
            &[],
            &syn::parse_file(&lib).unwrap().items,
            &mut public,
        );
        let mut users = vec![src.join("main.rs")];
        let tests = root.join("tests/integration");
        if tests.exists() {
            rust_files(&tests, &mut users);
        }
        let mut outside = BTreeSet::new();
        for file in users.iter().filter(|f| f.exists()) {
            outside.extend(file_idents(&std::fs::read_to_string(file).unwrap()));
        }
        // Doctests in src/ use the lib by path too.
        rust_files(&src, &mut users);
        let mut named = BTreeSet::new();
        for file in users.iter().filter(|f| f.exists()) {
            let text = std::fs::read_to_string(file).unwrap();
            lib_paths(text.parse().unwrap(), &mut named);
        }
        Surface {
            public,
            named,
            outside,
        }
    }
}

/// Whether `name` lies in one of PUBLIC_SUBTREES.
fn in_public_subtree(name: &str) -> bool {
    PUBLIC_SUBTREES
        .iter()
        .any(|(s, _)| name == *s || name.starts_with(&format!("{s}::")))
}

/// The lib's public modules that nothing outside the lib names a path through.
fn unused_public_modules(root: &Path) -> Vec<String> {
    let surface = Surface::of(root);
    surface
        .public
        .into_iter()
        .filter(|m| !surface.named.iter().any(|p| p.starts_with(m)))
        .map(|m| m.join("::"))
        .filter(|m| !in_public_subtree(m))
        .collect()
}

/// "file: kind name" for each `pub` function, constant and static of a public module
/// that nothing outside the lib names: the crate alone uses it, so `pub(crate)` lets
/// rustc's dead_code lint see it. (Types, fields and methods are left out: they are
/// reached through what main.rs and the tests call without being named.)
fn crate_only_items(root: &Path) -> Vec<String> {
    let surface = Surface::of(root);
    let mut out = Vec::new();
    for module in surface
        .public
        .iter()
        .filter(|m| !in_public_subtree(&m.join("::")))
    {
        let file = module_file(&root.join("src"), module);
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        for item in pub_items(&std::fs::read_to_string(&file).unwrap()) {
            let named = surface.outside.contains(&item.name)
                || surface.named.iter().any(|p| p.last() == Some(&item.name));
            if matches!(item.kind, "function" | "constant" | "static") && !named {
                out.push(format!("{rel}: {} {}", item.kind, item.name));
            }
        }
    }
    out
}

#[test]
fn public_modules_are_those_main_and_the_tests_use() {
    let unused = unused_public_modules(&repo());
    assert!(
        unused.is_empty(),
        "public modules that neither main.rs, tests/integration nor a doctest names: {unused:?}\n\
         declare them `mod` (in lib.rs) or `pub(crate) mod`, so rustc's dead_code lint sees their items"
    );
}

#[test]
fn pub_in_a_public_module_means_used_outside_the_lib() {
    let crate_only = crate_only_items(&repo());
    assert!(
        crate_only.is_empty(),
        "`pub` items of public modules that neither main.rs, tests/integration nor a \
         doctest names: make them `pub(crate)` so rustc sees whether they are used:\n{}",
        crate_only.join("\n")
    );
}

#[test]
fn every_pub_item_is_named_outside_its_file() {
    let root = repo();
    let lonely: Vec<String> = lonely_pub_items(&root.join("src"), &root.join("tests/integration"))
        .into_iter()
        .filter(|l| !ALLOWED.iter().any(|(a, _)| a == l))
        .collect();
    assert!(
        lonely.is_empty(),
        "`pub` items named in no other file: remove the dead ones, make the others \
         private (or move what only tests use into their #[cfg(test)] module):\n{}",
        lonely.join("\n")
    );
    let stale: Vec<&str> = ALLOWED
        .iter()
        .map(|(a, _)| *a)
        .filter(|a| {
            let (file, item) = a.split_once(": ").unwrap();
            let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
            let name = item.rsplit(' ').next().unwrap();
            !pub_items(&text).iter().any(|i| i.name == name)
        })
        .collect();
    assert!(
        stale.is_empty(),
        "ALLOWED names items that are gone: {stale:?}"
    );
}

/// Writes `files` (path, text) under a fresh scratch root and returns it.
fn scratch_tree(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let root = super::support::scratch(name);
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    root
}

#[test]
fn a_pub_item_named_only_in_its_own_file_is_caught() {
    let root = scratch_tree(
        "visibility-items",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "pub fn lonely() {}\npub fn used() { lonely() }\npub const IN_FORMAT: u8 = 1;\n\
                 pub fn in_attr() {}\npub fn in_doc() {}\n\
                 pub struct S { pub alone: u8, pub read: u8 }\n\
                 #[repr(C)]\npub struct C { pub layout: u8 }\n\
                 mod inline { pub fn for_the_file() {} }\n\
                 #[cfg(test)]\nmod tests { pub fn test_only() {} }\n",
            ),
            (
                "src/b.rs",
                "/// Not a use: crate::a::in_doc.\nfn f(s: crate::a::S) -> u8 { crate::a::used(); s.read }\n\
                 #[serde(with = \"crate::a::in_attr\")]\nstruct T;\n",
            ),
            (
                "tests/integration/t.rs",
                "fn t() { println!(\"{IN_FORMAT}\"); }\n",
            ),
        ],
    );
    let lonely = lonely_pub_items(&root.join("src"), &root.join("tests/integration"));
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        lonely,
        [
            "src/a.rs: function lonely",
            "src/a.rs: function in_doc",
            "src/a.rs: field alone",
        ]
    );
}

#[test]
fn a_public_module_or_item_nothing_outside_names_is_caught() {
    let root = scratch_tree(
        "visibility-modules",
        &[
            ("src/lib.rs", "pub mod a;\npub mod b;\nmod c;\n"),
            (
                "src/a/mod.rs",
                "pub mod grouped;\npub mod unused;\npub(crate) mod narrow;\n",
            ),
            (
                "src/b.rs",
                "/// ```\n/// use nccl_preflight::{a::grouped::FROM_DOC, b::X};\n/// ```\npub struct X;\n",
            ),
            ("src/c.rs", "pub mod inner;\n"),
            (
                "src/a/grouped.rs",
                "pub fn f() {}\npub fn helper() {}\npub(crate) fn narrow() {}\npub const FROM_DOC: u8 = 0;\n",
            ),
            ("src/a/unused.rs", "pub fn g() {}\n"),
            (
                "src/main.rs",
                "use nccl_preflight::{a::{self, grouped::f}};\n",
            ),
        ],
    );
    let unused = unused_public_modules(&root);
    let crate_only = crate_only_items(&root);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(unused, ["a::unused"]);
    assert_eq!(
        crate_only,
        [
            "src/a/grouped.rs: function helper",
            "src/a/unused.rs: function g"
        ]
    );
}

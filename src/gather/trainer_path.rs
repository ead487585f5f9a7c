//! Where the trainer's process finds a shared library, worked out as its dynamic
//! loader and its Python will: LD_PRELOAD, the RPATH/RUNPATH of the library that
//! needs it, LD_LIBRARY_PATH, ld.so.cache (a bare soname handed to dlopen), and the
//! Python packages that ship NVIDIA's libraries (the `nvidia-*` wheels under
//! site-packages) in the order Python sees them.
//!
//! The loader's order (ld.so(8), glibc elf/dl-load.c `_dl_map_object`): DT_RPATH of
//! the object that needs the library (only when it has no DT_RUNPATH), then
//! LD_LIBRARY_PATH, then DT_RUNPATH, then ld.so.cache and the default directories.
//! PyTorch's wheels link libtorch_cuda.so against `libnccl.so.2` with a DT_RUNPATH of
//! `$ORIGIN/../../nvidia/nccl/lib` (and its siblings), so the wheel's NCCL wins over a
//! system libnccl unless LD_LIBRARY_PATH names a directory that holds one.
//!
//! Python's order (the `site` module): PYTHONPATH, then the interpreter's prefix (a
//! virtualenv's or conda environment's `lib/python3.X/site-packages`; the first
//! `python3` on PATH when neither VIRTUAL_ENV nor CONDA_PREFIX says), the user's
//! `~/.local` site outside a virtualenv, then the system's directories.
//!
//! These are this process's own files (libraries are dlopen'ed here), not the host
//! root's.

use crate::gather::host::Host;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// One place to try: a name for dlopen (a path, or a bare soname the loader resolves)
/// and how the trainer would come to load it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub found_by: String,
    pub name: String,
}

impl Candidate {
    pub fn new(found_by: impl Into<String>, name: impl Into<String>) -> Candidate {
        Candidate {
            found_by: found_by.into(),
            name: name.into(),
        }
    }
}

/// `found_by` for a bare soname: the loader's own search (LD_LIBRARY_PATH of this
/// process, then ld.so.cache and the default directories).
pub const BY_LOADER: &str = "LD_LIBRARY_PATH / ld.so.cache";

/// A variable of `env`, when set to something.
pub fn env_value<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a str> {
    env.iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.to_str())
        .filter(|v| !v.is_empty())
}

/// The absolute directories of a colon list (LD_LIBRARY_PATH, PYTHONPATH): the loader
/// and Python ignore relative and empty entries for our purposes (they resolve against
/// the trainer's working directory, which is not known here).
pub fn path_list(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or("")
        .split(':')
        .filter(|e| e.starts_with('/'))
        .map(|e| e.trim_end_matches('/').to_string())
        .filter(|e| !e.is_empty())
        .collect()
}

/// LD_PRELOAD's entries (space or colon separated, ld.so(8)).
pub fn preload(env: &[(OsString, OsString)]) -> Vec<String> {
    env_value(env, "LD_PRELOAD")
        .unwrap_or("")
        .split([' ', ':'])
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

/// One Python site directory and why it is on the trainer's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteDir {
    pub found_by: String,
    pub dir: String,
}

/// `prefix/lib/python3*/{site,dist}-packages` and Debian's `prefix/lib/python3/dist-packages`.
fn prefix_sites(own: &Host, prefix: &str, found_by: &str, out: &mut Vec<SiteDir>) {
    let lib = format!("{}/lib", prefix.trim_end_matches('/'));
    let Ok(Some(mut entries)) = own.list_dir(&lib) else {
        return;
    };
    entries.sort();
    for python in entries.iter().filter(|e| e.starts_with("python3")) {
        for packages in ["site-packages", "dist-packages"] {
            let dir = format!("{lib}/{python}/{packages}");
            if own.path(&dir).is_dir() && !out.iter().any(|s| s.dir == dir) {
                out.push(SiteDir {
                    found_by: found_by.to_string(),
                    dir,
                });
            }
        }
    }
}

/// The prefix of the first `python3` on PATH (`/opt/venv/bin/python3` -> `/opt/venv`).
fn path_python_prefix(own: &Host, env: &[(OsString, OsString)]) -> Option<String> {
    path_list(env_value(env, "PATH"))
        .into_iter()
        .find(|dir| own.path(&format!("{dir}/python3")).exists())
        .and_then(|dir| dir.strip_suffix("/bin").map(str::to_string))
        .filter(|p| !p.is_empty())
}

/// Every Python site directory the trainer's interpreter would search, in its order.
pub fn python_site_dirs(own: &Host, env: &[(OsString, OsString)]) -> Vec<SiteDir> {
    let mut out = Vec::new();
    for dir in path_list(env_value(env, "PYTHONPATH")) {
        if own.path(&dir).is_dir() && !out.iter().any(|s: &SiteDir| s.dir == dir) {
            out.push(SiteDir {
                found_by: "PYTHONPATH".into(),
                dir,
            });
        }
    }
    let venv = ["VIRTUAL_ENV", "CONDA_PREFIX"].iter().find_map(|v| {
        env_value(env, v)
            .filter(|p| p.starts_with('/'))
            .map(|p| (*v, p))
    });
    match venv {
        Some((var, prefix)) => prefix_sites(own, prefix, var, &mut out),
        None => {
            if let Some(prefix) = path_python_prefix(own, env) {
                prefix_sites(own, &prefix, "python3 on PATH", &mut out);
            }
            if let Some(home) = env_value(env, "HOME").filter(|h| h.starts_with('/')) {
                prefix_sites(own, &format!("{home}/.local"), "user site", &mut out);
            }
        }
    }
    for prefix in ["/usr/local", "/usr", "/opt/conda"] {
        prefix_sites(own, prefix, "system Python", &mut out);
    }
    out
}

/// What a shared object's dynamic section says about finding its dependencies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dynamic {
    /// DT_NEEDED sonames, in order.
    pub needed: Vec<String>,
    /// DT_RPATH directories (searched before LD_LIBRARY_PATH, only without DT_RUNPATH).
    rpath: Vec<String>,
    /// DT_RUNPATH directories (searched after LD_LIBRARY_PATH).
    runpath: Vec<String>,
}

/// Bounds on what `dynamic_section` reads of a file: headers, the dynamic section and
/// the strings it names only (libtorch_cuda.so is about 1 GB).
const MAX_PHDRS: u64 = 256;
const MAX_DYNAMIC_BYTES: u64 = 64 << 10;
/// The longest DT_NEEDED, DT_RPATH or DT_RUNPATH string read.
const MAX_STRING_BYTES: u64 = 16 << 10;

fn read_at(file: &File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

fn u16_at(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn u32_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u64::from(u32::from_le_bytes(x))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// A PT_LOAD segment: where its virtual addresses sit in the file.
struct Load {
    vaddr: u64,
    offset: u64,
    filesz: u64,
}

fn file_offset(loads: &[Load], vaddr: u64) -> Option<u64> {
    loads
        .iter()
        .find(|l| vaddr >= l.vaddr && vaddr < l.vaddr + l.filesz)
        .map(|l| vaddr - l.vaddr + l.offset)
}

const PT_LOAD: u64 = 1;
const PT_DYNAMIC: u64 = 2;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

/// The program headers: PT_LOAD segments and the PT_DYNAMIC (offset, size).
fn segments(file: &File, header: &[u8]) -> Result<(Vec<Load>, (u64, u64)), String> {
    let (phoff, phentsize, phnum) = (
        u64_at(header, 0x20),
        u16_at(header, 0x36),
        u16_at(header, 0x38),
    );
    if phentsize < 56 || phnum > MAX_PHDRS {
        return Err(format!("program headers of {phnum} x {phentsize} bytes"));
    }
    let table = read_at(file, phoff, phentsize * phnum).map_err(|e| e.to_string())?;
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum as usize {
        let p = &table[i * phentsize as usize..];
        match u32_at(p, 0) {
            PT_LOAD => loads.push(Load {
                offset: u64_at(p, 8),
                vaddr: u64_at(p, 16),
                filesz: u64_at(p, 32),
            }),
            PT_DYNAMIC => dynamic = Some((u64_at(p, 8), u64_at(p, 32))),
            _ => {}
        }
    }
    let dynamic = dynamic.ok_or("no dynamic section")?;
    Ok((loads, dynamic))
}

/// Reads DT_NEEDED, DT_RPATH and DT_RUNPATH of a 64-bit little-endian ELF shared
/// object (x86_64, aarch64) without loading it, reading only its headers, dynamic
/// section and the strings those entries name.
pub fn dynamic_section(path: &str) -> Result<Dynamic, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let header = read_at(&file, 0, 64).map_err(|e| e.to_string())?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let (loads, (dyn_off, dyn_size)) = segments(&file, &header)?;
    let entries =
        read_at(&file, dyn_off, dyn_size.min(MAX_DYNAMIC_BYTES)).map_err(|e| e.to_string())?;
    let tags: Vec<(u64, u64)> = entries
        .chunks_exact(16)
        .map(|e| (u64_at(e, 0), u64_at(e, 8)))
        .take_while(|(tag, _)| *tag != 0)
        .collect();
    let find = |want: u64| tags.iter().find(|(t, _)| *t == want).map(|(_, v)| *v);
    let (Some(strtab), Some(strsz)) = (find(DT_STRTAB), find(DT_STRSZ)) else {
        return Err("no string table".into());
    };
    let offset = file_offset(&loads, strtab).ok_or("string table outside every segment")?;
    // Each string is read where it lies: a C++ library's string table runs to tens of
    // MiB (libtorch_cuda.so), and its DT_NEEDED names need not come first.
    let text = |at: u64| -> Option<String> {
        let len = strsz.checked_sub(at)?.min(MAX_STRING_BYTES);
        let bytes = read_at(&file, offset + at, len).ok()?;
        let end = bytes.iter().position(|b| *b == 0)?;
        Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
    };
    let mut out = Dynamic::default();
    for (tag, value) in &tags {
        let Some(s) = text(*value) else { continue };
        match *tag {
            DT_NEEDED => out.needed.push(s),
            DT_RPATH => out.rpath.extend(s.split(':').map(str::to_string)),
            DT_RUNPATH => out.runpath.extend(s.split(':').map(str::to_string)),
            _ => {}
        }
    }
    Ok(out)
}

/// A DT_RPATH/DT_RUNPATH entry with `$ORIGIN` (or `${ORIGIN}`) replaced by the
/// directory of the object that carries it; `None` for entries the loader would
/// resolve against something unknown here ($LIB, $PLATFORM, relative paths).
fn expand_origin(entry: &str, object: &str) -> Option<String> {
    let origin = object.rsplit_once('/').map(|(d, _)| d)?;
    let expanded = entry
        .replace("${ORIGIN}", origin)
        .replace("$ORIGIN", origin);
    (expanded.starts_with('/') && !expanded.contains('$')).then(|| normalize(&expanded))
}

/// Removes `.` and `..` components, as the loader's path would name the file.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Where the loader looks for `soname` when `object` (with `dynamic`) needs it, as
/// directories in the loader's order, each with why: RPATH, LD_LIBRARY_PATH, RUNPATH.
/// ld.so.cache comes after these and is the bare soname's own search.
pub fn loader_dirs(
    object: &str,
    dynamic: &Dynamic,
    env: &[(OsString, OsString)],
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let short = object.rsplit('/').next().unwrap_or(object);
    if dynamic.runpath.is_empty() {
        for e in &dynamic.rpath {
            if let Some(d) = expand_origin(e, object) {
                out.push((format!("RPATH of {short}"), d));
            }
        }
    }
    for d in path_list(env_value(env, "LD_LIBRARY_PATH")) {
        out.push(("LD_LIBRARY_PATH".to_string(), d));
    }
    for e in &dynamic.runpath {
        if let Some(d) = expand_origin(e, object) {
            out.push((format!("RUNPATH of {short}"), d));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn origin_expands_and_normalizes_like_the_loader() {
        let torch = "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so";
        assert_eq!(
            expand_origin("$ORIGIN/../../nvidia/nccl/lib", torch).as_deref(),
            Some("/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib")
        );
        assert_eq!(
            expand_origin("${ORIGIN}", torch).as_deref(),
            Some("/opt/venv/lib/python3.12/site-packages/torch/lib")
        );
        assert_eq!(expand_origin("$LIB/x", torch), None);
        assert_eq!(expand_origin("lib", torch), None);
        assert_eq!(
            expand_origin("/usr/lib/./x/", torch).as_deref(),
            Some("/usr/lib/x")
        );
    }

    #[test]
    fn rpath_precedes_ld_library_path_only_without_runpath() {
        let object = "/t/lib/libx.so";
        let e = env(&[("LD_LIBRARY_PATH", "/l1::rel:/l2/")]);
        let rpath = Dynamic {
            rpath: vec!["$ORIGIN/r".into()],
            ..Dynamic::default()
        };
        let got: Vec<String> = loader_dirs(object, &rpath, &e)
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        assert_eq!(got, ["/t/lib/r", "/l1", "/l2"]);
        let both = Dynamic {
            rpath: vec!["/ignored".into()],
            runpath: vec!["$ORIGIN/../n".into()],
            ..Dynamic::default()
        };
        let got = loader_dirs(object, &both, &e);
        assert_eq!(
            got,
            [
                ("LD_LIBRARY_PATH".to_string(), "/l1".to_string()),
                ("LD_LIBRARY_PATH".to_string(), "/l2".to_string()),
                ("RUNPATH of libx.so".to_string(), "/t/n".to_string()),
            ]
        );
    }

    #[test]
    fn preload_splits_on_spaces_and_colons() {
        let e = env(&[("LD_PRELOAD", "/a/libnccl.so.2 libb.so:/c.so")]);
        assert_eq!(preload(&e), ["/a/libnccl.so.2", "libb.so", "/c.so"]);
        assert!(preload(&env(&[])).is_empty());
    }

    /// The real loader's view of a real library: this test binary's own libc has
    /// DT_NEEDED entries the ELF reader must find; a text file is refused by name.
    #[test]
    fn reads_the_dynamic_section_of_a_real_library() {
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
        let Some(libc) = libc else {
            return;
        };
        let d = dynamic_section(libc).expect("libc's dynamic section");
        assert!(d.needed.iter().any(|n| n.starts_with("ld-linux")), "{d:?}");
        let err = dynamic_section("/etc/hostname").unwrap_err();
        assert!(err.contains("ELF") || err.contains("fill"), "{err}");
        assert!(dynamic_section("/nonexistent/x.so").is_err());
    }

    #[test]
    fn python_site_dirs_follow_pythonpath_then_the_environment_then_the_system() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_str().expect("utf-8").to_string();
        let venv = format!("{root}/venv");
        let user = format!("{root}/home");
        for d in [
            format!("{venv}/lib/python3.12/site-packages"),
            format!("{venv}/bin"),
            format!("{user}/.local/lib/python3.12/site-packages"),
            format!("{root}/pp"),
        ] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::write(format!("{venv}/bin/python3"), "").expect("python3");
        let own = Host::new("/");
        let on_path = env(&[
            ("PYTHONPATH", &format!("{root}/pp:{root}/missing")),
            ("PATH", &format!("/nonexistent:{venv}/bin")),
            ("HOME", &user),
        ]);
        let got: Vec<(String, String)> = python_site_dirs(&own, &on_path)
            .into_iter()
            .filter(|s| s.dir.starts_with(&root))
            .map(|s| (s.found_by, s.dir))
            .collect();
        assert_eq!(
            got,
            [
                ("PYTHONPATH".to_string(), format!("{root}/pp")),
                (
                    "python3 on PATH".to_string(),
                    format!("{venv}/lib/python3.12/site-packages")
                ),
                (
                    "user site".to_string(),
                    format!("{user}/.local/lib/python3.12/site-packages")
                ),
            ]
        );
        // An active virtualenv is the interpreter's prefix; the user site is off.
        let active = env(&[("VIRTUAL_ENV", &venv), ("HOME", &user)]);
        let got: Vec<String> = python_site_dirs(&own, &active)
            .into_iter()
            .filter(|s| s.dir.starts_with(&root))
            .map(|s| s.found_by)
            .collect();
        assert_eq!(got, ["VIRTUAL_ENV"]);
    }
}

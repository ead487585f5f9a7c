//! Writing output files so that a reader sees the old file or the whole new one.
//!
//! All files of one run are staged first (a temp file in the target's directory,
//! written and fsynced), then renamed into place, then the directories are
//! fsynced. If any staging fails, every staged temp file is removed and nothing
//! is replaced. The termination message is the exception: /dev/termination-log is
//! a bind-mounted file, which cannot be renamed over, so it is written in place.

use anyhow::{Context, Result, anyhow, bail};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// One file to write.
#[derive(Debug)]
pub struct Output {
    /// What the file is, for messages (`--env-file`).
    pub flag: &'static str,
    pub path: PathBuf,
    pub contents: Vec<u8>,
    /// Permission bits of the new file (0o644 for reports, 0o755 for the binary).
    pub mode: u32,
}

impl Output {
    /// A text file, mode 0644.
    pub fn text(flag: &'static str, path: PathBuf, contents: String) -> Output {
        Output {
            flag,
            path,
            contents: contents.into_bytes(),
            mode: 0o644,
        }
    }
}

/// Where the data really goes: the path, or the file a symlink points to.
fn resolve_target(flag: &str, path: &Path) -> Result<PathBuf> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            let target = fs::canonicalize(path).map_err(|e| {
                anyhow!(
                    "{flag} {}: a symbolic link whose target cannot be reached ({e})",
                    path.display()
                )
            })?;
            resolve_target(flag, &target)
        }
        Ok(meta) if meta.is_dir() => bail!("{flag} {}: is a directory", path.display()),
        Ok(_) => Ok(path.to_path_buf()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(path.to_path_buf()),
        Err(e) => bail!("{flag} {}: {e}", path.display()),
    }
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

struct Staged {
    temp: PathBuf,
    target: PathBuf,
}

fn stage(output: &Output, n: usize) -> Result<Staged> {
    let target = resolve_target(output.flag, &output.path)?;
    let dir = parent_of(&target);
    let meta = fs::metadata(&dir).with_context(|| {
        format!(
            "{} {}: directory {}",
            output.flag,
            output.path.display(),
            dir.display()
        )
    })?;
    if !meta.is_dir() {
        bail!(
            "{} {}: {} is not a directory",
            output.flag,
            output.path.display(),
            dir.display()
        );
    }
    let name = target
        .file_name()
        .ok_or_else(|| anyhow!("{} {}: not a file path", output.flag, output.path.display()))?;
    let temp = dir.join(format!(
        ".{}.nccl-preflight-{}-{n}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(output.mode)
            .open(&temp)?;
        file.write_all(&output.contents)?;
        // The umask may have taken bits away; the file gets exactly the mode asked for.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(output.mode))?;
        file.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&temp);
        bail!(
            "{} {}: cannot write: {e}",
            output.flag,
            output.path.display()
        );
    }
    Ok(Staged { temp, target })
}

/// Writes every output atomically, or none of them.
pub fn write_atomically(outputs: &[Output]) -> Result<()> {
    let mut staged = Vec::new();
    for (n, output) in outputs.iter().enumerate() {
        match stage(output, n) {
            Ok(s) => staged.push(s),
            Err(e) => {
                for s in &staged {
                    let _ = fs::remove_file(&s.temp);
                }
                return Err(e);
            }
        }
    }
    for (i, s) in staged.iter().enumerate() {
        if let Err(e) = fs::rename(&s.temp, &s.target) {
            for rest in &staged[i..] {
                let _ = fs::remove_file(&rest.temp);
            }
            bail!(
                "{} {}: cannot rename into place: {e}",
                outputs[i].flag,
                s.target.display()
            );
        }
    }
    for s in &staged {
        // Persist the renames; a directory that cannot be opened or synced (some
        // filesystems refuse) leaves the files complete, just not yet durable.
        if let Ok(dir) = fs::File::open(parent_of(&s.target)) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}

/// Writes the termination message in place (see the module doc for why).
pub fn write_in_place(flag: &str, path: &Path, contents: &str) -> Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("{flag} {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("{flag} {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("out-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn out(flag: &'static str, path: PathBuf, text: &str) -> Output {
        Output::text(flag, path, text.into())
    }

    #[test]
    fn replaces_whole_files_and_follows_symlinks() {
        let dir = scratch("ok");
        fs::write(dir.join("a.env"), "old").unwrap();
        std::os::unix::fs::symlink(dir.join("real.conf"), dir.join("link.conf")).unwrap();
        fs::write(dir.join("real.conf"), "old").unwrap();
        write_atomically(&[
            out("--env-file", dir.join("a.env"), "new"),
            out("--nccl-conf", dir.join("link.conf"), "conf"),
        ])
        .unwrap();
        assert_eq!(fs::read_to_string(dir.join("a.env")).unwrap(), "new");
        assert_eq!(fs::read_to_string(dir.join("real.conf")).unwrap(), "conf");
        assert!(
            fs::symlink_metadata(dir.join("link.conf"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 3, "no temp files left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_bad_path_writes_nothing() {
        let dir = scratch("bad");
        fs::write(dir.join("a.env"), "old").unwrap();
        fs::create_dir(dir.join("adir")).unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere/x"), dir.join("dangling")).unwrap();
        for (flag, bad, expect) in [
            ("--report", dir.join("adir"), "is a directory"),
            ("--report", dir.join("dangling"), "cannot be reached"),
            ("--report", dir.join("missing/r.json"), "missing"),
        ] {
            let err = write_atomically(&[
                out("--env-file", dir.join("a.env"), "new"),
                out(flag, bad.clone(), "x"),
            ])
            .unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains(flag) && msg.contains(expect), "{msg}");
            assert_eq!(fs::read_to_string(dir.join("a.env")).unwrap(), "old");
        }
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 3, "no temp files left: {names:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}

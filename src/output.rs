//! Writing output files so that a reader sees the old file or the whole new one.
//!
//! All files of one run are staged first (a temp file with an unpredictable name
//! in the target's directory, written and fsynced), then renamed into place, then
//! the directories are fsynced. If any staging fails, every staged temp file is
//! removed and nothing is replaced. The termination message is the exception:
//! /dev/termination-log is a bind-mounted file, which cannot be renamed over, so
//! it is written in place.
//!
//! An output path is only ever a regular file or absent. A symbolic link at the
//! last component is refused, not followed: in a shared emptyDir another container
//! can plant one to make this tool (often root) overwrite a file it points to. A
//! device node, FIFO, socket or directory is refused too (`init --env-file
//! /dev/null` used to replace the machine's /dev/null). A replaced file keeps its
//! permission bits only when it is ours (owned by this process's user) in a directory
//! no one else can write or a sticky one; otherwise, and for a new file, the output
//! gets its own mode (0644): another user's planted 0666 file never leaves a
//! world-writable env file behind. `install` always gives 0755.

use anyhow::{Context, Result, anyhow, bail};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One file to write.
#[derive(Debug)]
pub struct Output {
    /// What the file is, for messages (`--env-file`).
    pub flag: &'static str,
    pub path: PathBuf,
    pub contents: Vec<u8>,
    /// Permission bits of a new file (0o644 for reports, 0o755 for the binary).
    pub mode: u32,
    /// A replaced file keeps its own bits (a report someone made 0600 stays so);
    /// `install` sets `mode` always, since the copy must be executable.
    pub keep_mode: bool,
}

impl Output {
    /// A text file, mode 0644.
    pub fn text(flag: &'static str, path: PathBuf, contents: String) -> Output {
        Output {
            flag,
            path,
            contents: contents.into_bytes(),
            mode: 0o644,
            keep_mode: true,
        }
    }
}

/// Temp names are `.NAME.nccl-preflight-XXXXXX.tmp`: hidden, named after the
/// output they stage, and random in the middle (tempfile's O_EXCL retry), so a
/// temp left by a killed run (PID 1 in a pod has the same pid every time) never
/// blocks the next one.
const TEMP_INFIX: &str = ".nccl-preflight-";
const TEMP_SUFFIX: &str = ".tmp";

/// A temp file of ours older than this is left over from a run that was killed
/// (staging takes milliseconds); it is removed. Younger ones may belong to a run
/// going on right now and are left alone.
const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

/// What kind of thing a path names, for refusals.
fn kind_of(file_type: fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Whether the bits of the file `meta` describes may be kept for the output that
/// replaces it: only a file this process's user owns, in a directory no one else can
/// write or one that is sticky. Another user's file (planted 0666 in a shared
/// directory, issue 31 row 2) or any file in a non-sticky directory others can write
/// (where anyone could have made it) gets the output's own mode instead.
fn may_keep_mode(meta: &fs::Metadata, dir: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid(2) takes nothing, cannot fail and touches no memory of ours.
    let ours = meta.uid() == unsafe { libc::geteuid() };
    let others_write = dir.mode() & 0o022 != 0;
    let sticky = dir.mode() & 0o1000 != 0;
    ours && (!others_write || sticky)
}

/// The permission bits to give the output: those of the regular file it
/// replaces (when `keep` and `may_keep_mode`), or `mode`. Anything else at the path
/// is refused.
fn destination_mode(flag: &str, path: &Path, mode: u32, keep: bool) -> Result<u32> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() && keep => {
            let dir = fs::metadata(parent_of(path))
                .with_context(|| format!("{flag} {}: its directory", path.display()))?;
            Ok(if may_keep_mode(&meta, &dir) {
                meta.permissions().mode() & 0o777
            } else {
                mode
            })
        }
        Ok(meta) if meta.file_type().is_file() => Ok(mode),
        Ok(meta) if meta.file_type().is_symlink() => bail!(
            "{flag} {}: is a symbolic link; refusing to follow it (name the file it points to instead)",
            path.display()
        ),
        Ok(meta) => bail!(
            "{flag} {}: is {}, not a regular file; refusing to replace it",
            path.display(),
            kind_of(meta.file_type())
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(mode),
        Err(e) => bail!("{flag} {}: {e}", path.display()),
    }
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The file an output path names, spelled one way: its directory resolved
/// (symbolic links, `.` and `..` in it) and its own name, so two spellings of one
/// file compare equal.
fn identity(flag: &str, path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("{flag} {}: not a file path", path.display()))?;
    let dir = parent_of(path);
    let dir = fs::canonicalize(&dir)
        .with_context(|| format!("{flag} {}: directory {}", path.display(), dir.display()))?;
    Ok(dir.join(name))
}

/// Refuses two outputs that name the same file (`--env-file X --nccl-conf X`, or
/// `X` and `./X`): one would silently replace the other. Checked before anything
/// is written.
pub fn distinct(outputs: &[(&str, &Path)]) -> Result<()> {
    let mut seen: Vec<(&str, &Path, PathBuf)> = Vec::new();
    for (flag, path) in outputs {
        let id = identity(flag, path)?;
        if let Some((other, other_path, _)) = seen.iter().find(|(_, _, s)| *s == id) {
            bail!(
                "{flag} {} and {other} {} name the same file ({}); give each output its own path",
                path.display(),
                other_path.display(),
                id.display()
            );
        }
        seen.push((flag, path, id));
    }
    Ok(())
}

/// Removes temp files that a killed run left beside `name` in `dir`. Best
/// effort: only regular files of ours, only old ones (see `STALE_TEMP_AGE`).
fn remove_stale_temps(dir: &Path, name: &str) {
    let prefix = format!(".{name}{TEMP_INFIX}");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if !file_name.starts_with(&prefix) || !file_name.ends_with(TEMP_SUFFIX) {
            continue;
        }
        // DirEntry::metadata does not follow symbolic links.
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= STALE_TEMP_AGE);
        if meta.file_type().is_file() && old {
            let _ = fs::remove_file(entry.path());
        }
    }
}

struct Staged {
    temp: tempfile::NamedTempFile,
    target: PathBuf,
}

fn stage(output: &Output) -> Result<Staged> {
    let flag = output.flag;
    let target = output.path.clone();
    let name = target
        .file_name()
        .ok_or_else(|| anyhow!("{flag} {}: not a file path", target.display()))?
        .to_string_lossy()
        .into_owned();
    let mode = destination_mode(flag, &target, output.mode, output.keep_mode)?;
    let dir = parent_of(&target);
    let meta = fs::metadata(&dir)
        .with_context(|| format!("{flag} {}: directory {}", target.display(), dir.display()))?;
    if !meta.is_dir() {
        bail!(
            "{flag} {}: {} is not a directory",
            target.display(),
            dir.display()
        );
    }
    remove_stale_temps(&dir, &name);
    let write = || -> std::io::Result<tempfile::NamedTempFile> {
        let mut temp = tempfile::Builder::new()
            .prefix(&format!(".{name}{TEMP_INFIX}"))
            .suffix(TEMP_SUFFIX)
            .permissions(fs::Permissions::from_mode(mode))
            .tempfile_in(&dir)?;
        temp.write_all(&output.contents)?;
        // The umask may have taken bits away; the file gets exactly the mode meant.
        temp.as_file()
            .set_permissions(fs::Permissions::from_mode(mode))?;
        temp.as_file().sync_all()?;
        Ok(temp)
    };
    // A NamedTempFile removes itself when dropped, on every error path below too.
    let temp = write().map_err(|e| anyhow!("{flag} {}: cannot write: {e}", target.display()))?;
    Ok(Staged { temp, target })
}

/// Writes every output atomically, or none of them.
pub fn write_atomically(outputs: &[Output]) -> Result<()> {
    let names: Vec<(&str, &Path)> = outputs.iter().map(|o| (o.flag, o.path.as_path())).collect();
    distinct(&names)?;
    let mut staged = Vec::new();
    for output in outputs {
        // On error the temp files staged so far are dropped, which removes them.
        staged.push(stage(output)?);
    }
    let mut targets = Vec::new();
    for (s, output) in staged.into_iter().zip(outputs) {
        // rename(2) replaces the directory entry itself: a symbolic link planted
        // since the check above is replaced, its target left untouched. The file is
        // closed first: a new binary still open for writing when it appears under its
        // name makes a concurrent execve of that name fail with ETXTBSY (issue 31 row 9).
        s.temp.into_temp_path().persist(&s.target).map_err(|e| {
            anyhow!(
                "{} {}: cannot rename into place: {}",
                output.flag,
                s.target.display(),
                e.error
            )
        })?;
        targets.push(s.target);
    }
    for target in &targets {
        // Persist the renames; a directory that cannot be opened or synced (some
        // filesystems refuse) leaves the files complete, just not yet durable.
        if let Ok(dir) = fs::File::open(parent_of(target)) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}

/// Writes the termination message in place (see the module doc for why): the
/// file is opened without following a symbolic link and without blocking (a FIFO
/// would otherwise wait for a reader), and only a regular file is truncated.
pub fn write_in_place(flag: &str, path: &Path, contents: &str) -> Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                anyhow!(
                    "{flag} {}: is a symbolic link; refusing to follow it",
                    path.display()
                )
            } else {
                anyhow!("{flag} {}: {e}", path.display())
            }
        })?;
    let meta = file
        .metadata()
        .with_context(|| format!("{flag} {}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!(
            "{flag} {}: is {}, not a regular file; refusing to write it",
            path.display(),
            kind_of(meta.file_type())
        );
    }
    file.set_len(0)
        .and_then(|()| file.write_all(contents.as_bytes()))
        .with_context(|| format!("{flag} {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory, removed when the returned guard drops (even when the test fails).
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("out-{name}-"))
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        (tmp, dir)
    }

    fn out(flag: &'static str, path: PathBuf, text: &str) -> Output {
        Output::text(flag, path, text.into())
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn replaces_whole_files_keeping_their_mode() {
        let (_tmp, dir) = scratch("ok");
        fs::write(dir.join("a.env"), "old").unwrap();
        fs::set_permissions(dir.join("a.env"), fs::Permissions::from_mode(0o600)).unwrap();
        write_atomically(&[
            out("--env-file", dir.join("a.env"), "new"),
            out("--nccl-conf", dir.join("new.conf"), "conf"),
        ])
        .unwrap();
        assert_eq!(fs::read_to_string(dir.join("a.env")).unwrap(), "new");
        assert_eq!(
            mode(&dir.join("a.env")),
            0o600,
            "a replaced file keeps its mode"
        );
        assert_eq!(
            mode(&dir.join("new.conf")),
            0o644,
            "a new file gets the output's"
        );
        assert_eq!(names(&dir), ["a.env", "new.conf"], "no temp files left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn symlink_planted_at_an_output_is_refused_and_its_target_untouched() {
        // Issue 18: a link in a shared emptyDir made the tool clobber its target
        // (a 0600 file became 0644).
        let (_tmp, dir) = scratch("symlink");
        fs::write(dir.join("secret"), "keep").unwrap();
        fs::set_permissions(dir.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), dir.join("nccl.env")).unwrap();
        let err = write_atomically(&[out("--env-file", dir.join("nccl.env"), "x")]).unwrap_err();
        assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
        assert_eq!(fs::read_to_string(dir.join("secret")).unwrap(), "keep");
        assert_eq!(mode(&dir.join("secret")), 0o600);
        let err = write_in_place("--termination-log", &dir.join("nccl.env"), "x").unwrap_err();
        assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
        assert_eq!(fs::read_to_string(dir.join("secret")).unwrap(), "keep");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn env_file_dev_null_is_not_replaced() {
        // Issue 18: `init --env-file /dev/null` replaced the machine's /dev/null.
        let err = write_atomically(&[out("--env-file", "/dev/null".into(), "x")]).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("/dev/null") && msg.contains("character device"),
            "{msg}"
        );
        assert!(
            fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        let err = write_in_place("--termination-log", Path::new("/dev/null"), "x").unwrap_err();
        assert!(format!("{err:#}").contains("character device"), "{err:#}");
    }

    #[test]
    fn one_bad_path_writes_nothing() {
        let (_tmp, dir) = scratch("bad");
        fs::write(dir.join("a.env"), "old").unwrap();
        fs::create_dir(dir.join("adir")).unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere/x"), dir.join("dangling")).unwrap();
        nix::unistd::mkfifo(&dir.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        for (flag, bad, expect) in [
            ("--report", dir.join("adir"), "a directory"),
            ("--report", dir.join("dangling"), "symbolic link"),
            ("--report", dir.join("fifo"), "a FIFO"),
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
        assert_eq!(
            names(&dir),
            ["a.env", "adir", "dangling", "fifo"],
            "no temp files left"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temp_left_by_a_killed_run_neither_blocks_nor_stays() {
        // Issue 18: a killed `init` (PID 1, the same temp name every time) left a
        // temp that made the next attempt fail with "File exists".
        let (_tmp, dir) = scratch("stale");
        let old = dir.join(".nccl.env.nccl-preflight-1-0.tmp");
        let fresh = dir.join(".nccl.env.nccl-preflight-AbC123.tmp");
        for path in [&old, &fresh] {
            fs::write(path, "half").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - 2 * STALE_TEMP_AGE;
        fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        write_atomically(&[out("--env-file", dir.join("nccl.env"), "new")]).unwrap();
        assert_eq!(fs::read_to_string(dir.join("nccl.env")).unwrap(), "new");
        // The old one is removed; a recent one may be a run going on now.
        assert_eq!(
            names(&dir),
            [".nccl.env.nccl-preflight-AbC123.tmp", "nccl.env"]
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn env_file_and_nccl_conf_naming_one_file_are_refused() {
        // Issue 18: `--env-file X --nccl-conf X` silently lost the env file.
        let (_tmp, dir) = scratch("same");
        fs::create_dir(dir.join("sub")).unwrap();
        let spellings = [dir.join("x"), dir.join("sub/../x"), dir.join("./x")];
        for other in &spellings {
            let err = write_atomically(&[
                out("--env-file", dir.join("x"), "env"),
                out("--nccl-conf", other.clone(), "conf"),
            ])
            .unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains("name the same file"), "{msg}");
            assert!(
                msg.contains("--env-file") && msg.contains("--nccl-conf"),
                "{msg}"
            );
        }
        assert_eq!(names(&dir), ["sub"], "nothing written");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn termination_log_is_truncated_and_rewritten_in_place() {
        let (_tmp, dir) = scratch("inplace");
        let path = dir.join("termination-log");
        fs::write(&path, "a much longer old message").unwrap();
        write_in_place("--termination-log", &path, "short").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "short");
        fs::remove_dir_all(&dir).unwrap();
    }
}

//! Lines for standard error that cannot break the command writing them.
//!
//! `eprintln!` panics when the write fails with anything but EBADF (std treats a
//! closed descriptor 2 as a sink): a pod whose log collector went away leaves
//! stderr a pipe with no reader, and Rust ignores SIGPIPE, so the write returns
//! EPIPE and the panic turns a verdict into "internal error", exit 2. A diagnostic
//! is worth less than the exit code the command was about to return: a line that
//! cannot be written is dropped.

use std::io::Write;

/// Writes `args` and a newline to standard error, whole or not at all as far as
/// one `write` allows; any error (EPIPE, EIO, ENOSPC on a redirected file) is dropped.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut text = args.to_string();
    text.push('\n');
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Says what a step that can take more than a second is doing (a bench, the gang's
/// waits), for a person watching: only where standard error is a terminal or `asked`
/// (`--trace`), so the logs a pod's collector keeps stay as they were.
pub(crate) fn progress(asked: bool, args: std::fmt::Arguments<'_>) {
    use std::io::IsTerminal;
    if asked || std::io::stderr().is_terminal() {
        line(args);
    }
}

/// Text made safe for a terminal: every control character (escape sequences,
/// carriage returns, line breaks, tabs) is shown as a visible escape such as `\x1b`
/// or `\u{9b}`, so names and log text from the host cannot move the cursor, clear
/// the screen or forge report lines. Borrowed when there is nothing to escape.
pub(crate) fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if c.is_control() && (c as u32) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

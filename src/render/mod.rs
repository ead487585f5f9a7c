//! render: pure functions from a `Report` to text (human report, JSON, env file,
//! nccl.conf, termination message).

pub mod doctor;
pub mod env_file;
pub mod explain;
pub mod human;
pub mod json;
pub mod nccl_conf;
pub mod npd;
mod prediction;
pub mod termination;

/// Text made safe for a one-line `#` comment: control characters (newlines
/// among them) become `?`, so a hostile value cannot end the comment.
pub fn comment_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

pub(crate) use crate::diagnostic::visible;

/// A POSIX environment variable name: letters, digits and `_`, not starting with a digit.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
pub(crate) mod fixed_report;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_escapes_terminal_control_sequences() {
        assert!(matches!(
            visible("eth0"),
            std::borrow::Cow::Borrowed("eth0")
        ));
        assert_eq!(visible("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(visible("x\ry\nz\t"), "x\\x0dy\\x0az\\x09");
        assert_eq!(visible("c1\u{9b}31m"), "c1\\u{9b}31m");
        assert_eq!(visible("GPU ünïcode"), "GPU ünïcode");
    }
}

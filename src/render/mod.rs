//! render: pure functions from a `Report` to text (human report, JSON, env file,
//! nccl.conf, termination message).

pub mod doctor;
pub mod env_file;
pub mod explain;
pub mod human;
pub mod json;
pub mod nccl_conf;
pub mod termination;

/// Text made safe for a one-line `#` comment: control characters (newlines
/// among them) become `?`, so a hostile value cannot end the comment.
pub fn comment_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

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

//! aws-ofi-nccl's own variables (OFI_NCCL_*) and the values its parser takes
//! (aws/aws-ofi-nccl include/nccl_ofi_param.h and nccl_ofi_param_impl.h
//! `ofi_nccl_param_string_to_value`, v1.19.2; the same parser from v1.17.0): a set of
//! names for the enumerations (any case), `true`/`false` or a whole integer for the
//! booleans, a whole number for the sizes (no sign) and integers, a number for the
//! floats. A value it refuses is `WARNING: OFI_NCCL_X set to invalid value V` and the
//! plugin's initialization fails (-EINVAL), so NCCL goes on without it.

/// How aws-ofi-nccl reads one variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfiKind {
    /// One of these names, compared with strcasecmp.
    OneOf(&'static [&'static str]),
    Bool,
    /// `int`: an optional sign and digits (istringstream >> int), the whole value.
    Int,
    /// `size_t`: digits, no minus sign.
    Size,
    Float,
}

/// OFI_NCCL_<name>, v1.19.2 (strings, which take anything, are not listed).
const PARAMS: &[(&str, OfiKind)] = &[
    ("PROTOCOL", OfiKind::OneOf(&["SENDRECV", "RDMA"])),
    (
        "TUNER_TYPE",
        OfiKind::OneOf(&["INTERNAL", "REGION", "MODEL"]),
    ),
    (
        "PROGRESS_MODEL",
        OfiKind::OneOf(&["UNSPEC", "AUTO", "MANUAL"]),
    ),
    (
        "NVTX_TRACE_DIMENSION",
        OfiKind::OneOf(&["PER_COMM", "PER_DEV"]),
    ),
    ("ABORT_ON_ERROR", OfiKind::Bool),
    ("CUDA_FLUSH_ENABLE", OfiKind::Bool),
    ("DISABLE_CLOSE_MESSAGE", OfiKind::Bool),
    ("DISABLE_DMABUF", OfiKind::Bool),
    ("DISABLE_GDR_REQUIRED_CHECK", OfiKind::Bool),
    ("DISABLE_NATIVE_RDMA_CHECK", OfiKind::Bool),
    ("EARLY_COMPLETION", OfiKind::Bool),
    ("ERRORCHECK_MUTEX", OfiKind::Bool),
    ("GDR_FLUSH_DISABLE", OfiKind::Bool),
    ("MR_CACHE_DISABLE", OfiKind::Bool),
    ("RR_CTRL_MSG", OfiKind::Bool),
    ("USE_IPV6_TCP", OfiKind::Bool),
    ("USE_LOW_LATENCY_TC", OfiKind::Bool),
    ("EAGER_MAX_SIZE", OfiKind::Int),
    ("NIC_DUP_CONNS", OfiKind::Int),
    ("TUNER_NET_COMP_OVERHEAD", OfiKind::Int),
    ("TUNER_NET_LATENCY", OfiKind::Int),
    ("TUNER_NUM_CHANNELS", OfiKind::Int),
    ("CQ_READ_COUNT", OfiKind::Size),
    ("CQ_SIZE", OfiKind::Size),
    ("FORCE_NUM_RAILS", OfiKind::Size),
    ("GIN_CQ_PROCESS_MAX_ITER", OfiKind::Size),
    ("RDMA_MAX_POSTED_CONTROL_BUFFERS", OfiKind::Size),
    ("RDMA_MAX_POSTED_EAGER_BUFFERS", OfiKind::Size),
    ("RDMA_MIN_POSTED_CONTROL_BUFFERS", OfiKind::Size),
    ("RDMA_MIN_POSTED_EAGER_BUFFERS", OfiKind::Size),
    ("NET_LATENCY", OfiKind::Float),
];

/// How aws-ofi-nccl reads `name`, when it is one of its typed variables.
pub fn kind(name: &str) -> Option<OfiKind> {
    let short = name.strip_prefix("OFI_NCCL_")?;
    PARAMS.iter().find(|(n, _)| *n == short).map(|(_, k)| *k)
}

/// istringstream >> T on the whole value: leading blanks, then the number, then nothing.
fn whole_number(value: &str, signed: bool, fraction: bool) -> bool {
    let s = value.trim_start();
    let s = match s.strip_prefix('-') {
        Some(rest) if signed => rest,
        Some(_) => return false,
        None => s.strip_prefix('+').unwrap_or(s),
    };
    if fraction {
        return !s.is_empty() && !s.ends_with(char::is_whitespace) && s.parse::<f64>().is_ok();
    }
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Whether aws-ofi-nccl takes `value` for a variable of `kind`.
pub fn accepts(kind: OfiKind, value: &str) -> bool {
    match kind {
        OfiKind::OneOf(names) => names.iter().any(|n| n.eq_ignore_ascii_case(value)),
        OfiKind::Bool => {
            value.eq_ignore_ascii_case("true")
                || value.eq_ignore_ascii_case("false")
                || whole_number(value, true, false)
        }
        OfiKind::Int => whole_number(value, true, false),
        OfiKind::Size => whole_number(value, false, false),
        OfiKind::Float => whole_number(value, true, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_as_the_plugin_parses_them() {
        let protocol = kind("OFI_NCCL_PROTOCOL").unwrap();
        assert!(accepts(protocol, "rdma") && accepts(protocol, "SENDRECV"));
        assert!(!accepts(protocol, "RDMA_WRITE"));
        let b = kind("OFI_NCCL_DISABLE_GDR_REQUIRED_CHECK").unwrap();
        assert!(accepts(b, "TRUE") && accepts(b, "0") && accepts(b, " 1"));
        assert!(!accepts(b, "yes") && !accepts(b, "1 "));
        let size = kind("OFI_NCCL_CQ_SIZE").unwrap();
        assert!(accepts(size, "4096") && !accepts(size, "-1") && !accepts(size, "4k"));
        assert!(accepts(kind("OFI_NCCL_NET_LATENCY").unwrap(), "75.0"));
        assert_eq!(
            kind("OFI_NCCL_EXCLUDE_TCP_IF"),
            None,
            "a string takes anything"
        );
        assert_eq!(kind("NCCL_PROTO"), None);
    }
}

//! NCCL's parameter API (2.30 and later): what ncclParamDumpAll prints, read back
//! (NVIDIA/nccl src/include/param/param.h `ncclParam::dump`, v2.30.7-1; the 2.31.2 and
//! 2.32.3 wheels print the same):
//!
//! ```text
//! NCCL_SET_THREAD_NAME (bool) [Cached] Allow NCCL to give meaningful names ...
//!     Current value=FALSE set_by=Default default=FALSE
//!     Accepted value: Boolean: 1/T/TRUE or 0/F/FALSE
//! ```
//!
//! Only the parameters in NCCL's registry are there: 9 in 2.30.7 and 2.31.2 and 10 in
//! 2.32.3, against some 200 NCCL_PARAM variables that NCCL still reads on its own.

use crate::facts::NcclParam;

/// The parameters of `values` (each key with ncclParamGetParameter's answer) with the
/// type, source and flags `dump` gives them.
pub fn merge(values: Vec<(String, Option<String>)>, dump: &str) -> Vec<NcclParam> {
    let mut out: Vec<NcclParam> = values
        .into_iter()
        .map(|(key, value)| NcclParam {
            key,
            value,
            type_name: None,
            set_by: None,
            flags: Vec::new(),
        })
        .collect();
    let mut current: Option<usize> = None;
    for line in dump.lines() {
        if let Some(rest) = line.strip_prefix("    Current value=") {
            let Some(p) = current.and_then(|i| out.get_mut(i)) else {
                continue;
            };
            p.set_by = rest
                .rsplit_once(" set_by=")
                .map(|(_, r)| r.split(" default=").next().unwrap_or(r).to_string());
            continue;
        }
        if line.starts_with(' ') {
            continue;
        }
        // KEY (type) [flags] description
        let Some((key, rest)) = line.split_once(" (") else {
            continue;
        };
        current = out.iter().position(|p| p.key == key);
        let Some(p) = current.and_then(|i| out.get_mut(i)) else {
            continue;
        };
        let Some((type_name, rest)) = rest.split_once(") [") else {
            continue;
        };
        p.type_name = Some(type_name.to_string());
        if let Some((flags, _)) = rest.split_once(']') {
            p.flags = flags
                .split(", ")
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the 2.30.7 wheel printed here (no GPU), NCCL_PARAM_DUMP_ALL=1, two keys.
    const DUMP: &str = "=== ncclParam Registry Dump ===\nNCCL_PARAM_DUMP_ALL (bool) [Private] Print all parameters including private ones\n    Current value=TRUE set_by=EnvPlugin default=FALSE\n    Accepted value: Boolean: 1/T/TRUE or 0/F/FALSE\n\nNCCL_DEBUG_TIMESTAMP_FORMAT (const char*) [NoEnvPluginInit] Set the format used when printing debug log messages\n    Current value=[%F %T]  set_by=Default default=[%F %T] \n    Accepted value: String\n\nNCCL_DEBUG_SUBSYS (uint64_t) [] Filter\n    Current value=INIT,ENV set_by=Default default=INIT,ENV\n";

    #[test]
    fn the_dump_gives_type_source_and_flags() {
        let values = vec![
            ("NCCL_PARAM_DUMP_ALL".to_string(), Some("TRUE".to_string())),
            (
                "NCCL_DEBUG_TIMESTAMP_FORMAT".into(),
                Some("[%F %T] ".into()),
            ),
            ("NCCL_DEBUG_SUBSYS".into(), Some("INIT,ENV".into())),
            ("NCCL_NOT_DUMPED".into(), None),
        ];
        let p = merge(values, DUMP);
        assert_eq!(p[0].type_name.as_deref(), Some("bool"));
        assert_eq!(p[0].set_by.as_deref(), Some("EnvPlugin"));
        assert_eq!(p[0].flags, ["Private"]);
        assert_eq!(p[1].type_name.as_deref(), Some("const char*"));
        assert_eq!(p[1].set_by.as_deref(), Some("Default"));
        assert_eq!(p[2].flags, Vec::<String>::new());
        assert_eq!(p[3].type_name, None);
    }
}

//! CUDA_VISIBLE_DEVICES as the CUDA driver reads it: a comma list of device
//! indices, GPU UUIDs (a unique prefix is enough) or MIG device ids. An entry
//! that names no device ends the list: CUDA ignores it and everything after it.

/// What a CUDA_VISIBLE_DEVICES value selects among NVML's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// NVML indices of the selected GPUs, in CUDA ordinal order.
    pub gpus: Vec<u32>,
    /// The entry that ended the list and why, if one did.
    pub stopped_at: Option<(String, String)>,
    /// The value names MIG devices (this tool checks whole GPUs only).
    pub mig: bool,
}

/// Applies `value` to GPUs given as (NVML index, UUID).
pub fn select(value: &str, gpus: &[(u32, String)]) -> Selection {
    let mut out = Selection {
        gpus: Vec::new(),
        stopped_at: None,
        mig: false,
    };
    if value.trim().is_empty() {
        return out;
    }
    for raw in value.split(',') {
        let entry = raw.trim();
        let stop = |why: &str| Some((entry.to_string(), why.to_string()));
        let found = if entry.starts_with("MIG-") {
            out.mig = true;
            out.stopped_at = stop("a MIG device: only whole GPUs are checked");
            break;
        } else if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            match entry.parse::<usize>().ok().and_then(|i| gpus.get(i)) {
                Some((index, _)) => *index,
                None => {
                    out.stopped_at =
                        stop(&format!("no GPU has this index (there are {})", gpus.len()));
                    break;
                }
            }
        } else if entry.len() > 4 && entry.starts_with("GPU-") {
            let matches: Vec<u32> = gpus
                .iter()
                .filter(|(_, u)| u.starts_with(entry))
                .map(|(i, _)| *i)
                .collect();
            match matches.as_slice() {
                [one] => *one,
                [] => {
                    out.stopped_at = stop("no GPU has this UUID");
                    break;
                }
                _ => {
                    out.stopped_at = stop("this UUID prefix matches several GPUs");
                    break;
                }
            }
        } else {
            out.stopped_at = stop("neither an index, a GPU UUID nor a MIG id");
            break;
        };
        if out.gpus.contains(&found) {
            out.stopped_at = stop("names a GPU already listed");
            break;
        }
        out.gpus.push(found);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<(u32, String)> {
        (0..4).map(|i| (i, format!("GPU-{i}a1b2c3-0000"))).collect()
    }

    #[test]
    fn indices_uuids_and_where_cuda_stops() {
        assert_eq!(select("0,2", &gpus()).gpus, [0, 2]);
        assert_eq!(select(" 3 , 1", &gpus()).gpus, [3, 1]);
        let s = select("0,9,1", &gpus());
        assert_eq!(s.gpus, [0]);
        assert_eq!(s.stopped_at.unwrap().0, "9");
        assert_eq!(select("GPU-2a1b,0", &gpus()).gpus, [2, 0]);
        assert!(select("GPU-", &gpus()).stopped_at.is_some());
        let mig = select("MIG-GPU-0a1b2c3/1/0", &gpus());
        assert!(mig.mig && mig.gpus.is_empty());
        assert_eq!(select("", &gpus()).gpus, Vec::<u32>::new());
        assert_eq!(select("1,1", &gpus()).gpus, [1]);
        assert!(select("all", &gpus()).stopped_at.is_some());
        assert!(select("-1", &gpus()).stopped_at.is_some());
    }
}

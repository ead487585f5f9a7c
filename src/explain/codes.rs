//! The codes a message carries, decoded from their own source (`codes.tsv`, its
//! header names them): Linux errno of the call that failed, rdma-core's
//! `ibv_wc_status`, CUDA's `cudaError_t`/`CUresult`, libfabric's `fi_errno` and
//! the EFA provider's codes, NCCL's `ncclResult_t`. Each kind is found in the
//! text the way its printer writes it: NCCL prints strerror's text (`failed with
//! error Cannot allocate memory`), sometimes the number (`errno 12`, `failed
//! with 110 Connection timed out`); completion statuses as `with error 12`,
//! `status=12` or `status=transport retry counter exceeded(12)`; CUDA as
//! `Cuda failure 'out of memory'` (CUDACHECK) or `Cuda failure 2 'out of
//! memory'` (CUCHECK); aws-ofi-nccl as `RC: -12` or `RC: 113`.

const TABLE: &str = include_str!("codes.tsv");

/// One code of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    pub kind: &'static str,
    pub number: i64,
    /// `ENOMEM`, `IBV_WC_RETRY_EXC_ERR`, `cudaErrorMemoryAllocation/CUDA_ERROR_OUT_OF_MEMORY`.
    pub name: &'static str,
    /// The text its own library prints for it.
    pub text: &'static str,
    /// What it means for NCCL.
    pub meaning: &'static str,
}

impl Code {
    /// The names it goes by (`EOPNOTSUPP/ENOTSUP`: both).
    pub fn names(&self) -> Vec<&'static str> {
        self.name.split('/').collect()
    }

    /// `ENOMEM (12, Cannot allocate memory)`.
    pub fn show(&self) -> String {
        format!(
            "{} ({}, {})",
            self.names().first().copied().unwrap_or(self.name),
            self.number,
            self.text
        )
    }
}

fn codes() -> impl Iterator<Item = Code> {
    TABLE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let mut f = l.splitn(5, '\t');
            Some(Code {
                kind: f.next()?,
                number: f.next()?.parse().ok()?,
                name: f.next()?,
                text: f.next()?,
                meaning: f.next()?,
            })
        })
}

fn by_number(kind: &str, number: i64) -> Option<Code> {
    codes().find(|c| c.kind == kind && c.number == number)
}

/// The code of `kind` whose own text the message holds (the longest: `Connection
/// timed out` before `timed out`).
fn by_text(kind: &str, message: &str) -> Option<Code> {
    codes()
        .filter(|c| c.kind == kind && message.contains(c.text))
        .max_by_key(|c| c.text.len())
}

/// The number after `key` (`errno 12`, `RC: -12`, `status=12`), its sign kept.
fn number_after(message: &str, key: &str) -> Option<i64> {
    let rest = &message[message.find(key)? + key.len()..];
    let rest = rest.trim_start();
    let (sign, digits) = match rest.strip_prefix('-') {
        Some(r) => (-1, r),
        None => (1, rest),
    };
    let n: String = digits.chars().take_while(char::is_ascii_digit).collect();
    n.parse::<i64>().ok().map(|v| sign * v)
}

/// The number in `(N)` right after `text(`: `status=Work Request Flushed Error(5)`.
fn number_in_parens_after(message: &str, key: &str) -> Option<i64> {
    let rest = &message[message.find(key)? + key.len()..];
    let open = rest.find('(')?;
    let n: String = rest[open + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    n.parse().ok()
}

fn errno(message: &str) -> Option<Code> {
    // 2.19 on: `failed with error %s errno %d`; 2.24 on: `failed with %d %s`.
    ["errno ", "failed with ", "error: "]
        .iter()
        .filter_map(|k| number_after(message, k))
        .find_map(|n| by_number("errno", n.abs()))
        .or_else(|| by_text("errno", message))
}

fn wc(message: &str) -> Option<Code> {
    ["status=", "with error "]
        .iter()
        .find_map(|k| number_after(message, k).or_else(|| number_in_parens_after(message, k)))
        .and_then(|n| by_number("wc", n))
        .or_else(|| by_text("wc", message))
}

fn cuda(message: &str) -> Option<Code> {
    ["Cuda failure ", "CUDA error ", "CUDA failure "]
        .iter()
        .filter_map(|k| number_after(message, k))
        .find_map(|n| by_number("cuda", n))
        .or_else(|| by_text("cuda", message))
}

/// aws-ofi-nccl prints libfabric's return as `RC: -22` (a call) or the
/// completion's `err` as `RC: 113`; the EFA provider's own text follows
/// `Error:` when libfabric knows it.
fn fi(message: &str) -> Option<Code> {
    by_text("efa", message)
        .or_else(|| {
            ["RC: ", "RC:", "err: ", "prov_errno "]
                .iter()
                .filter_map(|k| number_after(message, k))
                .find_map(|n| by_number("fi", n.abs()).or_else(|| by_number("efa", n.abs())))
        })
        // `... failed: Invalid argument`: fi_strerror's text (strerror's below 256).
        .or_else(|| by_text("fi", message))
}

fn nccl(message: &str) -> Option<Code> {
    number_after(message, "-> ")
        .and_then(|n| by_number("nccl", n))
        .or_else(|| by_text("nccl", message))
}

/// The code of `kind` the message carries.
pub fn decode(kind: &str, message: &str) -> Option<Code> {
    match kind {
        "errno" => errno(message),
        "wc" => wc(message),
        "cuda" => cuda(message),
        "fi" => fi(message),
        "nccl" => nccl(message),
        _ => None,
    }
}

/// A number libfabric does not define, said as such: aws-ofi-nccl's RC of an
/// old provider (`RC: 21`) is the provider's own code, not an errno.
pub fn undefined_fi(message: &str) -> Option<i64> {
    let n = number_after(message, "RC: ")?;
    (by_number("fi", n.abs()).is_none() && by_number("efa", n.abs()).is_none()).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_in_every_printed_form() {
        for (kind, message, name) in [
            // src/misc/ibvwrap.cc at v2.12.12-1, v2.19.3-1 and v2.30.7-1.
            (
                "errno",
                "Call to ibv_reg_mr failed with error Cannot allocate memory",
                "ENOMEM",
            ),
            (
                "errno",
                "Call to ibv_create_cq failed with error Invalid argument errno 22",
                "EINVAL",
            ),
            (
                "errno",
                "Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr state INIT, next state RTR",
                "ETIMEDOUT",
            ),
            (
                "errno",
                "Connect to 10.38.10.112<21724> failed : Connection refused",
                "ECONNREFUSED",
            ),
            (
                "errno",
                "socketStartConnect: Connect to fe80::1%ib1<17943> failed : Software caused connection abort",
                "ECONNABORTED",
            ),
            (
                "errno",
                "Error while creating shared memory segment /dev/shm/x (size 9), error: No space left on device (28)",
                "ENOSPC",
            ),
            // rdma-core ibv_wc_status, three NCCL formats.
            (
                "wc",
                "NET/IB : Got completion from peer x with error 12, opcode 0",
                "IBV_WC_RETRY_EXC_ERR",
            ),
            (
                "wc",
                "NET/IB : Got completion from peer x with status=4 opcode=0",
                "IBV_WC_LOC_PROT_ERR",
            ),
            (
                "wc",
                "NET/IB: Got completion from peer x with status=Work Request Flushed Error(5) opcode=RDMA_WRITE(1)",
                "IBV_WC_WR_FLUSH_ERR",
            ),
            // CUDACHECK (text) and CUCHECK (CUresult number).
            (
                "cuda",
                "Cuda failure 'out of memory'",
                "cudaErrorMemoryAllocation/CUDA_ERROR_OUT_OF_MEMORY",
            ),
            (
                "cuda",
                "Cuda failure 1 'invalid argument'",
                "cudaErrorInvalidValue/CUDA_ERROR_INVALID_VALUE",
            ),
            (
                "cuda",
                "Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401 'the operation cannot be performed in the present state'.",
                "cudaErrorIllegalState/CUDA_ERROR_ILLEGAL_STATE",
            ),
            // aws-ofi-nccl: a call's negative return, a completion's err, EFA's text.
            (
                "fi",
                "NET/OFI Couldn't open CQ. RC: -22, ERROR: Invalid argument",
                "FI_EINVAL",
            ),
            (
                "fi",
                "NET/OFI Request 0x7f completed with error. RC: 113. Error: 15 (Unreachable remote - never received a response)",
                "EFA_IO_COMP_STATUS_LOCAL_ERROR_UNREACH_REMOTE",
            ),
            (
                "fi",
                "NET/OFI Request 0x7f completed with error. RC: 113.",
                "FI_EHOSTUNREACH",
            ),
            ("nccl", "transport/net.cc:1302 -> 6", "ncclRemoteError"),
        ] {
            assert_eq!(
                decode(kind, message).map(|c| c.name),
                Some(name),
                "{message}"
            );
        }
        assert!(decode("errno", "nothing to see").is_none());
        // libfabric does not define 20 (ENOTDIR is commented out in fi_errno.h).
        assert_eq!(
            undefined_fi("Request 0x1 completed with error. RC: 20. Error: unknown error"),
            Some(20)
        );
        assert_eq!(undefined_fi("RC: -22"), None);
    }

    #[test]
    fn the_table_is_whole_and_ordered_as_its_sources() {
        let all: Vec<Code> = codes().collect();
        // rdma-core's ibv_wc_status 1..21, in order.
        let wc: Vec<i64> = all
            .iter()
            .filter(|c| c.kind == "wc")
            .map(|c| c.number)
            .collect();
        assert_eq!(wc, (1..=21).collect::<Vec<_>>());
        for kind in ["errno", "cuda", "fi", "efa", "nccl"] {
            assert!(all.iter().filter(|c| c.kind == kind).count() >= 8, "{kind}");
        }
        assert_eq!(
            decode("errno", "errno 12").unwrap().show(),
            "ENOMEM (12, Cannot allocate memory)"
        );
    }
}

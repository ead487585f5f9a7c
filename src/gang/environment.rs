//! The worker's environment: the trainer's own (the user's variables and the
//! tuned settings the user did not set), less what must differ per pod, plus
//! what the gang needs from NCCL (its log, the root's address on rank 0, a
//! connect retry that fits the timeout).

use std::ffi::OsString;
use std::time::Duration;

/// NCCL_SOCKET_RETRY_CNT so that NCCL's connect retries (sleep n x 100 ms before
/// attempt n+1, src/misc/socket.cc since v2.24) last about as long as `timeout`.
fn retry_count(timeout: Duration) -> u64 {
    let budget_ms = timeout.as_millis() as f64;
    // 100 x c(c+1)/2 >= budget
    (((1.0 + 8.0 * budget_ms / 100.0).sqrt() - 1.0) / 2.0)
        .ceil()
        .max(1.0) as u64
}

/// The worker's environment. Only rank 0 gets `comm_id` (NCCL_COMM_ID): a
/// non-root rank with it would need a local interface in the root's subnet
/// (src/bootstrap.cc `bootstrapNetInit`), which pod networks rarely give.
pub fn worker_env(
    trainer: &[(OsString, OsString)],
    comm_id: Option<&str>,
    log: &str,
    timeout: Duration,
    ras_diagnostics: bool,
) -> Vec<(OsString, OsString)> {
    let drop_names = [
        "NCCL_COMM_ID",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
    ];
    let mut env: Vec<(OsString, OsString)> = trainer
        .iter()
        .filter(|(k, _)| !drop_names.contains(&k.to_string_lossy().as_ref()))
        .cloned()
        .collect();
    let has = |env: &[(OsString, OsString)], name: &str| env.iter().any(|(k, _)| k == name);
    if let Some(id) = comm_id {
        env.push(("NCCL_COMM_ID".into(), id.into()));
    }
    env.push(("NCCL_DEBUG".into(), "INFO".into()));
    env.push(("NCCL_DEBUG_SUBSYS".into(), "INIT,ENV".into()));
    env.push(("NCCL_DEBUG_FILE".into(), log.into()));
    // NCCL 2.31+: its RAS diagnostics at init, informational only to NCCL (they never
    // fail its init); the gang judges the lines (nccl::ras_diagnostics). The user's own
    // setting, 0 included, wins.
    if ras_diagnostics && !has(&env, "NCCL_RUN_RAS_DIAGNOSTICS") {
        env.push(("NCCL_RUN_RAS_DIAGNOSTICS".into(), "1".into()));
    }
    if !has(&env, "NCCL_SOCKET_RETRY_SLEEP_MSEC") && !has(&env, "NCCL_SOCKET_RETRY_CNT") {
        env.push(("NCCL_SOCKET_RETRY_SLEEP_MSEC".into(), "100".into()));
        env.push((
            "NCCL_SOCKET_RETRY_CNT".into(),
            retry_count(timeout).to_string().into(),
        ));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_count_covers_the_timeout() {
        for secs in [1u64, 5, 30, 300] {
            let c = retry_count(Duration::from_secs(secs));
            let window_ms = 100 * c * (c + 1) / 2;
            assert!(window_ms >= secs * 1000, "{secs}: {c}");
            assert!(
                c == 1 || 100 * (c - 1) * c / 2 < secs * 1000,
                "{secs}: {c} is more than needed"
            );
        }
    }

    #[test]
    fn worker_env_gives_comm_id_to_rank_0_only_and_keeps_the_trainers_tuning() {
        let trainer: Vec<(OsString, OsString)> = [
            ("NCCL_ALGO", "Ring"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_COMM_ID", "10.9.9.9:1"),
            ("PATH", "/bin"),
        ]
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect();
        let log = "/proc/self/fd/7";
        let get = |env: &[(OsString, OsString)], k: &str| {
            env.iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        let other = worker_env(&trainer, None, log, Duration::from_secs(30), false);
        assert!(get(&other, "NCCL_RUN_RAS_DIAGNOSTICS").is_empty());
        let diag = worker_env(&trainer, None, log, Duration::from_secs(30), true);
        assert_eq!(get(&diag, "NCCL_RUN_RAS_DIAGNOSTICS"), ["1"]);
        assert_eq!(get(&other, "NCCL_ALGO"), ["Ring"]);
        assert_eq!(get(&other, "NCCL_SOCKET_IFNAME"), ["eth0"]);
        // A non-root rank never gets NCCL_COMM_ID, not even the user's.
        assert!(get(&other, "NCCL_COMM_ID").is_empty());
        assert_eq!(get(&other, "NCCL_DEBUG_FILE"), ["/proc/self/fd/7"]);
        let root = worker_env(
            &trainer,
            Some("10.0.0.1:29501"),
            log,
            Duration::from_secs(30),
            false,
        );
        assert_eq!(get(&root, "NCCL_COMM_ID"), ["10.0.0.1:29501"]);
        assert_eq!(
            get(&root, "NCCL_SOCKET_RETRY_CNT"),
            [retry_count(Duration::from_secs(30)).to_string()]
        );
    }
}

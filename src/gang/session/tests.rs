//! The session on loopback: threads as pods, real sockets.

use super::*;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread;

fn port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn meeting(
    root: SocketAddr,
    job: u64,
    rank: u64,
    nodes: u64,
    record: &[u8],
    secs: u64,
) -> Meeting<'_> {
    Meeting {
        root,
        job,
        rank,
        nodes,
        record,
        deadline: Instant::now() + Duration::from_secs(secs),
        table_within: Duration::from_secs(secs + 5),
    }
}

/// Pod `rank` of `nodes` meeting at `at` on a thread; its session and table.
fn pod(
    at: SocketAddr,
    rank: u64,
    nodes: u64,
    job: u64,
) -> thread::JoinHandle<Result<(Session, Table), Failure>> {
    thread::spawn(move || {
        let record = format!("rec{rank}").into_bytes();
        Session::meet(&meeting(at, job, rank, nodes, &record, 10))
    })
}

#[test]
fn three_ranks_meet_and_each_gets_every_record_and_nccls_port() {
    let at = port();
    let joins: Vec<_> = (1..3).map(|r| pod(at, r, 3, 42)).collect();
    let (_root, table) = Session::meet(&meeting(at, 42, 0, 3, b"rec0", 10)).unwrap();
    let want: Vec<Option<Vec<u8>>> = (0..3)
        .map(|r| Some(format!("rec{r}").into_bytes()))
        .collect();
    assert_eq!(table.records, want);
    assert_ne!(table.nccl_port, 0);
    assert_ne!(table.nccl_port, at.port());
    for j in joins {
        let (_, t) = j.join().unwrap().unwrap();
        assert_eq!(t.records, want);
        assert_eq!(t.nccl_port, table.nccl_port);
    }
}

#[test]
fn a_stale_pod_a_duplicate_rank_and_garbage_are_refused_and_reported() {
    let at = port();
    let stale = pod(at, 1, 3, 41);
    let garbage = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        let mut s = TcpStream::connect(at).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n........");
        thread::sleep(Duration::from_millis(500));
    });
    let first = pod(at, 1, 3, 42);
    let root = thread::spawn(move || Session::meet(&meeting(at, 42, 0, 3, b"zero", 10)));
    // The duplicate comes once rank 1's record is in.
    thread::sleep(Duration::from_millis(700));
    let dup = pod(at, 1, 3, 42).join().unwrap();
    let started = Instant::now();
    let (_, table) = root.join().unwrap().unwrap();
    // A duplicate stands for the missing rank: no wait for rank 2 until the deadline.
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(&dup, Err(Failure::Refused { why, blame: Blame::Job }) if why.contains("rank 1 is already taken")),
        "{:?}",
        dup.err()
    );
    assert!(matches!(
        stale.join().unwrap(),
        Err(Failure::Refused { ref why, blame: Blame::Job }) if why.contains("earlier attempt")
    ));
    garbage.join().unwrap();
    assert_eq!(table.duplicates.len(), 1);
    assert_eq!(table.missing(), [2]);
    assert_eq!(table.refused_count, 2, "{table:?}");
    assert!(
        table.refused.iter().any(|r| r.contains("not a gang peer")),
        "{table:?}"
    );
    assert_eq!(
        first.join().unwrap().unwrap().1.duplicates,
        table.duplicates
    );
}

/// Issue 37: 256 idle connections on the gang port made an honest pod fail at once
/// ("node fault: retry elsewhere"). Expected from the admission rule before the run:
/// the idle ones are dropped oldest first, the pods' hellos are read, every pod
/// gets the table, and the drops are counted.
#[test]
fn regression_256_idle_connections_do_not_fail_an_honest_pod() {
    let at = port();
    let root = thread::spawn(move || Session::meet(&meeting(at, 42, 0, 3, b"zero", 10)));
    let mut idle = Vec::new();
    while idle.len() < 256 {
        match TcpStream::connect(at) {
            Ok(s) => idle.push(s),
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
    let pods: Vec<_> = (1..3).map(|r| pod(at, r, 3, 42)).collect();
    for p in pods {
        let got = p.join().unwrap();
        assert!(got.is_ok(), "{:?}", got.err());
    }
    let (_, table) = root.join().unwrap().unwrap();
    assert!(table.missing().is_empty());
    assert!(
        table.refused_count >= 256 - admission::PENDING_CAP as u64,
        "{}",
        table.refused_count
    );
    drop(idle);
}

/// A connection closed before rank 0 said a word (dropped unread, or rank 0
/// restarting) is tried again within the wait.
#[test]
fn a_join_closed_before_any_answer_is_tried_again() {
    let at = port();
    let first = TcpListener::bind(at).unwrap();
    let member = pod(at, 1, 2, 42);
    let (s, _) = first.accept().unwrap();
    drop(s);
    drop(first);
    let (_root, table) = Session::meet(&meeting(at, 42, 0, 2, b"zero", 10)).unwrap();
    assert!(table.missing().is_empty());
    assert!(member.join().unwrap().is_ok());
}

#[test]
fn a_silent_connection_is_dropped_and_a_missing_rank_ends_at_the_deadline() {
    let at = port();
    let silent = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        let s = TcpStream::connect(at).unwrap();
        thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let started = Instant::now();
    let (_, table) = Session::meet(&meeting(at, 42, 0, 2, b"zero", 2)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(table.missing(), [1]);
    silent.join().unwrap();
    // Nobody listening: a bounded failure naming the address.
    let gone = Session::meet(&Meeting {
        deadline: Instant::now() + Duration::from_millis(500),
        ..meeting(at, 42, 1, 2, b"x", 1)
    });
    assert!(
        matches!(&gone, Err(Failure::Unreachable(e)) if e.contains(&at.to_string())),
        "{:?}",
        gone.err()
    );
}

/// Follows a 3-pod gang where each pod ends its run after `runs[rank]` (None: the
/// pod's process goes away then, its session dropped); every live pod's outcomes.
fn follow_three(runs: [Option<f64>; 3]) -> Vec<Option<Outcomes>> {
    let at = port();
    let members: Vec<_> = (1..3).map(|r| pod(at, r, 3, 42)).collect();
    let (root, _) = Session::meet(&meeting(at, 42, 0, 3, b"rec0", 10)).unwrap();
    let mut sessions = vec![root];
    for m in members {
        sessions.push(m.join().unwrap().unwrap().0);
    }
    let handles: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(rank, mut session)| {
            thread::spawn(move || {
                let live = Live::default();
                live.stage("pairwise round 1");
                let deadline = Instant::now() + Duration::from_secs(15);
                let Some(secs) = runs[rank] else {
                    // The pod goes away: nothing more from it, its sockets closed.
                    thread::sleep(Duration::from_millis(500));
                    drop(session);
                    return None;
                };
                thread::scope(|s| {
                    let follow =
                        s.spawn(|| session.follow(&live, Duration::from_secs(3), deadline));
                    let t0 = Instant::now();
                    while t0.elapsed() < Duration::from_secs_f64(secs)
                        && !live.stop_flag().load(Ordering::SeqCst)
                    {
                        thread::sleep(Duration::from_millis(20));
                    }
                    let stopped = live.stop_flag().load(Ordering::SeqCst);
                    let o = Outcome {
                        joined: true,
                        done: !stopped,
                        error: stopped.then(|| "stopped".to_string()),
                        ..Outcome::default()
                    };
                    live.end(o.clone(), o.early());
                    Some(follow.join().unwrap())
                })
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn every_pod_gets_every_outcome_when_all_finish() {
    let t0 = Instant::now();
    let all = follow_three([Some(0.3), Some(0.5), Some(0.2)]);
    assert!(t0.elapsed() < Duration::from_secs(5));
    for o in all.iter().flatten() {
        assert!(o.gone.is_empty(), "{o:?}");
        assert!(
            o.outcomes
                .iter()
                .skip(1)
                .all(|x| x.as_ref().is_some_and(|x| x.done)),
            "{o:?}"
        );
    }
}

/// Issue 37: a pod killed mid-measurement was not named and its peers waited out
/// the timeout. Its session closes: rank 0 names it gone at once with its last
/// stage, every surviving pod's run is stopped and every survivor gets that verdict.
#[test]
fn regression_a_pod_that_goes_away_is_named_gone_and_stops_the_others() {
    let t0 = Instant::now();
    // Pod 2 goes away at 0.5 s (its session dropped); the others would run 20 s.
    let at = port();
    let members: Vec<_> = (1..3).map(|r| pod(at, r, 3, 42)).collect();
    let (mut root, _) = Session::meet(&meeting(at, 42, 0, 3, b"rec0", 10)).unwrap();
    let mut m1 = members.into_iter().map(|m| m.join().unwrap().unwrap().0);
    let (mut one, two) = (m1.next().unwrap(), m1.next().unwrap());
    let (l0, l1) = (Live::default(), Live::default());
    l1.stage("pairwise round 2 with node 2");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (a, b) = thread::scope(|s| {
        let f0 = s.spawn(|| root.follow(&l0, Duration::from_secs(3), deadline));
        let f1 = s.spawn(|| one.follow(&l1, Duration::from_secs(3), deadline));
        thread::sleep(Duration::from_millis(500));
        drop(two);
        for live in [&l0, &l1] {
            while !live.stop_flag().load(Ordering::SeqCst) {
                assert!(t0.elapsed() < Duration::from_secs(5), "not stopped");
                thread::sleep(Duration::from_millis(20));
            }
            live.end(
                Outcome {
                    joined: true,
                    error: Some("stopped".into()),
                    ..Outcome::default()
                },
                Some("stopped".into()),
            );
        }
        (f0.join().unwrap(), f1.join().unwrap())
    });
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    for o in [&a, &b] {
        assert_eq!(o.gone.len(), 1, "{o:?}");
        assert_eq!(o.gone[0].node, 2);
        assert_eq!(o.gone[0].how, How::Closed);
        assert!(o.gone[0].seconds.is_some_and(|s| s < 3.0), "{o:?}");
    }
    assert_eq!(
        a.gone, b.gone,
        "every survivor names the same pod in the same words"
    );
}

#[test]
fn rank_0_going_away_is_named_by_every_other_pod() {
    let all = follow_three([None, Some(20.0), Some(20.0)]);
    for o in all.iter().skip(1).flatten() {
        assert_eq!(o.gone.len(), 1, "{o:?}");
        assert_eq!(o.gone[0].node, 0);
        assert_eq!(o.gone[0].how, How::Closed);
    }
}

/// A pod whose run ended early (its NCCL process died) stops the others at once,
/// and its outcome reaches every pod.
#[test]
fn a_pod_whose_run_ends_early_stops_the_others() {
    let t0 = Instant::now();
    let at = port();
    let members: Vec<_> = (1..3).map(|r| pod(at, r, 3, 42)).collect();
    let (root, _) = Session::meet(&meeting(at, 42, 0, 3, b"rec0", 10)).unwrap();
    let mut sessions = vec![root];
    for m in members {
        sessions.push(m.join().unwrap().unwrap().0);
    }
    let lives: Vec<Live> = (0..3).map(|_| Live::default()).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let outs = thread::scope(|s| {
        let follows: Vec<_> = sessions
            .iter_mut()
            .zip(&lives)
            .map(|(session, live)| {
                s.spawn(move || session.follow(live, Duration::from_secs(3), deadline))
            })
            .collect();
        thread::sleep(Duration::from_millis(300));
        let died = Outcome {
            joined: true,
            died: Some("the NCCL process ended (exit status: 137) without a result".into()),
            ..Outcome::default()
        };
        lives[1].end(died.clone(), died.early());
        for live in [&lives[0], &lives[2]] {
            while !live.stop_flag().load(Ordering::SeqCst) {
                assert!(t0.elapsed() < Duration::from_secs(5), "not stopped");
                thread::sleep(Duration::from_millis(20));
            }
            live.end(Outcome::default(), Some("stopped".into()));
        }
        follows
            .into_iter()
            .map(|f| f.join().unwrap())
            .collect::<Vec<_>>()
    });
    for o in &outs {
        assert!(o.gone.is_empty(), "{o:?}");
        assert!(
            o.outcomes[1].as_ref().is_some_and(|x| x.died.is_some()),
            "{o:?}"
        );
    }
}

/// Issue 37: a peer claiming a rank first made the honest pod exit 3 where rank 0
/// exited 1. Rank 0 keeps the gang port open while the gang runs: the honest pod
/// that comes later is refused as a duplicate (the job's), and every pod's outcomes
/// carry the two claims, so every pod ends as the job's.
#[test]
fn regression_a_rank_claimed_first_is_a_duplicate_for_every_pod() {
    let at = port();
    let impostor = pod(at, 1, 2, 42);
    let (mut root, _) = Session::meet(&meeting(at, 42, 0, 2, b"rec0", 10)).unwrap();
    let mut impostor = impostor.join().unwrap().unwrap().0;
    let (l0, l1) = (Live::default(), Live::default());
    let deadline = Instant::now() + Duration::from_secs(20);
    let (a, b, honest) = thread::scope(|s| {
        let f0 = s.spawn(|| root.follow(&l0, Duration::from_secs(3), deadline));
        let f1 = s.spawn(|| impostor.follow(&l1, Duration::from_secs(3), deadline));
        let honest = pod(at, 1, 2, 42).join().unwrap();
        let done = Outcome {
            joined: true,
            done: true,
            ..Outcome::default()
        };
        l0.end(done.clone(), None);
        l1.end(done, None);
        (f0.join().unwrap(), f1.join().unwrap(), honest)
    });
    assert!(
        matches!(&honest, Err(Failure::Refused { why, blame: Blame::Job }) if why.contains("rank 1 is already taken")),
        "{:?}",
        honest.err()
    );
    for o in [&a, &b] {
        assert_eq!(o.duplicates.len(), 1, "{o:?}");
        assert_eq!(o.duplicates[0].rank, 1);
    }
}

/// Open descriptors and peak resident memory of this process.
fn fds_and_peak_kib() -> (usize, u64) {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    (fds, peak)
}

/// Not a timed test (scripts/gang-bench.sh --rendezvous runs it): a rendezvous of
/// NCCL_PREFLIGHT_GANG_BENCH_NODES pods (default 256) on loopback, each sending a
/// record of the largest size a record may have, no NCCL: rank 0 in a process of
/// its own (`bench_rank_0_alone`, started from this test binary), the other pods as
/// threads here, all connecting before rank 0 listens. Prints rank 0's line: from
/// listening to the table sent to every pod, its peak descriptors and memory.
#[test]
#[ignore = "a measurement, run by scripts/gang-bench.sh --rendezvous"]
fn bench_a_rendezvous_of_many_pods() {
    let n: u64 = std::env::var("NCCL_PREFLIGHT_GANG_BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let at = port();
    let record = vec![b'r'; crate::gang::fingerprint::FINGERPRINT_BYTES];
    let members: Vec<_> = (1..n)
        .map(|r| {
            let record = record.clone();
            thread::spawn(move || {
                Session::meet(&meeting(at, 42, r, n, &record, 60)).map(|(_, t)| t.records.len())
            })
        })
        .collect();
    // Every pod is trying to connect before rank 0 listens.
    thread::sleep(Duration::from_secs(1));
    let root = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "gang::session::tests::bench_rank_0_alone",
            "--ignored",
            "--exact",
            "--nocapture",
        ])
        .env("NCCL_PREFLIGHT_GANG_BENCH_AT", at.to_string())
        .env("NCCL_PREFLIGHT_GANG_BENCH_NODES", n.to_string())
        .output()
        .unwrap();
    for m in members {
        assert_eq!(m.join().unwrap().unwrap(), n as usize);
    }
    let text = String::from_utf8_lossy(&root.stdout);
    let line = text.lines().find(|l| l.starts_with("gang-rendezvous "));
    println!("{}", line.unwrap_or("rank 0 printed no line"));
    assert!(root.status.success(), "{text}");
}

/// Rank 0 of `bench_a_rendezvous_of_many_pods`, in its own process; does nothing
/// when run by itself.
#[test]
#[ignore = "rank 0 of bench_a_rendezvous_of_many_pods"]
fn bench_rank_0_alone() {
    let (Ok(at), Ok(n)) = (
        std::env::var("NCCL_PREFLIGHT_GANG_BENCH_AT"),
        std::env::var("NCCL_PREFLIGHT_GANG_BENCH_NODES"),
    ) else {
        return;
    };
    let (at, n): (SocketAddr, u64) = (at.parse().unwrap(), n.parse().unwrap());
    let record = vec![b'r'; crate::gang::fingerprint::FINGERPRINT_BYTES];
    let (fds0, peak0) = fds_and_peak_kib();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = std::sync::Arc::clone(&stop);
        thread::spawn(move || {
            let mut most = 0;
            while !stop.load(Ordering::SeqCst) {
                most = most.max(fds_and_peak_kib().0);
                thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };
    let started = Instant::now();
    let (root, table) = Session::meet(&meeting(at, 42, 0, n, &record, 60)).unwrap();
    let wall = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let most = sampler.join().unwrap();
    let (_, peak) = fds_and_peak_kib();
    assert!(table.missing().is_empty(), "{:?}", table.missing());
    drop(root);
    println!(
        "gang-rendezvous pods {n} record_bytes {} rank0_wall_s {:.3} rank0_fds_peak {most} (at start {fds0}) rank0_rss_peak_mib {:.1} (at start {:.1}) refused {}",
        record.len(),
        wall.as_secs_f64(),
        peak as f64 / 1024.0,
        peak0 as f64 / 1024.0,
        table.refused_count
    );
}

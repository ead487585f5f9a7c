//! N "nodes" on one machine for the multi-node (gang) tests: each node is a
//! network namespace with one veth (`eth0`, 10.77.0.(i+1)/24) whose peer is a
//! port of a bridge in a separate "switch" namespace, so the nodes reach each
//! other through real sockets, real addresses and real timeouts, and nothing
//! is added to the host's own namespace. The bridge holds 10.77.0.254, each
//! node's default route, as a pod's default route leaves through its eth0. A program runs on node i under
//! `ip netns exec NS unshare --uts`, with the node's host name (`node<i>`) set
//! in its own UTS namespace; every node resolves the others' names through the
//! `/etc/netns/NS/hosts` file that `ip netns exec` bind-mounts over /etc/hosts
//! (iproute2 ip/ipnetns.c, bind_etc), as a headless Service's DNS would; its
//! resolv.conf names a DNS server on the node's loopback, where nobody
//! listens, so other names fail at once.
//! `tc` rate-limits one node's link in both directions (tbf on both ends of
//! its veth), and a node's NIC can be given the speed it carries (its sysfs
//! `speed` file, bind-mounted over in the node's mount namespace), so a job
//! judged against its NICs' rates sees a network that keeps its word.
//!
//! Names are unique per test process and per harness (`npfnet-PID-K-...`), so
//! tests run in parallel; `Drop` deletes the namespaces (which deletes their
//! veths and bridge) and the hosts files, also when the test failed. A run
//! killed before its `Drop` leaves namespaces behind: the next harness removes
//! those whose process no longer exists.
//!
//! [`run_together`] starts one process per node, bounds the whole run by a
//! deadline (a process still running then is killed with its process group and
//! the test fails saying so) and returns what each one printed and how it ended.

use super::support::*;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Prefix of every namespace this harness creates.
const PREFIX: &str = "npfnet";

/// The nodes' subnet: node i is 10.77.0.(i+1); 10.77.0.200 and above belong to
/// nobody (an unreachable host on the nodes' own link).
pub const SUBNET: [u8; 3] = [10, 77, 0];

/// The bridge's own address, every node's default route (a pod has one; the
/// interface that holds it is the one NCCL and the gang pick).
const GATEWAY: &str = "10.77.0.254";

/// N node namespaces joined by a bridge; see the module doc.
pub struct Net {
    switch: String,
    nodes: Vec<String>,
    /// (name, address) lines of every node's /etc/hosts.
    hosts: Vec<(String, Ipv4Addr)>,
}

impl Net {
    /// `n` nodes named `node0`, `node1`, ... for test `test`, or None (with a
    /// message) when not root or without ip, tc or unshare, unless strict
    /// (CI), where that fails the test; see [`require_root`].
    pub fn new(test: &str, n: usize) -> Option<Net> {
        let names: Vec<String> = (0..n).map(|i| format!("node{i}")).collect();
        Net::with_hosts(test, &names)
    }

    /// One node per name in `hosts`, each named so (as pods are by their pod name).
    pub fn with_hosts(test: &str, hosts: &[String]) -> Option<Net> {
        if !require_root(test) || !require_tools(test, &["ip", "tc", "unshare"]) {
            return None;
        }
        let n = hosts.len();
        assert!(
            (1..200).contains(&n),
            "{test}: {n} nodes do not fit the subnet"
        );
        remove_stale();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let base = format!(
            "{PREFIX}-{}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            test.chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .take(24)
                .collect::<String>()
        );
        let net = Net {
            switch: format!("{base}-sw"),
            nodes: (0..n).map(|i| format!("{base}-n{i}")).collect(),
            hosts: hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (h.clone(), node_addr(i)))
                .collect(),
        };
        // From here on Drop cleans up whatever was made, also if a step fails.
        let sw = &net.switch;
        sh(&format!(
            "set -e; ip netns add {sw}; ip -n {sw} link set lo up; \
             ip -n {sw} link add br0 type bridge; ip -n {sw} link set br0 up; \
             ip -n {sw} addr add {GATEWAY}/24 dev br0"
        ));
        for (i, ns) in net.nodes.iter().enumerate() {
            let addr = node_addr(i);
            sh(&format!(
                "set -e; ip netns add {ns}; ip -n {ns} link set lo up; \
                 ip link add eth0 netns {ns} type veth peer name p{i} netns {sw}; \
                 ip -n {sw} link set p{i} master br0; ip -n {sw} link set p{i} up; \
                 ip -n {ns} addr add {addr}/24 dev eth0; ip -n {ns} link set eth0 up; \
                 ip -n {ns} route add default via {GATEWAY}"
            ));
        }
        net.write_hosts();
        // The bridge runs without STP (the default): a port forwards as soon as
        // it is up, so the nodes reach each other at once.
        Some(net)
    }

    /// Node i's network namespace.
    pub fn ns(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// Node i's address, as text.
    pub fn addr(&self, i: usize) -> String {
        node_addr(i).to_string()
    }

    /// Node i's host name, which every node resolves.
    pub fn host(&self, i: usize) -> String {
        self.hosts[i].0.clone()
    }

    /// Makes `name` resolve to `addr` on every node (a pod or Service name);
    /// a name the nodes already resolve moves to `addr`.
    pub fn add_host(&mut self, name: &str, addr: &str) {
        let addr: Ipv4Addr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
        match self.hosts.iter_mut().find(|(h, _)| h == name) {
            Some(entry) => entry.1 = addr,
            None => self.hosts.push((name.to_string(), addr)),
        }
        self.write_hosts();
    }

    /// Limits node i's link to `rate` (tc syntax, e.g. "100mbit") both ways:
    /// out of the node (its eth0) and into it (the bridge port).
    pub fn limit(&self, i: usize, rate: &str) {
        let tbf = format!("tbf rate {rate} burst 32kbit latency 50ms");
        sh(&format!(
            "set -e; ip netns exec {} tc qdisc add dev eth0 root {tbf}; \
             ip netns exec {} tc qdisc add dev p{i} root {tbf}",
            self.nodes[i], self.switch
        ));
    }

    /// Drops every TCP connection into node i but those to `port` (iptables in its
    /// namespace): a NetworkPolicy that opens only the gang port, so NCCL's own
    /// listeners (ephemeral ports) cannot be reached.
    pub fn only_port_open(&self, i: usize, port: u16) {
        sh(&format!(
            "set -e; ip netns exec {} iptables -A INPUT -p tcp --syn ! --dport {port} -j DROP",
            self.nodes[i]
        ));
    }

    /// Every node's link carries `mbit` Mb/s (tc, both ends). Its eth0 stays
    /// what it is, one end of a veth pair as a pod's is on most CNIs, whose
    /// sysfs speed (10000) rtnetlink's link kind marks as no figure: the gang
    /// judges such pods without a network figure, as it does real ones.
    pub fn all_links(&self, mbit: u32) {
        for i in 0..self.nodes.len() {
            self.limit(i, &format!("{mbit}mbit"));
        }
    }

    /// Removes `name` from every node's hosts file: a pod that never started
    /// has no DNS record behind its headless Service.
    pub fn remove_host(&mut self, name: &str) {
        self.hosts.retain(|(h, _)| h != name);
        self.write_hosts();
    }

    /// `program args...` on node i: in its network namespace and a UTS
    /// namespace of its own named after it (`ip netns exec` runs it in a mount
    /// namespace of its own, with the node's sysfs), and an empty environment
    /// but PATH.
    pub fn command(&self, i: usize, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.nodes[i],
            "unshare",
            "--uts",
            "sh",
            "-c",
        ])
        // unshare and sh exec: the process the caller waits on is the program.
        .arg("echo \"$0\" >/proc/sys/kernel/hostname && exec \"$@\"")
        .arg(self.host(i))
        .arg(program)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        cmd
    }

    fn write_hosts(&self) {
        let mut text = String::from("127.0.0.1 localhost\n");
        for (name, addr) in &self.hosts {
            text.push_str(&format!("{addr} {name}\n"));
        }
        for ns in &self.nodes {
            let dir = etc_dir(ns);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("hosts"), &text).unwrap();
            // No DNS server: a name missing from the hosts file (or an AAAA
            // lookup of one in it) is refused at once by the node's own
            // loopback instead of waiting for the host's resolver through a
            // default route that leads nowhere.
            std::fs::write(
                dir.join("resolv.conf"),
                "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
            )
            .unwrap();
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain([&self.switch]) {
            remove_namespace(ns);
        }
    }
}

fn node_addr(i: usize) -> Ipv4Addr {
    let [a, b, c] = SUBNET;
    Ipv4Addr::new(a, b, c, (i + 1) as u8)
}

fn etc_dir(ns: &str) -> PathBuf {
    Path::new("/etc/netns").join(ns)
}

fn remove_namespace(ns: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(etc_dir(ns));
}

/// Removes the namespaces of harnesses whose test process no longer exists.
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&format!("{PREFIX}-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_namespace(&name);
        }
    }
}

fn sh(script: &str) {
    let out = Command::new("sh").args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One process of a run: `cmd` (stdio set by [`run_together`]) as node `node`.
/// A `stuck` one is expected to outlive the others: it is killed once they
/// have ended, and that is not a failure.
pub struct Launch {
    pub node: usize,
    pub cmd: Command,
    pub stuck: bool,
}

impl Launch {
    pub fn new(node: usize, cmd: Command) -> Launch {
        Launch {
            node,
            cmd,
            stuck: false,
        }
    }
    pub fn stuck(mut self) -> Launch {
        self.stuck = true;
        self
    }
}

/// How a process ended.
#[derive(Debug, Clone)]
pub struct Ended {
    pub node: usize,
    /// None: killed (by a signal, or here as a stuck process).
    pub code: Option<i32>,
    /// Whether processes it started were still running in its process group
    /// after it ended (they were killed then).
    pub left_behind: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Ended {
    /// Whether a line of stdout starts with `line_start`.
    pub fn has(&self, line_start: &str) -> bool {
        self.stdout.lines().any(|l| l.starts_with(line_start))
    }
}

/// Starts every launch at once, each in a process group of its own, and waits
/// for all but the stuck ones. A process still running after `deadline` is
/// killed with its group and the test fails naming it; the stuck ones are
/// killed last. Results come back in launch order.
pub fn run_together(name: &str, deadline: Duration, launches: Vec<Launch>) -> Vec<Ended> {
    use std::os::unix::process::CommandExt;
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch(&format!(
        "together-{name}-{}",
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let started = Instant::now();
    let mut children: Vec<(usize, bool, Child)> = launches
        .into_iter()
        .enumerate()
        .map(|(k, mut l)| {
            l.cmd
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.join(format!("{k}.out"))).unwrap())
                .stderr(std::fs::File::create(dir.join(format!("{k}.err"))).unwrap());
            let child = l
                .cmd
                .spawn()
                .unwrap_or_else(|e| panic!("{name}: starting node {}: {e}", l.node));
            (l.node, l.stuck, child)
        })
        .collect();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; children.len()];
    let mut left_behind = vec![false; children.len()];
    let mut hung = vec![];
    loop {
        for (k, (_, _, child)) in children.iter_mut().enumerate() {
            if codes[k].is_none()
                && let Some(status) = child.try_wait().unwrap()
            {
                codes[k] = Some(status.code());
                // Whatever it left in its group goes now, while the group's id
                // is still held by those members.
                left_behind[k] = kill_group_only(child);
            }
        }
        let waiting = children
            .iter()
            .zip(&codes)
            .any(|((_, stuck, _), code)| code.is_none() && !stuck);
        if !waiting {
            break;
        }
        if started.elapsed() > deadline {
            for (k, (node, stuck, child)) in children.iter_mut().enumerate() {
                if codes[k].is_none() && !*stuck {
                    kill_group(child);
                    hung.push(*node);
                    codes[k] = Some(None);
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (k, (_, _, child)) in children.iter_mut().enumerate() {
        if codes[k].is_none() {
            kill_group(child);
            codes[k] = Some(None);
        }
    }
    let ended: Vec<Ended> = children
        .iter()
        .zip(codes)
        .enumerate()
        .map(|(k, ((node, _, _), code))| Ended {
            node: *node,
            code: code.flatten(),
            left_behind: left_behind[k],
            stdout: std::fs::read_to_string(dir.join(format!("{k}.out"))).unwrap(),
            stderr: std::fs::read_to_string(dir.join(format!("{k}.err"))).unwrap(),
        })
        .collect();
    assert!(
        hung.is_empty(),
        "{name}: nodes {hung:?} still ran after {deadline:?}: {ended:#?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    ended
}

/// SIGKILLs the child's process group (it leads one: `process_group(0)`) and reaps it.
fn kill_group(child: &mut Child) {
    kill_group_only(child);
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGKILLs what is left of the child's process group; whether anything was.
fn kill_group_only(child: &Child) -> bool {
    let Ok(pgid) = i32::try_from(child.id()) else {
        return false;
    };
    // SAFETY: kill has no memory preconditions; a negative pid names the group
    // this child leads, which holds only processes this test started (the
    // kernel does not hand out a group's id while a member is alive).
    unsafe { libc::kill(-pgid, libc::SIGKILL) == 0 }
}

#[test]
fn nodes_have_their_names_resolve_each_other_and_are_removed_after_a_failure() {
    let mut made = vec![];
    let host_name = nix::unistd::gethostname().unwrap();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let Some(mut net) = Net::new("harness", 3) else {
            return false;
        };
        net.add_host("job-master-0", &net.addr(0));
        made = (0..3).map(|i| net.ns(i).to_string()).collect();
        made.push(net.switch.clone());
        for i in 0..3 {
            let out = net
                .command(i, Path::new("sh"))
                .args([
                    "-c",
                    "hostname; getent hosts job-master-0 node2; ip -4 -o addr show eth0; ip route show default",
                ])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "node {i}: {text}");
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines[0], format!("node{i}"), "{text}");
            assert!(
                lines[1].starts_with("10.77.0.1 ") && lines[1].ends_with("job-master-0"),
                "{text}"
            );
            assert!(
                lines[2].starts_with("10.77.0.3 ") && lines[2].ends_with("node2"),
                "{text}"
            );
            assert!(
                lines[3].contains(&format!("inet {}/24", net.addr(i))),
                "{text}"
            );
            assert!(
                lines[4].starts_with("default via 10.77.0.254 dev eth0"),
                "{text}"
            );
        }
        // The host's own name is untouched: each node named itself in its own UTS namespace.
        assert_eq!(nix::unistd::gethostname().unwrap(), host_name);
        panic!("a failing test");
    }));
    if made.is_empty() {
        assert!(matches!(failed, Ok(false)), "skipped, yet failed");
        return;
    }
    assert!(failed.is_err());
    for ns in &made {
        assert!(!Path::new("/run/netns").join(ns).exists(), "{ns} is left");
        assert!(!etc_dir(ns).exists(), "{ns}'s hosts file is left");
    }
}

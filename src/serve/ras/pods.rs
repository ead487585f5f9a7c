//! Pod names for RAS's hosts, where the sidecar can know them without an API client.
//!
//! RAS names a rank by the address its process listens on (the pod IP inside
//! Kubernetes) and its pid. The pod's /etc/hosts, which the kubelet writes into every
//! container of the pod, maps the pod's own IP to its hostname (the pod's name unless
//! `spec.hostname` is set; with `spec.subdomain`, as JobSet and the Kubeflow trainer set
//! for their headless services, the FQDN comes first and the hostname second), and
//! carries the pod spec's `hostAliases`, which some launchers fill with every peer. So
//! ranks in this pod get their pod name, and peers get theirs where a host alias names
//! them; the others stay an address (README, docs/job-watch.md: `kubectl get pods -o
//! wide` maps them). Resolving peers through cluster DNS would need reverse records that
//! only pods of a headless service have, and a DNS wait off the watcher's bounds: not done.

use super::reply::{JobStatus, Member};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Address (as `IpAddr` prints it) to the host name /etc/hosts gives it: the first name
/// without a dot, else the first label of the first name. Loopback, unspecified and
/// multicast addresses are skipped, and so are the names Debian's and the kubelet's
/// defaults give them (`localhost`, `ip6-localnet`, `ip6-allnodes`, ...), as are later
/// lines for an address already named (the first line wins, as glibc's files backend
/// answers).
pub fn from_etc_hosts(text: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(ip) = fields.next().and_then(|a| a.parse::<IpAddr>().ok()) else {
            continue;
        };
        if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
            continue;
        }
        let all: Vec<&str> = fields.collect();
        if all
            .iter()
            .any(|n| n.starts_with("ip6-") || n.starts_with("localhost"))
        {
            continue;
        }
        let name = all
            .iter()
            .find(|n| !n.contains('.'))
            .or(all.first())
            .and_then(|n| n.split('.').next())
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        if let Some(name) = name {
            names
                .entry(ip.to_string())
                .or_insert_with(|| name.to_string());
        }
    }
    names
}

fn name_one(m: &mut Member, pods: &BTreeMap<String, String>) {
    let ip = m
        .host
        .as_deref()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'));
    if let Some(ip) = ip.and_then(|h| h.parse::<IpAddr>().ok()) {
        m.pod = pods.get(&ip.to_string()).cloned();
    }
}

/// Gives every member of a reply whose host /etc/hosts names its pod name.
pub fn name(status: &mut JobStatus, pods: &BTreeMap<String, String>) {
    if pods.is_empty() {
        return;
    }
    for c in &mut status.comms {
        c.ranks
            .iter_mut()
            .for_each(|r| name_one(&mut r.member, pods));
        c.missing
            .iter_mut()
            .for_each(|m| name_one(&mut m.member, pods));
        for g in &mut c.groups {
            g.members.iter_mut().for_each(|m| name_one(m, pods));
        }
        c.finalized.iter_mut().for_each(|m| name_one(m, pods));
        c.errors
            .iter_mut()
            .for_each(|e| name_one(&mut e.member, pods));
    }
    status.dead.iter_mut().for_each(|m| name_one(m, pods));
    status
        .unreachable
        .iter_mut()
        .for_each(|m| name_one(m, pods));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubelet-written /etc/hosts of a JobSet pod (spec.subdomain set), with a
    /// hostAliases block naming a peer.
    const HOSTS: &str = "# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
192.0.2.2\ttrainer-0-0.trainer.default.svc.cluster.local\ttrainer-0-0

# Entries added by HostAliases.
192.0.2.3\ttrainer-0-1.trainer
";

    #[test]
    fn the_pods_own_address_and_host_aliases_name_pods() {
        let pods = from_etc_hosts(HOSTS);
        assert_eq!(
            pods.get("192.0.2.2").map(String::as_str),
            Some("trainer-0-0")
        );
        assert_eq!(
            pods.get("192.0.2.3").map(String::as_str),
            Some("trainer-0-1")
        );
        assert_eq!(pods.len(), 2, "{pods:?}");
    }

    #[test]
    fn the_recorded_2_32_3_reply_names_the_stopped_rank_by_pod() {
        let text = include_str!("../../../tests/data/ras/gpu-h200x4-2.32.3/stopped-hung.json");
        let json = &text[text.find('{').unwrap()..];
        let mut status = super::super::reply::parse_json(json).unwrap();
        name(&mut status, &from_etc_hosts(HOSTS));
        let missing = &status.comms[0].missing[0].member;
        assert_eq!(missing.pod.as_deref(), Some("trainer-0-0"));
        assert_eq!(
            missing.to_string(),
            "rank 1 (pid 981 on pod trainer-0-0 at 192.0.2.2, GPU 1)"
        );
        // An address /etc/hosts does not name stays an address.
        let mut status = super::super::reply::parse_json(json).unwrap();
        name(&mut status, &from_etc_hosts("198.51.100.7 other\n"));
        assert_eq!(status.comms[0].missing[0].member.pod, None);
    }
}

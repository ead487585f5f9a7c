//! Fixes a user can paste: pod-spec fragments and runtime settings, shared by
//! the checks and by explain-log's diagnoses so both say the same thing.

/// /dev/shm too small or full (FACTS.md sections 1 and 2).
pub const DEV_SHM: &str = "\
Mount a memory-backed emptyDir at /dev/shm in the pod spec:
  volumes:
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: 16Gi   # counts against the pod's memory; an over-run evicts the pod
  containers:
    - volumeMounts:
        - name: dshm
          mountPath: /dev/shm
Docker: docker run --shm-size=1g ...";

/// memlock too low for RDMA registration. Kubernetes has no pod field for
/// ulimits; CAP_IPC_LOCK lifts the limit (FACTS.md section 1).
pub const MEMLOCK: &str = "\
Grant the container CAP_IPC_LOCK, which lifts the limit for RDMA registration:
  securityContext:
    capabilities:
      add: [\"IPC_LOCK\"]
or raise the container runtime's default limit on the node (Kubernetes has no pod field for ulimits):
  containerd: systemctl edit containerd  ->  [Service] LimitMEMLOCK=infinity ; systemctl restart containerd
  CRI-O:      /etc/crio/crio.conf.d/10-memlock.conf  ->  [crio.runtime] default_ulimits = [\"memlock=-1:-1\"]
              (OpenShift: ship that file with a MachineConfig)
  Docker:     docker run --ulimit memlock=-1:-1 ...";

/// The memlock fix for the container's user. For a non-root user, `capabilities.add:
/// [IPC_LOCK]` puts the capability in the bounding set but not the effective one
/// (kubernetes/kubernetes#56374: Kubernetes sets no ambient capabilities), so it lifts
/// nothing: there the node's runtime limit is the fix, or file capabilities on the
/// trainer's binary. `euid` is `None` when it could not be read.
pub fn memlock_for(euid: Option<u32>) -> String {
    match euid {
        Some(uid) if uid != 0 => format!(
            "\
This container runs as user {uid}: `capabilities.add: [\"IPC_LOCK\"]` does not make the capability
effective for a non-root user (kubernetes/kubernetes#56374), so raise the limit itself:
  containerd: systemctl edit containerd  ->  [Service] LimitMEMLOCK=infinity ; systemctl restart containerd
  CRI-O:      /etc/crio/crio.conf.d/10-memlock.conf  ->  [crio.runtime] default_ulimits = [\"memlock=-1:-1\"]
              (OpenShift: ship that file with a MachineConfig)
  Docker:     docker run --ulimit memlock=-1:-1 ...
or run the container as root (securityContext.runAsUser: 0) with IPC_LOCK added."
        ),
        _ => MEMLOCK.to_string(),
    }
}

/// The pod should share the host's IPC namespace.
pub const HOST_IPC: &str = "\
Share the host's IPC namespace in the pod spec:
  spec:
    hostIPC: true
Docker: docker run --ipc=host ...";

/// An unlimited or small stack limit.
pub const STACK_LIMIT: &str = "\
Set a finite stack limit of at least 8 MiB before the launcher starts, e.g. in the container command:
  command: [\"sh\", \"-c\", \"ulimit -s 8192 && exec torchrun ...\"]
or use NCCL >= 2.28.3, which sizes its own threads' stacks.";

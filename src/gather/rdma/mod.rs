//! RDMA gathering: sysfs and device nodes (files under the host root), and the
//! libraries (libibverbs, libfabric, libnccl and its net plugin) on one worker
//! thread under the per-call deadline, alongside the GPU threads.

pub mod fabric;
pub mod gdr;
pub mod nccl;
pub mod sysfs;
pub mod verbs;

use crate::facts::FactError;
use crate::facts::gpu::{Library, LibraryState};
use crate::facts::rdma::{FabricFacts, LoadAttempt, NcclFacts, RdmaFacts, VerbsFacts};
use crate::gather::host::Host;
use crate::vendor::deadline;
use std::time::Duration;

/// Library locations and probe sizes.
#[derive(Debug, Clone)]
pub struct RdmaOptions {
    pub verbs_library: String,
    /// libfabric locations, tried in order.
    pub fabric_libraries: Vec<String>,
    /// libnccl locations, tried in order.
    pub nccl_libraries: Vec<crate::gather::trainer_path::Candidate>,
    /// NCCL_NET_PLUGIN as set, if it is.
    pub net_plugin_env: Option<String>,
    /// Bytes to register with ibv_reg_mr on each device (`--memreg-size`).
    pub memreg_bytes: u64,
    pub call_timeout: Duration,
    pub trace: bool,
    /// Load every library even without RDMA devices (`doctor`, `--require rdma|efa`).
    /// Otherwise libibverbs and the net plugin are loaded only where RDMA devices
    /// exist, and libfabric only where EFA devices do: libfabric's dlopen alone
    /// costs ~0.2 s and holds the loader lock the GPU probes also need.
    pub probe_all: bool,
    /// This is nccl-preflight's own image (`--image own`): its libraries are not the
    /// ones training will load, so none is probed.
    pub own_image: bool,
    /// What an earlier probe of the libraries found, used instead of loading them
    /// again (`serve`'s runs after its first: see [`Probed`]).
    pub probed: Option<Probed>,
}

/// What the library probe found: libibverbs (its device list, opens and memory
/// registration), libfabric's providers, libnccl's version and the net plugin.
/// `serve` probes them once and reuses the answer on every later interval: the
/// image's libraries do not change while the pod lives, and loading them again
/// each second mapped libnccl (hundreds of MB of file), libfabric and the plugin
/// again and again in a process that lives as long as the pod. Device files, ports
/// and sysfs are still read on every run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Probed {
    verbs: LibraryState<VerbsFacts>,
    fabric: LibraryState<FabricFacts>,
    fabric_attempts: Vec<LoadAttempt>,
    nccl: NcclFacts,
}

impl Probed {
    /// The library facts of an earlier run, when every library answered (loaded, not
    /// found or skipped): a failed probe (a timeout, a thread this process could not
    /// start) is tried again on the next run rather than kept for the pod's life.
    pub fn settled(rdma: &RdmaFacts) -> Option<Probed> {
        let failed = matches!(rdma.verbs.state, LibraryState::Failed(_))
            || matches!(rdma.libfabric.state, LibraryState::Failed(_))
            || matches!(rdma.nccl.library.state, LibraryState::Failed(_))
            || rdma.nccl.net_plugin.error().is_some();
        (!failed).then(|| Probed::of(rdma))
    }

    /// The library facts of a run as they are, failures included: for reuse by one run
    /// (`serve`'s run whose libraries a child process probed), not kept.
    pub fn of(rdma: &RdmaFacts) -> Probed {
        Probed {
            verbs: rdma.verbs.state.clone(),
            fabric: rdma.libfabric.state.clone(),
            fabric_attempts: rdma.libfabric_attempts.clone(),
            nccl: rdma.nccl.clone(),
        }
    }

    fn libraries(&self) -> Libraries {
        Libraries {
            verbs: self.verbs.clone(),
            fabric: self.fabric.clone(),
            fabric_attempts: self.fabric_attempts.clone(),
            nccl: self.nccl.clone(),
        }
    }
}

/// Which libraries to load, from what sysfs shows.
struct Plan {
    verbs: Option<String>,
    fabric: Option<String>,
    plugin: Option<String>,
    nccl: Option<String>,
}

fn plan(devices: &[crate::facts::rdma::RdmaDevice], probe_all: bool, own_image: bool) -> Plan {
    if own_image {
        let own = || Some(crate::facts::ImageRole::OWN_REASON.to_string());
        return Plan {
            verbs: own(),
            fabric: own(),
            plugin: own(),
            nccl: own(),
        };
    }
    let skip = |needed: bool, why: &str| (!needed && !probe_all).then(|| why.to_string());
    Plan {
        verbs: skip(!devices.is_empty(), "no RDMA device"),
        fabric: skip(devices.iter().any(|d| d.is_efa()), "no EFA device"),
        plugin: skip(!devices.is_empty(), "no RDMA device"),
        nccl: None,
    }
}

struct Libraries {
    verbs: LibraryState<VerbsFacts>,
    fabric: LibraryState<FabricFacts>,
    fabric_attempts: Vec<LoadAttempt>,
    nccl: NcclFacts,
}

fn probe_libraries(w: &deadline::Watch, o: &RdmaOptions, plan: Plan) -> Libraries {
    let verbs = match plan.verbs {
        Some(reason) => LibraryState::Skipped { reason },
        None => match verbs::gather(w, &o.verbs_library, o.memreg_bytes) {
            verbs::Outcome::NotFound(message) => LibraryState::NotFound { message },
            verbs::Outcome::Failed(e) => LibraryState::Failed(e),
            verbs::Outcome::Loaded(f) => LibraryState::Loaded(f),
        },
    };
    let (fabric, fabric_attempts) = match plan.fabric {
        Some(reason) => (LibraryState::Skipped { reason }, Vec::new()),
        None => {
            let (outcome, attempts) = fabric::gather(w, &o.fabric_libraries);
            let state = match outcome {
                fabric::Outcome::NotFound(message) => LibraryState::NotFound { message },
                fabric::Outcome::Failed(e) => LibraryState::Failed(e),
                fabric::Outcome::Loaded(f) => LibraryState::Loaded(f),
            };
            (state, attempts)
        }
    };
    let nccl = match plan.nccl {
        Some(reason) => NcclFacts {
            library: Library {
                library: nccl::names(&o.nccl_libraries).join(", "),
                state: LibraryState::Skipped { reason },
            },
            net_plugin: crate::facts::Observed::Value(None),
            net_plugin_attempts: Vec::new(),
            net_plugin_skipped: plan.plugin,
            copies: Vec::new(),
        },
        None => nccl::gather(
            w,
            &o.nccl_libraries,
            o.net_plugin_env.as_deref(),
            plan.plugin,
        ),
    };
    Libraries {
        verbs,
        fabric,
        fabric_attempts,
        nccl,
    }
}

fn failed_libraries(e: FactError) -> Libraries {
    Libraries {
        verbs: LibraryState::Failed(e.clone()),
        fabric: LibraryState::Failed(e.clone()),
        fabric_attempts: Vec::new(),
        nccl: NcclFacts {
            library: Library {
                library: String::new(),
                state: LibraryState::Failed(e.clone()),
            },
            net_plugin: crate::facts::Observed::Error(e),
            net_plugin_attempts: Vec::new(),
            net_plugin_skipped: None,
            copies: Vec::new(),
        },
    }
}

/// RDMA facts when the library probe could not run at all: files still read, libraries failed with `e`.
pub fn failed_facts(host: &Host, e: FactError) -> RdmaFacts {
    let devices = sysfs::devices(host);
    assemble(host, &RdmaOptions::unused(), devices, failed_libraries(e))
}

impl RdmaOptions {
    fn unused() -> RdmaOptions {
        RdmaOptions {
            verbs_library: String::new(),
            fabric_libraries: Vec::new(),
            nccl_libraries: Vec::new(),
            net_plugin_env: None,
            memreg_bytes: 0,
            call_timeout: Duration::ZERO,
            trace: false,
            probe_all: false,
            own_image: false,
            probed: None,
        }
    }
}

/// Gathers the RDMA facts; the second value says whether a library call hung.
pub fn gather(host: &Host, options: &RdmaOptions) -> (RdmaFacts, bool) {
    let devices = sysfs::devices(host);
    if let Some(probed) = &options.probed {
        return (assemble(host, options, devices, probed.libraries()), false);
    }
    let plan = plan(
        devices.value().map_or(&[][..], Vec::as_slice),
        options.probe_all,
        options.own_image,
    );
    let o = options.clone();
    let result = deadline::run("rdma", options.call_timeout, options.trace, move |w| {
        probe_libraries(w, &o, plan)
    });
    match result {
        Ok(libs) => (assemble(host, options, devices, libs), false),
        Err(h) if h.not_started => {
            let e = crate::gather::gpu::own_resources(&h.call);
            (assemble(host, options, devices, failed_libraries(e)), false)
        }
        Err(h) => {
            let e = FactError::new(
                h.call.clone(),
                format!("did not return within {:.1} s", h.deadline.as_secs_f64()),
            )
            .with_kind(crate::facts::FailureKind::Timeout);
            (assemble(host, options, devices, failed_libraries(e)), true)
        }
    }
}

fn assemble(
    host: &Host,
    options: &RdmaOptions,
    devices: crate::facts::Observed<Vec<crate::facts::rdma::RdmaDevice>>,
    libs: Libraries,
) -> RdmaFacts {
    RdmaFacts {
        devices,
        uverbs: sysfs::uverbs(host),
        rdma_cm: sysfs::rdma_cm(host),
        verbs: Library {
            library: options.verbs_library.clone(),
            state: libs.verbs,
        },
        libfabric: Library {
            library: libs
                .fabric_attempts
                .iter()
                .find(|a| a.error.is_none())
                .map_or_else(
                    || options.fabric_libraries.join(", "),
                    |a| a.library.clone(),
                ),
            state: libs.fabric,
        },
        libfabric_attempts: libs.fabric_attempts,
        nccl: libs.nccl,
        gdr: gdr::gather(host),
        ofi_nccl_xml: host
            .list_dir(crate::platform::OFI_NCCL_XML_DIR)
            .map(Option::unwrap_or_default)
            .into(),
    }
}

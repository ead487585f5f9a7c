//! Literal `Facts` for unit tests of judge and tune: a healthy node, and
//! variations of it with one thing broken each.

use crate::facts::*;
use std::collections::BTreeMap;

pub fn iface(name: &str, kind: Option<&str>) -> Interface {
    Interface {
        name: name.into(),
        up: true,
        running: true,
        loopback: name == "lo",
        kind: kind.map(String::from),
    }
}

pub fn v4(name: &str, address: &str) -> IfAddress {
    IfAddress {
        interface: name.into(),
        family: Family::Inet,
        address: address.into(),
        prefix_len: Some(24),
    }
}

/// A node where every check passes: unlimited memlock, 1 GiB tmpfs /dev/shm,
/// host IPC, 8 MiB stack, eth0 with the default route, no NCCL variables.
pub fn healthy() -> Facts {
    Facts {
        schema: FACTS_SCHEMA.into(),
        tool_version: "0.0.0".into(),
        host_root: "/".into(),
        memlock: MemlockFacts {
            limit: Observed::Value(Rlimit {
                soft: Limit::Unlimited,
                hard: Limit::Unlimited,
            }),
            cap_ipc_lock: Observed::Value(false),
            euid: Some(0),
            probe: Some(MlockProbe {
                bytes: 65536,
                refused: None,
            }),
            enforcement_probe: None,
            probe_errors: Vec::new(),
        },
        stack_limit: Observed::Value(Rlimit {
            soft: Limit::Bytes(8 << 20),
            hard: Limit::Unlimited,
        }),
        dev_shm: ShmFacts {
            usage: Observed::Value(Some(FsUsage {
                size_bytes: 1 << 30,
                free_bytes: 1 << 30,
            })),
            mount: Observed::Value(Some(MountEntry {
                mount_point: "/dev/shm".into(),
                fs_type: "tmpfs".into(),
                source: "shm".into(),
                mount_options: vec!["rw".into()],
                super_options: vec!["rw".into(), "size=1048576k".into()],
            })),
        },
        namespaces: NamespaceFacts {
            ipc: Observed::Value(4026531839),
            uts: Observed::Value(4026531838),
            net: Observed::Value(4026531840),
            hostname: Observed::Value("node-a".into()),
            boot_id: Observed::Value("2f0c7c0e-0000-4000-8000-000000000001".into()),
        },
        network: NetworkFacts {
            interfaces: Observed::Value(vec![iface("lo", None), iface("eth0", None)]),
            addresses: Observed::Value(vec![v4("lo", "127.0.0.1"), v4("eth0", "10.0.0.5")]),
            default_routes: Observed::Value(vec![DefaultRoute {
                interface: "eth0".into(),
                family: Family::Inet,
                metric: 0,
            }]),
            hosts_entries: Observed::Value(vec![]),
            errors: Vec::new(),
        },
        platform: PlatformFacts {
            product_name: Observed::Value(None),
            sys_vendor: Observed::Value(None),
        },
        rdma: no_rdma(),
        gpus: h200x2_gpus(),
        launcher: BTreeMap::new(),
        nccl_env: BTreeMap::new(),
        image: crate::facts::ImageRole::Trainer,
        nccl_files: Default::default(),
        nodes: None,
    }
}

/// The lent 2x H200 machine: both GPUs visible, NVSwitch fabric, CUDA agrees.
pub fn h200x2_gpus() -> gpu::GpuFacts {
    use gpu::*;
    let nvml = crate::topology::matrix::fixtures::h200x2();
    let buses: Vec<String> = nvml
        .gpus
        .iter()
        .map(|g| g.pci_bus_id.value().unwrap().clone())
        .collect();
    GpuFacts {
        cuda: Library {
            library: "libcuda.so.1".into(),
            state: LibraryState::Loaded(CudaFacts {
                driver_version: Observed::Value(13000),
                init_result: 0,
                init_result_name: "CUDA_SUCCESS".into(),
                devices: buses
                    .iter()
                    .enumerate()
                    .map(|(i, b)| CudaDevice {
                        ordinal: i as u32,
                        pci_bus_id: Observed::Value(b.clone()),
                    })
                    .collect(),
                peer_access: vec![
                    PeerAccess {
                        a: 0,
                        b: 1,
                        can_access: Observed::Value(true),
                    },
                    PeerAccess {
                        a: 1,
                        b: 0,
                        can_access: Observed::Value(true),
                    },
                ],
            }),
        },
        nvml: Library {
            library: "libnvidia-ml.so.1".into(),
            state: LibraryState::Loaded(nvml),
        },
        pci_gpus: Observed::Value(
            buses
                .iter()
                .map(|b| PciGpu {
                    bus_id: b.clone(),
                    device_id: "0x2335".into(),
                    sysfs_path: Some(format!("/sys/devices/pci0000:00/{b}")),
                    numa_node: None,
                    max_link_speed: Some("32.0 GT/s PCIe".into()),
                    max_link_width: Some(16),
                    current_link_speed: Some("32.0 GT/s PCIe".into()),
                    current_link_width: Some(16),
                    upstream_acs: Vec::new(),
                    unreadable: Vec::new(),
                })
                .collect(),
        ),
        pci_nvswitches: Observed::Value(vec![]),
        call_timeout_ms: 10_000,
        imex_channels: Observed::Value(None),
        // PyTorch 2.11's wheel: CUDA 12.8 under a CUDA 13.0 driver.
        cuda_runtime: CudaRuntimeFacts {
            libraries: vec![CudaRuntime {
                found_by: "python wheel".into(),
                path: "/usr/local/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12".into(),
                version: Observed::Value(12080),
            }],
            attempts: Vec::new(),
            compat_libcuda: Vec::new(),
            skipped: None,
        },
    }
}

/// A machine without NVIDIA libraries or GPUs.
pub fn no_gpus() -> gpu::GpuFacts {
    use gpu::*;
    fn absent<T>(lib: &str) -> LibraryState<T> {
        LibraryState::NotFound {
            message: format!("{lib}: cannot open shared object file: No such file or directory"),
        }
    }
    GpuFacts {
        nvml: Library {
            library: "libnvidia-ml.so.1".into(),
            state: absent("libnvidia-ml.so.1"),
        },
        cuda: Library {
            library: "libcuda.so.1".into(),
            state: absent("libcuda.so.1"),
        },
        pci_gpus: Observed::Value(vec![]),
        pci_nvswitches: Observed::Value(vec![]),
        call_timeout_ms: 10_000,
        imex_channels: Observed::Value(None),
        cuda_runtime: CudaRuntimeFacts {
            libraries: Vec::new(),
            attempts: Vec::new(),
            compat_libcuda: Vec::new(),
            skipped: None,
        },
    }
}

/// No RDMA device; Debian-like libraries: libibverbs without kernel support, libfabric 1.17.
pub fn no_rdma() -> rdma::RdmaFacts {
    use rdma::*;
    RdmaFacts {
        devices: Observed::Value(vec![]),
        uverbs: Observed::Value(vec![]),
        rdma_cm: Observed::Value(None),
        verbs: gpu::Library {
            library: "libibverbs.so.1".into(),
            state: gpu::LibraryState::Loaded(VerbsFacts {
                devices: Observed::Error(FactError::new(
                    "ibv_get_device_list",
                    "ENOSYS: Function not implemented",
                )),
                memreg_bytes: 128 << 20,
            }),
        },
        libfabric: gpu::Library {
            library: "libfabric.so.1".into(),
            state: gpu::LibraryState::Loaded(FabricFacts {
                version: "1.17".into(),
                providers: vec!["shm".into(), "tcp".into()],
                efa_rdm: Observed::Value(0),
            }),
        },
        libfabric_attempts: vec![],
        nccl: NcclFacts {
            library: gpu::Library {
                library: "libnccl.so.2".into(),
                state: gpu::LibraryState::Loaded(NcclLibrary {
                    path: Some("/usr/lib/x86_64-linux-gnu/libnccl.so.2".into()),
                    version: Observed::Value("2.28.9".into()),
                    found_by: Some("LD_LIBRARY_PATH / ld.so.cache".into()),
                }),
            },
            net_plugin: Observed::Value(None),
            net_plugin_attempts: vec![],
            net_plugin_skipped: None,
            copies: vec![NcclCopy {
                path: "/usr/lib/x86_64-linux-gnu/libnccl.so.2".into(),
                found_by: "LD_LIBRARY_PATH / ld.so.cache".into(),
                version: Observed::Value("2.28.9".into()),
            }],
        },
        gdr: GdrFacts {
            peermem_module: Observed::Value(None),
            kernel_release: Observed::Value("6.8.0-1015-aws".into()),
            nvidia_open_modules: Observed::Value(Some(true)),
        },
        ofi_nccl_xml: Observed::Value(vec![]),
    }
}

/// An RDMA device with one port, and a uverbs node this process can open.
pub fn rdma_device(
    name: &str,
    driver: &str,
    bus: &str,
    path: &str,
    state: &str,
    link_layer: &str,
) -> rdma::RdmaDevice {
    rdma::RdmaDevice {
        name: name.into(),
        driver: Some(driver.into()),
        pci_bus_id: Some(bus.into()),
        sysfs_path: Some(path.into()),
        numa_node: Some(0),
        fw_ver: None,
        node_guid: None,
        netdevs: vec![],
        ports: vec![rdma::RdmaPort {
            port: 1,
            state: Some(state.into()),
            phys_state: Some(
                if state == "ACTIVE" {
                    "LinkUp"
                } else {
                    "Disabled"
                }
                .into(),
            ),
            link_layer: Some(link_layer.into()),
            rate: Some("100 Gb/sec (4X EDR)".into()),
            gids: vec![],
            error_counters: Default::default(),
        }],
        pcie: None,
        efa_p2p: None,
        unreadable: vec![],
    }
}

/// `facts` with one active EFA device (`rdmap16s27`, as on p4d/p5), usable from this process.
pub fn with_efa(facts: Facts) -> Facts {
    with_rdma(
        facts,
        vec![rdma_device(
            "rdmap16s27",
            "efa",
            "0000:10:1b.0",
            "/sys/devices/x",
            "ACTIVE",
            "Unspecified",
        )],
    )
}

/// `facts` whose NCCL loads aws-ofi-nccl 1.13.2-aws (`libnccl-net.so`, ncclNet v2-v8,
/// named `Libfabric`), as on an EFA node.
pub fn with_ofi_plugin(mut facts: Facts) -> Facts {
    facts.rdma.nccl.net_plugin = Observed::Value(Some(rdma::NetPlugin {
        library: "libnccl-net.so".into(),
        path: Some("/opt/amazon/ofi-nccl/lib/libnccl-net.so".into()),
        api: Some("v8".into()),
        apis: vec![2, 3, 4, 5, 6, 7, 8],
        name: Some("Libfabric".into()),
        ofi_nccl_version: Some("1.13.2-aws".into()),
    }));
    facts
}

/// `facts` whose trainer loads libnccl `version` (`2.27.7`).
pub fn with_nccl_version(mut facts: Facts, version: &str) -> Facts {
    if let gpu::LibraryState::Loaded(l) = &mut facts.rdma.nccl.library.state {
        l.version = Observed::Value(version.into());
    }
    facts
}

/// `facts` with one active InfiniBand HCA (`mlx5_0`), usable from this process.
pub fn with_ib(facts: Facts) -> Facts {
    with_rdma(
        facts,
        vec![rdma_device(
            "mlx5_0",
            "mlx5_core",
            "0000:17:00.0",
            "/sys/devices/x",
            "ACTIVE",
            "InfiniBand",
        )],
    )
}

/// `devices` made visible to this process through uverbs nodes and libibverbs, each registering fine.
pub fn with_rdma(mut facts: Facts, devices: Vec<rdma::RdmaDevice>) -> Facts {
    use rdma::*;
    facts.rdma.uverbs = Observed::Value(
        devices
            .iter()
            .enumerate()
            .map(|(i, d)| UverbsNode {
                name: format!("uverbs{i}"),
                ibdev: Some(d.name.clone()),
                ibdev_error: None,
                open: Some(Openable { refused: None }),
            })
            .collect(),
    );
    facts.rdma.verbs.state = gpu::LibraryState::Loaded(VerbsFacts {
        devices: Observed::Value(
            devices
                .iter()
                .map(|d| VerbsDevice {
                    name: d.name.clone(),
                    open: Observed::Value(()),
                    fw_ver: None,
                    vendor_id: None,
                    vendor_part_id: None,
                    ports: vec![VerbsPort {
                        port: 1,
                        query: Observed::Value(()),
                        state: d.ports[0].state.clone(),
                        link_layer: d.ports[0].link_layer.clone(),
                        active_mtu: Some(4096),
                    }],
                    memreg: Some(Observed::Value(())),
                })
                .collect(),
        ),
        memreg_bytes: 128 << 20,
    });
    facts.rdma.devices = Observed::Value(devices);
    facts
}

pub fn with_env(mut facts: Facts, pairs: &[(&str, &str)]) -> Facts {
    for (k, v) in pairs {
        let value = EnvValue::text(*v);
        if crate::layout::LAUNCHER_VARS.contains(k) {
            facts.launcher.insert(k.to_string(), value);
        } else {
            facts.nccl_env.insert(k.to_string(), value);
        }
    }
    facts
}

/// Each a healthy node with one thing broken or unreadable.
pub fn broken_variants() -> Vec<Facts> {
    let unreadable = || Observed::Error(FactError::new("/proc/x", "Permission denied"));
    let mut out = Vec::new();
    let mut f = healthy();
    f.memlock.limit = Observed::Value(Rlimit {
        soft: Limit::Bytes(8 << 20),
        hard: Limit::Bytes(8 << 20),
    });
    let f = with_rdma(
        f,
        vec![rdma_device(
            "mlx5_0",
            "mlx5_core",
            "0000:17:00.0",
            "/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.0",
            "ACTIVE",
            "InfiniBand",
        )],
    );
    out.push(f);
    let mut f = healthy();
    f.memlock.limit = unreadable();
    out.push(f);
    // A GPU with an uncorrectable ECC error and a failed row remap.
    let mut f = healthy();
    if let gpu::LibraryState::Loaded(nvml) = &mut f.gpus.nvml.state
        && let Some(h) = nvml.gpus[0].health.as_mut()
    {
        h.ecc_uncorrected_volatile = Observed::Value(3);
        if let Observed::Value(r) = &mut h.remapped_rows {
            r.failure = true;
        }
    }
    out.push(f);
    let mut f = healthy();
    f.dev_shm.usage = Observed::Value(None);
    out.push(f);
    let mut f = healthy();
    f.namespaces.ipc = Observed::Value(4026532200);
    out.push(f);
    out.push(with_env(healthy(), &[("NCCL_SOCKET_IFNAME", "nonexist0")]));
    out.push(with_env(
        healthy(),
        &[("NCCL_SOCKET_IFNAME", "lo"), ("PET_NNODES", "2")],
    ));
    out
}

/// A judge called as the run calls it: with the prediction made once from the same facts.
pub fn judged(
    judge: fn(
        &Facts,
        &crate::predict::Prediction,
        &crate::policy::Policy,
    ) -> crate::finding::Finding,
    facts: &Facts,
    policy: &crate::policy::Policy,
) -> crate::finding::Finding {
    judge(facts, &crate::predict::predict(facts), policy)
}

/// The iteration count of a seeded fuzz test: `NCCL_PREFLIGHT_FUZZ_ITERATIONS` when set
/// (for a longer run than CI's), else `default`, the count CI runs. Shared by every fuzz
/// target, so one variable lengthens them all.
pub fn fuzz_iterations(default: usize) -> usize {
    let value = std::env::var("NCCL_PREFLIGHT_FUZZ_ITERATIONS").ok();
    iterations_from(value.as_deref(), default)
        .unwrap_or_else(|e| panic!("NCCL_PREFLIGHT_FUZZ_ITERATIONS: {e}"))
}

/// The seed of a fuzz target: the target's own fixed seed `own`, or, when
/// `NCCL_PREFLIGHT_FUZZ_SEED` is set, that number mixed with `own` (so the targets still
/// differ from each other). The seed in use is printed, so a failing long run can be
/// replayed with the same variables.
pub fn fuzz_seed(own: u64) -> u64 {
    let value = std::env::var("NCCL_PREFLIGHT_FUZZ_SEED").ok();
    let seed = seed_from(value.as_deref(), own)
        .unwrap_or_else(|e| panic!("NCCL_PREFLIGHT_FUZZ_SEED: {e}"));
    eprintln!("fuzz seed {seed:#018x} (own {own:#018x})");
    seed
}

fn iterations_from(value: Option<&str>, default: usize) -> Result<usize, String> {
    match value.map(|v| (v, v.trim().parse::<usize>())) {
        None => Ok(default),
        Some((_, Ok(n))) if n > 0 => Ok(n),
        Some((text, _)) => Err(format!("{text:?} is not a positive count")),
    }
}

/// Never zero, as the xorshift generators of the fuzz targets need.
fn seed_from(value: Option<&str>, own: u64) -> Result<u64, String> {
    let seed = match value {
        None => own,
        Some(text) => {
            let t = text.trim();
            let n = match t.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => t.parse::<u64>(),
            }
            .map_err(|_| format!("{text:?} is not a number (decimal or 0x hex)"))?;
            // splitmix64 of the given number, folded into the target's own seed.
            let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            own ^ z ^ (z >> 31)
        }
    };
    Ok(if seed == 0 { own | 1 } else { seed })
}

/// A RoCE node with two mlx5 NICs on different PCIe switches, the first port ACTIVE and
/// the second in `second_state` (the HCA and GID-index tuning rules' node).
pub fn roce_two_nics(second_state: &str) -> Facts {
    with_rdma(
        healthy(),
        vec![
            rdma_device(
                "mlx5_0",
                "mlx5_core",
                "0000:19:00.0",
                "/sys/devices/x/0000:19:00.0",
                "ACTIVE",
                "Ethernet",
            ),
            rdma_device(
                "mlx5_1",
                "mlx5_core",
                "0000:9a:00.0",
                "/sys/devices/y/0000:9a:00.0",
                second_state,
                "Ethernet",
            ),
        ],
    )
}

#[cfg(test)]
mod fuzz_knobs {
    use super::{iterations_from, seed_from};

    #[test]
    fn fuzz_knobs_default_to_the_targets_own_and_refuse_garbage() {
        assert_eq!(iterations_from(None, 400), Ok(400));
        assert_eq!(iterations_from(Some(" 90000\n"), 400), Ok(90_000));
        for bad in ["0", "-5", "lots", ""] {
            assert!(iterations_from(Some(bad), 400).is_err(), "{bad:?}");
        }
        assert_eq!(seed_from(None, 0x1234), Ok(0x1234));
        assert_eq!(seed_from(None, 0), Ok(1));
        // A given seed changes the stream, the same way every time, and differently per target.
        let a = seed_from(Some("42"), 0x1234).unwrap();
        assert_ne!(a, 0x1234);
        assert_eq!(seed_from(Some("0x2a"), 0x1234), Ok(a));
        assert_ne!(seed_from(Some("42"), 0x5678).unwrap(), a);
        assert!(seed_from(Some("0xzz"), 1).is_err());
    }
}

//! libibverbs' facts, through vendor::verbs: list the devices (telling "no kernel
//! RDMA support" (ENOSYS) from "no devices"), open every one (a single device that
//! cannot be opened can make libfabric's EFA provider vanish,
//! ofiwg/libfabric#12708), query it and its ports, and register a memory region of
//! `--memreg-size` to prove memlock and pinning work as NCCL will need them.
//! Everything opened is released again, in reverse order, whichever step fails.

use crate::facts::rdma::{VerbsDevice, VerbsFacts, VerbsPort};
use crate::facts::{FactError, Observed};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use crate::vendor::verbs::{Context, DeviceList, RegError};
use std::io;

fn errno_text(code: i32) -> String {
    crate::gather::kernel::errno_text(io::Error::from_raw_os_error(code))
}

fn port_state(code: u32) -> &'static str {
    match code {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

pub fn link_layer(code: u8) -> &'static str {
    match code {
        1 => "InfiniBand",
        2 => "Ethernet",
        _ => "Unspecified",
    }
}

/// The registration probe as a fact.
fn memreg(ctx: &Context<'_>, bytes: u64) -> Observed<()> {
    match ctx.register(bytes) {
        Ok(()) => Observed::Value(()),
        Err(RegError::TooLarge) => {
            Observed::Error(FactError::new("ibv_reg_mr", "size does not fit"))
        }
        Err(RegError::Map { call, errno }) => {
            Observed::Error(FactError::new(call, errno_text(errno)))
        }
        Err(RegError::Errno { call, errno }) if call.starts_with("ibv_reg_mr") => {
            Observed::Error(FactError::new(call, errno_text(errno)).with_errno(errno))
        }
        Err(RegError::Errno { call, errno }) => {
            Observed::Error(FactError::new(call, errno_text(errno)))
        }
    }
}

/// Queries ports 1..=count of an open device.
fn query_ports(ctx: &Context<'_>, name: &str, count: u8) -> Vec<VerbsPort> {
    (1..=count)
        .map(|port| match ctx.query_port(port) {
            Ok(pa) => VerbsPort {
                port: u32::from(port),
                query: Observed::Value(()),
                state: Some(port_state(pa.state).to_string()),
                link_layer: Some(link_layer(pa.link_layer).to_string()),
                active_mtu: (1..=5)
                    .contains(&pa.active_mtu)
                    .then(|| 128 << pa.active_mtu),
            },
            Err(rc) => VerbsPort {
                port: u32::from(port),
                query: Observed::Error(FactError::new(
                    format!("ibv_query_port({name}, {port})"),
                    errno_text(rc),
                )),
                state: None,
                link_layer: None,
                active_mtu: None,
            },
        })
        .collect()
}

/// Opens, queries and registers memory on device `i`; closes it again.
fn probe(list: &DeviceList<'_>, i: usize, bytes: u64) -> VerbsDevice {
    let name = list.name(i);
    let mut out = VerbsDevice {
        name: name.clone(),
        open: Observed::Value(()),
        fw_ver: None,
        vendor_id: None,
        vendor_part_id: None,
        ports: Vec::new(),
        memreg: None,
    };
    let ctx = match list.open(i, &name) {
        Ok(ctx) => ctx,
        Err(errno) => {
            out.open = Observed::Error(FactError::new(
                format!("ibv_open_device({name})"),
                errno_text(errno),
            ));
            return out;
        }
    };
    match ctx.query_device() {
        Ok(attr) => {
            out.fw_ver = Some(attr.fw_ver).filter(|s| !s.is_empty());
            out.vendor_id = Some(attr.vendor_id);
            out.vendor_part_id = Some(attr.vendor_part_id);
            out.ports = query_ports(&ctx, &name, attr.phys_port_cnt);
            out.memreg = Some(memreg(&ctx, bytes));
        }
        Err(rc) => {
            out.open = Observed::Error(FactError::new(
                format!("ibv_query_device({name})"),
                errno_text(rc),
            ));
        }
    }
    out
}

/// How loading libibverbs ended.
pub type Outcome = crate::gather::Outcome<VerbsFacts>;

pub fn gather(watch: &Watch, library: &str, memreg_bytes: u64) -> Outcome {
    let verbs = match crate::vendor::verbs::open(watch, library) {
        Ok(verbs) => verbs,
        Err(LoadError::Missing(why)) => return Outcome::NotFound(why),
        Err(LoadError::Failed(e)) => return Outcome::Failed(e),
    };
    let devices = match verbs.devices() {
        Err(errno) => {
            let what = if errno == libc::ENOSYS {
                " (the kernel has no RDMA verbs support: no ib_uverbs)"
            } else {
                ""
            };
            Observed::Error(FactError::new(
                "ibv_get_device_list",
                format!("{}{what}", errno_text(errno)),
            ))
        }
        Ok(list) => Observed::Value(
            (0..list.len())
                .map(|i| probe(&list, i, memreg_bytes))
                .collect(),
        ),
    };
    Outcome::Loaded(VerbsFacts {
        devices,
        memreg_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_states_and_link_layers_read_as_ibstat_prints_them() {
        let states: Vec<&str> = (0..=6).map(port_state).collect();
        assert_eq!(
            states,
            [
                "NOP",
                "DOWN",
                "INIT",
                "ARMED",
                "ACTIVE",
                "ACTIVE_DEFER",
                "NOP"
            ]
        );
        let layers: Vec<&str> = (0..=3).map(link_layer).collect();
        assert_eq!(
            layers,
            ["Unspecified", "InfiniBand", "Ethernet", "Unspecified"]
        );
    }
}

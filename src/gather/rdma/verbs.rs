//! libibverbs, dlopen'ed (the two structs it reads are declared in `abi`): list the
//! devices (telling "no kernel RDMA support" (ENOSYS) from "no devices"), open
//! every one (a single device that cannot be opened can make libfabric's EFA
//! provider vanish, ofiwg/libfabric#12708), query it and its ports, and
//! register a memory region of `--memreg-size` to prove memlock and pinning
//! work as NCCL will need them. Everything opened is released again, in
//! reverse order, whichever step fails.

use crate::facts::rdma::{VerbsDevice, VerbsFacts, VerbsPort};
use crate::facts::{FactError, Observed};
use crate::gather::deadline::Watch;
use crate::gather::dl::{Library, Symbol};
use abi::{ibv_context, ibv_device, ibv_device_attr, ibv_mr, ibv_pd, ibv_port_attr};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::io;

/// The ibverbs types this module touches, declared by hand from rdma-core's
/// `libibverbs/verbs.h` (ABI-stable since IBVERBS_1.1), as NCCL does when it is not
/// built against rdma-core (NVIDIA/nccl, src/include/ibvcore.h at b0cedcc). The handles
/// are opaque; the two structs the library fills are declared field for field. A
/// test checks every offset and the size against the installed headers (Debian's
/// libibverbs-dev), and, with the `rdma-sys` feature, against rdma-sys's bindgen types.
#[allow(non_camel_case_types)]
pub(crate) mod abi {
    use std::ffi::{c_char, c_int, c_uint};

    /// Declares opaque C types, only ever behind a pointer.
    macro_rules! opaque {
        ($($name:ident),*) => {$(
            #[repr(C)]
            pub struct $name {
                _private: [u8; 0],
            }
        )*};
    }
    opaque!(ibv_device, ibv_context, ibv_pd, ibv_mr);

    /// `struct ibv_device_attr`, what ibv_query_device fills.
    #[repr(C)]
    pub struct ibv_device_attr {
        pub fw_ver: [c_char; 64],
        pub node_guid: u64,
        pub sys_image_guid: u64,
        pub max_mr_size: u64,
        pub page_size_cap: u64,
        pub vendor_id: u32,
        pub vendor_part_id: u32,
        pub hw_ver: u32,
        pub max_qp: c_int,
        pub max_qp_wr: c_int,
        pub device_cap_flags: c_uint,
        pub max_sge: c_int,
        pub max_sge_rd: c_int,
        pub max_cq: c_int,
        pub max_cqe: c_int,
        pub max_mr: c_int,
        pub max_pd: c_int,
        pub max_qp_rd_atom: c_int,
        pub max_ee_rd_atom: c_int,
        pub max_res_rd_atom: c_int,
        pub max_qp_init_rd_atom: c_int,
        pub max_ee_init_rd_atom: c_int,
        /// `enum ibv_atomic_cap`: a C enum, int-sized on the Linux ABIs.
        pub atomic_cap: c_uint,
        pub max_ee: c_int,
        pub max_rdd: c_int,
        pub max_mw: c_int,
        pub max_raw_ipv6_qp: c_int,
        pub max_raw_ethy_qp: c_int,
        pub max_mcast_grp: c_int,
        pub max_mcast_qp_attach: c_int,
        pub max_total_mcast_qp_attach: c_int,
        pub max_ah: c_int,
        pub max_fmr: c_int,
        pub max_map_per_fmr: c_int,
        pub max_srq: c_int,
        pub max_srq_wr: c_int,
        pub max_srq_sge: c_int,
        pub max_pkeys: u16,
        pub local_ca_ack_delay: u8,
        pub phys_port_cnt: u8,
    }

    /// `struct ibv_port_attr` as rdma-core 44 (Debian 12) declares it. The exported
    /// `ibv_query_port` writes only its IBVERBS_1.1 prefix (`struct _compat_ibv_port_attr`
    /// in verbs.h), which ends before `port_cap_flags2`; rdma-core 47 and later append
    /// `active_speed_ex`, which this tool neither needs nor lets the library write.
    #[repr(C)]
    pub struct ibv_port_attr {
        /// `enum ibv_port_state`.
        pub state: c_uint,
        /// `enum ibv_mtu`.
        pub max_mtu: c_uint,
        /// `enum ibv_mtu`: 1..=5 for 256..4096 bytes.
        pub active_mtu: c_uint,
        pub gid_tbl_len: c_int,
        pub port_cap_flags: u32,
        pub max_msg_sz: u32,
        pub bad_pkey_cntr: u32,
        pub qkey_viol_cntr: u32,
        pub pkey_tbl_len: u16,
        pub lid: u16,
        pub sm_lid: u16,
        pub lmc: u8,
        pub max_vl_num: u8,
        pub sm_sl: u8,
        pub subnet_timeout: u8,
        pub init_type_reply: u8,
        pub active_width: u8,
        pub active_speed: u8,
        pub phys_state: u8,
        pub link_layer: u8,
        pub flags: u8,
        pub port_cap_flags2: u16,
    }
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut ibv_device);
type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;

/// IBV_ACCESS_LOCAL_WRITE: enough to pin and register, which is what memlock limits.
const ACCESS_LOCAL_WRITE: c_int = 1;

struct Api {
    get_device_list: Symbol<GetDeviceList>,
    free_device_list: Symbol<FreeDeviceList>,
    get_device_name: Symbol<GetDeviceName>,
    open_device: Symbol<OpenDevice>,
    close_device: Symbol<CloseDevice>,
    query_device: Symbol<QueryDevice>,
    query_port: Symbol<QueryPort>,
    alloc_pd: Symbol<AllocPd>,
    dealloc_pd: Symbol<DeallocPd>,
    reg_mr: Symbol<RegMr>,
    dereg_mr: Symbol<DeregMr>,
}

impl Api {
    fn load(lib: &Library) -> Result<Api, FactError> {
        Ok(Api {
            get_device_list: lib.symbol("ibv_get_device_list")?,
            free_device_list: lib.symbol("ibv_free_device_list")?,
            get_device_name: lib.symbol("ibv_get_device_name")?,
            open_device: lib.symbol("ibv_open_device")?,
            close_device: lib.symbol("ibv_close_device")?,
            query_device: lib.symbol("ibv_query_device")?,
            query_port: lib.symbol("ibv_query_port")?,
            alloc_pd: lib.symbol("ibv_alloc_pd")?,
            dealloc_pd: lib.symbol("ibv_dealloc_pd")?,
            reg_mr: lib.symbol("ibv_reg_mr")?,
            dereg_mr: lib.symbol("ibv_dereg_mr")?,
        })
    }
}

fn errno_text(code: i32) -> String {
    crate::gather::kernel::errno_text(io::Error::from_raw_os_error(code))
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn port_state(code: u32) -> &'static str {
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

/// An anonymous mapping for the registration probe, unmapped on drop.
struct Buffer {
    addr: *mut c_void,
    len: usize,
}

impl Buffer {
    fn new(len: usize) -> Result<Buffer, String> {
        // SAFETY: a fresh private anonymous mapping owned by this value.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(errno_text(last_errno()));
        }
        Ok(Buffer { addr, len })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` and is unmapped once.
        unsafe {
            libc::munmap(self.addr, self.len);
        }
    }
}

/// Allocates a protection domain and registers `bytes` on an open device, then releases both.
fn memreg(watch: &Watch, api: &Api, name: &str, ctx: *mut ibv_context, bytes: u64) -> Observed<()> {
    let len = match usize::try_from(bytes) {
        Ok(l) => l,
        Err(_) => return Observed::Error(FactError::new("ibv_reg_mr", "size does not fit")),
    };
    // errno is read inside each call's closure: the watch's `--trace` line and lock run
    // between the call's return and the caller, and a failed write there would overwrite it.
    // SAFETY: ctx is an open context from ibv_open_device.
    let (pd, errno) = watch.call(format!("ibv_alloc_pd({name})"), || unsafe {
        let pd = (api.alloc_pd.get())(ctx);
        (pd, last_errno())
    });
    if pd.is_null() {
        return Observed::Error(FactError::new(
            format!("ibv_alloc_pd({name})"),
            errno_text(errno),
        ));
    }
    let result = match Buffer::new(len) {
        Err(e) => Observed::Error(FactError::new(format!("mmap({len})"), e)),
        Ok(buffer) => {
            let call = format!("ibv_reg_mr({name}, {len} bytes)");
            // SAFETY: pd is valid; the buffer is mapped for `len` bytes and outlives the registration.
            let (mr, errno) = watch.call(call.clone(), || unsafe {
                let mr = (api.reg_mr.get())(pd, buffer.addr, len, ACCESS_LOCAL_WRITE);
                (mr, last_errno())
            });
            if mr.is_null() {
                Observed::Error(FactError::new(call, errno_text(errno)).with_errno(errno))
            } else {
                // SAFETY: mr came from ibv_reg_mr and is deregistered once, before the buffer is unmapped.
                watch.call(format!("ibv_dereg_mr({name})"), || unsafe {
                    (api.dereg_mr.get())(mr)
                });
                Observed::Value(())
            }
        }
    };
    // SAFETY: pd came from ibv_alloc_pd; its only MR was deregistered above.
    watch.call(format!("ibv_dealloc_pd({name})"), || unsafe {
        (api.dealloc_pd.get())(pd)
    });
    result
}

/// Queries ports 1..=count of an open device.
fn query_ports(
    watch: &Watch,
    api: &Api,
    name: &str,
    ctx: *mut ibv_context,
    count: u8,
) -> Vec<VerbsPort> {
    let mut ports = Vec::new();
    for port in 1..=count {
        // SAFETY: zeroed plain struct, filled by the library.
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        let call = format!("ibv_query_port({name}, {port})");
        // SAFETY: ctx is open; the exported ibv_query_port writes the compat prefix of ibv_port_attr.
        let rc = watch.call(call.clone(), || unsafe {
            (api.query_port.get())(ctx, port, &mut pa)
        });
        ports.push(if rc == 0 {
            VerbsPort {
                port: u32::from(port),
                query: Observed::Value(()),
                state: Some(port_state(pa.state).to_string()),
                link_layer: Some(link_layer(pa.link_layer).to_string()),
                active_mtu: (1..=5)
                    .contains(&pa.active_mtu)
                    .then(|| 128 << pa.active_mtu),
            }
        } else {
            VerbsPort {
                port: u32::from(port),
                query: Observed::Error(FactError::new(call, errno_text(rc))),
                state: None,
                link_layer: None,
                active_mtu: None,
            }
        });
    }
    ports
}

/// The device's name as libibverbs gives it; `?` when it gives none.
fn device_name(api: &Api, dev: *mut ibv_device) -> String {
    // SAFETY: dev is an element of the list ibv_get_device_list returned, which is still alive.
    let name_ptr = unsafe { (api.get_device_name.get())(dev) };
    if name_ptr.is_null() {
        "?".to_string()
    } else {
        // SAFETY: libibverbs returns a NUL-terminated name owned by the device.
        unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Opens, queries and registers memory on one device; closes it again.
fn probe(watch: &Watch, api: &Api, dev: *mut ibv_device, bytes: u64) -> VerbsDevice {
    let name = device_name(api, dev);
    let mut out = VerbsDevice {
        name: name.clone(),
        open: Observed::Value(()),
        fw_ver: None,
        vendor_id: None,
        vendor_part_id: None,
        ports: Vec::new(),
        memreg: None,
    };
    // SAFETY: dev is an element of the list ibv_get_device_list returned, which is still alive.
    let (ctx, errno) = watch.call(format!("ibv_open_device({name})"), || unsafe {
        let ctx = (api.open_device.get())(dev);
        (ctx, last_errno())
    });
    if ctx.is_null() {
        out.open = Observed::Error(FactError::new(
            format!("ibv_open_device({name})"),
            errno_text(errno),
        ));
        return out;
    }
    // SAFETY: a plain C struct; all-zero is valid and the library fills it.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is open; attr is a valid out-pointer of the right type.
    let rc = watch.call(format!("ibv_query_device({name})"), || unsafe {
        (api.query_device.get())(ctx, &mut attr)
    });
    if rc == 0 {
        // SAFETY: fw_ver is a NUL-terminated char array inside attr (zeroed before the call).
        out.fw_ver = Some(
            unsafe { CStr::from_ptr(attr.fw_ver.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        )
        .filter(|s| !s.is_empty());
        out.vendor_id = Some(attr.vendor_id);
        out.vendor_part_id = Some(attr.vendor_part_id);
        out.ports = query_ports(watch, api, &name, ctx, attr.phys_port_cnt);
        out.memreg = Some(memreg(watch, api, &name, ctx, bytes));
    } else {
        out.open = Observed::Error(FactError::new(
            format!("ibv_query_device({name})"),
            errno_text(rc),
        ));
    }
    // SAFETY: ctx came from ibv_open_device; its PD and MR were released in memreg.
    watch.call(format!("ibv_close_device({name})"), || unsafe {
        (api.close_device.get())(ctx)
    });
    out
}

/// How loading libibverbs ended.
pub type Outcome = crate::gather::Outcome<VerbsFacts>;

pub fn gather(watch: &Watch, library: &str, memreg_bytes: u64) -> Outcome {
    let lib = match crate::gather::dl::load(watch, library) {
        Ok(lib) => lib,
        Err(crate::gather::dl::LoadError::Missing(why)) => return Outcome::NotFound(why),
        Err(crate::gather::dl::LoadError::Failed(e)) => return Outcome::Failed(e),
    };
    let api = match Api::load(&lib) {
        Ok(a) => a,
        Err(e) => return Outcome::Failed(e),
    };
    let mut count: c_int = 0;
    // SAFETY: count is a valid out-pointer.
    let (list, errno) = watch.call("ibv_get_device_list", || unsafe {
        let list = (api.get_device_list.get())(&mut count);
        (list, last_errno())
    });
    let devices = if list.is_null() {
        let what = if errno == libc::ENOSYS {
            " (the kernel has no RDMA verbs support: no ib_uverbs)"
        } else {
            ""
        };
        Observed::Error(FactError::new(
            "ibv_get_device_list",
            format!("{}{what}", errno_text(errno)),
        ))
    } else {
        let n = usize::try_from(count).unwrap_or(0);
        let devices = (0..n)
            .map(|i| {
                // SAFETY: the list holds `count` valid device pointers.
                let dev = unsafe { *list.add(i) };
                probe(watch, &api, dev, memreg_bytes)
            })
            .collect();
        // SAFETY: list came from ibv_get_device_list; every device opened from it was closed.
        unsafe { (api.free_device_list.get())(list) };
        Observed::Value(devices)
    };
    Outcome::Loaded(VerbsFacts {
        devices,
        memreg_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// `(C expression, value)`: the struct's size and every field's offset, for a
    /// Rust type declared with C's struct name `$c` and fields.
    macro_rules! layout {
        ($c:literal, $t:ty; $($field:ident),*) => {{
            let mut v = vec![(format!("sizeof(struct {})", $c), size_of::<$t>())];
            $(v.push((
                format!("offsetof(struct {}, {})", $c, stringify!($field)),
                offset_of!($t, $field),
            ));)*
            v
        }};
    }
    macro_rules! device_attr {
        ($t:ty) => {
            layout!("ibv_device_attr", $t; fw_ver, node_guid, sys_image_guid, max_mr_size,
                page_size_cap, vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr,
                device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd,
                max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom, max_qp_init_rd_atom,
                max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp,
                max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach,
                max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge, max_pkeys,
                local_ca_ack_delay, phys_port_cnt)
        };
    }
    macro_rules! port_attr {
        ($t:ty) => {
            layout!("ibv_port_attr", $t; state, max_mtu, active_mtu, gid_tbl_len,
                port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid,
                sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width,
                active_speed, phys_state, link_layer, flags, port_cap_flags2)
        };
    }

    fn declared() -> Vec<(String, usize)> {
        let mut all = device_attr!(abi::ibv_device_attr);
        all.extend(port_attr!(abi::ibv_port_attr));
        all
    }

    #[test]
    fn the_declared_structs_match_the_installed_verbs_header() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        if !header.exists() {
            assert!(
                std::env::var_os("NCCL_PREFLIGHT_TEST_STRICT").is_none(),
                "{} is missing (libibverbs-dev) and NCCL_PREFLIGHT_TEST_STRICT is set",
                header.display()
            );
            eprintln!("skipped: {} is missing (libibverbs-dev)", header.display());
            return;
        }
        let ours = declared();
        let dir = tempfile::tempdir().unwrap();
        let mut program = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (expr, _) in &ours {
            program.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        program.push_str("    return 0;\n}\n");
        std::fs::write(dir.path().join("layout.c"), program).unwrap();
        let built = std::process::Command::new("cc")
            .arg("-o")
            .arg(dir.path().join("layout"))
            .arg(dir.path().join("layout.c"))
            .output()
            .expect("cc (build-essential) compiles the layout probe");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let run = std::process::Command::new(dir.path().join("layout"))
            .output()
            .unwrap();
        let theirs: Vec<usize> = String::from_utf8_lossy(&run.stdout)
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let differ: Vec<String> = ours
            .iter()
            .zip(&theirs)
            .filter(|((_, a), b)| a != *b)
            .map(|((expr, a), b)| format!("{expr}: declared {a}, header {b}"))
            .collect();
        assert_eq!(theirs.len(), ours.len());
        assert!(differ.is_empty(), "{differ:#?}");
        // The numbers themselves, so a header that changed in step with the
        // declarations is still noticed: Debian 12's rdma-core 44 on x86_64/aarch64.
        assert_eq!(size_of::<abi::ibv_device_attr>(), 232);
        assert_eq!(size_of::<abi::ibv_port_attr>(), 52);
        assert_eq!(offset_of!(abi::ibv_device_attr, phys_port_cnt), 227);
        assert_eq!(offset_of!(abi::ibv_port_attr, link_layer), 46);
    }

    /// rdma-sys generates its types with bindgen from the same headers.
    #[cfg(feature = "rdma-sys")]
    #[test]
    fn the_declared_structs_match_rdma_sys() {
        let mut theirs = device_attr!(rdma_sys::ibv_device_attr);
        theirs.extend(port_attr!(rdma_sys::ibv_port_attr));
        assert_eq!(declared(), theirs);
    }

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

//! libibverbs (rdma-core `libibverbs/verbs.h`), typed: the device list (freed on
//! drop), an open device (closed on drop), its attributes and ports, and a memory
//! registration probe (a protection domain and an MR on an anonymous mapping, all
//! released again). Failures carry the errno the library left (or returned), read
//! inside the watched call: the watch's `--trace` line runs between the call's
//! return and the caller, and a failed write there would overwrite errno.

use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use abi::{ibv_context, ibv_device, ibv_device_attr, ibv_port_attr};
use std::ffi::{CStr, c_char, c_int, c_void};

/// The ibverbs types this module touches, declared by hand from rdma-core's
/// `libibverbs/verbs.h` (ABI-stable since IBVERBS_1.1), as NCCL does when it is not
/// built against rdma-core (NVIDIA/nccl, src/include/ibvcore.h at b0cedcc). The handles
/// are opaque; the two structs the library fills are declared field for field. A
/// test checks every offset and the size against the installed headers (Debian's
/// libibverbs-dev), and, with the `rdma-sys` feature, against rdma-sys's bindgen types.
#[allow(non_camel_case_types)]
pub mod abi {
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

crate::vendor::dl::symbols! {
    struct Api {
        get_device_list: "ibv_get_device_list" => fn(*mut c_int) -> *mut *mut ibv_device;
        free_device_list: "ibv_free_device_list" => fn(*mut *mut ibv_device) -> ();
        get_device_name: "ibv_get_device_name" => fn(*mut ibv_device) -> *const c_char;
        open_device: "ibv_open_device" => fn(*mut ibv_device) -> *mut ibv_context;
        close_device: "ibv_close_device" => fn(*mut ibv_context) -> c_int;
        query_device: "ibv_query_device" => fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
        query_port: "ibv_query_port" => fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
        alloc_pd: "ibv_alloc_pd" => fn(*mut ibv_context) -> *mut abi::ibv_pd;
        dealloc_pd: "ibv_dealloc_pd" => fn(*mut abi::ibv_pd) -> c_int;
        reg_mr: "ibv_reg_mr" => fn(*mut abi::ibv_pd, *mut c_void, usize, c_int) -> *mut abi::ibv_mr;
        dereg_mr: "ibv_dereg_mr" => fn(*mut abi::ibv_mr) -> c_int;
    }
}

/// IBV_ACCESS_LOCAL_WRITE: enough to pin and register, which is what memlock limits.
const ACCESS_LOCAL_WRITE: c_int = 1;

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A loaded libibverbs.
pub struct Verbs<'w> {
    api: Api,
    watch: &'w Watch,
}

/// Loads libibverbs from `library`; a library without the verbs calls is `Failed`.
pub fn open<'w>(watch: &'w Watch, library: &str) -> Result<Verbs<'w>, LoadError> {
    let lib = crate::vendor::dl::load(watch, library)?;
    let api = Api::load(&lib).map_err(LoadError::Failed)?;
    Ok(Verbs { api, watch })
}

/// The devices ibv_get_device_list returned, freed on drop.
pub struct DeviceList<'v> {
    verbs: &'v Verbs<'v>,
    list: *mut *mut ibv_device,
    len: usize,
}

/// An open device (ibv_open_device), closed on drop.
pub struct Context<'v> {
    verbs: &'v Verbs<'v>,
    name: String,
    ctx: *mut ibv_context,
}

/// What ibv_query_device says of a device, of what this tool reads.
pub struct DeviceAttr {
    pub fw_ver: String,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub phys_port_cnt: u8,
}

/// What ibv_query_port says of a port, of what this tool reads (verbs.h enums as codes).
pub struct PortAttr {
    /// `enum ibv_port_state`.
    pub state: u32,
    /// `enum ibv_mtu`: 1..=5 for 256..4096 bytes.
    pub active_mtu: u32,
    /// IBV_LINK_LAYER_*.
    pub link_layer: u8,
}

/// Why the registration probe failed: the step (its call's name) and the errno, or
/// the mapping's error.
pub enum RegError {
    Errno { call: String, errno: i32 },
    Map { call: String, errno: i32 },
    TooLarge,
}

impl Verbs<'_> {
    /// ibv_get_device_list; the errno when it returns NULL (ENOSYS: no ib_uverbs).
    pub fn devices(&self) -> Result<DeviceList<'_>, i32> {
        let mut count: c_int = 0;
        // SAFETY: `struct ibv_device **ibv_get_device_list(int *num_devices)`; count is
        // a valid out-pointer.
        let (list, errno) = self.watch.call("ibv_get_device_list", || unsafe {
            let list = (self.api.get_device_list.get())(&mut count);
            (list, last_errno())
        });
        if list.is_null() {
            return Err(errno);
        }
        Ok(DeviceList {
            verbs: self,
            list,
            len: usize::try_from(count).unwrap_or(0),
        })
    }
}

impl<'v> DeviceList<'v> {
    pub fn len(&self) -> usize {
        self.len
    }

    fn device(&self, i: usize) -> Option<*mut ibv_device> {
        // SAFETY: the list holds `len` valid device pointers while it lives.
        (i < self.len).then(|| unsafe { *self.list.add(i) })
    }

    /// Device `i`'s name as libibverbs gives it; `?` when it gives none.
    pub fn name(&self, i: usize) -> String {
        let Some(dev) = self.device(i) else {
            return "?".to_string();
        };
        // SAFETY: `const char *ibv_get_device_name(struct ibv_device *)`; dev is an element
        // of the live list.
        let name_ptr = self.verbs.watch.call("ibv_get_device_name", || unsafe {
            (self.verbs.api.get_device_name.get())(dev)
        });
        if name_ptr.is_null() {
            "?".to_string()
        } else {
            // SAFETY: libibverbs returns a NUL-terminated name owned by the device.
            unsafe { CStr::from_ptr(name_ptr) }
                .to_string_lossy()
                .into_owned()
        }
    }

    /// ibv_open_device on device `i` (named `name` in the call); the errno on failure.
    pub fn open(&self, i: usize, name: &str) -> Result<Context<'v>, i32> {
        let dev = self.device(i).ok_or(libc::ENODEV)?;
        // SAFETY: `struct ibv_context *ibv_open_device(struct ibv_device *)`; dev is an
        // element of the live list.
        let (ctx, errno) = self
            .verbs
            .watch
            .call(format!("ibv_open_device({name})"), || unsafe {
                let ctx = (self.verbs.api.open_device.get())(dev);
                (ctx, last_errno())
            });
        if ctx.is_null() {
            return Err(errno);
        }
        Ok(Context {
            verbs: self.verbs,
            name: name.to_string(),
            ctx,
        })
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once; a context
        // opened from it stays valid (verbs.h: devices may be freed once opened).
        self.verbs.watch.call("ibv_free_device_list", || unsafe {
            (self.verbs.api.free_device_list.get())(self.list)
        });
    }
}

impl Context<'_> {
    /// ibv_query_device; the code it returned on failure.
    pub fn query_device(&self) -> Result<DeviceAttr, i32> {
        // SAFETY: a plain C struct; all-zero is valid and the library fills it.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; attr is a valid out-pointer of the right type.
        let rc = self
            .verbs
            .watch
            .call(format!("ibv_query_device({})", self.name), || unsafe {
                (self.verbs.api.query_device.get())(self.ctx, &mut attr)
            });
        if rc != 0 {
            return Err(rc);
        }
        Ok(DeviceAttr {
            // SAFETY: fw_ver is a NUL-terminated char array inside attr (zeroed before the call).
            fw_ver: unsafe { CStr::from_ptr(attr.fw_ver.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
            vendor_id: attr.vendor_id,
            vendor_part_id: attr.vendor_part_id,
            phys_port_cnt: attr.phys_port_cnt,
        })
    }

    /// ibv_query_port; the code it returned on failure.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, i32> {
        // SAFETY: zeroed plain struct, filled by the library.
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; the exported ibv_query_port writes the compat prefix of ibv_port_attr.
        let rc = self.verbs.watch.call(
            format!("ibv_query_port({}, {port})", self.name),
            || unsafe { (self.verbs.api.query_port.get())(self.ctx, port, &mut pa) },
        );
        if rc != 0 {
            return Err(rc);
        }
        Ok(PortAttr {
            state: pa.state,
            active_mtu: pa.active_mtu,
            link_layer: pa.link_layer,
        })
    }

    /// Allocates a protection domain and registers `bytes` of fresh anonymous memory,
    /// then releases both: what NCCL's ibv_reg_mr needs of memlock and pinning.
    pub fn register(&self, bytes: u64) -> Result<(), RegError> {
        let len = usize::try_from(bytes).map_err(|_| RegError::TooLarge)?;
        let (api, watch, name) = (&self.verbs.api, self.verbs.watch, &self.name);
        // SAFETY: `struct ibv_pd *ibv_alloc_pd(struct ibv_context *)`; ctx is open.
        let (pd, errno) = watch.call(format!("ibv_alloc_pd({name})"), || unsafe {
            let pd = (api.alloc_pd.get())(self.ctx);
            (pd, last_errno())
        });
        if pd.is_null() {
            let call = format!("ibv_alloc_pd({name})");
            return Err(RegError::Errno { call, errno });
        }
        let result = match Mapping::new(len) {
            Err(errno) => Err(RegError::Map {
                call: format!("mmap({len})"),
                errno,
            }),
            Ok(buffer) => {
                let call = format!("ibv_reg_mr({name}, {len} bytes)");
                // SAFETY: pd is valid; the buffer is mapped for `len` bytes and outlives
                // the registration.
                let (mr, errno) = watch.call(call.clone(), || unsafe {
                    let mr = (api.reg_mr.get())(pd, buffer.addr, len, ACCESS_LOCAL_WRITE);
                    (mr, last_errno())
                });
                if mr.is_null() {
                    Err(RegError::Errno { call, errno })
                } else {
                    // SAFETY: mr came from ibv_reg_mr and is deregistered once, before
                    // the buffer is unmapped.
                    watch.call(format!("ibv_dereg_mr({name})"), || unsafe {
                        (api.dereg_mr.get())(mr)
                    });
                    Ok(())
                }
            }
        };
        // SAFETY: pd came from ibv_alloc_pd; its only MR was deregistered above.
        watch.call(format!("ibv_dealloc_pd({name})"), || unsafe {
            (api.dealloc_pd.get())(pd)
        });
        result
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: ctx came from ibv_open_device and is closed once; its PD and MR were
        // released in `register`.
        self.verbs
            .watch
            .call(format!("ibv_close_device({})", self.name), || unsafe {
                (self.verbs.api.close_device.get())(self.ctx)
            });
    }
}

/// An anonymous mapping for the registration probe, unmapped on drop.
struct Mapping {
    addr: *mut c_void,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Mapping, i32> {
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
            return Err(last_errno());
        }
        Ok(Mapping { addr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` and is unmapped once.
        unsafe {
            libc::munmap(self.addr, self.len);
        }
    }
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
}

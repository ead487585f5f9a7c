//! libibverbs, dlopen'ed (rdma-sys supplies the struct layouts only): list the
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
use rdma_sys::{ibv_context, ibv_device, ibv_device_attr, ibv_mr, ibv_pd, ibv_port_attr};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::io;

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
    // SAFETY: ctx is an open context from ibv_open_device.
    let pd = watch.call(format!("ibv_alloc_pd({name})"), || unsafe {
        (api.alloc_pd.get())(ctx)
    });
    if pd.is_null() {
        return Observed::Error(FactError::new(
            format!("ibv_alloc_pd({name})"),
            errno_text(last_errno()),
        ));
    }
    let result = match Buffer::new(len) {
        Err(e) => Observed::Error(FactError::new(format!("mmap({len})"), e)),
        Ok(buffer) => {
            let call = format!("ibv_reg_mr({name}, {len} bytes)");
            // SAFETY: pd is valid; the buffer is mapped for `len` bytes and outlives the registration.
            let mr = watch.call(call.clone(), || unsafe {
                (api.reg_mr.get())(pd, buffer.addr, len, ACCESS_LOCAL_WRITE)
            });
            if mr.is_null() {
                let errno = last_errno();
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

/// Opens, queries and registers memory on one device; closes it again.
fn probe(watch: &Watch, api: &Api, dev: *mut ibv_device, bytes: u64) -> VerbsDevice {
    // SAFETY: dev is an element of the list ibv_get_device_list returned, which is still alive.
    let name_ptr = unsafe { (api.get_device_name.get())(dev) };
    let name = if name_ptr.is_null() {
        "?".to_string()
    } else {
        // SAFETY: libibverbs returns a NUL-terminated name owned by the device.
        unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned()
    };
    let mut out = VerbsDevice {
        name: name.clone(),
        open: Observed::Value(()),
        fw_ver: None,
        vendor_id: None,
        vendor_part_id: None,
        ports: Vec::new(),
        memreg: None,
    };
    // SAFETY: as above.
    let ctx = watch.call(format!("ibv_open_device({name})"), || unsafe {
        (api.open_device.get())(dev)
    });
    if ctx.is_null() {
        out.open = Observed::Error(FactError::new(
            format!("ibv_open_device({name})"),
            errno_text(last_errno()),
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
        for port in 1..=attr.phys_port_cnt {
            // SAFETY: zeroed plain struct, filled by the library.
            let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
            let call = format!("ibv_query_port({name}, {port})");
            // SAFETY: ctx is open; the exported ibv_query_port writes the compat prefix of ibv_port_attr.
            let rc = watch.call(call.clone(), || unsafe {
                (api.query_port.get())(ctx, port, &mut pa)
            });
            out.ports.push(if rc == 0 {
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
    let list = watch.call("ibv_get_device_list", || unsafe {
        (api.get_device_list.get())(&mut count)
    });
    let devices = if list.is_null() {
        let errno = last_errno();
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

//! libfabric (rdma/fabric.h): its version, its providers, and fi_getinfo for efa
//! with RDM endpoints, as aws-ofi-nccl asks. Only the head of `struct fi_info` is
//! declared (fields are only ever appended). Where to look for the library is
//! gather's business (gather::rdma::fabric); loading and calling it is here.

use crate::facts::FactError;
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use std::ffi::{CStr, c_char, c_int, c_void};

/// The head of struct fi_info (rdma/fabric.h); fields are only ever appended.
#[repr(C)]
struct FiInfo {
    next: *mut FiInfo,
    caps: u64,
    mode: u64,
    addr_format: u32,
    src_addrlen: usize,
    dest_addrlen: usize,
    src_addr: *mut c_void,
    dest_addr: *mut c_void,
    handle: *mut c_void,
    tx_attr: *mut c_void,
    rx_attr: *mut c_void,
    ep_attr: *mut FiEpAttr,
    domain_attr: *mut c_void,
    fabric_attr: *mut FiFabricAttr,
}

#[repr(C)]
struct FiEpAttr {
    /// enum fi_ep_type
    kind: c_int,
}

#[repr(C)]
struct FiFabricAttr {
    fabric: *mut c_void,
    name: *mut c_char,
    prov_name: *mut c_char,
    prov_version: u32,
    api_version: u32,
}

/// FI_EP_RDM in enum fi_ep_type.
const FI_EP_RDM: c_int = 3;
/// -FI_ENODATA: no provider matched.
const FI_ENODATA: c_int = -61;

crate::vendor::dl::symbols! {
    struct Api {
        version: "fi_version" => fn() -> u32;
        getinfo: "fi_getinfo" => fn(u32, *const c_char, *const c_char, u64, *const FiInfo, *mut *mut FiInfo) -> c_int;
        freeinfo: "fi_freeinfo" => fn(*mut FiInfo) -> ();
        dupinfo: "fi_dupinfo" => fn(*const FiInfo) -> *mut FiInfo;
    }
}

/// Provider names in an fi_info list.
fn providers(mut info: *const FiInfo) -> Vec<String> {
    let mut names = Vec::new();
    // Bounded: a provider list is tens of entries.
    for _ in 0..10_000 {
        if info.is_null() {
            break;
        }
        // SAFETY: info points into the list fi_getinfo returned, not yet freed.
        let entry = unsafe { &*info };
        if !entry.fabric_attr.is_null() {
            // SAFETY: fabric_attr is valid while the list lives; prov_name is NUL-terminated or NULL.
            let prov = unsafe { (*entry.fabric_attr).prov_name };
            if !prov.is_null() {
                // SAFETY: as above.
                names.push(
                    unsafe { CStr::from_ptr(prov) }
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        info = entry.next;
    }
    names
}

/// A loaded libfabric; it stays loaded until exit (its providers start threads and
/// hold resources).
pub struct Fabric<'w> {
    api: Api,
    watch: &'w Watch,
}

/// Why no libfabric could be used.
pub enum OpenError {
    /// dlopen gave no library (absent or broken: `LoadError` tells which).
    Load(LoadError),
    /// It loaded but lacks a call every libfabric has.
    Api(FactError),
}

/// Loads libfabric from `location`.
pub fn open<'w>(watch: &'w Watch, location: &str) -> Result<Fabric<'w>, OpenError> {
    let lib = crate::vendor::dl::load(watch, location).map_err(OpenError::Load)?;
    let api = Api::load(&lib).map_err(OpenError::Api)?;
    Ok(Fabric { api, watch })
}

impl Fabric<'_> {
    /// fi_version: FI_VERSION(major, minor), major in the high 16 bits.
    pub fn version(&self) -> u32 {
        // SAFETY: `uint32_t fi_version(void)`.
        self.watch
            .call("fi_version", || unsafe { (self.api.version.get())() })
    }

    /// Every provider fi_getinfo lists for `version` with no hints (one name per
    /// entry, repeated as libfabric lists them); empty when fi_getinfo fails.
    pub fn providers(&self, version: u32) -> Vec<String> {
        let mut info: *mut FiInfo = std::ptr::null_mut();
        // SAFETY: NULL hints list every provider; info is a valid out-pointer.
        let rc = self.watch.call("fi_getinfo", || unsafe {
            (self.api.getinfo.get())(
                version,
                std::ptr::null(),
                std::ptr::null(),
                0,
                std::ptr::null(),
                &mut info,
            )
        });
        if rc != 0 {
            return Vec::new();
        }
        let names = providers(info);
        // SAFETY: info came from fi_getinfo and is freed once.
        self.watch
            .call("fi_freeinfo", || unsafe { (self.api.freeinfo.get())(info) });
        names
    }

    /// How many efa providers fi_getinfo offers with RDM endpoints (0 for -FI_ENODATA).
    pub fn efa_rdm(&self, version: u32) -> Result<u32, FactError> {
        let api = &self.api;
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo(): a zeroed fi_info with its attribute structs.
        let hints = self.watch.call("fi_allocinfo", || unsafe {
            (api.dupinfo.get())(std::ptr::null())
        });
        if hints.is_null() {
            return Err(FactError::new("fi_allocinfo", "out of memory"));
        }
        // SAFETY: hints is a fresh fi_info whose attr pointers fi_allocinfo filled in;
        // prov_name is strdup'ed because fi_freeinfo frees it.
        unsafe {
            if !(*hints).fabric_attr.is_null() {
                (*(*hints).fabric_attr).prov_name = libc::strdup(c"efa".as_ptr());
            }
            if !(*hints).ep_attr.is_null() {
                (*(*hints).ep_attr).kind = FI_EP_RDM;
            }
        }
        let mut info: *mut FiInfo = std::ptr::null_mut();
        // SAFETY: valid hints and out-pointer.
        let rc = self.watch.call("fi_getinfo(efa, FI_EP_RDM)", || unsafe {
            (api.getinfo.get())(
                version,
                std::ptr::null(),
                std::ptr::null(),
                0,
                hints,
                &mut info,
            )
        });
        let out = if rc == 0 {
            let n = providers(info).len() as u32;
            // SAFETY: info came from fi_getinfo and is freed once.
            self.watch
                .call("fi_freeinfo", || unsafe { (api.freeinfo.get())(info) });
            Ok(n)
        } else if rc == FI_ENODATA {
            Ok(0)
        } else {
            Err(FactError::new(
                "fi_getinfo(efa, FI_EP_RDM)",
                format!("error {rc}"),
            ))
        };
        // SAFETY: hints came from fi_dupinfo and is freed once.
        self.watch
            .call("fi_freeinfo", || unsafe { (api.freeinfo.get())(hints) });
        out
    }
}

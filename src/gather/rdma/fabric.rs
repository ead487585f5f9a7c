//! libfabric, dlopen'ed from the EFA installer's directory first (its build
//! carries the efa provider; aws-ofi-nccl is linked against it), then the
//! default search path: version, providers, and fi_getinfo for efa with RDM
//! endpoints, as aws-ofi-nccl asks. A libfabric that exists but whose own
//! dependencies are missing is a common trap: every attempt keeps dlerror's text.

use crate::facts::FactError;
use crate::facts::Observed;
use crate::facts::rdma::{FabricFacts, LoadAttempt};
use crate::gather::deadline::Watch;
use crate::gather::dl::{Library, Symbol, is_missing};
use std::ffi::{CStr, c_char, c_int, c_void};

/// Where libfabric is looked for, in order (FACTS.md section 4: EFA's lives outside the default path).
pub const LOCATIONS: &[&str] = &[
    "/opt/amazon/efa/lib/libfabric.so.1",
    "/opt/amazon/efa/lib64/libfabric.so.1",
    "libfabric.so.1",
];

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

type FiVersion = unsafe extern "C" fn() -> u32;
type FiGetinfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const FiInfo,
    *mut *mut FiInfo,
) -> c_int;
type FiFreeinfo = unsafe extern "C" fn(*mut FiInfo);
type FiDupinfo = unsafe extern "C" fn(*const FiInfo) -> *mut FiInfo;

struct Api {
    version: Symbol<FiVersion>,
    getinfo: Symbol<FiGetinfo>,
    freeinfo: Symbol<FiFreeinfo>,
    dupinfo: Symbol<FiDupinfo>,
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

fn efa_rdm(watch: &Watch, api: &Api, version: u32) -> Observed<u32> {
    // SAFETY: fi_dupinfo(NULL) is fi_allocinfo(): a zeroed fi_info with its attribute structs.
    let hints = unsafe { (api.dupinfo.get())(std::ptr::null()) };
    if hints.is_null() {
        return Observed::Error(FactError::new("fi_allocinfo", "out of memory"));
    }
    // SAFETY: hints is a fresh fi_info whose attr pointers fi_allocinfo filled in; prov_name is
    // strdup'ed because fi_freeinfo frees it.
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
    let rc = watch.call("fi_getinfo(efa, FI_EP_RDM)", || unsafe {
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
        // SAFETY: info came from fi_getinfo.
        unsafe { (api.freeinfo.get())(info) };
        Observed::Value(n)
    } else if rc == FI_ENODATA {
        Observed::Value(0)
    } else {
        Observed::Error(FactError::new(
            "fi_getinfo(efa, FI_EP_RDM)",
            format!("error {rc}"),
        ))
    };
    // SAFETY: hints came from fi_dupinfo and is freed once.
    unsafe { (api.freeinfo.get())(hints) };
    out
}

/// How loading libfabric ended.
pub type Outcome = crate::gather::Outcome<FabricFacts>;

pub fn gather(watch: &Watch, locations: &[String]) -> (Outcome, Vec<LoadAttempt>) {
    let mut attempts = Vec::new();
    let mut broken = None;
    for location in locations {
        let lib = match watch.call(format!("dlopen({location})"), || Library::open(location)) {
            Ok(lib) => lib,
            Err(e) => {
                if !is_missing(location, &e.message) && broken.is_none() {
                    broken = Some(e.clone());
                }
                attempts.push(LoadAttempt {
                    library: location.clone(),
                    error: Some(e.message),
                });
                continue;
            }
        };
        attempts.push(LoadAttempt {
            library: location.clone(),
            error: None,
        });
        let api = match (|| -> Result<Api, FactError> {
            Ok(Api {
                version: lib.symbol("fi_version")?,
                getinfo: lib.symbol("fi_getinfo")?,
                freeinfo: lib.symbol("fi_freeinfo")?,
                dupinfo: lib.symbol("fi_dupinfo")?,
            })
        })() {
            Ok(a) => a,
            Err(e) => return (Outcome::Failed(e), attempts),
        };
        // SAFETY: fi_version takes no arguments.
        let version = watch.call("fi_version", || unsafe { (api.version.get())() });
        let mut info: *mut FiInfo = std::ptr::null_mut();
        // SAFETY: NULL hints list every provider; info is a valid out-pointer.
        let rc = watch.call("fi_getinfo", || unsafe {
            (api.getinfo.get())(
                version,
                std::ptr::null(),
                std::ptr::null(),
                0,
                std::ptr::null(),
                &mut info,
            )
        });
        let mut names = if rc == 0 { providers(info) } else { Vec::new() };
        if rc == 0 {
            // SAFETY: info came from fi_getinfo.
            unsafe { (api.freeinfo.get())(info) };
        }
        names.sort();
        names.dedup();
        let facts = FabricFacts {
            version: format!("{}.{}", version >> 16, version & 0xffff),
            providers: names,
            efa_rdm: efa_rdm(watch, &api, version),
        };
        // libfabric's providers start threads and hold resources; it stays loaded until exit.
        std::mem::forget(lib);
        return (Outcome::Loaded(facts), attempts);
    }
    let outcome = match broken {
        Some(e) => Outcome::Failed(e),
        None => Outcome::NotFound(
            attempts
                .iter()
                .filter_map(|a| a.error.clone())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    (outcome, attempts)
}

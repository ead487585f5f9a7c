//! Loading the vendor libraries this tool calls directly (libcuda, libcudart,
//! libibverbs, libfabric, libnccl and the NCCL net plugin) at run time, through
//! libloading: the crate's one dlopen site (NVML is loaded by nvml-wrapper, in
//! `vendor::nvml`).
//! The binary links no vendor library: their absence is a finding, not a load
//! failure.
//!
//! A [`Library`] is never unloaded, by its type: dropping it does not dlclose.
//! Unloading libcuda after cuInit is not supported (its threads keep running),
//! a net plugin may have started threads of its own, and a symbol handed out
//! must stay callable for as long as anyone holds it. The process exits soon
//! after (or, under `serve`, loads the same library again, which only bumps
//! the loader's reference count), so keeping them costs nothing.
//!
//! dlopen flags are RTLD_NOW | RTLD_LOCAL, as NCCL opens its net plugin
//! (NVIDIA/nccl v2.8.3, src/init.cc: `dlopen("libnccl-net.so", RTLD_NOW | RTLD_LOCAL)`):
//! NOW so that a library with unresolved symbols fails at load, as a finding,
//! not mid-call; LOCAL so that one vendor library's symbols never resolve
//! another's (a test's fake NVML next to the real libcuda, two libnccl copies).

use crate::facts::FactError;
use std::ffi::{CStr, c_void};
use std::mem::ManuallyDrop;

/// An open shared library, never closed (see the module docs).
pub struct Library {
    /// Never dropped on purpose: dropping a libloading library calls dlclose.
    inner: ManuallyDrop<libloading::os::unix::Library>,
    name: String,
}

/// A function pointer (or, for a data symbol, its address) of type `F` taken
/// from a `Library`. It stays valid after the `Library` value is dropped,
/// because libraries are never unloaded.
#[derive(Clone, Copy)]
pub struct Symbol<F> {
    value: F,
}

impl<F: Copy> Symbol<F> {
    /// The function pointer. `F` must be the C signature of the symbol.
    pub fn get(&self) -> F {
        self.value
    }
}

/// Declares a table of a library's functions, each by its C name and its C
/// signature, and a `load(&Library)` that resolves them all (the first missing one is
/// the error). Each row must copy the library's header: that is the safety contract
/// of [`Library::symbol`], discharged here once per symbol.
macro_rules! symbols {
    (
        $(#[$meta:meta])*
        struct $name:ident {
            $( $field:ident : $sym:literal => fn($($arg:ty),* $(,)?) -> $ret:ty; )*
        }
    ) => {
        $(#[$meta])*
        struct $name {
            $( $field: $crate::vendor::dl::Symbol<unsafe extern "C" fn($($arg),*) -> $ret>, )*
        }
        impl $name {
            fn load(lib: &$crate::vendor::dl::Library) -> Result<$name, $crate::facts::FactError> {
                Ok($name {
                    $(
                        // SAFETY: the row's signature is the C prototype of `$sym` in
                        // the library's header, as this table's declaration requires.
                        $field: unsafe { lib.symbol($sym)? },
                    )*
                })
            }
        }
    };
}
pub(crate) use symbols;

/// True when dlopen's message says `name` itself does not exist, as opposed to
/// a dependency of it ("libfabric.so.1: cannot open shared object file" when
/// loading a plugin that exists is a broken install, not an absent one).
pub fn is_missing(name: &str, message: &str) -> bool {
    message.starts_with(&format!("{name}:")) && message.contains("No such file or directory")
}

/// The file an address (a symbol) was loaded from (dladdr).
pub(crate) fn path_of(symbol: *const c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data; dladdr fills it for an address inside a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: symbol is an address in a loaded library; info is a valid out-pointer.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Why a watched dlopen gave no library.
pub enum LoadError {
    /// The library itself is not installed (dlopen's message).
    Missing(String),
    /// It exists but could not be loaded (a missing dependency, a bad ELF, ...).
    Failed(FactError),
}

/// dlopen under a deadline watch, telling an absent library from a broken one.
pub fn load(watch: &crate::vendor::deadline::Watch, name: &str) -> Result<Library, LoadError> {
    match watch.call(format!("dlopen({name})"), || Library::open(name)) {
        Ok(lib) => Ok(lib),
        Err(e) if is_missing(name, &e.message) => Err(LoadError::Missing(e.message)),
        Err(e) => Err(LoadError::Failed(e)),
    }
}

impl Library {
    /// dlopen with RTLD_NOW | RTLD_LOCAL (see the module docs for why).
    pub fn open(name: &str) -> Result<Library, FactError> {
        if name.contains('\0') {
            return Err(FactError::new(
                format!("dlopen({name})"),
                "name contains NUL",
            ));
        }
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
        // SAFETY: loading runs the library's initialisers; the libraries named here are
        // the vendor libraries (or their test fakes) whose initialisers NCCL itself runs,
        // and their finalisers never run because the library is never unloaded.
        let inner = unsafe { libloading::os::unix::Library::open(Some(name), flags) }
            .map_err(|e| FactError::new(format!("dlopen({name})"), e.to_string()))?;
        Ok(Library {
            inner: ManuallyDrop::new(inner),
            name: name.to_string(),
        })
    }

    /// Looks up `symbol` as a value of type `F`; a symbol whose address is NULL is an error.
    ///
    /// # Safety
    /// `F` must be the symbol's C type: its exact function signature (for a function)
    /// or a pointer to its type (for data). Nothing checks this: a wrong `F` makes every
    /// later call through the symbol undefined behaviour. Callers state the header they
    /// copied `F` from; [`symbols!`] declares a table of them in one place.
    pub unsafe fn symbol<F: Copy>(&self, symbol: &str) -> Result<Symbol<F>, FactError> {
        const {
            assert!(
                std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>(),
                "F must be a function or data pointer"
            )
        };
        let call = || format!("dlsym({}, {symbol})", self.name);
        if symbol.contains('\0') {
            return Err(FactError::new(call(), "name contains NUL"));
        }
        // SAFETY: the symbol is read as an untyped address, which any symbol is.
        let raw = unsafe { self.inner.get::<*mut c_void>(symbol.as_bytes()) }
            .map_err(|e| FactError::new(call(), e.to_string()))?
            .into_raw();
        if raw.is_null() {
            return Err(FactError::new(call(), "the symbol's address is NULL"));
        }
        // SAFETY: `F` is pointer-sized (checked at compile time above) and, by this
        // function's safety contract, the symbol's C type; `raw` is its non-NULL address, which
        // stays mapped because the library is never unloaded.
        let value = unsafe { std::mem::transmute_copy::<*mut c_void, F>(&raw) };
        Ok(Symbol { value })
    }
}

/// Builds the fake vendor library `source` (tests/fakes, the same sources the
/// integration tests load) into `out`, with `extra` compiler arguments.
#[cfg(test)]
pub(crate) fn build_fake_library(source: &str, out: &std::path::Path, extra: &[&str]) {
    let fakes = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakes");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(out)
        .arg(fakes.join(source))
        .args(extra)
        .arg("-lpthread")
        .output()
        .expect("cc (build-essential) builds the fake vendor libraries");
    assert!(
        built.status.success(),
        "building {source}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{CString, c_int};
    use std::path::{Path, PathBuf};

    fn build_fake_cuda(dir: &Path) -> PathBuf {
        let out = dir.join("libcuda.so.1");
        build_fake_library("fake_cuda.c", &out, &[]);
        out
    }

    /// Whether the loader still has `path` mapped (RTLD_NOLOAD loads nothing new).
    fn resident(path: &Path) -> bool {
        let c = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; RTLD_NOLOAD only looks the library up.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            return false;
        }
        // SAFETY: drops the reference RTLD_NOLOAD just took, nothing else.
        unsafe { libc::dlclose(handle) };
        true
    }

    #[test]
    fn opens_libc_and_reports_missing_libraries_and_symbols() {
        let lib = Library::open("libc.so.6").unwrap();
        // SAFETY: `pid_t getpid(void)` (unistd.h).
        let getpid: Symbol<unsafe extern "C" fn() -> libc::pid_t> =
            unsafe { lib.symbol("getpid") }.unwrap();
        // SAFETY: getpid has this signature and no preconditions.
        assert_eq!(unsafe { (getpid.get())() } as u32, std::process::id());
        // SAFETY: the lookup fails; nothing is called.
        let missing = unsafe { lib.symbol::<unsafe extern "C" fn()>("no_such_symbol_here") }
            .err()
            .unwrap();
        assert_eq!(missing.source, "dlsym(libc.so.6, no_such_symbol_here)");
        assert!(missing.message.contains("no_such_symbol_here"), "{missing}");
        let err = Library::open("libdoes-not-exist.so.9").err().unwrap();
        assert_eq!(err.source, "dlopen(libdoes-not-exist.so.9)");
        assert!(is_missing("libdoes-not-exist.so.9", &err.message), "{err}");
        assert!(!is_missing(
            "libnccl-net.so",
            "libfabric.so.1: cannot open shared object file: No such file or directory"
        ));
        let nul = Library::open("lib\0c.so.6").err().unwrap();
        assert_eq!(nul.message, "name contains NUL");
        // SAFETY: the lookup fails; nothing is called.
        let nul = unsafe { lib.symbol::<unsafe extern "C" fn()>("get\0pid") }
            .err()
            .unwrap();
        assert_eq!(nul.message, "name contains NUL");
    }

    #[test]
    fn a_symbol_stays_callable_after_its_library_value_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = build_fake_cuda(dir.path());
        assert!(!resident(&path));
        let version: Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> = {
            let lib = Library::open(path.to_str().unwrap()).unwrap();
            // SAFETY: `CUresult cuDriverGetVersion(int*)` (cuda.h).
            unsafe { lib.symbol("cuDriverGetVersion") }.unwrap()
        };
        // The Library value is gone; the library is not.
        assert!(resident(&path), "dropping a Library unloaded it");
        let mut v: c_int = 0;
        // SAFETY: `CUresult cuDriverGetVersion(int*)`; v is a valid out-pointer.
        let rc = unsafe { (version.get())(&mut v) };
        // The fake answers CUDA 12.2 when no scenario is set (tests/fakes/scenario.h).
        assert_eq!((rc, v), (0, 12020));
        // Opening it again finds the same, still-loaded library.
        let again = Library::open(path.to_str().unwrap()).unwrap();
        // SAFETY: `CUresult cuDriverGetVersion(int*)` (cuda.h).
        let same: Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
            unsafe { again.symbol("cuDriverGetVersion") }.unwrap();
        assert_eq!(same.get() as usize, version.get() as usize);
    }
}

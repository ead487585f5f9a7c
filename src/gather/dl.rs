//! A minimal dlopen/dlsym wrapper for the vendor libraries this tool calls
//! directly (libcuda, later libibverbs, libfabric, libnccl). The binary links
//! no vendor library: their absence is a finding, not a load failure.

use crate::facts::FactError;
use std::ffi::{CStr, CString, c_void};
use std::marker::PhantomData;

/// An open shared library; closed on drop.
pub struct Library {
    handle: *mut c_void,
    name: String,
}

// SAFETY: a dlopen handle may be used from any thread; glibc's dl* functions are thread-safe.
unsafe impl Send for Library {}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, read immediately.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// A function pointer of type `F` taken from a `Library`.
pub struct Symbol<F> {
    pointer: *mut c_void,
    _type: PhantomData<F>,
}

impl<F: Copy> Symbol<F> {
    /// The function pointer. `F` must be the C signature of the symbol.
    pub fn get(&self) -> F {
        // SAFETY: `F` is a function pointer type of pointer size (checked in `symbol`),
        // and the pointer came from dlsym for this symbol.
        unsafe { std::mem::transmute_copy(&self.pointer) }
    }
}

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
pub fn load(watch: &crate::gather::deadline::Watch, name: &str) -> Result<Library, LoadError> {
    match watch.call(format!("dlopen({name})"), || Library::open(name)) {
        Ok(lib) => Ok(lib),
        Err(e) if is_missing(name, &e.message) => Err(LoadError::Missing(e.message)),
        Err(e) => Err(LoadError::Failed(e)),
    }
}

impl Library {
    /// dlopen with RTLD_NOW | RTLD_LOCAL: a library with unresolved symbols fails here, not mid-call.
    pub fn open(name: &str) -> Result<Library, FactError> {
        let c = CString::new(name)
            .map_err(|_| FactError::new(format!("dlopen({name})"), "name contains NUL"))?;
        // SAFETY: `c` is a valid C string; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(FactError::new(format!("dlopen({name})"), dlerror_text()));
        }
        Ok(Library {
            handle,
            name: name.to_string(),
        })
    }

    /// Looks up `symbol`; `F` must be its C function signature.
    pub fn symbol<F: Copy>(&self, symbol: &str) -> Result<Symbol<F>, FactError> {
        assert_eq!(
            std::mem::size_of::<F>(),
            std::mem::size_of::<*mut c_void>(),
            "F must be a function pointer"
        );
        let c = CString::new(symbol).map_err(|_| FactError::new(symbol, "name contains NUL"))?;
        // SAFETY: the handle is open; `c` is a valid C string.
        let pointer = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if pointer.is_null() {
            return Err(FactError::new(
                format!("dlsym({}, {symbol})", self.name),
                dlerror_text(),
            ));
        }
        Ok(Symbol {
            pointer,
            _type: PhantomData,
        })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once.
        unsafe {
            libc::dlclose(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_libc_and_reports_missing_libraries_and_symbols() {
        let lib = Library::open("libc.so.6").unwrap();
        let getpid: Symbol<unsafe extern "C" fn() -> libc::pid_t> = lib.symbol("getpid").unwrap();
        // SAFETY: getpid has this signature and no preconditions.
        assert_eq!(unsafe { (getpid.get())() } as u32, std::process::id());
        let missing = lib
            .symbol::<unsafe extern "C" fn()>("no_such_symbol_here")
            .err()
            .unwrap();
        assert!(missing.source.contains("no_such_symbol_here"));
        let err = Library::open("libdoes-not-exist.so.9").err().unwrap();
        assert!(is_missing("libdoes-not-exist.so.9", &err.message), "{err}");
        assert!(!is_missing(
            "libnccl-net.so",
            "libfabric.so.1: cannot open shared object file: No such file or directory"
        ));
    }
}

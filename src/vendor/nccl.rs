//! The one libnccl wrapper: gather's probe (ncclGetVersion and where the library
//! lies, [`probe`]; the net plugin's tables, [`open_net_plugin`]), `bench nccl` (one
//! process, every GPU, through ncclCommInitAll) and the gang worker (one rank per
//! local GPU of a job that spans pods, through non-blocking ncclCommInitRankConfig)
//! load libnccl here and call it through a typed, mostly safe API, every call under
//! the loader's `Watch`. [`Version`] is the one reader of NCCL's version code.
//!
//! The symbols both need are resolved for every load; the ones only one kind
//! of communicator needs live in [`SingleProcess`] or [`Ranked`], so a bench
//! run does not require the multi-process calls and the gang does not require
//! ncclCommInitAll (the fake libnccl of each test exports only its own set).
//!
//! Collectives take [`DeviceBuffer`]s and the [`Gpu`] whose stream runs them,
//! not raw addresses: the element count is checked against both buffers and
//! the buffers against the GPU before NCCL sees them, and a bad call answers
//! ncclInvalidArgument as NCCL itself would. Signatures and codes follow
//! NVIDIA/nccl v2.28.9-1 src/nccl.h.in.

use crate::facts::FactError;
use crate::vendor::cuda::{DeviceBuffer, Gpu};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::{Library, LoadError, Symbol, is_missing, path_of};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

/// An ncclResult_t.
pub type Code = c_int;
/// ncclSuccess.
pub const SUCCESS: Code = 0;
/// ncclInvalidArgument: what the wrapper answers for a call whose buffers do
/// not fit, before NCCL is called.
const INVALID_ARGUMENT: Code = 4;
/// ncclInProgress: a non-blocking communicator's "queued, not done".
pub const IN_PROGRESS: Code = 7;
/// sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES in src/nccl.h.in).
const UNIQUE_ID_BYTES: usize = 128;

type RawComm = *mut c_void;
type Ptr = u64;
type Stream = *mut c_void;

/// The ncclDataType_t values the tool sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    /// ncclUint8.
    U8,
    /// ncclFloat32.
    F32,
    /// ncclFloat64.
    F64,
}

impl DataType {
    fn code(self) -> c_int {
        match self {
            DataType::U8 => 1,
            DataType::F32 => 7,
            DataType::F64 => 8,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::U8 => 1,
            DataType::F32 => 4,
            DataType::F64 => 8,
        }
    }
}

/// The ncclRedOp_t values the tool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedOp {
    /// ncclSum.
    Sum,
    /// ncclMax.
    Max,
}

impl RedOp {
    fn code(self) -> c_int {
        match self {
            RedOp::Sum => 0,
            RedOp::Max => 2,
        }
    }
}

/// ncclUniqueId, passed by value as the C struct.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    internal: [u8; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// The id whose bytes are `bytes`; None unless exactly 128 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<UniqueId> {
        let internal = <[u8; UNIQUE_ID_BYTES]>::try_from(bytes).ok()?;
        Some(UniqueId { internal })
    }

    pub fn bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.internal
    }
}

/// ncclConfig_t as of NCCL 2.17 (ncclConfig_v21700 in src/nccl.h.in). NCCL copies
/// `size` bytes of it when `version` >= 2.17.0 and reads the 2.17 fields otherwise
/// (src/init.cc parseCommConfig), so this prefix works with every later NCCL.
#[repr(C)]
struct Config {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// NCCL_CONFIG_INITIALIZER with blocking = 0 (non-blocking init, since v2.14.3-1).
fn nonblocking_config() -> Config {
    const UNDEF: c_int = c_int::MIN;
    Config {
        size: std::mem::size_of::<Config>(),
        magic: 0xcafe_beef,
        version: 21700,
        blocking: 0,
        cga_cluster_size: UNDEF,
        min_ctas: UNDEF,
        max_ctas: UNDEF,
        net_name: std::ptr::null(),
        split_share: UNDEF,
    }
}

/// A communicator: made only by an init call here, ended (destroyed or aborted)
/// by value, so it is ended at most once. It remembers its rank count, which
/// bounds the all-gather's receive buffer and the p2p peer.
///
/// NCCL may write the handle after the init call returns: a non-blocking (or
/// grouped) init keeps the caller's `ncclComm_t*` and stores the handle when its
/// job ends (NVIDIA/nccl v2.18.5-1 and v2.28.9-1 src/init.cc
/// `ncclCommInitRankFunc`: `__atomic_store_n(job->newcomm, comm, ...)`; v2.14.3-1
/// allocates through `*newcomm` in that job). So the handle lives in a slot NCCL
/// owns for the rest of the process (a few bytes per communicator, never freed)
/// and is read atomically.
pub struct Comm {
    slot: &'static AtomicPtr<c_void>,
    nranks: usize,
}

impl Comm {
    /// Slots for `n` communicators, contiguous (ncclCommInitAll fills an array).
    fn slots(n: usize) -> &'static [AtomicPtr<c_void>] {
        let slots: Box<[AtomicPtr<c_void>]> = (0..n)
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect();
        Box::leak(slots)
    }

    /// The slot's address as NCCL's `ncclComm_t*`. AtomicPtr<T> has the same
    /// in-memory representation as *mut T (std::sync::atomic::AtomicPtr docs).
    fn out(slot: &'static AtomicPtr<c_void>) -> *mut RawComm {
        slot.as_ptr()
    }

    /// The handle NCCL has written so far.
    fn raw(&self) -> RawComm {
        self.slot.load(Ordering::Acquire)
    }

    /// Whether NCCL has not (yet) given this communicator a handle.
    pub fn is_null(&self) -> bool {
        self.raw().is_null()
    }
}

crate::vendor::dl::symbols! {
    /// The calls every NCCL user here makes.
    struct Core {
        version: "ncclGetVersion" => fn(*mut c_int) -> Code;
        error_string: "ncclGetErrorString" => fn(Code) -> *const c_char;
        group_start: "ncclGroupStart" => fn() -> Code;
        group_end: "ncclGroupEnd" => fn() -> Code;
        all_reduce: "ncclAllReduce" => fn(Ptr, Ptr, usize, c_int, c_int, RawComm, Stream) -> Code;
    }
}

crate::vendor::dl::symbols! {
    /// ncclGetLastError, since NCCL 2.13: optional.
    struct LastError {
        get: "ncclGetLastError" => fn(RawComm) -> *const c_char;
    }
}

crate::vendor::dl::symbols! {
    /// ncclGetUniqueId: optional (the worker only cross-checks its layout with it).
    struct GetUniqueId {
        get: "ncclGetUniqueId" => fn(*mut UniqueId) -> Code;
    }
}

/// The calls of the set a loader needs beyond [`Core`].
pub trait Calls: Sized {
    /// Resolves the set's symbols; a missing one is an error naming it.
    fn resolve(lib: &Library) -> Result<Self, FactError>;
}

crate::vendor::dl::symbols! {
    /// One process owning every GPU: ncclCommInitAll and ncclCommDestroy (`bench nccl`).
    struct SingleProcessCalls {
        init_all: "ncclCommInitAll" => fn(*mut RawComm, c_int, *const c_int) -> Code;
        destroy: "ncclCommDestroy" => fn(RawComm) -> Code;
    }
}

/// One process owning every GPU (`bench nccl`).
pub struct SingleProcess(SingleProcessCalls);

impl Calls for SingleProcess {
    fn resolve(lib: &Library) -> Result<Self, FactError> {
        SingleProcessCalls::load(lib).map(SingleProcess)
    }
}

crate::vendor::dl::symbols! {
    /// One rank per GPU across processes.
    struct RankedCalls {
        init: "ncclCommInitRankConfig" => fn(*mut RawComm, c_int, UniqueId, c_int, *mut Config) -> Code;
        async_error: "ncclCommGetAsyncError" => fn(RawComm, *mut Code) -> Code;
        abort: "ncclCommAbort" => fn(RawComm) -> Code;
        all_gather: "ncclAllGather" => fn(Ptr, Ptr, usize, c_int, RawComm, Stream) -> Code;
        send: "ncclSend" => fn(Ptr, usize, c_int, c_int, RawComm, Stream) -> Code;
        recv: "ncclRecv" => fn(Ptr, usize, c_int, c_int, RawComm, Stream) -> Code;
    }
}

/// One rank per GPU across processes: non-blocking init, asynchronous error
/// polling, abort, all-gather and send/receive (the gang worker).
pub struct Ranked {
    unique_id: Option<GetUniqueId>,
    calls: RankedCalls,
}

impl Calls for Ranked {
    fn resolve(lib: &Library) -> Result<Self, FactError> {
        Ok(Ranked {
            unique_id: GetUniqueId::load(lib).ok(),
            calls: RankedCalls::load(lib)?,
        })
    }
}

/// A loaded libnccl with the calls of set `C`, each made under `watch`.
pub struct Nccl<'w, C> {
    core: Core,
    last_error: Option<LastError>,
    calls: C,
    library: String,
    watch: &'w Watch,
}

/// Why no libnccl was loaded.
#[derive(Debug)]
pub enum LoadFailure {
    /// No candidate is installed (the last dlopen message, or "no candidates").
    Missing(String),
    /// One exists but could not be loaded or lacks a symbol.
    Failed(FactError),
}

/// Loads the first candidate that dlopen finds (each under `watch`) and
/// resolves the core calls and set `C`'s. A candidate that exists but fails
/// ends the search: it is the library the user's job would load.
pub fn load<'w, C: Calls>(
    watch: &'w Watch,
    candidates: &[String],
) -> Result<Nccl<'w, C>, LoadFailure> {
    let mut missing = true;
    let mut last = None;
    for name in candidates {
        match watch.call(format!("dlopen({name})"), || Library::open(name)) {
            Ok(lib) => {
                // NCCL starts threads; the library is never unloaded (vendor::dl).
                return resolve(&lib)
                    .map(|(core, last_error, calls)| Nccl {
                        core,
                        last_error,
                        calls,
                        library: name.clone(),
                        watch,
                    })
                    .map_err(LoadFailure::Failed);
            }
            Err(e) => {
                missing &= is_missing(name, &e.message);
                last = Some(e);
            }
        }
    }
    match last {
        Some(e) if !missing => Err(LoadFailure::Failed(e)),
        Some(e) => Err(LoadFailure::Missing(e.to_string())),
        None => Err(LoadFailure::Missing("no candidates".into())),
    }
}

fn resolve<C: Calls>(lib: &Library) -> Result<(Core, Option<LastError>, C), FactError> {
    Ok((
        Core::load(lib)?,
        LastError::load(lib).ok(),
        C::resolve(lib)?,
    ))
}

/// A string NCCL returns: trimmed, None when NULL or empty.
fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: NCCL returns NUL-terminated strings it owns (static for
    // ncclGetErrorString, per-thread for ncclGetLastError); read at once.
    let s = unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .trim()
        .to_string();
    (!s.is_empty()).then_some(s)
}

/// Whether `buf` holds `count` elements of `dtype` and lies on `gpu`.
fn fits(buf: &DeviceBuffer<'_, '_>, count: usize, dtype: DataType, gpu: &Gpu) -> bool {
    buf.ordinal() == gpu.ordinal
        && count
            .checked_mul(dtype.size())
            .is_some_and(|bytes| bytes <= buf.len())
}

impl<C> Nccl<'_, C> {
    /// The library name that loaded.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Runs one NCCL call under the watch.
    fn call<T>(&self, name: &str, f: impl FnOnce() -> T) -> T {
        self.watch.call(name, f)
    }

    /// ncclGetVersion: the version code (22809 for 2.28.9) into `code`.
    pub fn version(&self, code: &mut c_int) -> Code {
        // SAFETY: an out-pointer to a live int.
        self.call("ncclGetVersion", || unsafe {
            (self.core.version.get())(code)
        })
    }

    /// ncclGetErrorString's text for `rc`.
    pub fn error_text(&self, rc: Code) -> Option<String> {
        // SAFETY: ncclGetErrorString takes any code and returns a static string.
        text(self.call("ncclGetErrorString", || unsafe {
            (self.core.error_string.get())(rc)
        }))
    }

    /// ncclGetLastError for the whole process (NCCL's last WARN), where the
    /// library has it.
    pub fn last_error(&self) -> Option<String> {
        let f = self.last_error.as_ref()?;
        // SAFETY: ncclGetLastError accepts NULL (the process-wide last error).
        text(self.call("ncclGetLastError", || unsafe {
            (f.get.get())(std::ptr::null_mut())
        }))
    }

    /// ncclGroupStart.
    pub fn group_start(&self) -> Code {
        // SAFETY: no arguments.
        self.call("ncclGroupStart", || unsafe {
            (self.core.group_start.get())()
        })
    }

    /// ncclGroupEnd.
    pub fn group_end(&self) -> Code {
        // SAFETY: no arguments; NCCL answers an unmatched end with an error code.
        self.call("ncclGroupEnd", || unsafe { (self.core.group_end.get())() })
    }

    /// ncclAllReduce of `count` elements from `send` into `recv` (the same
    /// buffer for in place) on `gpu`'s stream; ncclInvalidArgument when either
    /// buffer is too small or on another GPU.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        send: &DeviceBuffer<'_, '_>,
        recv: &DeviceBuffer<'_, '_>,
        count: usize,
        dtype: DataType,
        op: RedOp,
        comm: &Comm,
        gpu: &Gpu,
    ) -> Code {
        if !fits(send, count, dtype, gpu) || !fits(recv, count, dtype, gpu) || comm.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: both buffers are live allocations on `gpu` holding `count` elements
        // (checked above); the communicator came from an init call and is not ended
        // (it is ended by value); the stream is `gpu`'s.
        self.call("ncclAllReduce", || unsafe {
            (self.core.all_reduce.get())(
                send.device_ptr(),
                recv.device_ptr(),
                count,
                dtype.code(),
                op.code(),
                comm.raw(),
                gpu.stream,
            )
        })
    }
}

impl Nccl<'_, SingleProcess> {
    /// ncclCommInitAll over CUDA devices 0..n-1: the code and one communicator per device.
    pub fn init_all(&self, n: usize) -> (Code, Vec<Comm>) {
        let Ok(count) = c_int::try_from(n) else {
            return (INVALID_ARGUMENT, Vec::new());
        };
        let slots = Comm::slots(n);
        let comms = slots.iter().map(|slot| Comm { slot, nranks: n }).collect();
        let Some(first) = slots.first() else {
            return (INVALID_ARGUMENT, comms);
        };
        // SAFETY: `first` starts `n` contiguous handle slots that live for the rest of
        // the process (NCCL may fill them later); a NULL device list means devices 0..n-1.
        let rc = self.call("ncclCommInitAll", || unsafe {
            (self.calls.0.init_all.get())(Comm::out(first), count, std::ptr::null())
        });
        (rc, comms)
    }

    /// ncclCommDestroy; a communicator that init never set is left alone.
    pub fn destroy(&self, comm: Comm) -> Code {
        if comm.is_null() {
            return SUCCESS;
        }
        // SAFETY: a communicator from ncclCommInitAll, destroyed once (taken by value).
        self.call("ncclCommDestroy", || unsafe {
            (self.calls.0.destroy.get())(comm.raw())
        })
    }
}

impl Nccl<'_, Ranked> {
    /// ncclGetUniqueId, where the library has it: its code and the id.
    pub fn unique_id(&self) -> Option<(Code, UniqueId)> {
        let f = self.calls.unique_id.as_ref()?;
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: an out-pointer to a 128-byte id.
        let rc = self.call("ncclGetUniqueId", || unsafe { (f.get.get())(&mut id) });
        Some((rc, id))
    }

    /// Non-blocking ncclCommInitRankConfig for `rank` of `nranks` on the calling
    /// thread's current CUDA context; the communicator is unset when NCCL gave none.
    pub fn init_rank(&self, nranks: usize, id: UniqueId, rank: usize) -> (Code, Comm) {
        let comm = Comm {
            slot: &Comm::slots(1)[0],
            nranks,
        };
        let (Ok(n), Ok(r)) = (c_int::try_from(nranks), c_int::try_from(rank)) else {
            return (INVALID_ARGUMENT, comm);
        };
        let mut config = nonblocking_config();
        // SAFETY: the out-pointer is a handle slot that lives for the rest of the process
        // (NCCL stores into it when the non-blocking init ends); the id is passed by value;
        // the config outlives the call (NCCL copies it, src/init.cc parseCommConfig).
        let rc = self.call("ncclCommInitRankConfig", || unsafe {
            (self.calls.calls.init.get())(Comm::out(comm.slot), n, id, r, &mut config)
        });
        (rc, comm)
    }

    /// ncclCommGetAsyncError: the call's code, and the communicator's state in `state`.
    pub fn async_error(&self, comm: &Comm, state: &mut Code) -> Code {
        if comm.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: a live communicator (not ended: ending takes it by value); an
        // out-pointer to a live int.
        self.call("ncclCommGetAsyncError", || unsafe {
            (self.calls.calls.async_error.get())(comm.raw(), state)
        })
    }

    /// ncclCommAbort; a communicator that init never set is left alone.
    pub fn abort(&self, comm: Comm) -> Code {
        if comm.is_null() {
            return SUCCESS;
        }
        // SAFETY: a communicator from init, aborted once (taken by value).
        self.call("ncclCommAbort", || unsafe {
            (self.calls.calls.abort.get())(comm.raw())
        })
    }

    /// ncclAllGather of `count` bytes per rank: `recv` must hold one block per rank.
    pub fn all_gather(
        &self,
        send: &DeviceBuffer<'_, '_>,
        recv: &DeviceBuffer<'_, '_>,
        count: usize,
        comm: &Comm,
        gpu: &Gpu,
    ) -> Code {
        let total = count.saturating_mul(comm.nranks);
        if !fits(send, count, DataType::U8, gpu)
            || !fits(recv, total, DataType::U8, gpu)
            || comm.is_null()
        {
            return INVALID_ARGUMENT;
        }
        // SAFETY: `send` holds `count` bytes and `recv` `count` per rank, both live on
        // `gpu` (checked above); a live communicator; `gpu`'s stream.
        self.call("ncclAllGather", || unsafe {
            (self.calls.calls.all_gather.get())(
                send.device_ptr(),
                recv.device_ptr(),
                count,
                DataType::U8.code(),
                comm.raw(),
                gpu.stream,
            )
        })
    }

    /// ncclSend of `bytes` bytes of `buf` to rank `peer`.
    pub fn send(
        &self,
        buf: &DeviceBuffer<'_, '_>,
        bytes: usize,
        peer: usize,
        comm: &Comm,
        gpu: &Gpu,
    ) -> Code {
        self.p2p(
            ("ncclSend", &self.calls.calls.send),
            buf,
            bytes,
            peer,
            comm,
            gpu,
        )
    }

    /// ncclRecv of `bytes` bytes into `buf` from rank `peer`.
    pub fn recv(
        &self,
        buf: &DeviceBuffer<'_, '_>,
        bytes: usize,
        peer: usize,
        comm: &Comm,
        gpu: &Gpu,
    ) -> Code {
        self.p2p(
            ("ncclRecv", &self.calls.calls.recv),
            buf,
            bytes,
            peer,
            comm,
            gpu,
        )
    }

    fn p2p(
        &self,
        (name, call): (&str, &P2pCall),
        buf: &DeviceBuffer<'_, '_>,
        bytes: usize,
        peer: usize,
        comm: &Comm,
        gpu: &Gpu,
    ) -> Code {
        let Ok(peer) = c_int::try_from(peer) else {
            return INVALID_ARGUMENT;
        };
        if !fits(buf, bytes, DataType::U8, gpu) || comm.is_null() || peer as usize >= comm.nranks {
            return INVALID_ARGUMENT;
        }
        // SAFETY: `buf` holds `bytes` bytes live on `gpu` (checked above); the peer is
        // a rank of this live communicator; `gpu`'s stream. ncclSend and ncclRecv share
        // this signature (src/nccl.h.in).
        self.call(name, || unsafe {
            (call.get())(
                buf.device_ptr(),
                bytes,
                DataType::U8.code(),
                peer,
                comm.raw(),
                gpu.stream,
            )
        })
    }
}

/// ncclSend's and ncclRecv's shared signature.
type P2pCall = Symbol<unsafe extern "C" fn(Ptr, usize, c_int, c_int, RawComm, Stream) -> Code>;

/// What gather reads of a libnccl without initialising it: its version code (or why
/// ncclGetVersion gave none) and the file the loader mapped.
pub struct Probe {
    pub version: Result<i32, FactError>,
    pub path: Option<String>,
}

crate::vendor::dl::symbols! {
    /// ncclGetVersion alone: what a library must export to be probed.
    struct GetVersion {
        get: "ncclGetVersion" => fn(*mut c_int) -> Code;
    }
}

/// Loads `name` and calls ncclGetVersion, nothing else (no GPU, no thread of NCCL's).
pub fn probe(watch: &Watch, name: &str) -> Result<Probe, LoadError> {
    let lib = crate::vendor::dl::load(watch, name)?;
    let api = match GetVersion::load(&lib) {
        Ok(api) => api,
        Err(e) => {
            return Ok(Probe {
                version: Err(e),
                path: None,
            });
        }
    };
    let mut code: c_int = 0;
    // SAFETY: `ncclResult_t ncclGetVersion(int*)`; it only writes the int.
    let rc = watch.call("ncclGetVersion", || unsafe { (api.get.get())(&mut code) });
    let version = if rc == SUCCESS {
        Ok(code)
    } else {
        Err(FactError::new("ncclGetVersion", format!("ncclResult {rc}")))
    };
    Ok(Probe {
        version,
        path: path_of(api.get.get() as *const c_void),
    })
}

crate::vendor::dl::symbols! {
    /// NCCL's parameter API, 2.30 and later (NVIDIA/nccl src/nccl.h.in v2.30.7-1,
    /// "Parameter access"; the 2.31.2 and 2.32.3 wheels export the same).
    struct ParamApi {
        keys: "ncclParamGetAllParameterKeys" => fn(*mut *const *const c_char, *mut c_int) -> Code;
        get: "ncclParamGetParameter" => fn(*const c_char, *mut *const c_char, *mut c_int) -> Code;
        dump: "ncclParamDumpAll" => fn() -> ();
    }
}

/// What NCCL's parameter API answered: each registered key with the value NCCL holds
/// (ncclParamGetParameter's text, or its error code), and ncclParamDumpAll's text
/// (types, flags, where each value came from), which NCCL prints to standard output.
pub struct ParamAnswer {
    pub values: Vec<(String, Result<String, Code>)>,
    pub dump: String,
}

/// Loads `name` and asks its parameter API; `Ok(None)`: it has none (NCCL before 2.30).
/// Only for a child process of its own: the first call makes NCCL apply its settings
/// files to the process environment and load its env plugin, as it would in the trainer
/// (src/param/c_api.cc ncclParamGetAllParameterKeys reads NCCL_PARAM_DUMP_ALL through
/// the env plugin, which runs initEnv). No GPU is needed.
pub fn params(watch: &Watch, name: &str) -> Result<Option<ParamAnswer>, FactError> {
    let lib = watch.call(format!("dlopen({name})"), || Library::open(name))?;
    let Ok(api) = ParamApi::load(&lib) else {
        return Ok(None);
    };
    let mut table: *const *const c_char = std::ptr::null();
    let mut len: c_int = 0;
    // SAFETY: `ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* len)`:
    // it writes a pointer to a thread-local array of `len` NUL-terminated strings.
    let rc = watch.call("ncclParamGetAllParameterKeys", || unsafe {
        (api.keys.get())(&mut table, &mut len)
    });
    if rc != SUCCESS || table.is_null() {
        return Err(FactError::new(
            "ncclParamGetAllParameterKeys",
            format!("ncclResult {rc}"),
        ));
    }
    let count = usize::try_from(len).unwrap_or(0);
    // SAFETY: NCCL's table holds `len` entries and stays valid until the next call of
    // ncclParamGetAllParameterKeys on this thread; they are copied out before any.
    let keys: Vec<String> = (0..count)
        .filter_map(|i| text(unsafe { *table.add(i) }))
        .collect();
    let mut values = Vec::new();
    for key in keys {
        let Ok(c_key) = std::ffi::CString::new(key.clone()) else {
            continue;
        };
        let mut value: *const c_char = std::ptr::null();
        let mut value_len: c_int = 0;
        // SAFETY: `ncclParamGetParameter(const char* key, const char** value, int* len)`:
        // it writes a thread-local string, copied out before the next call.
        let rc = watch.call("ncclParamGetParameter", || unsafe {
            (api.get.get())(c_key.as_ptr(), &mut value, &mut value_len)
        });
        let answer = if rc == SUCCESS && !value.is_null() {
            // SAFETY: a NUL-terminated string NCCL owns, copied at once (not trimmed:
            // a value's blanks are its own).
            Ok(unsafe { CStr::from_ptr(value) }
                .to_string_lossy()
                .into_owned())
        } else {
            Err(rc)
        };
        values.push((key, answer));
    }
    // SAFETY: `void ncclParamDumpAll(void)` prints with printf.
    let dump = capture_stdout(|| watch.call("ncclParamDumpAll", || unsafe { (api.dump.get())() }))?;
    Ok(Some(ParamAnswer { values, dump }))
}

/// What `f` prints to file descriptor 1 (C stdio included), through a memfd put in its
/// place for the call.
fn capture_stdout(f: impl FnOnce()) -> Result<String, FactError> {
    use std::io::{Read, Seek};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let err = |what: &str| FactError::new(what, std::io::Error::last_os_error());
    // SAFETY: memfd_create(2) through syscall(2) (glibc 2.17, the release's floor, has no
    // wrapper) with a NUL-terminated name and flags; it returns a new fd or -1.
    let raw = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            c"nccl-param-dump".as_ptr(),
            libc::MFD_CLOEXEC,
        )
    };
    let Ok(raw) = i32::try_from(raw)
        .map_err(drop)
        .and_then(|r| if r < 0 { Err(()) } else { Ok(r) })
    else {
        return Err(err("memfd_create"));
    };
    // SAFETY: `raw` is a descriptor this function just opened and owns.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    // SAFETY: dup(1) returns a new descriptor for standard output, or -1.
    let saved = unsafe { libc::dup(1) };
    if saved < 0 {
        return Err(err("dup(1)"));
    }
    // SAFETY: `saved` was just returned by dup and is owned here.
    let saved = unsafe { OwnedFd::from_raw_fd(saved) };
    // SAFETY: fflush(NULL) flushes every C stream; dup2 replaces fd 1 by the memfd and,
    // after the call, by the saved descriptor again.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::dup2(file.as_raw_fd(), 1);
    }
    f();
    // SAFETY: as above.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::dup2(saved.as_raw_fd(), 1);
    }
    let mut bytes = Vec::new();
    file.rewind()
        .and_then(|_| file.take(1 << 20).read_to_end(&mut bytes))
        .map_err(|e| FactError::new("ncclParamDumpAll output", e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The newest NCCL net plugin API version a plugin may export (`ncclNetPlugin_vN`).
const NEWEST_NET_API: u32 = 16;

/// What a loaded NCCL net plugin exports: every `ncclNetPlugin_vN` table (2..=16,
/// ascending) and, of the newest, its name field and the file it lies in.
#[derive(Debug, Default)]
pub struct NetPluginTables {
    pub apis: Vec<u32>,
    pub newest_name: Option<String>,
    pub path: Option<String>,
}

/// Loads a net plugin (it stays loaded: plugins may start threads from their
/// constructors) and reads its tables. Nothing of it is initialised.
pub fn open_net_plugin(watch: &Watch, name: &str) -> Result<NetPluginTables, FactError> {
    let lib = watch.call(format!("dlopen({name})"), || Library::open(name))?;
    let mut out = NetPluginTables::default();
    for v in (2..=NEWEST_NET_API).rev() {
        // SAFETY: `ncclNetPlugin_vN` is a data symbol, an `ncclNet_vN_t` struct; only
        // its first field is read, and every version starts with `const char* name`
        // (NVIDIA/nccl v2.28.9-1 src/include/plugin/net/net_v*.h).
        let Ok(s) = (unsafe { lib.symbol::<*const *const c_char>(&format!("ncclNetPlugin_v{v}")) })
        else {
            continue;
        };
        out.apis.insert(0, v);
        if out.apis.len() > 1 {
            // Not the newest table: only its version is listed.
            continue;
        }
        let table = s.get();
        out.path = path_of(table as *const c_void);
        // SAFETY: the table's first field, `const char* name`, set statically by the plugin.
        let name_ptr = unsafe { *table };
        if !name_ptr.is_null() {
            // SAFETY: a NUL-terminated static string in the plugin.
            out.newest_name = Some(
                unsafe { CStr::from_ptr(name_ptr) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_takes_exactly_128_bytes() {
        assert!(UniqueId::from_bytes(&[0u8; 127]).is_none());
        assert!(UniqueId::from_bytes(&[0u8; 129]).is_none());
        let mut bytes = [0u8; 128];
        bytes[0] = 2;
        bytes[127] = 9;
        let id = UniqueId::from_bytes(&bytes).map(|id| *id.bytes());
        assert_eq!(id, Some(bytes));
    }

    #[test]
    fn config_matches_nccl_2_17_layout() {
        // ncclConfig_v21700 on LP64: size_t, 2 x unsigned, 4 x int, a pointer, an int
        // (padded to 8): 8 + 8 + 16 + 8 + 8.
        let c = nonblocking_config();
        assert_eq!(c.size, 48);
        assert_eq!(std::mem::size_of::<UniqueId>(), UNIQUE_ID_BYTES);
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21700, 0));
    }

    #[test]
    fn data_type_codes_and_sizes_follow_nccl_h() {
        assert_eq!(
            [DataType::U8, DataType::F32, DataType::F64].map(|d| (d.code(), d.size())),
            [(1, 1), (7, 4), (8, 8)]
        );
        assert_eq!([RedOp::Sum, RedOp::Max].map(RedOp::code), [0, 2]);
    }

    #[test]
    fn a_handle_written_after_init_returned_reaches_the_moved_communicator() {
        // What a non-blocking ncclCommInitRankConfig does: it keeps the out-pointer
        // and stores the handle when its job ends, after the Comm has moved.
        let comm = Comm {
            slot: &Comm::slots(1)[0],
            nranks: 2,
        };
        let out = Comm::out(comm.slot);
        let moved = [comm];
        assert!(moved[0].is_null());
        let mut pretend = 0u8;
        // SAFETY: `out` is the slot's address, alive for the process; no other thread
        // touches it in this test.
        unsafe { *out = (&raw mut pretend).cast() };
        assert!(!moved[0].is_null());
        // ncclCommInitAll fills an array: the slots are contiguous.
        let slots = Comm::slots(3);
        // SAFETY: pointer arithmetic inside one allocation of three slots.
        assert_eq!(Comm::out(&slots[2]), unsafe { Comm::out(&slots[0]).add(2) });
    }

    #[test]
    fn load_tells_missing_from_broken() {
        let watch = Watch::default();
        let none: Result<Nccl<SingleProcess>, _> = load(&watch, &[]);
        assert!(matches!(none, Err(LoadFailure::Missing(m)) if m == "no candidates"));
        let absent: Result<Nccl<Ranked>, _> =
            load(&watch, &["libnccl-not-installed-here.so.9".to_string()]);
        assert!(
            matches!(absent, Err(LoadFailure::Missing(ref m)) if m.contains("libnccl-not-installed-here")),
            "{:?}",
            absent.err()
        );
        // libc exists but has no NCCL symbol: a broken library, naming the symbol.
        let wrong: Result<Nccl<Ranked>, _> = load(&watch, &["libc.so.6".to_string()]);
        assert!(
            matches!(wrong, Err(LoadFailure::Failed(ref e)) if e.to_string().contains("ncclGetVersion")),
            "{:?}",
            wrong.err()
        );
    }
}

//! The CUDA driver API (libcuda.so.1), loaded once here for every user: gather's
//! probe (cuInit, device count, PCI bus ids and peer access, [`Cuda`]) and the
//! benches and the gang worker (primary contexts, device memory, streams, events
//! and copies, [`Driver`]). Every call goes through the `Watch`, so a hung GPU is
//! named on time. Signatures and codes follow cuda.h (CUDA 12); the driver applies
//! CUDA_VISIBLE_DEVICES itself, so ordinals here are the process's CUDA ordinals.
//!
//! cuInit fails with CUDA_ERROR_SYSTEM_NOT_READY (802) on an NVSwitch system whose
//! fabric manager is not running, which NVML does not show: so the probe keeps the
//! code, and only a [`Driver`] requires success.

use crate::facts::{FactError, FailureKind};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::{Library, LoadError, Symbol};
use std::ffi::{CStr, c_char, c_float, c_int, c_uint, c_void};
use std::marker::PhantomData;

pub type Context = *mut c_void;
pub type Stream = *mut c_void;
type RawEvent = *mut c_void;

/// A CUDA event created by `Driver::event`.
#[derive(Debug, Clone, Copy)]
pub struct Event(RawEvent);
type DevicePtr = u64;

/// A CUresult (cuda.h `cudaError_enum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub i32);

impl Status {
    pub const SUCCESS: Status = Status(0);
    /// cuStreamQuery's "work still queued".
    pub const NOT_READY: Status = Status(600);
    /// cuCtxEnablePeerAccess when it was already enabled: not an error here.
    const PEER_ACCESS_ALREADY_ENABLED: Status = Status(704);
}

/// CUresult names for the codes this tool reports (cuda.h).
pub fn result_name(code: i32) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        35 => "CUDA_ERROR_INSUFFICIENT_DRIVER",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        600 => "CUDA_ERROR_NOT_READY",
        704 => "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "CUDA_ERROR (unlisted code)",
    }
}

type R = c_int;

crate::vendor::dl::symbols! {
    /// The calls gather's probe makes: required of every libcuda.
    struct Probe {
        init: "cuInit" => fn(c_uint) -> R;
        driver_version: "cuDriverGetVersion" => fn(*mut c_int) -> R;
        device_count: "cuDeviceGetCount" => fn(*mut c_int) -> R;
        device_get: "cuDeviceGet" => fn(*mut c_int, c_int) -> R;
        bus_id: "cuDeviceGetPCIBusId" => fn(*mut c_char, c_int, c_int) -> R;
        can_access_peer: "cuDeviceCanAccessPeer" => fn(*mut c_int, c_int, c_int) -> R;
    }
}

crate::vendor::dl::symbols! {
    /// The calls a [`Driver`] makes beyond the probe's.
    struct Api {
        primary_retain: "cuDevicePrimaryCtxRetain" => fn(*mut Context, c_int) -> R;
        set_current: "cuCtxSetCurrent" => fn(Context) -> R;
        enable_peer: "cuCtxEnablePeerAccess" => fn(Context, c_uint) -> R;
        mem_alloc: "cuMemAlloc_v2" => fn(*mut DevicePtr, usize) -> R;
        mem_free: "cuMemFree_v2" => fn(DevicePtr) -> R;
        memset_d32: "cuMemsetD32Async" => fn(DevicePtr, c_uint, usize, Stream) -> R;
        copy_peer: "cuMemcpyPeerAsync" => fn(DevicePtr, Context, DevicePtr, Context, usize, Stream) -> R;
        copy_dtoh: "cuMemcpyDtoH_v2" => fn(*mut c_void, DevicePtr, usize) -> R;
        copy_htod: "cuMemcpyHtoD_v2" => fn(DevicePtr, *const c_void, usize) -> R;
        stream_create: "cuStreamCreate" => fn(*mut Stream, c_uint) -> R;
        stream_query: "cuStreamQuery" => fn(Stream) -> R;
        stream_sync: "cuStreamSynchronize" => fn(Stream) -> R;
        stream_wait: "cuStreamWaitEvent" => fn(Stream, RawEvent, c_uint) -> R;
        event_create: "cuEventCreate" => fn(*mut RawEvent, c_uint) -> R;
        event_record: "cuEventRecord" => fn(RawEvent, Stream) -> R;
        event_sync: "cuEventSynchronize" => fn(RawEvent) -> R;
        event_elapsed: "cuEventElapsedTime" => fn(*mut c_float, RawEvent, RawEvent) -> R;
    }
}

fn check(call: &str, rc: R) -> Result<(), FactError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FactError::new(call, format!("{} ({rc})", result_name(rc))))
    }
}

/// A CUdevice handle from cuDeviceGet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device(c_int);

/// libcuda loaded with the probe's calls; not yet initialised.
pub struct Cuda<'w> {
    probe: Probe,
    lib: Library,
    watch: &'w Watch,
}

/// Loads `library`: `Missing` when it is not installed; `Failed` (kind `Unloadable`)
/// when it is there but not loadable or lacks the driver API (a stub, or not the
/// driver's). gather::gpu re-marks dlopen's ENOMEM as this process's own limit.
pub fn load<'w>(watch: &'w Watch, library: &str) -> Result<Cuda<'w>, LoadError> {
    let lib = match crate::vendor::dl::load(watch, library) {
        Ok(lib) => lib,
        Err(LoadError::Failed(e)) => {
            return Err(LoadError::Failed(e.with_kind(FailureKind::Unloadable)));
        }
        Err(missing) => return Err(missing),
    };
    match Probe::load(&lib) {
        Ok(probe) => Ok(Cuda { probe, lib, watch }),
        Err(e) => Err(LoadError::Failed(e.with_kind(FailureKind::Unloadable))),
    }
}

impl<'w> Cuda<'w> {
    fn run(&self, call: impl Into<String>, f: impl FnOnce() -> R) -> Result<(), FactError> {
        let call = call.into();
        let rc = self.watch.call(call.clone(), f);
        check(&call, rc)
    }

    fn int_out(
        &self,
        call: &str,
        f: &Symbol<unsafe extern "C" fn(*mut c_int) -> R>,
    ) -> Result<i32, FactError> {
        let mut value: c_int = 0;
        // SAFETY: `CUresult f(int*)` (cuda.h); `value` is a valid out-pointer.
        self.run(call, || unsafe { (f.get())(&mut value) })?;
        Ok(value)
    }

    /// cuInit(0): its status, kept even when it failed (802 names the fabric manager).
    pub fn init(&self) -> Status {
        // SAFETY: `CUresult cuInit(unsigned int Flags)`; flags must be 0.
        Status(
            self.watch
                .call("cuInit", || unsafe { (self.probe.init.get())(0) }),
        )
    }

    /// cuDriverGetVersion: the CUDA version the driver supports (12020 for 12.2).
    pub fn driver_version(&self) -> Result<i32, FactError> {
        self.int_out("cuDriverGetVersion", &self.probe.driver_version)
    }

    /// cuDeviceGetCount (after a successful `init`).
    pub fn device_count(&self) -> Result<u32, FactError> {
        Ok(self
            .int_out("cuDeviceGetCount", &self.probe.device_count)?
            .max(0) as u32)
    }

    /// cuDeviceGet for a CUDA ordinal.
    pub fn device(&self, ordinal: u32) -> Result<Device, FactError> {
        let n = c_int::try_from(ordinal).map_err(|_| {
            FactError::new(format!("cuDeviceGet({ordinal})"), "ordinal out of range")
        })?;
        let mut dev: c_int = 0;
        // SAFETY: `CUresult cuDeviceGet(CUdevice*, int)`; CUdevice is an int.
        self.run(format!("cuDeviceGet({ordinal})"), || unsafe {
            (self.probe.device_get.get())(&mut dev, n)
        })?;
        Ok(Device(dev))
    }

    /// cuDeviceGetPCIBusId as the driver writes it (`0000:10:1C.0`); `ordinal` names the call.
    pub fn pci_bus_id(&self, ordinal: u32, dev: Device) -> Result<String, FactError> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: the buffer is 64 bytes and its length is passed; the driver
        // NUL-terminates within it.
        self.run(format!("cuDeviceGetPCIBusId({ordinal})"), || unsafe {
            (self.probe.bus_id.get())(buf.as_mut_ptr(), buf.len() as c_int, dev.0)
        })?;
        // SAFETY: zero-initialised and NUL-terminated within its length (length passed).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// cuDeviceCanAccessPeer(a, b); `names` are the ordinals for the call's name.
    pub fn can_access_peer(
        &self,
        names: (u32, u32),
        a: Device,
        b: Device,
    ) -> Result<bool, FactError> {
        let mut can: c_int = 0;
        // SAFETY: `CUresult cuDeviceCanAccessPeer(int*, CUdevice, CUdevice)`.
        self.run(
            format!("cuDeviceCanAccessPeer({}, {})", names.0, names.1),
            || unsafe { (self.probe.can_access_peer.get())(&mut can, a.0, b.0) },
        )?;
        Ok(can != 0)
    }
}

/// A loaded, initialised CUDA driver.
pub struct Driver<'w> {
    cuda: Cuda<'w>,
    api: Api,
    watch: &'w Watch,
}

/// How opening the driver ended.
pub enum Opened<'w> {
    /// libcuda is not on this machine: nothing to measure.
    NotFound(String),
    Failed(FactError),
    Ready(Driver<'w>),
}

/// One GPU as the benches use it: its primary context and a stream on it.
pub struct Gpu {
    pub ordinal: u32,
    pub device: Device,
    pub bus_id: String,
    pub context: Context,
    pub stream: Stream,
}

impl<'w> Driver<'w> {
    pub fn open(watch: &'w Watch, library: &str) -> Opened<'w> {
        let cuda = match load(watch, library) {
            Ok(cuda) => cuda,
            Err(LoadError::Missing(why)) => return Opened::NotFound(why),
            Err(LoadError::Failed(e)) => return Opened::Failed(e),
        };
        let api = match Api::load(&cuda.lib) {
            Ok(api) => api,
            Err(e) => return Opened::Failed(e),
        };
        // The library is never unloaded (vendor::dl): libcuda after cuInit must not be.
        match cuda.init() {
            Status::SUCCESS => Opened::Ready(Driver { cuda, api, watch }),
            Status(rc) => Opened::Failed(FactError::new(
                "cuInit",
                format!("{} ({rc})", result_name(rc)),
            )),
        }
    }

    /// Runs one driver call under the watch and turns its CUresult into a Result.
    fn run(&self, call: impl Into<String>, f: impl FnOnce() -> R) -> Result<(), FactError> {
        let call = call.into();
        let rc = self.watch.call(call.clone(), f);
        check(&call, rc)
    }

    /// Every visible device with its primary context current-able and a non-blocking stream.
    pub fn gpus(&self) -> Result<Vec<Gpu>, FactError> {
        let mut gpus = Vec::new();
        for ordinal in 0..self.cuda.device_count()? {
            let dev = self.cuda.device(ordinal)?;
            let bus = self.cuda.pci_bus_id(ordinal, dev)?;
            let mut context: Context = std::ptr::null_mut();
            // SAFETY: `cuDevicePrimaryCtxRetain(CUcontext*, CUdevice)`; `dev` is from cuDeviceGet.
            self.run(format!("cuDevicePrimaryCtxRetain({ordinal})"), || unsafe {
                (self.api.primary_retain.get())(&mut context, dev.0)
            })?;
            let mut gpu = Gpu {
                ordinal,
                device: dev,
                bus_id: crate::facts::gpu::normalize_bus_id(&bus),
                context,
                stream: std::ptr::null_mut(),
            };
            self.make_current(&gpu)?;
            let mut stream: Stream = std::ptr::null_mut();
            // SAFETY: `cuStreamCreate(CUstream*, unsigned)`; 1 is CU_STREAM_NON_BLOCKING.
            self.run(format!("cuStreamCreate({ordinal})"), || unsafe {
                (self.api.stream_create.get())(&mut stream, 1)
            })?;
            gpu.stream = stream;
            gpus.push(gpu);
        }
        Ok(gpus)
    }

    pub fn make_current(&self, gpu: &Gpu) -> Result<(), FactError> {
        // SAFETY: the context was retained by `gpus`.
        self.run(format!("cuCtxSetCurrent({})", gpu.ordinal), || unsafe {
            (self.api.set_current.get())(gpu.context)
        })
    }

    pub fn can_access_peer(&self, a: &Gpu, b: &Gpu) -> Result<bool, FactError> {
        self.cuda
            .can_access_peer((a.ordinal, b.ordinal), a.device, b.device)
    }

    /// Lets `from` reach `to`'s memory (already enabled is fine).
    pub fn enable_peer(&self, from: &Gpu, to: &Gpu) -> Result<(), FactError> {
        self.make_current(from)?;
        let call = format!("cuCtxEnablePeerAccess({} -> {})", from.ordinal, to.ordinal);
        // SAFETY: both contexts were retained; flags must be 0.
        let rc = self.watch.call(call.clone(), || unsafe {
            (self.api.enable_peer.get())(to.context, 0)
        });
        if Status(rc) == Status::PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(&call, rc)
    }

    /// Whether `gpu`'s stream has finished its queued work (cuStreamQuery: NOT_READY
    /// is "not yet", any other failure an error).
    pub fn stream_done(&self, gpu: &Gpu) -> Result<bool, FactError> {
        let call = format!("cuStreamQuery({})", gpu.ordinal);
        // SAFETY: `CUresult cuStreamQuery(CUstream)`; the stream was created by `gpus`.
        let rc = self.watch.call(call.clone(), || unsafe {
            (self.api.stream_query.get())(gpu.stream)
        });
        if Status(rc) == Status::NOT_READY {
            return Ok(false);
        }
        check(&call, rc).map(|()| true)
    }

    /// Copies all of `bytes` into the start of `dst` (synchronous); `dst` must be on
    /// `gpu` and at least as long.
    pub fn upload(&self, gpu: &Gpu, dst: DeviceSlice<'_>, bytes: &[u8]) -> Result<(), FactError> {
        let call = format!("cuMemcpyHtoD({})", gpu.ordinal);
        dst.on(gpu, &call)?;
        if bytes.len() > dst.bytes {
            return Err(FactError::new(
                call,
                format!("{} bytes into a buffer of {}", bytes.len(), dst.bytes),
            ));
        }
        self.make_current(gpu)?;
        // SAFETY: `dst` lies inside a live allocation on `gpu` (DeviceSlice's invariant)
        // holding at least `bytes.len()` bytes (checked above); `bytes` is readable.
        self.run(call, || unsafe {
            (self.api.copy_htod.get())(dst.ptr, bytes.as_ptr().cast(), bytes.len())
        })
    }

    /// Allocates `bytes` on `gpu` (made current).
    pub fn alloc<'d>(&'d self, gpu: &Gpu, bytes: usize) -> Result<DeviceBuffer<'d, 'w>, FactError> {
        self.make_current(gpu)?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: `cuMemAlloc_v2(CUdeviceptr*, size_t)`.
        self.run(
            format!("cuMemAlloc({}, {bytes} bytes)", gpu.ordinal),
            || unsafe { (self.api.mem_alloc.get())(&mut ptr, bytes) },
        )?;
        Ok(DeviceBuffer {
            driver: self,
            ordinal: gpu.ordinal,
            context: gpu.context,
            ptr,
            bytes,
        })
    }

    /// Fills `dst` with the 32-bit `value` on `gpu`'s stream; `dst` must be on `gpu`
    /// and a whole number of words long.
    pub fn fill(&self, gpu: &Gpu, dst: DeviceSlice<'_>, value: u32) -> Result<(), FactError> {
        let call = format!("cuMemsetD32Async({})", gpu.ordinal);
        dst.on(gpu, &call)?;
        if !dst.bytes.is_multiple_of(4) {
            return Err(FactError::new(
                call,
                format!("{} bytes is not a whole number of 32-bit words", dst.bytes),
            ));
        }
        // SAFETY: `dst` lies inside a live allocation on `gpu` (DeviceSlice's invariant)
        // and holds `bytes / 4` words; the stream is `gpu`'s.
        self.run(call, || unsafe {
            (self.api.memset_d32.get())(dst.ptr, value, dst.bytes / 4, gpu.stream)
        })
    }

    /// Queues a copy of all of `src` into the start of `dst` on `on`'s stream;
    /// `dst` must be at least as long as `src`.
    pub fn copy_peer(
        &self,
        on: &Gpu,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
    ) -> Result<(), FactError> {
        let call = format!("cuMemcpyPeerAsync({} -> {})", src.ordinal, dst.ordinal);
        if dst.bytes < src.bytes {
            return Err(FactError::new(
                call,
                format!(
                    "{} bytes do not fit in the {}-byte destination",
                    src.bytes, dst.bytes
                ),
            ));
        }
        // SAFETY: both slices lie inside live allocations (DeviceSlice's invariant), in
        // the contexts they name; `dst` holds at least `src.bytes`.
        self.run(call, || unsafe {
            (self.api.copy_peer.get())(
                dst.ptr,
                dst.context,
                src.ptr,
                src.context,
                src.bytes,
                on.stream,
            )
        })
    }

    /// Copies the start of `src` into all of `out` (synchronous); `src` must hold
    /// at least `out.len()` bytes.
    pub fn read_back(&self, src: DeviceSlice<'_>, out: &mut [u8]) -> Result<(), FactError> {
        let call = format!("cuMemcpyDtoH({})", src.ordinal);
        if out.len() > src.bytes {
            return Err(FactError::new(
                call,
                format!(
                    "{} bytes asked of a {}-byte device range",
                    out.len(),
                    src.bytes
                ),
            ));
        }
        // SAFETY: the context is retained (the slice's buffer came from `alloc`).
        self.run(format!("cuCtxSetCurrent({})", src.ordinal), || unsafe {
            (self.api.set_current.get())(src.context)
        })?;
        // SAFETY: `out` is writable for its length; `src` lies inside a live allocation
        // and holds at least that many bytes (checked above).
        self.run(call, || unsafe {
            (self.api.copy_dtoh.get())(out.as_mut_ptr().cast(), src.ptr, out.len())
        })
    }

    pub fn sync(&self, gpu: &Gpu) -> Result<(), FactError> {
        // SAFETY: the stream was created by `gpus`.
        self.run(format!("cuStreamSynchronize({})", gpu.ordinal), || unsafe {
            (self.api.stream_sync.get())(gpu.stream)
        })
    }

    pub fn event(&self, gpu: &Gpu) -> Result<Event, FactError> {
        self.make_current(gpu)?;
        let mut event: RawEvent = std::ptr::null_mut();
        // SAFETY: `cuEventCreate(CUevent*, unsigned)`; 0 is the default (timing) flag.
        self.run(format!("cuEventCreate({})", gpu.ordinal), || unsafe {
            (self.api.event_create.get())(&mut event, 0)
        })?;
        Ok(Event(event))
    }

    pub fn record(&self, event: Event, gpu: &Gpu) -> Result<(), FactError> {
        // SAFETY: the event and stream belong to live contexts.
        self.run(format!("cuEventRecord({})", gpu.ordinal), || unsafe {
            (self.api.event_record.get())(event.0, gpu.stream)
        })
    }

    /// Makes `gpu`'s stream wait for `event` (which may belong to another GPU).
    pub fn wait(&self, gpu: &Gpu, event: Event) -> Result<(), FactError> {
        // SAFETY: the event and stream belong to live contexts; flags 0.
        self.run(format!("cuStreamWaitEvent({})", gpu.ordinal), || unsafe {
            (self.api.stream_wait.get())(gpu.stream, event.0, 0)
        })
    }

    /// Milliseconds between two events recorded on the same GPU, after `end` completes.
    pub fn elapsed_ms(&self, gpu: &Gpu, start: Event, end: Event) -> Result<f64, FactError> {
        // SAFETY: the event was recorded.
        self.run(format!("cuEventSynchronize({})", gpu.ordinal), || unsafe {
            (self.api.event_sync.get())(end.0)
        })?;
        let mut ms: c_float = 0.0;
        // SAFETY: both events were recorded on the same context and have completed.
        self.run(format!("cuEventElapsedTime({})", gpu.ordinal), || unsafe {
            (self.api.event_elapsed.get())(&mut ms, start.0, end.0)
        })?;
        Ok(f64::from(ms))
    }
}

/// Device memory on one GPU, freed on drop. The driver calls take it (or a
/// [`DeviceSlice`] of it) rather than a raw address, so every range they touch
/// is checked against the allocation.
pub struct DeviceBuffer<'d, 'w> {
    driver: &'d Driver<'w>,
    ordinal: u32,
    context: Context,
    ptr: DevicePtr,
    bytes: usize,
}

impl DeviceBuffer<'_, '_> {
    /// The allocation's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// The CUDA ordinal of the GPU the buffer lives on.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// All of the buffer.
    pub fn all(&self) -> DeviceSlice<'_> {
        DeviceSlice {
            ordinal: self.ordinal,
            context: self.context,
            ptr: self.ptr,
            bytes: self.bytes,
            _buffer: PhantomData,
        }
    }

    /// The longest prefix that is a whole number of 32-bit words (what `fill` takes).
    pub fn words(&self) -> DeviceSlice<'_> {
        DeviceSlice {
            bytes: self.bytes / 4 * 4,
            ..self.all()
        }
    }

    /// `bytes` bytes from `offset`; an error when the range leaves the buffer.
    pub fn slice(&self, offset: usize, bytes: usize) -> Result<DeviceSlice<'_>, FactError> {
        match sub_range(self.bytes, offset, bytes) {
            Some(start) => Ok(DeviceSlice {
                ptr: self.ptr + start,
                bytes,
                ..self.all()
            }),
            None => Err(FactError::new(
                format!("device buffer on GPU {}", self.ordinal),
                format!(
                    "bytes {offset}..+{bytes} lie outside its {} bytes",
                    self.bytes
                ),
            )),
        }
    }

    /// The device address, for a vendor call that takes device memory and its
    /// length separately (ncclAllReduce): the caller passes at most `len()` bytes.
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
}

/// The device offset of `offset..offset + bytes` inside an allocation of `len`
/// bytes, or None when that range does not lie inside it.
fn sub_range(len: usize, offset: usize, bytes: usize) -> Option<DevicePtr> {
    let end = offset.checked_add(bytes)?;
    (end <= len).then_some(offset as DevicePtr)
}

/// A checked range of a live [`DeviceBuffer`], borrowed from it.
#[derive(Clone, Copy)]
pub struct DeviceSlice<'b> {
    ordinal: u32,
    context: Context,
    ptr: DevicePtr,
    bytes: usize,
    _buffer: PhantomData<&'b ()>,
}

impl DeviceSlice<'_> {
    /// An error naming `call` unless this range is on `gpu`.
    fn on(&self, gpu: &Gpu, call: &str) -> Result<(), FactError> {
        if self.ordinal == gpu.ordinal {
            Ok(())
        } else {
            Err(FactError::new(
                call,
                format!("the device range is on GPU {}", self.ordinal),
            ))
        }
    }
}

impl Drop for DeviceBuffer<'_, '_> {
    fn drop(&mut self) {
        let api = &self.driver.api;
        // SAFETY: the context is retained; the pointer came from cuMemAlloc. A failure
        // here leaves memory to the process's exit, so the result is not checked.
        let _ = self.driver.watch.call("cuMemFree", || unsafe {
            (api.set_current.get())(self.context);
            (api.mem_free.get())(self.ptr)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sub_ranges_stay_inside_the_allocation() {
        assert_eq!(sub_range(16, 0, 16), Some(0));
        assert_eq!(sub_range(16, 4, 8), Some(4));
        assert_eq!(sub_range(16, 16, 0), Some(16));
        assert_eq!(sub_range(16, 12, 8), None);
        assert_eq!(sub_range(16, 17, 0), None);
        assert_eq!(sub_range(16, usize::MAX, 2), None);
    }

    /// What the driver calls did on the fake libcuda: the bytes read back, then
    /// each refused call's error.
    fn exercise(watch: &Watch, library: &str) -> Result<(Vec<u8>, Vec<String>), FactError> {
        let driver = match Driver::open(watch, library) {
            Opened::Ready(d) => d,
            Opened::NotFound(why) => return Err(FactError::new("open", why)),
            Opened::Failed(e) => return Err(e),
        };
        let gpus = driver.gpus()?;
        let (g0, g1) = (&gpus[0], &gpus[1]);
        let a = driver.alloc(g0, 16)?;
        let b = driver.alloc(g1, 8)?;
        driver.fill(g0, a.all(), 0x0101_0101)?;
        driver.fill(g0, a.slice(4, 4)?, 0x0202_0202)?;
        driver.fill(g1, b.all(), 0)?;
        driver.copy_peer(g0, b.all(), a.slice(4, 8)?)?;
        driver.sync(g0)?;
        let mut back = vec![0u8; 8];
        driver.read_back(b.all(), &mut back)?;
        let refused = [
            a.slice(12, 8).map(|_| ()),
            a.slice(usize::MAX, 2).map(|_| ()),
            driver.fill(g1, a.all(), 0),
            a.slice(0, 6).and_then(|s| driver.fill(g0, s, 0)),
            driver.copy_peer(g0, b.all(), a.all()),
            b.slice(4, 4)
                .and_then(|s| driver.read_back(s, &mut [0u8; 8])),
        ];
        let errors = refused
            .into_iter()
            .map(|r| match r {
                Ok(()) => "accepted".to_string(),
                Err(e) => e.to_string(),
            })
            .collect();
        Ok((back, errors))
    }

    #[test]
    fn device_buffers_check_every_range_against_their_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let scenario = dir.path().join("gpu.scenario");
        std::fs::write(
            &scenario,
            "gpu 0000:10:1c.0 9.0 143771 0 0-15 GPU-0a NVIDIA H200\n\
             gpu 0000:20:1c.0 9.0 143771 0 0-15 GPU-1b NVIDIA H200\n",
        )
        .unwrap();
        let library = dir.path().join("libcuda.so.1");
        let define = format!("-DFAKE_GPU_SCENARIO_FILE=\"{}\"", scenario.display());
        crate::vendor::dl::build_fake_library("fake_cuda.c", &library, &[&define]);
        let library = library.to_str().unwrap().to_string();
        let (back, errors) =
            crate::vendor::deadline::run("t", Duration::from_secs(60), false, move |w| {
                exercise(w, &library)
            })
            .unwrap()
            .unwrap();
        // Bytes 4..12 of GPU 0's buffer: one word of 0x02, one of 0x01.
        assert_eq!(back, [2, 2, 2, 2, 1, 1, 1, 1]);
        assert_eq!(
            errors,
            [
                "device buffer on GPU 0: bytes 12..+8 lie outside its 16 bytes",
                &format!(
                    "device buffer on GPU 0: bytes {}..+2 lie outside its 16 bytes",
                    usize::MAX
                ),
                "cuMemsetD32Async(1): the device range is on GPU 0",
                "cuMemsetD32Async(0): 6 bytes is not a whole number of 32-bit words",
                "cuMemcpyPeerAsync(0 -> 1): 16 bytes do not fit in the 8-byte destination",
                "cuMemcpyDtoH(1): 8 bytes asked of a 4-byte device range",
            ]
        );
    }
}

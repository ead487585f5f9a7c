//! The CUDA driver calls the benches make (libcuda.so.1, dlopen'ed like the
//! checks'): primary contexts, device memory, streams, events and peer copies.
//! Every call goes through the `Watch`, so a hung GPU fails the bench on time.

use crate::facts::FactError;
use crate::gather::deadline::Watch;
use crate::gather::dl::{Library, Symbol};
use crate::gather::gpu::cuda::result_name;
use std::ffi::{c_char, c_float, c_int, c_uint, c_void};

pub type Context = *mut c_void;
pub type Stream = *mut c_void;
type RawEvent = *mut c_void;

/// A CUDA event created by `Driver::event`.
#[derive(Debug, Clone, Copy)]
pub struct Event(RawEvent);
pub type DevicePtr = u64;

/// cuCtxEnablePeerAccess when it was already enabled: not an error here.
const PEER_ACCESS_ALREADY_ENABLED: c_int = 704;

type R = c_int;

macro_rules! api {
    ($( $field:ident : $sym:literal => fn($($arg:ty),*); )*) => {
        struct Api { $( $field: Symbol<unsafe extern "C" fn($($arg),*) -> R>, )* }
        impl Api {
            fn load(lib: &Library) -> Result<Api, FactError> {
                Ok(Api { $( $field: lib.symbol($sym)?, )* })
            }
        }
    };
}

api! {
    init: "cuInit" => fn(c_uint);
    device_count: "cuDeviceGetCount" => fn(*mut c_int);
    device_get: "cuDeviceGet" => fn(*mut c_int, c_int);
    bus_id: "cuDeviceGetPCIBusId" => fn(*mut c_char, c_int, c_int);
    can_access_peer: "cuDeviceCanAccessPeer" => fn(*mut c_int, c_int, c_int);
    primary_retain: "cuDevicePrimaryCtxRetain" => fn(*mut Context, c_int);
    set_current: "cuCtxSetCurrent" => fn(Context);
    enable_peer: "cuCtxEnablePeerAccess" => fn(Context, c_uint);
    mem_alloc: "cuMemAlloc_v2" => fn(*mut DevicePtr, usize);
    mem_free: "cuMemFree_v2" => fn(DevicePtr);
    memset_d32: "cuMemsetD32Async" => fn(DevicePtr, c_uint, usize, Stream);
    copy_peer: "cuMemcpyPeerAsync" => fn(DevicePtr, Context, DevicePtr, Context, usize, Stream);
    copy_dtoh: "cuMemcpyDtoH_v2" => fn(*mut c_void, DevicePtr, usize);
    stream_create: "cuStreamCreate" => fn(*mut Stream, c_uint);
    stream_sync: "cuStreamSynchronize" => fn(Stream);
    stream_wait: "cuStreamWaitEvent" => fn(Stream, RawEvent, c_uint);
    event_create: "cuEventCreate" => fn(*mut RawEvent, c_uint);
    event_record: "cuEventRecord" => fn(RawEvent, Stream);
    event_sync: "cuEventSynchronize" => fn(RawEvent);
    event_elapsed: "cuEventElapsedTime" => fn(*mut c_float, RawEvent, RawEvent);
}

/// A loaded, initialised CUDA driver.
pub struct Driver<'w> {
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
    pub bus_id: String,
    pub context: Context,
    pub stream: Stream,
}

fn check(call: &str, rc: R) -> Result<(), FactError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FactError::new(call, format!("{} ({rc})", result_name(rc))))
    }
}

impl<'w> Driver<'w> {
    pub fn open(watch: &'w Watch, library: &str) -> Opened<'w> {
        let lib = match crate::gather::dl::load(watch, library) {
            Ok(lib) => lib,
            Err(crate::gather::dl::LoadError::Missing(why)) => return Opened::NotFound(why),
            Err(crate::gather::dl::LoadError::Failed(e)) => return Opened::Failed(e),
        };
        let api = match Api::load(&lib) {
            Ok(api) => api,
            Err(e) => return Opened::Failed(e),
        };
        // The driver is never unloaded: unloading libcuda after cuInit is not supported.
        std::mem::forget(lib);
        let driver = Driver { api, watch };
        // SAFETY: `CUresult cuInit(unsigned int)`, flags 0.
        let rc = watch.call("cuInit", || unsafe { (driver.api.init.get())(0) });
        match check("cuInit", rc) {
            Ok(()) => Opened::Ready(driver),
            Err(e) => Opened::Failed(e),
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
        let mut count: c_int = 0;
        // SAFETY: out-pointer to an int.
        self.run("cuDeviceGetCount", || unsafe {
            (self.api.device_count.get())(&mut count)
        })?;
        let mut gpus = Vec::new();
        for ordinal in 0..count.max(0) {
            let mut dev: c_int = 0;
            // SAFETY: `cuDeviceGet(CUdevice*, int)`.
            self.run(format!("cuDeviceGet({ordinal})"), || unsafe {
                (self.api.device_get.get())(&mut dev, ordinal)
            })?;
            let mut buf = [0 as c_char; 64];
            // SAFETY: the buffer's length is passed; the driver NUL-terminates within it.
            self.run(format!("cuDeviceGetPCIBusId({ordinal})"), || unsafe {
                (self.api.bus_id.get())(buf.as_mut_ptr(), buf.len() as c_int, dev)
            })?;
            // SAFETY: zero-initialised and NUL-terminated within its length.
            let bus = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
            let mut context: Context = std::ptr::null_mut();
            // SAFETY: `cuDevicePrimaryCtxRetain(CUcontext*, CUdevice)`.
            self.run(format!("cuDevicePrimaryCtxRetain({ordinal})"), || unsafe {
                (self.api.primary_retain.get())(&mut context, dev)
            })?;
            let mut gpu = Gpu {
                ordinal: ordinal as u32,
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
        let mut can: c_int = 0;
        // SAFETY: `cuDeviceCanAccessPeer(int*, CUdevice, CUdevice)`; ordinals are the devices.
        self.run(
            format!("cuDeviceCanAccessPeer({}, {})", a.ordinal, b.ordinal),
            || unsafe {
                (self.api.can_access_peer.get())(&mut can, a.ordinal as c_int, b.ordinal as c_int)
            },
        )?;
        Ok(can != 0)
    }

    /// Lets `from` reach `to`'s memory (already enabled is fine).
    pub fn enable_peer(&self, from: &Gpu, to: &Gpu) -> Result<(), FactError> {
        self.make_current(from)?;
        let call = format!("cuCtxEnablePeerAccess({} -> {})", from.ordinal, to.ordinal);
        // SAFETY: both contexts were retained; flags must be 0.
        let rc = self.watch.call(call.clone(), || unsafe {
            (self.api.enable_peer.get())(to.context, 0)
        });
        if rc == PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(&call, rc)
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
            context: gpu.context,
            ptr,
            bytes,
        })
    }

    /// Fills `words` 32-bit words at `ptr` with `value` on `gpu`'s stream.
    pub fn fill(
        &self,
        gpu: &Gpu,
        ptr: DevicePtr,
        value: u32,
        words: usize,
    ) -> Result<(), FactError> {
        // SAFETY: the range lies inside a buffer from `alloc` (callers pass offsets within it).
        self.run(format!("cuMemsetD32Async({})", gpu.ordinal), || unsafe {
            (self.api.memset_d32.get())(ptr, value, words, gpu.stream)
        })
    }

    /// Queues a copy of `bytes` from `src` on `from` to `dst` on `to`, on `stream`'s GPU.
    pub fn copy_peer(
        &self,
        on: &Gpu,
        (dst, to): (DevicePtr, &Gpu),
        (src, from): (DevicePtr, &Gpu),
        bytes: usize,
    ) -> Result<(), FactError> {
        // SAFETY: both ranges lie inside buffers from `alloc` of at least `bytes`.
        self.run(
            format!("cuMemcpyPeerAsync({} -> {})", from.ordinal, to.ordinal),
            || unsafe {
                (self.api.copy_peer.get())(dst, to.context, src, from.context, bytes, on.stream)
            },
        )
    }

    /// Copies device memory back to `out` (synchronous).
    pub fn read_back(&self, gpu: &Gpu, src: DevicePtr, out: &mut [u8]) -> Result<(), FactError> {
        self.make_current(gpu)?;
        // SAFETY: `out` is writable for its length; `src` has at least as many bytes.
        self.run(format!("cuMemcpyDtoH({})", gpu.ordinal), || unsafe {
            (self.api.copy_dtoh.get())(out.as_mut_ptr().cast(), src, out.len())
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

/// Device memory, freed on drop.
pub struct DeviceBuffer<'d, 'w> {
    driver: &'d Driver<'w>,
    context: Context,
    pub ptr: DevicePtr,
    pub bytes: usize,
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

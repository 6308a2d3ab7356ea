//! The library's stream and the device it runs on. Every graph the library builds runs on one
//! process-wide stream, made on first use on the device chosen for it: MLX's default device (the
//! GPU where MLX has one: Metal on Apple silicon, CUDA on NVIDIA) when that device works, MLX's
//! CPU otherwise (a Mac whose virtual machine exposes no Metal device still has MLX's Metal
//! build, whose default device is a GPU that fails on first use), or the device the engine chose
//! (`choose`, or `LATENT_CACHE_DEVICE=cpu|gpu` in the environment) before that first use.
use std::sync::Mutex;

use mlx_rs::Array;
use once_cell::sync::OnceCell;

use crate::core::error::{fail, Result};

/// Which device the library's stream goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// MLX's default device when it works, its CPU otherwise.
    Default,
    Cpu,
    Gpu,
}

/// The library's stream. MLX 0.32 binds ordinary streams to the thread that made them: an array
/// left unevaluated on thread A's stream cannot be evaluated on thread B, and every thread that
/// touches MLX's default stream gets a worker thread of its own. A stream from
/// `mlx_stream_new_thread_unsafe` is registered for the whole process instead: usable from any
/// thread, one worker however many threads call us, and its evaluations serialized by the
/// library's evaluation lock (`eval`). Made once and never freed.
struct LibraryStream {
    stream: mlx_sys::mlx_stream,
    on_gpu: bool,
}

// SAFETY: the stream is registered process-wide by MLX; the handle is an immutable token, and
// evaluation on it is serialized by the evaluation lock.
unsafe impl Send for LibraryStream {}
unsafe impl Sync for LibraryStream {}

static STREAM: OnceCell<LibraryStream> = OnceCell::new();
/// The engine's choice; read once, when the stream is made (under this lock, so a choice and
/// the first use cannot interleave).
static CHOICE: Mutex<Option<DeviceChoice>> = Mutex::new(None);

/// The library's stream, made on first use.
pub(crate) fn library_stream() -> mlx_sys::mlx_stream {
    stream().stream
}

/// Whether the library runs on a GPU (its kernels are for GPUs only).
pub fn on_gpu() -> bool {
    stream().on_gpu
}

fn stream() -> &'static LibraryStream {
    STREAM.get_or_init(|| {
        ensure_error_handler();
        let mut choice = CHOICE.lock().unwrap_or_else(|e| e.into_inner());
        let wanted = choice.or_else(from_environment).unwrap_or(DeviceChoice::Default);
        let on_gpu = match wanted {
            DeviceChoice::Cpu => false,
            // A refused explicit choice never got here (`choose` probes first); from the
            // environment, a GPU that does not work falls back like the default.
            DeviceChoice::Gpu | DeviceChoice::Default => gpu_works(),
        };
        *choice = Some(wanted);
        // SAFETY: plain mlx-c constructors; the device is freed once the stream holds its copy.
        unsafe {
            let device = mlx_sys::mlx_device_new_type(if on_gpu { GPU } else { CPU }, 0);
            let stream = mlx_sys::mlx_stream_new_thread_unsafe(device);
            mlx_sys::mlx_device_free(device);
            LibraryStream { stream, on_gpu }
        }
    })
}

/// A process-wide stream on MLX's CPU, for the operations MLX runs there only (its distributed
/// layer's sends and receives): the library's stream where that is on the CPU, else one more
/// made the same way, once.
pub(crate) fn cpu_stream() -> mlx_sys::mlx_stream {
    static CPU_STREAM: OnceCell<LibraryStream> = OnceCell::new();
    let library = stream();
    if !library.on_gpu {
        return library.stream;
    }
    // SAFETY: as the library's stream is made.
    CPU_STREAM
        .get_or_init(|| unsafe {
            let device = mlx_sys::mlx_device_new_type(CPU, 0);
            let stream = mlx_sys::mlx_stream_new_thread_unsafe(device);
            mlx_sys::mlx_device_free(device);
            LibraryStream { stream, on_gpu: false }
        })
        .stream
}

const CPU: mlx_sys::mlx_device_type = mlx_sys::mlx_device_type__MLX_CPU;
const GPU: mlx_sys::mlx_device_type = mlx_sys::mlx_device_type__MLX_GPU;

fn from_environment() -> Option<DeviceChoice> {
    match std::env::var("LATENT_CACHE_DEVICE").ok()?.as_str() {
        "cpu" => Some(DeviceChoice::Cpu),
        "gpu" => Some(DeviceChoice::Gpu),
        _ => None,
    }
}

/// Whether MLX has a GPU backend and its device loads: asking for the device's properties makes
/// MLX load it (Metal: `MTLCreateSystemDefaultDevice`), which fails, as an error and not an
/// abort, where there is none.
fn gpu_works() -> bool {
    // SAFETY: the device and info objects are made and freed here.
    unsafe {
        let device = mlx_sys::mlx_device_new_type(GPU, 0);
        let mut available = false;
        let mut works = mlx_sys::mlx_device_is_available(&mut available, device) == 0 && available;
        if works {
            let mut info = mlx_sys::mlx_device_info_new();
            works = mlx_sys::mlx_device_info_get(&mut info, device) == 0;
            mlx_sys::mlx_device_info_free(info);
        }
        mlx_sys::mlx_device_free(device);
        works
    }
}

/// Chooses the device of the library's stream. Only before the library's first use of MLX
/// (a later choice of the same device is accepted); a GPU that does not work is refused.
pub fn choose(choice: DeviceChoice) -> Result<()> {
    let mut current = CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(made) = STREAM.get() {
        let same = match choice {
            DeviceChoice::Default => true,
            DeviceChoice::Cpu => !made.on_gpu,
            DeviceChoice::Gpu => made.on_gpu,
        };
        if same {
            return Ok(());
        }
        let on = if made.on_gpu { "the GPU" } else { "the CPU" };
        return fail!(State, "the library already runs on {on}: choose its device before the first call that uses MLX");
    }
    if choice == DeviceChoice::Gpu {
        ensure_error_handler();
        if !gpu_works() {
            return fail!(Backend, "MLX has no working GPU here (no GPU backend, or its device does not load)");
        }
    }
    *current = Some(choice);
    Ok(())
}

/// mlx-c reports failures through a process-wide handler; mlx-rs installs one that keeps the
/// message for the failing thread instead of exiting the process. Make sure it is installed
/// before our first direct mlx-c call. Cloning an array is a guarded mlx-rs call that touches
/// no stream (an evaluation would make the calling thread a stream and a worker of its own).
fn ensure_error_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| drop(Array::from_slice(&[0f32], &[1]).clone()));
}

//! Making and applying kernels on MLX's CUDA backend: through MLX's custom-kernel API (mlx-c's
//! `mlx_fast_cuda_kernel_*`; MLX compiles each source with NVRTC at its first evaluation and
//! caches it), applied lazily on the library's stream like any MLX operation; and what the
//! kernels ask of the device (compute capability, shared memory).
use std::sync::Mutex;

use mlx_rs::Array;
use once_cell::sync::Lazy;

use crate::core::error::{fail, Result};
use crate::core::kernels::launch::{cstr, made_once, Launch, Made, Source};
use crate::core::mlx::{device, ops};

/// The GPU's compute capability when the library runs on a GPU driven by MLX's CUDA backend.
static CUDA_CAPABILITY: Lazy<Option<(usize, usize)>> = Lazy::new(|| {
    let mut cuda = false;
    // SAFETY: a plain query writing one bool.
    unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) };
    if !cuda || !device::on_gpu() {
        return None;
    }
    // SAFETY: the device and info objects are made and freed here; the keys are C strings.
    unsafe {
        let device = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        let (mut major, mut minor) = (0usize, 0usize);
        let ok = mlx_sys::mlx_device_info_get(&mut info, device) == 0
            && mlx_sys::mlx_device_info_get_size(&mut major, info, c"compute_capability_major".as_ptr()) == 0
            && mlx_sys::mlx_device_info_get_size(&mut minor, info, c"compute_capability_minor".as_ptr()) == 0;
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(device);
        Some(if ok { (major, minor) } else { (0, 0) })
    }
});

/// The CUDA GPU's compute capability ((0, 0) where MLX's device info lacks it); `None` off CUDA.
pub fn compute_capability() -> Option<(usize, usize)> {
    *CUDA_CAPABILITY
}

/// Whether the default device is a GPU driven by MLX's CUDA backend, whatever its generation.
pub fn cuda_device() -> bool {
    CUDA_CAPABILITY.is_some()
}

/// Whether the library's kernels run here: a CUDA GPU of compute capability 8.0 or later (they
/// use bfloat16 tensor-core `mma.sync`, `cp.async` and `ldmatrix`).
pub fn on_cuda() -> bool {
    matches!(*CUDA_CAPABILITY, Some((major, _)) if major >= 8)
}

/// The dynamic shared memory one block may opt into on this GPU (the CUDA programming guide's
/// figures by compute capability): 227 KiB on 9.0 and 10.x, 163 KiB on 8.0 and 8.7, 99 KiB on
/// the others from 8.6 on; none where the kernels do not run.
pub fn shared_memory_limit() -> usize {
    match *CUDA_CAPABILITY {
        Some((9, 0)) | Some((10, _)) => 227 * 1024,
        Some((8, 0)) | Some((8, 7)) => 163 * 1024,
        Some((major, _)) if major >= 8 => 99 * 1024,
        _ => 0,
    }
}

/// The library's kernels' row-ranges input, int32 `[lo_0, hi_0, lo_1, ...]`: `None` where every
/// row spans the window `[0, positions)` (the usual decode step), so the kernel reads no ranges
/// and no array is made on the host, which on MLX's CUDA backend costs an evaluation whose kernel
/// reads it about 30 us (measured on an H200).
pub(crate) fn ranges_array(ranges: &[(usize, usize)], positions: usize) -> Option<Array> {
    if ranges.iter().all(|&(lo, hi)| lo == 0 && hi == positions) {
        return None;
    }
    let bounds: Vec<i32> = ranges.iter().flat_map(|&(lo, hi)| [lo as i32, hi as i32]).collect();
    Some(ops::indices(&bounds, &[bounds.len()]))
}

/// A compiled-on-first-use kernel object (mlx-c's handle), made once per kernel and shared
/// memory size and kept for the process.
pub(crate) struct Kernel(mlx_sys::mlx_fast_cuda_kernel);

// SAFETY: the handle is immutable once made; applying it only reads it (MLX's kernel function is
// a const closure), and the library applies kernels from one thread at a time or under its lock.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

static KERNELS: Lazy<Made<Kernel>> = Lazy::new(|| Mutex::new(Vec::new()));

/// The kernel of `source` with `shared` bytes of dynamic shared memory, made on first use.
pub(crate) fn kernel(source: &'static Source, shared: usize) -> Result<&'static Kernel> {
    made_once(&KERNELS, source, shared, |t| {
        // SAFETY: a plain mlx-c constructor; it copies the names and strings it is given.
        let k = unsafe {
            mlx_sys::mlx_fast_cuda_kernel_new(
                t.name.as_ptr(),
                t.inputs,
                t.outputs,
                t.body.as_ptr(),
                t.header.as_ptr(),
                t.contiguous,
                shared as i32,
            )
        };
        (!k.ctx.is_null()).then_some(Kernel(k))
    })
}

/// The mlx-c handles of one launch, freed on every path.
struct Launched {
    config: mlx_sys::mlx_fast_cuda_kernel_config,
    inputs: mlx_sys::mlx_vector_array,
    outputs: mlx_sys::mlx_vector_array,
}

impl Drop for Launched {
    fn drop(&mut self) {
        // SAFETY: each handle was made by its mlx-c constructor and is freed once, here.
        unsafe {
            mlx_sys::mlx_fast_cuda_kernel_config_free(self.config);
            mlx_sys::mlx_vector_array_free(self.inputs);
            mlx_sys::mlx_vector_array_free(self.outputs);
        }
    }
}

/// Applies a kernel lazily on the library's stream (MLX compiles it at its first evaluation).
pub(crate) fn apply(kernel: &Kernel, inputs: &[&Array], launch: Launch) -> Result<Vec<Array>> {
    apply_with(kernel, inputs, launch, None)
}

/// `apply` with every output filled with zeros before the kernel runs (MLX fills them as part
/// of the same operation), for kernels that add into their outputs.
pub(crate) fn apply_zeroed(kernel: &Kernel, inputs: &[&Array], launch: Launch) -> Result<Vec<Array>> {
    apply_with(kernel, inputs, launch, Some(0.0))
}

fn apply_with(kernel: &Kernel, inputs: &[&Array], launch: Launch, init: Option<f32>) -> Result<Vec<Array>> {
    // SAFETY: every handle is owned by `l` and freed when it drops; arrays are borrowed for the
    // call (mlx-c copies them into its vector) and the outputs are copied into owned Arrays.
    unsafe {
        let l = Launched {
            config: mlx_sys::mlx_fast_cuda_kernel_config_new(),
            inputs: mlx_sys::mlx_vector_array_new(),
            outputs: mlx_sys::mlx_vector_array_new(),
        };
        let mut rc = 0;
        for (shape, dtype) in launch.outputs {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(l.config, shape.as_ptr(), shape.len(), *dtype as u32);
        }
        let [gx, gy, gz] = launch.grid;
        let [tx, ty, tz] = launch.block;
        rc |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(l.config, gx, gy, gz);
        rc |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(l.config, tx, ty, tz);
        if let Some(value) = init {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_set_init_value(l.config, value);
        }
        for (n, v) in launch.ints {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(l.config, cstr(n).as_ptr(), *v);
        }
        for (n, v) in launch.bools {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_bool(l.config, cstr(n).as_ptr(), *v);
        }
        for a in inputs {
            rc |= mlx_sys::mlx_vector_array_append_value(l.inputs, a.as_ptr());
        }
        let mut outputs = l.outputs;
        if rc != 0
            || mlx_sys::mlx_fast_cuda_kernel_apply(&mut outputs, kernel.0, l.inputs, l.config, device::library_stream()) != 0
        {
            return fail!(Backend, "MLX could not apply a kernel of the library");
        }
        let mut arrays = Vec::new();
        for i in 0..mlx_sys::mlx_vector_array_size(outputs) {
            let mut a = mlx_sys::mlx_array_new();
            if mlx_sys::mlx_vector_array_get(&mut a, outputs, i) != 0 {
                mlx_sys::mlx_array_free(a);
                return fail!(Backend, "a kernel of the library returned no output {i}");
            }
            arrays.push(Array::from_ptr(a));
        }
        Ok(arrays)
    }
}

//! Making and applying kernels on MLX's Metal backend (Apple GPUs): through MLX's custom-kernel
//! API (mlx-c's `mlx_fast_metal_kernel_*`; MLX writes each kernel's signature from its inputs,
//! compiles the source at its first evaluation and caches it), applied lazily on the library's
//! stream like any MLX operation. Metal has no dynamic threadgroup memory, so the kernels size
//! theirs from template arguments.
use std::sync::Mutex;

use mlx_rs::Array;
use once_cell::sync::Lazy;

use crate::core::error::{fail, Result};
use crate::core::kernels::launch::{cstr, made_once, Launch, Made, Source};
use crate::core::mlx::device;

/// Whether the library runs on a GPU driven by MLX's Metal backend.
static ON_METAL: Lazy<bool> = Lazy::new(|| {
    let mut metal = false;
    // SAFETY: a plain query writing one bool.
    unsafe { mlx_sys::mlx_metal_is_available(&mut metal) };
    metal && device::on_gpu()
});

/// Whether the library's Metal kernels can run here (an Apple GPU through MLX's Metal backend).
pub fn on_metal() -> bool {
    *ON_METAL
}

/// A kernel object (mlx-c's handle), made once per kernel and kept for the process.
pub(crate) struct Kernel(mlx_sys::mlx_fast_metal_kernel);

// SAFETY: the handle is immutable once made; applying it only reads it (MLX's kernel function is
// a const closure), and the library applies kernels from one thread at a time or under its lock.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

static KERNELS: Lazy<Made<Kernel>> = Lazy::new(|| Mutex::new(Vec::new()));

/// The kernel of `source`, made on first use.
pub(crate) fn kernel(source: &'static Source) -> Result<&'static Kernel> {
    made_once(&KERNELS, source, 0, |t| {
        // SAFETY: a plain mlx-c constructor; it copies the names and strings it is given.
        let k = unsafe {
            mlx_sys::mlx_fast_metal_kernel_new(
                t.name.as_ptr(),
                t.inputs,
                t.outputs,
                t.body.as_ptr(),
                t.header.as_ptr(),
                t.contiguous,
                false,
            )
        };
        (!k.ctx.is_null()).then_some(Kernel(k))
    })
}

/// Applies a kernel lazily on the library's stream. `launch.grid` counts threads (Metal's
/// `dispatchThreads`), `launch.block` is the threadgroup.
pub(crate) fn apply(kernel: &Kernel, inputs: &[&Array], launch: Launch) -> Result<Vec<Array>> {
    apply_with(kernel, inputs, launch, None)
}

/// `apply` with every output filled with zeros before the kernel runs (MLX fills them as part
/// of the same operation), for kernels that add into their outputs.
pub(crate) fn apply_zeroed(kernel: &Kernel, inputs: &[&Array], launch: Launch) -> Result<Vec<Array>> {
    apply_with(kernel, inputs, launch, Some(0.0))
}

fn apply_with(kernel: &Kernel, inputs: &[&Array], launch: Launch, init: Option<f32>) -> Result<Vec<Array>> {
    // SAFETY: the config and vectors are made here and freed on every path below; arrays are
    // borrowed for the call (mlx-c copies them into its vector) and the outputs copied out.
    unsafe {
        let config = mlx_sys::mlx_fast_metal_kernel_config_new();
        let (ins, mut outs) = (mlx_sys::mlx_vector_array_new(), mlx_sys::mlx_vector_array_new());
        let mut rc = 0;
        for (shape, dtype) in launch.outputs {
            rc |= mlx_sys::mlx_fast_metal_kernel_config_add_output_arg(config, shape.as_ptr(), shape.len(), *dtype as u32);
        }
        let ([gx, gy, gz], [tx, ty, tz]) = (launch.grid, launch.block);
        rc |= mlx_sys::mlx_fast_metal_kernel_config_set_grid(config, gx, gy, gz);
        rc |= mlx_sys::mlx_fast_metal_kernel_config_set_thread_group(config, tx, ty, tz);
        if let Some(value) = init {
            rc |= mlx_sys::mlx_fast_metal_kernel_config_set_init_value(config, value);
        }
        for (n, v) in launch.ints {
            rc |= mlx_sys::mlx_fast_metal_kernel_config_add_template_arg_int(config, cstr(n).as_ptr(), *v);
        }
        for (n, v) in launch.bools {
            rc |= mlx_sys::mlx_fast_metal_kernel_config_add_template_arg_bool(config, cstr(n).as_ptr(), *v);
        }
        for a in inputs {
            rc |= mlx_sys::mlx_vector_array_append_value(ins, a.as_ptr());
        }
        let applied =
            rc == 0 && mlx_sys::mlx_fast_metal_kernel_apply(&mut outs, kernel.0, ins, config, device::library_stream()) == 0;
        let mut arrays = Vec::new();
        for i in 0..if applied { mlx_sys::mlx_vector_array_size(outs) } else { 0 } {
            let mut a = mlx_sys::mlx_array_new();
            if mlx_sys::mlx_vector_array_get(&mut a, outs, i) == 0 {
                arrays.push(Array::from_ptr(a));
            } else {
                mlx_sys::mlx_array_free(a);
            }
        }
        mlx_sys::mlx_fast_metal_kernel_config_free(config);
        mlx_sys::mlx_vector_array_free(ins);
        mlx_sys::mlx_vector_array_free(outs);
        if !applied || arrays.len() != launch.outputs.len() {
            return fail!(Backend, "MLX could not apply a Metal kernel of the library");
        }
        Ok(arrays)
    }
}

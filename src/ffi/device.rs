//! `latent_cache_device`: which device the library's MLX work runs on, chosen by the engine
//! before the first call that uses MLX, or MLX's default device with a fallback to its CPU.
use super::args::{out_ptr, write};
use super::error::Failure;
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::mlx::device::{self, DeviceChoice};

/// A device for the library's MLX work (`latent_cache_set_device`, `latent_cache_get_device`;
/// passed as `uint32_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum latent_cache_device {
    /// MLX's default device (the GPU where MLX has one: Metal on Apple silicon, CUDA on
    /// NVIDIA) when its device loads, MLX's CPU otherwise (for example a Mac virtual machine
    /// without a Metal device).
    Default = 0,
    Cpu = 1,
    Gpu = 2,
}

/// Chooses the device every graph of the library runs on (one for the process; the library's
/// views and arrays live there). Call it before the first call that uses MLX (any append,
/// read, array or load); until then `LATENT_CACHE_DEVICE=cpu` or `gpu` in the environment
/// chooses, and otherwise `DEFAULT`. Choosing the device already in use later is accepted.
/// Returns `OK`, `INVALID_ARGUMENT` (no such device), `INVALID_STATE` (the library already runs
/// on the other device), `BACKEND` (`GPU`, before first use, where MLX has no working GPU;
/// nothing changes).
#[no_mangle]
pub extern "C" fn latent_cache_set_device(device: u32) -> latent_cache_status {
    ffi_boundary! {
        let choice = match device {
            0 => DeviceChoice::Default,
            1 => DeviceChoice::Cpu,
            2 => DeviceChoice::Gpu,
            _ => return Err(Failure::new(latent_cache_status::InvalidArgument, format!("device {device}: DEFAULT (0), CPU (1) or GPU (2)"))),
        };
        Ok(device::choose(choice)?)
    }
}

/// `*out` = the device the library runs on, `CPU` or `GPU` (after this call the choice is
/// made: the library's stream exists). Returns `OK`, `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_get_device(out: *mut u32) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let device = if device::on_gpu() { latent_cache_device::Gpu } else { latent_cache_device::Cpu };
        unsafe { write(out, device as u32) };
        Ok(())
    }
}

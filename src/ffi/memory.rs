//! MLX's memory, for engines that link only this library: what its allocator holds, its memory
//! limit (which every allocation check of the library measures against) and its buffer cache
//! (freed arrays' memory MLX keeps for reuse until told to return it).
use super::args::{out_ptr, write, write_optional};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::mlx::memory;

/// What MLX's allocator holds, in bytes (`latent_cache_memory_info`). Process-wide: every
/// cache, set, donor and array of the process, and the engine's own MLX arrays.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct latent_cache_memory {
    /// Held by live arrays.
    pub active: usize,
    /// Freed by arrays and kept by MLX for reuse; `latent_cache_clear_memory_cache` returns it
    /// to the system.
    pub cache: usize,
    /// The most `active` has been since the process started.
    pub peak: usize,
    /// MLX's memory limit (`latent_cache_set_memory_limit`).
    pub limit: usize,
}

/// `*out` = what MLX's allocator holds now. Returns `OK`, `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_memory_info(out: *mut latent_cache_memory) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let info = memory::info();
        let value = latent_cache_memory { active: info.active, cache: info.cache, peak: info.peak, limit: info.limit };
        unsafe { write(out, value) };
        Ok(())
    }
}

/// Sets MLX's memory limit to `bytes` for the whole process (as mlx-c's `mlx_set_memory_limit`):
/// every later reserve, growing append, row rebuild and host array is checked against it and
/// refused with `CAPACITY` when it would pass it. `*previous` (may be NULL) receives the limit
/// before the call. Returns `OK`, `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_memory_limit(bytes: usize, previous: *mut usize) -> latent_cache_status {
    ffi_boundary! {
        let old = memory::set_limit(bytes)?;
        unsafe { write_optional(previous, old) };
        Ok(())
    }
}

/// Returns the memory MLX keeps from freed arrays to the system (as mlx-c's `mlx_clear_cache`).
/// Live arrays, the caches' buffers included, are untouched. Call it after freeing caches an
/// engine no longer needs (a finished request, a dropped model), when the process's resident
/// memory matters. Returns `OK`, `BACKEND`.
#[no_mangle]
pub extern "C" fn latent_cache_clear_memory_cache() -> latent_cache_status {
    ffi_boundary! { Ok(memory::clear_cache()?) }
}

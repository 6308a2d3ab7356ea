//! Raw bindings to mlx-c, generated at build time by bindgen exactly as crates.io's mlx-sys does,
//! so mlx-rs compiles against identical declarations.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// mlx-rs seeds its random keys from the Mach clock (`mach_approximate_time`), which exists only on
/// Apple platforms. Elsewhere we provide it from the monotonic clock, in nanoseconds.
#[cfg(not(target_vendor = "apple"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

extern "C" {
    /// References holding `arr`'s buffer (the array itself, its evaluated views, and MLX's work
    /// in flight that reads it); -1 for a null handle, 0 before the array is evaluated. Compiled
    /// from `shim/holders.cpp` with mlx-c.
    pub fn lc_mlx_data_holders(arr: mlx_array) -> std::os::raw::c_long;
    /// Batches of work MLX has handed to its devices and not seen complete (see the shim).
    pub fn lc_mlx_active_tasks() -> std::os::raw::c_int;
}

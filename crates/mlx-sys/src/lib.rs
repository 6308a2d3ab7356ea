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

//! An MLX runtime the library does not admit (`core::mlx::runtime`): every call that returns a
//! status is `BACKEND`, with a message naming the running version and the admitted ones, and
//! nothing runs; the calls that need no MLX (the version, the last error) still answer. PyPI's
//! runtimes outside the admitted ones do not link against the library at all (docs/packaging.md),
//! so the runtime here is this build's own MLX, and the admitted list is replaced before the
//! first call (`LATENT_CACHE_ADMIT_MLX`, read once). Its own binary: the check is once per
//! process.
#[path = "common/mod.rs"]
mod common;

use common::check::last_error;
use latent_cache::ffi::cache::latent_cache_new;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::memory::{latent_cache_memory, latent_cache_memory_info};
use latent_cache::ffi::version::latent_cache_version;

#[test]
fn a_runtime_not_admitted_refuses_every_call() {
    // Before any call of the library in this process.
    std::env::set_var("LATENT_CACHE_ADMIT_MLX", "9.9.9, 9.9.10");
    let running = latent_cache::core::mlx::runtime::running_version().unwrap();
    let cfg = latent_cache_config_default();
    for attempt in 0..2 {
        let mut cache = std::ptr::null_mut();
        let status = unsafe { latent_cache_new(&cfg, &mut cache) };
        assert_eq!(status, Status::Backend, "attempt {attempt}");
        assert!(cache.is_null(), "a refused call wrote its output");
        let message = last_error();
        assert!(message.contains(&format!("MLX {running}")) && message.contains("9.9.9, 9.9.10"), "{message}");
    }
    let mut info: latent_cache_memory = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { latent_cache_memory_info(&mut info) }, Status::Backend);
    let version = unsafe { std::ffi::CStr::from_ptr(latent_cache_version()) }.to_string_lossy().into_owned();
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
}

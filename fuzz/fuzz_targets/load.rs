//! Bytes -> a load of saved state through the C API: whatever the bytes, the call returns a
//! status (a set only when everything checked out), never crashes, and leaks nothing.
#![no_main]

use latent_cache::ffi::persist::latent_cache_set_load_from_buffer;
use latent_cache::ffi::set::latent_cache_set_free;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut set = std::ptr::null_mut();
    let status = unsafe { latent_cache_set_load_from_buffer(data.as_ptr(), data.len(), &mut set) };
    if status == latent_cache::ffi::latent_cache_status::Ok {
        unsafe { latent_cache_set_free(set) };
    } else {
        assert!(set.is_null(), "a refused load wrote its output");
    }
});

//! Bytes -> a load of the seed's cache-file format (`core::mlxbun`): whatever the bytes, the load
//! returns caches only when the header, every field and every tensor hash check out, and never
//! crashes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok((layers, _)) = latent_cache::core::persist::mlxbun::load_from_bytes(data) {
        assert!(!layers.is_empty(), "a load returns at least one layer");
    }
});

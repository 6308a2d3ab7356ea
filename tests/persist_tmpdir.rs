//! Loading saved state from bytes needs no temporary file: whatever TMPDIR says (a name with a
//! format conversion in it, a folder that does not exist, a file), bytes a save wrote load. Its
//! own binary: it sets TMPDIR, which is process-wide.
use latent_cache::core::persist::{self, mlxbun};
use latent_cache::ffi::cache::latent_cache_free;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::persist::{latent_cache_load_from_buffer, latent_cache_set_load_from_buffer};
use latent_cache::ffi::set::latent_cache_set_free;
use latent_cache::{Geometry, LatentCache};

#[test]
fn loads_from_bytes_ignore_tmpdir() {
    let g = Geometry { kv_lora_rank: 16, rope_head_dim: 8, ..Geometry::default() };
    let mut cache = LatentCache::new(g).unwrap();
    let latent: Vec<f32> = (0..2 * 3 * 16).map(|i| i as f32 * 0.25).collect();
    let rope: Vec<f32> = (0..2 * 3 * 8).map(|i| -(i as f32)).collect();
    cache.append_host(2, 3, &latent, &rope, None).unwrap();
    let bytes = persist::save_to_bytes(&[&cache]).unwrap();
    let seed = mlxbun::save_to_bytes(&[&cache], &mlxbun::MlxbunInfo::default()).unwrap();
    let a_file = std::env::temp_dir().join(format!("latent-cache-tmpdir-{}", std::process::id()));
    std::fs::write(&a_file, b"not a folder").unwrap();
    for tmpdir in ["/x%s%n", "/nonexistent/latent-cache/tmp", a_file.to_str().unwrap()] {
        std::env::set_var("TMPDIR", tmpdir);
        let loaded = persist::load_from_bytes(&bytes).unwrap_or_else(|e| panic!("TMPDIR={tmpdir}: {}", e.message));
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].row_offsets(), cache.row_offsets(), "TMPDIR={tmpdir}");
        for family in [latent_cache::Family::Latent, latent_cache::Family::Rope] {
            for row in 0..2 {
                assert_eq!(loaded[0].read_row(family, row).unwrap(), cache.read_row(family, row).unwrap(), "TMPDIR={tmpdir}");
            }
        }
        let mut one = std::ptr::null_mut();
        assert_eq!(
            unsafe { latent_cache_load_from_buffer(bytes.as_ptr(), bytes.len(), &mut one) },
            Status::Ok,
            "TMPDIR={tmpdir}"
        );
        unsafe { latent_cache_free(one) };
        let mut set = std::ptr::null_mut();
        assert_eq!(
            unsafe { latent_cache_set_load_from_buffer(bytes.as_ptr(), bytes.len(), &mut set) },
            Status::Ok,
            "TMPDIR={tmpdir}"
        );
        unsafe { latent_cache_set_free(set) };
        assert!(mlxbun::load_from_bytes(&seed).is_ok(), "TMPDIR={tmpdir}");
    }
    std::env::remove_var("TMPDIR");
    std::fs::remove_file(&a_file).unwrap();
}

//! Replays the fuzz corpora (fuzz/corpus/api and fuzz/corpus/load, kept small in the repository;
//! `make fuzz` grows them locally) and a fixed set of generated inputs: the C-API driver checks
//! every call against the reference model; the loader must load the seeds, refuse their damaged
//! variants with a status, and refuse the inputs that once crashed it (a '%' in a damaged header
//! reached MLX's error formatting as a conversion) or that the frame check refuses (sizes past
//! the end, a tensor's range not its shape's size, overlapping tensors, bytes after the last
//! tensor).
use crate::common::api_driver::run_bytes;
use crate::common::model::Rng;

#[test]
fn the_corpus_replays_cleanly() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/api");
    let mut files: Vec<_> = std::fs::read_dir(dir).expect("fuzz/corpus/api").map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "the seed corpus is checked in");
    for file in files {
        let data = std::fs::read(&file).unwrap();
        let result = std::panic::catch_unwind(|| run_bytes(&data));
        assert!(result.is_ok(), "corpus input {} failed", file.display());
    }
}

#[test]
fn generated_call_sequences_match_the_model() {
    // LATENT_CACHE_DRIVER_SEED and LATENT_CACHE_DRIVER_RUNS widen a local search.
    let env = |name: &str, default: u64| std::env::var(name).map_or(default, |v| v.parse().expect("a number"));
    let mut rng = Rng::new(env("LATENT_CACHE_DRIVER_SEED", 2026));
    for _ in 0..env("LATENT_CACHE_DRIVER_RUNS", 150) {
        let len = rng.range(8, 400);
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        run_bytes(&data);
    }
}

#[test]
fn the_load_corpus_loads_and_its_damaged_variants_are_refused() {
    use latent_cache::ffi::latent_cache_status as Status;
    use latent_cache::ffi::persist::latent_cache_set_load_from_buffer;
    use latent_cache::ffi::set::latent_cache_set_free;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/load");
    let mut files: Vec<_> = std::fs::read_dir(dir).expect("fuzz/corpus/load").map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "the load corpus is checked in");
    let load = |data: &[u8]| {
        let mut set = std::ptr::null_mut();
        let status = unsafe { latent_cache_set_load_from_buffer(data.as_ptr(), data.len(), &mut set) };
        if status == Status::Ok {
            unsafe { latent_cache_set_free(set) };
        } else {
            assert!(set.is_null());
        }
        status
    };
    let mut rng = Rng::new(7);
    for file in files {
        let data = std::fs::read(&file).unwrap();
        // Seeds are saved states; the other inputs (crashes the fuzzer found once) must be
        // refused with a status.
        if !file.file_name().unwrap().to_string_lossy().starts_with("seed") {
            assert_eq!(load(&data), Status::InvalidArgument, "{} is refused", file.display());
            continue;
        }
        assert_eq!(load(&data), Status::Ok, "{} loads", file.display());
        for _ in 0..40 {
            let mut damaged = data.clone();
            let at = rng.range(8, data.len() - 1);
            damaged[at] ^= 1 << rng.range(0, 7);
            let cut = rng.range(0, data.len() - 1);
            assert_eq!(load(&damaged[..cut]), Status::InvalidArgument, "{} truncated at {cut}", file.display());
            let _ = load(&damaged); // a status either way (a flip in JSON whitespace may be harmless)
        }
    }
}

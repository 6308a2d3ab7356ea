//! Allocations beyond what MLX may use are refused, not crashes: with MLX's memory limit set
//! low, reserve, a growing append, a merge, a join, reserve_rows and an extract of big rows
//! return CAPACITY or BACKEND with a message and change nothing; with the default limit, huge reserves either really
//! allocate or return CAPACITY, and later appends and reads stay consistent; a layer of width
//! INT32_MAX cannot crash the process; after the limit is restored the caches work again. Also:
//! reserve allocates during the call, and the memory calls (limit, counters, clearing MLX's buffer
//! cache) agree with MLX's own counters. Every check is against the reference model. (Its own test
//! binary, one test: the memory limit and active-memory counts are process-wide.)
mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::memory::*;
use latent_cache::ffi::persist::*;
use latent_cache::ffi::prefix::latent_cache_share_prefix;
use latent_cache::ffi::rows::*;
use latent_cache::ffi::set::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use mlx_sys::mlx_array;

use common::check::{append_host, assert_equal, assert_view, filled, host_data, last_error, new_cache};
use common::model::{Model, Rng};

const GLM: [usize; 3] = [512, 64, 128];
const MB: usize = 1 << 20;

/// MLX's own counters, read through mlx-c: the reference for the library's memory calls.
fn mlx_counters() -> (usize, usize, usize) {
    let (mut active, mut cache, mut limit) = (0, 0, 0);
    unsafe {
        assert_eq!(mlx_sys::mlx_get_active_memory(&mut active), 0);
        assert_eq!(mlx_sys::mlx_get_cache_memory(&mut cache), 0);
        assert_eq!(mlx_sys::mlx_get_memory_limit(&mut limit), 0);
    }
    (active, cache, limit)
}

fn info() -> latent_cache_memory {
    let mut out = latent_cache_memory { active: 0, cache: 0, peak: 0, limit: 0 };
    assert_eq!(unsafe { latent_cache_memory_info(&mut out) }, Status::Ok);
    out
}

fn active_memory() -> usize {
    info().active
}

fn memory_limit() -> usize {
    info().limit
}

/// Sets the limit through the library's call and checks MLX took it and the previous one
/// came back.
fn set_memory_limit(limit: usize) {
    let before = mlx_counters().2;
    let mut previous = 0;
    assert_eq!(unsafe { latent_cache_set_memory_limit(limit, &mut previous) }, Status::Ok);
    assert_eq!(previous, before, "the previous limit comes back");
    assert_eq!(mlx_counters().2, limit, "MLX's limit is the one set");
}

/// The call was refused as an allocation failure, with a message.
fn refused(status: Status, what: &str) {
    let message = last_error();
    assert!(
        matches!(status, Status::Capacity | Status::Backend),
        "{what}: expected CAPACITY or BACKEND, got {status:?} ({message})"
    );
    assert!(!message.is_empty(), "{what}: refused without a message");
}

fn bytes_per_token(widths: [usize; 3]) -> usize {
    widths.iter().sum::<usize>() * 4
}

/// Appends `tokens` positions to every row: OK (the model follows), or an allocation refusal
/// (nothing changed). Either way the cache must equal the model afterwards.
fn append_either_way(cache: *mut Handle, model: &mut Model, tokens: usize, rng: &mut Rng, what: &str) {
    let batch = model.rows.len().max(1);
    let data = host_data(rng, model.widths, batch, tokens);
    let status = append_host(cache, batch, tokens, &data);
    if status == Status::Ok {
        model.append(batch, tokens, &data);
    } else {
        refused(status, what);
    }
    assert_equal(cache, model, what);
}

/// Reserve with the default limit: either OK with the memory allocated by the time it returns
/// (for a cache holding rows), or CAPACITY.
fn huge_reserve(cache: *mut Handle, model: &Model, tokens: usize, what: &str) {
    let before = active_memory();
    let status = unsafe { latent_cache_reserve(cache, tokens) };
    match status {
        Status::Ok if !model.rows.is_empty() => {
            let need = tokens * model.rows.len() * bytes_per_token(model.widths);
            let grown = active_memory().saturating_sub(before);
            assert!(grown >= need / 10 * 9, "{what}: OK, but MLX's active memory grew by {grown} bytes, not the {need} needed");
        }
        Status::Ok => {}
        other => assert_eq!(other, Status::Capacity, "{what}: {}", last_error()),
    }
    assert_equal(cache, model, what);
}

/// Runs one part of the test; a failure is recorded and the memory limit restored, so the
/// later parts still run.
fn part(failures: &mut Vec<String>, default_limit: usize, name: &str, f: impl FnOnce()) {
    eprintln!("memory_limit: {name}"); // names the part if the process dies in it
    if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
        let message = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        failures.push(format!("{name}: {}", message.unwrap_or_default()));
    }
    set_memory_limit(default_limit);
}

#[test]
fn allocations_beyond_the_memory_limit_are_refused_and_change_nothing() {
    let default_limit = memory_limit();
    let mut failures = Vec::new();
    let mut rng = Rng::new(51);

    part(&mut failures, default_limit, "reserve allocates during the call", || {
        let widths = [8, 4, 3];
        let (cache, model) = filled(widths, 1, 2, &mut rng);
        let tokens = 100_000;
        let before = active_memory();
        assert_eq!(unsafe { latent_cache_reserve(cache, tokens) }, Status::Ok, "{}", last_error());
        let grown = active_memory().saturating_sub(before);
        // The old buffers (a few hundred positions) may be released in the same call.
        let need = (tokens - 1024) * bytes_per_token(widths);
        assert!(
            grown >= need,
            "reserve({tokens}) on a one-row cache grew MLX's active memory by {grown} bytes, expected at least {need}"
        );
        assert_equal(cache, &model, "reserve(100000)");
        unsafe { latent_cache_free(cache) };
    });

    // The caches the low-limit part works on, made under the default limit.
    let (glm, mut glm_model) = filled(GLM, 2, 50, &mut rng);
    let (wide, wide_model) = filled(GLM, 2, 6_000, &mut rng); // 2 rows, ~34 MB stored
    let (long, long_model) = filled(GLM, 1, 25_000, &mut rng); // 1 row, ~70 MB stored

    part(&mut failures, default_limit, "low memory limit", || {
        set_memory_limit(active_memory() + 64 * MB);

        let status = unsafe { latent_cache_reserve(glm, 200_000) }; // ~1.1 GB
        refused(status, "reserve(200000) under a low memory limit");
        assert_equal(glm, &glm_model, "refused reserve");

        let tokens = 20_000; // growth to ~113 MB
        let data = host_data(&mut rng, GLM, 2, tokens);
        let status = append_host(glm, 2, tokens, &data);
        refused(status, "append_host growing past a low memory limit");
        assert_equal(glm, &glm_model, "refused append_host");
        drop(data);

        let destination = new_cache(GLM, 0);
        let sources = [wide.cast_const(), wide.cast_const(), wide.cast_const()]; // ~101 MB merged
        let status = unsafe { latent_cache_merge_rows(destination, sources.as_ptr(), sources.len()) };
        refused(status, "merge_rows of big sources under a low memory limit");
        assert_equal(destination, &Model::new(GLM), "refused merge_rows (destination)");
        unsafe { latent_cache_free(destination) };

        // A big request joining a running batch without a free slot rebuilds it (~210 MB), and
        // slots for 8 rows of `wide` (~180 MB): refused, both batches as they were.
        let joining = [long.cast_const()];
        let status = unsafe { latent_cache_merge_rows(glm, joining.as_ptr(), 1) };
        refused(status, "merge_rows of a ~70 MB request into a running batch under a low memory limit");
        assert_equal(glm, &glm_model, "refused join");
        let status = unsafe { latent_cache_reserve_rows(wide, 8) };
        refused(status, "reserve_rows(8) of a ~34 MB batch under a low memory limit");
        assert_equal(wide, &wide_model, "refused reserve_rows");

        let mut single: *mut Handle = std::ptr::null_mut();
        let status = unsafe { latent_cache_extract_row(long, 0, &mut single) };
        refused(status, "extract_row of a ~70 MB row under a low memory limit");
        assert!(single.is_null(), "extract_row wrote its output on failure");
        // Storing the row as a shared prefix copies its positions: refused the same way.
        let mut prefix = std::ptr::null_mut();
        let status = unsafe { latent_cache_share_prefix(long, 0, long_model.len(0), &mut prefix) };
        refused(status, "share_prefix of a ~70 MB row under a low memory limit");
        assert!(prefix.is_null(), "share_prefix wrote its output on failure");
        assert_equal(long, &long_model, "refused share_prefix");
        assert_equal(glm, &glm_model, "refused calls on other caches");
    });

    part(&mut failures, default_limit, "huge reserves under the default limit", || {
        for tokens in [16_000_000, i32::MAX as usize] {
            let cfg = latent_cache_config_default(); // GLM-5.2's DSA layer
            assert_eq!([cfg.kv_lora_rank, cfg.rope_head_dim, cfg.index_head_dim], GLM);
            let mut fresh = std::ptr::null_mut();
            assert_eq!(unsafe { latent_cache_new(&cfg, &mut fresh) }, Status::Ok);
            let mut fresh_model = Model::new(GLM);
            huge_reserve(fresh, &fresh_model, tokens, &format!("reserve({tokens}) on a fresh layer"));
            append_either_way(
                fresh,
                &mut fresh_model,
                3,
                &mut rng,
                &format!("append_host after reserve({tokens}) on a fresh layer"),
            );
            unsafe { latent_cache_free(fresh) };

            huge_reserve(glm, &glm_model, tokens, &format!("reserve({tokens}) on a layer holding rows"));
            append_either_way(
                glm,
                &mut glm_model,
                3,
                &mut rng,
                &format!("append_host after reserve({tokens}) on a layer holding rows"),
            );
        }
    });

    for rank in [512, 1 << 24, i32::MAX as usize] {
        part(&mut failures, default_limit, &format!("merging an empty source, kv_lora_rank {rank}"), || {
            set_memory_limit(active_memory() + 64 * MB);
            empty_merge(rank);
        });
    }

    part(&mut failures, default_limit, "loads under a low memory limit", || {
        // GLM-shaped files: float32 (mlx-lm's layout) and Q8 (our own names), one of three layers.
        let dir = std::env::temp_dir().join(format!("latent-cache-memory-limit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut q8_cfg = latent_cache_config_default();
        q8_cfg.latent_storage = 3; // Q8
        q8_cfg.index_storage = 3;
        let configs = [latent_cache_config_default(), q8_cfg, latent_cache_config_default()];
        let mut set = std::ptr::null_mut();
        assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), configs.len(), &mut set) }, Status::Ok, "{}", last_error());
        let data = host_data(&mut rng, GLM, 2, 3_000); // ~17 MB a float32 layer
        let layer = |i: usize| {
            let mut c = std::ptr::null_mut();
            assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut c) }, Status::Ok, "{}", last_error());
            c
        };
        for i in 0..3 {
            assert_eq!(append_host(layer(i), 2, 3_000, &data), Status::Ok, "{}", last_error());
        }
        let (wide, q8) = (layer(0), layer(1));
        let mut files = Vec::new();
        for (name, cache) in [("f32", wide), ("q8", q8)] {
            let (mut out, mut len) = (std::ptr::null_mut::<u8>(), 0usize);
            assert_eq!(unsafe { latent_cache_save_to_buffer(cache, &mut out, &mut len) }, Status::Ok, "{}", last_error());
            let bytes = unsafe { std::slice::from_raw_parts(out, len) }.to_vec();
            unsafe { latent_cache_bytes_free(out, len) };
            files.push((name.to_string(), bytes));
        }
        let (mut out, mut len) = (std::ptr::null_mut::<u8>(), 0usize);
        assert_eq!(unsafe { latent_cache_set_save_to_buffer(set, &mut out, &mut len) }, Status::Ok, "{}", last_error());
        files.push(("set of three".into(), unsafe { std::slice::from_raw_parts(out, len) }.to_vec()));
        unsafe { latent_cache_bytes_free(out, len) };
        for (name, bytes) in &files {
            let path = dir.join("file.safetensors");
            std::fs::write(&path, bytes).unwrap();
            let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            let before = active_memory();
            set_memory_limit(before + bytes.len() / 10);
            let mut set_out = std::ptr::null_mut();
            let status = unsafe { latent_cache_set_load_from_buffer(bytes.as_ptr(), bytes.len(), &mut set_out) };
            assert_eq!(status, Status::Capacity, "set_load_from_buffer of {name} ({} bytes): {}", bytes.len(), last_error());
            assert!(set_out.is_null(), "a refused load wrote its output");
            let status = unsafe { latent_cache_set_load(c_path.as_ptr(), &mut set_out) };
            assert_eq!(status, Status::Capacity, "set_load of {name}: {}", last_error());
            assert!(set_out.is_null() && !last_error().is_empty(), "a refused load wrote its output, or no message");
            if name != "set of three" {
                let mut one = std::ptr::null_mut();
                let status = unsafe { latent_cache_load_from_buffer(bytes.as_ptr(), bytes.len(), &mut one) };
                assert_eq!(status, Status::Capacity, "load_from_buffer of {name}: {}", last_error());
                let status = unsafe { latent_cache_load(c_path.as_ptr(), &mut one) };
                assert_eq!(status, Status::Capacity, "load of {name}: {}", last_error());
                assert!(one.is_null(), "a refused load wrote its output");
            }
            let after = active_memory();
            assert!(after <= memory_limit(), "{name}: MLX holds {after} bytes past its {}-byte limit", memory_limit());
            assert!(after <= before + bytes.len() / 10, "{name}: refused loads left {} bytes", after - before);
            set_memory_limit(default_limit);
            let status = unsafe { latent_cache_set_load_from_buffer(bytes.as_ptr(), bytes.len(), &mut set_out) };
            assert_eq!(status, Status::Ok, "{name} under the default limit: {}", last_error());
            unsafe { latent_cache_set_free(set_out) };
        }
        unsafe { latent_cache_set_free(set) };
        let _ = std::fs::remove_dir_all(&dir);
    });

    part(&mut failures, default_limit, "usable again after the limit is restored", || {
        assert_equal(wide, &wide_model, "big merge source, after refusals");
        assert_equal(long, &long_model, "big extract source, after refusals");
        let data = host_data(&mut rng, GLM, 2, 5);
        assert_eq!(append_host(glm, 2, 5, &data), Status::Ok, "append_host after restoring the limit: {}", last_error());
        glm_model.append(2, 5, &data);
        assert_eq!(unsafe { latent_cache_reserve(glm, 2_000) }, Status::Ok, "reserve(2000): {}", last_error());
        let data = host_data(&mut rng, GLM, 2, 300);
        assert_eq!(append_host(glm, 2, 300, &data), Status::Ok, "append_host into the reservation: {}", last_error());
        glm_model.append(2, 300, &data);
        assert_equal(glm, &glm_model, "appends after restoring the limit");
        let mut single: *mut Handle = std::ptr::null_mut();
        assert_eq!(unsafe { latent_cache_extract_row(long, 0, &mut single) }, Status::Ok, "extract_row: {}", last_error());
        assert_equal(single, &long_model.extract(0), "extract_row after restoring the limit");
        unsafe { latent_cache_free(single) };
    });

    for cache in [glm, wide, long] {
        unsafe { latent_cache_free(cache) };
    }

    part(&mut failures, default_limit, "freed memory returns to the system when the engine asks", || {
        let (cache, _) = filled(GLM, 2, 3_000, &mut rng);
        let held = info();
        let (active, _, limit) = mlx_counters();
        assert_eq!((held.active, held.limit), (active, limit), "the library reports MLX's own counters");
        assert!(held.peak >= held.active);
        unsafe { latent_cache_free(cache) };
        let freed = info();
        let stored = 2 * 3_000 * bytes_per_token(GLM);
        assert!(held.active - freed.active >= stored, "freeing the cache releases its {stored} bytes");
        assert!(freed.cache >= stored, "MLX keeps them for reuse: {} bytes cached", freed.cache);
        assert_eq!(latent_cache_clear_memory_cache(), Status::Ok);
        assert_eq!(info().cache, 0, "clearing returns every cached buffer");
        assert_eq!(mlx_counters().1, 0);
    });
    assert!(failures.is_empty(), "{} part(s) failed:\n{}", failures.len(), failures.join("\n"));
}

fn refused_or_invalid(status: Status, what: &str) {
    let message = last_error();
    assert!(
        matches!(status, Status::InvalidArgument | Status::Capacity | Status::Backend),
        "{what}: expected a refusal, got {status:?} ({message})"
    );
    assert!(!message.is_empty(), "{what}: refused without a message");
}

/// Under a low limit, on layers of kv_lora_rank `rank` (one position of 2^24 is 64 MB, of
/// INT32_MAX ~8.6 GB): the layer may be refused at creation; otherwise merging one empty source
/// gives one empty row (or an allocation refusal), its views evaluate (or are refused), and a
/// reservation for that row is either really allocated or refused. Nothing crashes.
fn empty_merge(rank: usize) {
    let mut cfg = latent_cache_config_default();
    cfg.kv_lora_rank = rank;
    let widths = [rank, cfg.rope_head_dim, cfg.index_head_dim];
    let mut source = std::ptr::null_mut();
    let status = unsafe { latent_cache_new(&cfg, &mut source) };
    if status != Status::Ok {
        refused_or_invalid(status, &format!("latent_cache_new with kv_lora_rank {rank}"));
        eprintln!("memory_limit: latent_cache_new refused kv_lora_rank {rank} ({status:?})");
        return;
    }
    let mut destination = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_new(&cfg, &mut destination) }, Status::Ok, "{}", last_error());
    let status = unsafe { latent_cache_reserve(source, 1) }; // no rows yet: nothing to allocate
    assert!(matches!(status, Status::Ok | Status::Capacity), "reserve(1) on an empty layer of rank {rank}: {status:?}");

    let sources = [source.cast_const()];
    let status = unsafe { latent_cache_merge_rows(destination, sources.as_ptr(), 1) };
    let merged = match status {
        Status::Ok => Model::merge(&[&Model::new(widths)]),
        other => {
            refused(other, &format!("merge_rows of an empty source of rank {rank}"));
            Model::new(widths)
        }
    };
    let mut views = [mlx_array { ctx: std::ptr::null_mut() }; 3];
    let [l, r, i] = &mut views;
    let status = unsafe { latent_cache_state(destination, l, r, i) };
    if status == Status::Ok {
        let status = unsafe { latent_cache_eval(views.as_ptr(), 3) };
        assert!(matches!(status, Status::Ok | Status::Backend), "eval of the views of rank {rank}: {status:?}");
        if status == Status::Ok {
            for (f, &view) in views.iter().enumerate() {
                assert_view(view, &merged, f, &format!("state of the merged layer of rank {rank}"));
            }
        }
        for v in views {
            unsafe { latent_cache_array_free(v) };
        }
    } else {
        refused(status, &format!("state of the merged layer of rank {rank}"));
    }
    if !merged.rows.is_empty() {
        let before = active_memory();
        let status = unsafe { latent_cache_reserve(destination, 10_000) };
        // The row's first buffers (a few hundred positions) may be released in the same call.
        let need = (10_000 - 1024) * bytes_per_token(widths);
        if status == Status::Ok {
            let grown = active_memory().saturating_sub(before);
            assert!(grown >= need, "reserve(10000) of rank {rank}: OK, but active memory grew by {grown} of {need} bytes");
        } else {
            refused(status, &format!("reserve(10000) on a one-row layer of rank {rank}"));
        }
    }
    assert_equal(destination, &merged, &format!("merged layer of rank {rank}"));
    unsafe { latent_cache_free(source) };
    unsafe { latent_cache_free(destination) };
}

//! Appends write in place: appending a few positions to a cache holding a large reserved
//! buffer, through the host path and through MLX arrays (views released, then evaluated), never
//! makes MLX hold a second copy of the buffer (its peak memory stays far below the buffer's
//! size), and the values stay equal to the reference model. A held view forces the documented
//! copy, which the same measure sees. A rollback in which right-justified rows keep different
//! counts moves only the rows that shift, in place; a merge into a cache with a reservation keeps
//! it, so the merged rows append without reallocating. (Its own test binary, one test: MLX's
//! peak memory is process-wide.)
mod common;

use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::rows::latent_cache_merge_rows;
use latent_cache::ffi::spec::*;
use mlx_sys::mlx_array;

use common::check::{append_host, assert_equal, filled, host_array, host_data, last_error, new_cache};
use common::model::{Model, Rng};

const WIDTHS: [usize; 3] = [512, 64, 128];
const RESERVED: usize = 40_000;

fn memory(get: unsafe extern "C" fn(*mut usize) -> i32) -> usize {
    let mut bytes = 0;
    assert_eq!(unsafe { get(&mut bytes) }, 0);
    bytes
}

/// MLX's peak memory above `base` while `f` runs.
fn peak_during(f: impl FnOnce()) -> usize {
    unsafe { mlx_sys::mlx_reset_peak_memory() };
    let base = memory(mlx_sys::mlx_get_active_memory);
    f();
    memory(mlx_sys::mlx_get_peak_memory).saturating_sub(base)
}

/// append_latent with one position; the returned views are kept (`keep`) or freed at once,
/// then the cache is evaluated through a fresh state view.
fn append_latent_and_eval(cache: *mut latent_cache::ffi::latent_cache, data: &[Vec<f32>; 3], keep: bool) -> Vec<mlx_array> {
    let inputs: Vec<mlx_array> = (0..3).map(|f| host_array(&data[f], 1, WIDTHS[f])).collect();
    let mut views = [mlx_array { ctx: std::ptr::null_mut() }; 3];
    let [latent, rope, keys] = &mut views;
    let status = unsafe { latent_cache_append_latent(cache, inputs[0], inputs[1], inputs[2], latent, rope, keys) };
    assert_eq!(status, Status::Ok, "append_latent: {}", last_error());
    for a in inputs {
        unsafe { latent_cache_array_free(a) };
    }
    if !keep {
        views.iter().for_each(|&v| unsafe { latent_cache_array_free(v) });
    }
    // Evaluate through new views of the state, released right after.
    let mut state = [mlx_array { ctx: std::ptr::null_mut() }; 3];
    let [l, r, k] = &mut state;
    assert_eq!(unsafe { latent_cache_state(cache, l, r, k) }, Status::Ok);
    assert_eq!(unsafe { latent_cache_eval(state.as_ptr(), 3) }, Status::Ok, "eval: {}", last_error());
    state.iter().for_each(|&v| unsafe { latent_cache_array_free(v) });
    if keep {
        views.to_vec()
    } else {
        Vec::new()
    }
}

#[test]
fn appends_write_in_place() {
    let mut rng = Rng::new(11);
    let (cache, mut model) = filled(WIDTHS, 1, 64, &mut rng);
    assert_eq!(unsafe { latent_cache_reserve(cache, RESERVED) }, Status::Ok, "reserve: {}", last_error());
    let buffer = RESERVED * WIDTHS.iter().sum::<usize>() * 4;
    let small = buffer / 10;

    for step in 0..4 {
        let data = host_data(&mut rng, WIDTHS, 1, 2);
        let peak = peak_during(|| assert_eq!(append_host(cache, 1, 2, &data), Status::Ok, "append_host: {}", last_error()));
        model.append(1, 2, &data);
        assert!(peak < small, "append_host {step} peaked {peak} bytes above the cache; the buffer is {buffer}: it was copied");
    }
    assert_equal(cache, &model, "host appends into the reservation");

    for step in 0..4 {
        let data = host_data(&mut rng, WIDTHS, 1, 1);
        let peak = peak_during(|| drop(append_latent_and_eval(cache, &data, false)));
        model.append(1, 1, &data);
        assert!(peak < small, "append_latent {step} peaked {peak} bytes above the cache; the buffer is {buffer}: it was copied");
    }
    assert_equal(cache, &model, "MLX-array appends into the reservation");

    // Views held across the next append: the documented copy, which this measure must see
    // (otherwise the checks above could not fail).
    let data = host_data(&mut rng, WIDTHS, 1, 1);
    let held = append_latent_and_eval(cache, &data, true);
    model.append(1, 1, &data);
    let data = host_data(&mut rng, WIDTHS, 1, 1);
    let peak = peak_during(|| drop(append_latent_and_eval(cache, &data, false)));
    model.append(1, 1, &data);
    assert!(peak >= buffer / 2, "an append while views are held peaked only {peak} bytes; the buffer is {buffer}");
    // A view kept across an append keeps the values it had: it is the state before that append.
    let mut before = model.clone();
    before.trim(1);
    assert_eq!(unsafe { latent_cache_eval(held.as_ptr(), held.len()) }, Status::Ok, "eval: {}", last_error());
    for (f, &view) in held.iter().enumerate() {
        common::check::assert_view(view, &before, f, "a view kept across the next append");
    }
    held.iter().for_each(|&v| unsafe { latent_cache_array_free(v) });
    assert_equal(cache, &model, "after an append with held views");
    unsafe { latent_cache_free(cache) };

    // An uneven rollback of right-justified rows: three rows keep everything, the fourth drops
    // three positions and shifts. Only its positions move; the buffers are not rebuilt.
    let (rows, reserved) = (4, 10_000);
    let (batch, mut model) = filled(WIDTHS, rows, 200, &mut rng);
    assert_eq!(unsafe { latent_cache_reserve(batch, reserved) }, Status::Ok, "reserve: {}", last_error());
    let buffer = rows * reserved * WIDTHS.iter().sum::<usize>() * 4;
    assert_eq!(unsafe { latent_cache_spec_round_begin(batch) }, Status::Ok);
    model.begin();
    let data = host_data(&mut rng, WIDTHS, rows, 4);
    assert_eq!(append_host(batch, rows, 4, &data), Status::Ok);
    model.append(rows, 4, &data);
    let keep = [4, 4, 4, 1];
    let peak = peak_during(|| {
        let status = unsafe { latent_cache_spec_round_rollback_rows(batch, keep.as_ptr(), keep.len()) };
        assert_eq!(status, Status::Ok, "rollback: {}", last_error());
        let mut state = [mlx_array { ctx: std::ptr::null_mut() }; 3];
        let [l, r, k] = &mut state;
        assert_eq!(unsafe { latent_cache_state(batch, l, r, k) }, Status::Ok);
        assert_eq!(unsafe { latent_cache_eval(state.as_ptr(), 3) }, Status::Ok, "eval: {}", last_error());
        state.iter().for_each(|&v| unsafe { latent_cache_array_free(v) });
    });
    model.rollback(&keep);
    // A rebuild allocates every buffer anew (the whole `buffer`); moving one row in place
    // allocates only its copy on the CPU. (MLX's CUDA backend was seen to peak at about 28% of
    // the buffers here, still far from a rebuild.)
    assert!(peak < buffer / 2, "the uneven rollback peaked {peak} bytes above the cache; the buffers hold {buffer}");
    assert_equal(batch, &model, "after an uneven rollback in place");
    unsafe { latent_cache_free(batch) };

    // A merge into a reserved cache keeps the reservation: the merge allocates the reserved
    // buffers, and appends up to the reservation then never reallocate.
    let sources: Vec<(*mut latent_cache::ffi::latent_cache, Model)> = (0..2).map(|_| filled(WIDTHS, 1, 100, &mut rng)).collect();
    let merged = new_cache(WIDTHS, 0);
    assert_eq!(unsafe { latent_cache_reserve(merged, reserved) }, Status::Ok);
    let handles: Vec<_> = sources.iter().map(|(c, _)| c.cast_const()).collect();
    let before = memory(mlx_sys::mlx_get_active_memory);
    let status = unsafe { latent_cache_merge_rows(merged, handles.as_ptr(), handles.len()) };
    assert_eq!(status, Status::Ok, "merge: {}", last_error());
    let held = memory(mlx_sys::mlx_get_active_memory) - before;
    let reserved_bytes = 2 * reserved * WIDTHS.iter().sum::<usize>() * 4;
    assert!(held >= reserved_bytes, "the merge holds {held} bytes; the reservation needs {reserved_bytes}");
    let mut model = Model::merge(&[&sources[0].1, &sources[1].1]);
    let data = host_data(&mut rng, WIDTHS, 2, 2000);
    let peak = peak_during(|| assert_eq!(append_host(merged, 2, 2000, &data), Status::Ok, "{}", last_error()));
    model.append(2, 2000, &data);
    assert!(peak < reserved_bytes / 2, "an append within the reservation peaked {peak} bytes: it reallocated");
    assert_equal(merged, &model, "appends after a merge into a reservation");
    for (cache, _) in sources {
        unsafe { latent_cache_free(cache) };
    }
    unsafe { latent_cache_free(merged) };
}

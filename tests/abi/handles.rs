//! Stale handles are never confused with new ones: after a cache is freed and 1,000 others are
//! created (an allocator may hand its address to one of them), every kind of call on the old
//! pointer is refused with NULL_ARGUMENT and a message, writes no output, and reads or changes
//! no live cache; a second free of it leaves every live cache intact.
use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::query::*;
use latent_cache::ffi::rows::*;
use latent_cache::ffi::spec::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use mlx_sys::mlx_array;

use crate::common::check::{append_host, assert_equal, host_data, last_error, new_cache};
use crate::common::model::{Model, Rng};

const WIDTHS: [usize; 3] = [8, 4, 3];
const LIVE: usize = 1000;
const SENTINEL: usize = 0xDEAD;

/// Leaves a known message on this thread, so a refusal that sets none is noticed.
fn prime_message() -> String {
    let mut out = mlx_array { ctx: std::ptr::null_mut() };
    let one = [1f32];
    assert_eq!(unsafe { latent_cache_array_from_host(one.as_ptr(), 1, 1, 1, 2, &mut out) }, Status::Shape);
    last_error()
}

/// Runs `call` on the stale handle: it must be refused with NULL_ARGUMENT and a new message.
fn refused(failures: &mut Vec<String>, name: &str, call: impl FnOnce() -> Status) {
    let primed = prime_message();
    let status = call();
    let message = last_error();
    if status != Status::NullArgument {
        failures.push(format!("{name} on a freed handle returned {status:?}"));
    } else if message.is_empty() || message == primed {
        failures.push(format!("{name} on a freed handle set no message"));
    }
}

fn unwritten(failures: &mut Vec<String>, name: &str, written: bool) {
    if written {
        failures.push(format!("{name} on a freed handle wrote its output"));
    }
}

/// Every call that takes a handle, on `stale`; `live` is a live cache used where a call needs a
/// second handle.
fn every_call_refuses(stale: *mut Handle, live: *mut Handle) -> Vec<String> {
    let mut f = Vec::new();
    let c = stale.cast_const();
    let (w, d) = (WIDTHS, [1f32; 64]);
    let null_array = mlx_array { ctx: std::ptr::null_mut() };

    refused(&mut f, "append_host", || unsafe {
        latent_cache_append_host(stale, 1, 1, d.as_ptr(), w[0], d.as_ptr(), w[1], d.as_ptr(), w[2])
    });
    let inputs: Vec<mlx_array> = (0..3)
        .map(|k| {
            let mut a = null_array;
            assert_eq!(unsafe { latent_cache_array_from_host(d.as_ptr(), w[k], 1, 1, w[k], &mut a) }, Status::Ok);
            a
        })
        .collect();
    let mut outs = [null_array; 3];
    let [l, r, i] = &mut outs;
    refused(&mut f, "append_latent", || unsafe { latent_cache_append_latent(stale, inputs[0], inputs[1], inputs[2], l, r, i) });
    unwritten(&mut f, "append_latent", outs.iter().any(|a| !a.ctx.is_null()));
    let pad = [0usize];
    let mut outs = [null_array; 3];
    let [l, r, i] = &mut outs;
    refused(&mut f, "append_latent_padded", || unsafe {
        latent_cache_append_latent_padded(stale, pad.as_ptr(), 1, inputs[0], inputs[1], inputs[2], l, r, i)
    });
    unwritten(&mut f, "append_latent_padded", outs.iter().any(|a| !a.ctx.is_null()));
    refused(&mut f, "append_host_padded", || unsafe {
        latent_cache_append_host_padded(stale, 1, 1, pad.as_ptr(), 1, d.as_ptr(), w[0], d.as_ptr(), w[1], d.as_ptr(), w[2])
    });
    for a in inputs {
        unsafe { latent_cache_array_free(a) };
    }
    let mut keys = null_array;
    refused(&mut f, "stored_index_keys", || unsafe { latent_cache_stored_index_keys(c, &mut keys) });
    unwritten(&mut f, "stored_index_keys", !keys.ctx.is_null());
    let mut outs = [null_array; 3];
    let [l, r, i] = &mut outs;
    refused(&mut f, "state", || unsafe { latent_cache_state(c, l, r, i) });
    unwritten(&mut f, "state", outs.iter().any(|a| !a.ctx.is_null()));
    let path = c"/nonexistent/never-written.safetensors";
    refused(&mut f, "save", || unsafe { latent_cache::ffi::persist::latent_cache_save(c, path.as_ptr()) });
    let (mut bytes, mut len) = (std::ptr::null_mut(), 0);
    refused(&mut f, "save_to_buffer", || unsafe {
        latent_cache::ffi::persist::latent_cache_save_to_buffer(c, &mut bytes, &mut len)
    });
    unwritten(&mut f, "save_to_buffer", !bytes.is_null() || len != 0);
    let mut donor = std::ptr::null_mut();
    refused(&mut f, "capture_donor_rows", || unsafe { latent_cache::ffi::donor::latent_cache_capture_donor_rows(c, &mut donor) });
    unwritten(&mut f, "capture_donor_rows", !donor.is_null());
    let mut packed =
        latent_cache_packed { storage: 7, bits: 7, group_size: 7, values: null_array, scales: null_array, biases: null_array };
    refused(&mut f, "packed_state", || unsafe { latent_cache_packed_state(c, 0, &mut packed) });
    unwritten(&mut f, "packed_state", packed.storage != 7 || !packed.values.ctx.is_null());

    let mut buf = vec![f32::NAN; 4096];
    let mut written = SENTINEL;
    refused(&mut f, "read_row_host", || unsafe {
        latent_cache_read_row_host(c, 0, 0, buf.as_mut_ptr(), buf.len(), &mut written)
    });
    refused(&mut f, "read_host", || unsafe { latent_cache_read_host(c, 0, buf.as_mut_ptr(), buf.len(), &mut written) });
    unwritten(&mut f, "read_row_host/read_host", written != SENTINEL || buf.iter().any(|x| !x.is_nan()));
    refused(&mut f, "trim", || unsafe { latent_cache_trim(stale, 0, false) });
    refused(&mut f, "trim (bypass)", || unsafe { latent_cache_trim(stale, 1, true) });
    refused(&mut f, "reserve", || unsafe { latent_cache_reserve(stale, 64) });
    let mut sig = [0x55 as std::ffi::c_char; 256];
    refused(&mut f, "signature", || unsafe { latent_cache_signature(c, sig.as_mut_ptr(), sig.len(), &mut written) });
    unwritten(&mut f, "signature", written != SENTINEL || sig.iter().any(|&b| b != 0x55));

    type Query = unsafe extern "C" fn(*const Handle, *mut usize) -> Status;
    let queries: [(&str, Query); 9] = [
        ("offset", latent_cache_offset),
        ("batch_size", latent_cache_batch_size),
        ("kv_lora_rank", latent_cache_kv_lora_rank),
        ("rope_head_dim", latent_cache_rope_head_dim),
        ("index_head_dim", latent_cache_index_head_dim),
        ("bytes_per_token", latent_cache_bytes_per_token),
        ("byte_length", latent_cache_byte_length),
        ("max_append_tokens", latent_cache_max_append_tokens),
        ("minimum_reusable_offset", latent_cache_minimum_reusable_offset),
    ];
    for (name, query) in queries {
        let mut out = SENTINEL;
        refused(&mut f, name, || unsafe { query(c, &mut out) });
        unwritten(&mut f, name, out != SENTINEL);
    }
    let mut list = [SENTINEL; 16];
    refused(&mut f, "row_offsets", || unsafe { latent_cache_row_offsets(c, list.as_mut_ptr(), list.len(), &mut written) });
    refused(&mut f, "left_pad", || unsafe { latent_cache_left_pad(c, list.as_mut_ptr(), list.len(), &mut written) });
    refused(&mut f, "row_ends", || unsafe { latent_cache_row_ends(c, list.as_mut_ptr(), list.len(), &mut written) });
    unwritten(&mut f, "row_offsets/left_pad/row_ends", written != SENTINEL || list.iter().any(|&x| x != SENTINEL));
    let mut flag = false;
    refused(&mut f, "is_trimmable", || unsafe { latent_cache_is_trimmable(c, &mut flag) });
    refused(&mut f, "in_spec_round", || unsafe { latent_cache_in_spec_round(c, &mut flag) });
    unwritten(&mut f, "is_trimmable/in_spec_round", flag);

    let sources = [live.cast_const()];
    refused(&mut f, "merge_rows (freed destination)", || unsafe { latent_cache_merge_rows(stale, sources.as_ptr(), 1) });
    let destination = new_cache(WIDTHS, 0);
    let sources = [live.cast_const(), c];
    refused(&mut f, "merge_rows (freed source)", || unsafe { latent_cache_merge_rows(destination, sources.as_ptr(), 2) });
    let mut batch = SENTINEL;
    assert_eq!(unsafe { latent_cache_batch_size(destination, &mut batch) }, Status::Ok);
    if batch != 0 {
        f.push(format!("merge_rows with a freed source filled the destination ({batch} rows)"));
    }
    unsafe { latent_cache_free(destination) };
    let mut single = 0x1234 as *mut Handle;
    refused(&mut f, "extract_row", || unsafe { latent_cache_extract_row(c, 0, &mut single) });
    unwritten(&mut f, "extract_row", single != 0x1234 as *mut Handle);
    let keep = [0usize];
    refused(&mut f, "filter_rows", || unsafe { latent_cache_filter_rows(stale, keep.as_ptr(), 1) });
    refused(&mut f, "spec_round_begin", || unsafe { latent_cache_spec_round_begin(stale) });
    refused(&mut f, "spec_round_commit", || unsafe { latent_cache_spec_round_commit(stale) });
    refused(&mut f, "spec_round_rollback", || unsafe { latent_cache_spec_round_rollback(stale, 0) });
    refused(&mut f, "spec_round_rollback_rows", || unsafe { latent_cache_spec_round_rollback_rows(stale, keep.as_ptr(), 1) });
    refused(&mut f, "reset", || unsafe { latent_cache_reset(stale) });
    f
}

/// A cache holding one row of one position with values from `rng`.
fn one_row(rng: &mut Rng) -> (*mut Handle, Model) {
    let cache = new_cache(WIDTHS, 0);
    let data = host_data(rng, WIDTHS, 1, 1);
    assert_eq!(append_host(cache, 1, 1, &data), Status::Ok, "{}", last_error());
    let mut model = Model::new(WIDTHS);
    model.append(1, 1, &data);
    (cache, model)
}

/// Indices of the live caches that no longer equal their model.
fn changed_caches(live: &[(*mut Handle, Model)], after: &str) -> Vec<usize> {
    let check = |k: usize| {
        let (cache, model) = (live[k].0, &live[k].1);
        std::panic::catch_unwind(|| assert_equal(cache, model, &format!("live cache {k} after {after}"))).is_err()
    };
    (0..live.len()).filter(|&k| check(k)).collect()
}

#[test]
fn a_freed_handle_is_refused_after_many_new_caches() {
    let mut rng = Rng::new(31);
    let (stale, _) = one_row(&mut rng);
    unsafe { latent_cache_free(stale) };
    let live: Vec<(*mut Handle, Model)> = (0..LIVE).map(|_| one_row(&mut rng)).collect();
    let reused = live.iter().any(|&(c, _)| c == stale);

    let failures = every_call_refuses(stale, live[LIVE / 2].0);
    let changed = changed_caches(&live, "calls on a freed handle");
    assert!(
        failures.is_empty() && changed.is_empty(),
        "address reused by a live cache: {reused}; live caches changed: {changed:?}; {failures:#?}"
    );

    // A second free is detected and ignored: it sets a message and touches no live cache.
    let primed = prime_message();
    unsafe { latent_cache_free(stale) };
    let message = last_error();
    let changed = changed_caches(&live, "a second free of a freed handle");
    assert!(changed.is_empty(), "live caches changed or gone after a second free of a freed handle: {changed:?}");
    assert!(!message.is_empty() && message != primed, "a second free set no message");
    for (cache, _) in live {
        unsafe { latent_cache_free(cache) };
    }
}

#[test]
fn a_freed_handle_is_refused_right_after_the_next_create() {
    // The likeliest reuse: the very next allocation of the same size.
    let mut rng = Rng::new(32);
    for round in 0..50 {
        let (stale, _) = one_row(&mut rng);
        unsafe { latent_cache_free(stale) };
        let (fresh, model) = one_row(&mut rng);
        let failures = every_call_refuses(stale, fresh);
        assert_equal(fresh, &model, &format!("round {round}: new cache after calls on the freed one"));
        unsafe { latent_cache_free(stale) };
        assert_equal(fresh, &model, &format!("round {round}: new cache after a second free of the freed one"));
        assert!(failures.is_empty(), "round {round}, same address: {}; {failures:#?}", fresh == stale);
        unsafe { latent_cache_free(fresh) };
    }
}

//! Decodes arbitrary bytes into a sequence of C API calls on two caches (a right-justified DSA
//! layer with a position limit, a ragged plain layer without): appends, padded appends, trims,
//! rounds, row operations, merges, resets, padded prefills (prepare / finalize) and forks of a
//! row into rows over a shared prefix, including
//! invalid calls, and checks every result
//! against the reference model: a call the documented rules accept must succeed and leave the
//! cache equal to the model; a call they reject must fail with a message and change nothing.
//! Shared by the fuzz target (fuzz/) and the corpus replay in `make test`.
#![allow(dead_code)]

use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::last_error::latent_cache_last_error;
use latent_cache::ffi::prefill::*;
use latent_cache::ffi::prefix::latent_cache_fork_row;
use latent_cache::ffi::rows::*;
use latent_cache::ffi::spec::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

use super::check::assert_equal;
use super::model::{Model, Prefill};

const WIDTHS: [[usize; 3]; 2] = [[4, 2, 3], [4, 2, 0]];
const MAX_TOKENS: [usize; 2] = [40, 0];

struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn next(&mut self) -> usize {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b as usize
    }

    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
}

struct Slot {
    cache: *mut Handle,
    model: Model,
    dsa: bool,
    max_tokens: usize,
    /// Positions of the shared prefix below every row (a fork's); trims and a prefill's right
    /// padding stop above it.
    shared: usize,
}

fn new_cache(kind: usize) -> *mut Handle {
    let mut cfg = latent_cache_config_default();
    cfg.kv_lora_rank = WIDTHS[kind][0];
    cfg.rope_head_dim = WIDTHS[kind][1];
    cfg.index_head_dim = WIDTHS[kind][2];
    cfg.max_tokens = MAX_TOKENS[kind];
    cfg.layout = kind as u32; // cache 1 is ragged
    let mut cache = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_new(&cfg, &mut cache) }, Status::Ok);
    cache
}

fn expect(status: Status, valid: bool, what: &str) {
    if valid {
        if status != Status::Ok {
            let mut buf = vec![0 as std::ffi::c_char; 512];
            unsafe { latent_cache_last_error(buf.as_mut_ptr(), buf.len()) };
            let message = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
            panic!("{what} should succeed; got {status:?}: {message}");
        }
    } else {
        assert_ne!(status, Status::Ok, "{what} should be rejected");
        assert!(unsafe { latent_cache_last_error(std::ptr::null_mut(), 0) } > 0, "{what}: no message");
    }
}

/// Runs the calls encoded in `data`.
pub fn run_bytes(data: &[u8]) {
    let mut bytes = Bytes { data, at: 0 };
    let mut slots: Vec<Slot> = (0..2)
        .map(|k| {
            let mut model = Model::new(WIDTHS[k]);
            model.ragged = k == 1;
            Slot { cache: new_cache(k), model, dsa: k == 0, max_tokens: MAX_TOKENS[k], shared: 0 }
        })
        .collect();
    let mut step = 0;
    while !bytes.done() && step < 200 {
        step += 1;
        let k = bytes.next() % 2;
        let op = bytes.next() % 17;
        let what = format!("step {step} op {op} on cache {k}");
        if std::env::var("DRIVER_TRACE").is_ok() {
            let m = &slots[k].model;
            eprintln!("{what}: rows {:?} pads {:?} round {:?}", m.row_offsets(), m.pads, m.round);
        }
        if op == 11 {
            merge(&mut slots, k, bytes.next() % 2, &what);
            continue;
        }
        let slot = &mut slots[k];
        let shared = slot.shared;
        let (batch, model) = (slot.model.rows.len(), &mut slot.model);
        match op {
            0..=2 => {
                let rows = if batch > 0 && bytes.next() % 8 != 0 { batch } else { bytes.next() % 4 };
                let tokens = bytes.next() % 5;
                let corrupt = bytes.next();
                let with_keys = match corrupt % 16 {
                    0 => !slot.dsa,
                    _ => slot.dsa,
                };
                // Index keys passed to a layer without them get a plausible 3-wide buffer.
                let mut lens: [usize; 3] = std::array::from_fn(|f| rows * tokens * if f == 2 { 3 } else { model.widths[f] });
                if corrupt % 16 == 1 {
                    lens[corrupt % if with_keys { 3 } else { 2 }] += 1;
                }
                let data: [Vec<f32>; 3] = std::array::from_fn(|f| (0..lens[f]).map(|i| (step * 1000 + i) as f32 * 0.5).collect());
                let key_len = if with_keys { lens[2] } else { 0 };
                // A prepared prefill binds the first append's batch and gives it its left padding.
                let prepared = if batch == 0 { prepared_rows(model) } else { None };
                let left = match (&model.prefill, batch) {
                    (Some(p), 0) => p.left.clone(),
                    _ => None,
                };
                let valid = rows > 0
                    && tokens > 0
                    && (batch == 0 || rows == batch)
                    && prepared.map_or(true, |n| n == rows)
                    && left.as_ref().map_or(true, |l| l.iter().all(|&p| p <= tokens))
                    && with_keys == slot.dsa
                    && corrupt % 16 != 1
                    && (slot.max_tokens == 0 || model.offset() + tokens <= slot.max_tokens);
                let keys_ptr = if with_keys { data[2].as_ptr() } else { std::ptr::null() };
                let status = unsafe {
                    latent_cache_append_host(
                        slot.cache,
                        rows,
                        tokens,
                        data[0].as_ptr(),
                        lens[0],
                        data[1].as_ptr(),
                        lens[1],
                        keys_ptr,
                        key_len,
                    )
                };
                expect(status, valid, &what);
                if valid {
                    let exact: [Vec<f32>; 3] = std::array::from_fn(|f| data[f][..rows * tokens * model.widths[f]].to_vec());
                    match &left {
                        Some(pads) => model.append_padded(rows, tokens, pads, &exact),
                        None => model.append(rows, tokens, &exact),
                    }
                }
            }
            3 => {
                let n = bytes.next() % 8;
                let bypass = bytes.next() % 2 == 1;
                // Shared positions are never trimmed.
                let shortest = model.row_offsets().into_iter().min().unwrap_or(0).saturating_sub(shared);
                // Inside a round a bypass trim may drop only what every row appended in it.
                let in_round = match model.round {
                    Some(_) => (0..batch).map(|r| model.appended_in_round(r)).min().unwrap_or(0),
                    None => 0,
                };
                let valid = n <= shortest && (model.round.is_none() || (bypass && n <= in_round));
                expect(unsafe { latent_cache_trim(slot.cache, n, bypass) }, valid, &what);
                if valid {
                    model.trim(n);
                }
            }
            4 => {
                let valid = model.round.is_none() && model.prefill.is_none();
                expect(unsafe { latent_cache_spec_round_begin(slot.cache) }, valid, &what);
                if valid {
                    model.begin();
                }
            }
            5 => {
                let valid = model.round.is_some();
                expect(unsafe { latent_cache_spec_round_commit(slot.cache) }, valid, &what);
                model.round = None;
            }
            6 | 7 => {
                let len = if op == 6 || bytes.next() % 8 != 0 { batch } else { bytes.next() % 4 };
                let keep: Vec<usize> = match op {
                    6 => vec![bytes.next() % 4; batch],
                    _ => (0..len).map(|_| bytes.next() % 4).collect(),
                };
                let uniform = keep.first().copied().unwrap_or(bytes.next() % 2);
                // A uniform rollback of an empty batch may keep nothing (the round appended nothing).
                let valid = model.round.is_some()
                    && keep.len() == batch
                    && keep.iter().enumerate().all(|(r, &n)| n <= model.appended_in_round(r))
                    && !(op == 6 && batch == 0 && uniform > 0);
                let status = match op {
                    6 => unsafe { latent_cache_spec_round_rollback(slot.cache, uniform) },
                    _ => unsafe { latent_cache_spec_round_rollback_rows(slot.cache, keep.as_ptr(), keep.len()) },
                };
                expect(status, valid, &what);
                if valid {
                    model.rollback(&keep);
                }
            }
            8 => {
                let family = bytes.next() % 4;
                let row = bytes.next() % 4;
                let short = bytes.next() % 4 == 0;
                let width = if family < 3 { model.widths[family] } else { 0 };
                let need = if row < batch { model.len(row) * width } else { 0 };
                let len = if short && need > 0 { need - 1 } else { need };
                let mut out = vec![0f32; len];
                let mut written = 0;
                let valid = family < 3 && width > 0 && row < batch && !(short && need > 0);
                let status =
                    unsafe { latent_cache_read_row_host(slot.cache, family as u32, row, out.as_mut_ptr(), len, &mut written) };
                expect(status, valid, &what);
            }
            9 => {
                let keep: Vec<usize> = (0..bytes.next() % 4).map(|_| bytes.next() % 5).collect();
                let mut seen = [false; 8];
                let distinct = keep.iter().all(|&r| !std::mem::replace(&mut seen[r], true));
                let valid = model.round.is_none() && !keep.is_empty() && distinct && keep.iter().all(|&r| r < batch);
                expect(unsafe { latent_cache_filter_rows(slot.cache, keep.as_ptr(), keep.len()) }, valid, &what);
                if valid {
                    model.filter(&keep);
                }
            }
            10 => {
                let row = bytes.next() % 4;
                let mut single = std::ptr::null_mut();
                let valid = row < batch;
                expect(unsafe { latent_cache_extract_row(slot.cache, row, &mut single) }, valid, &what);
                if valid {
                    // A row leaving mid-prefill leaves with its prompt alone.
                    assert_equal(single, &model.prompts_above(shared).extract(row), &what);
                    unsafe { latent_cache_free(single) };
                }
            }
            12 => {
                // The first append of a padded batch.
                let rows = 1 + bytes.next() % 3;
                let tokens = bytes.next() % 5;
                let pads: Vec<usize> = (0..rows - bytes.next() % 2).map(|_| bytes.next() % 6).collect();
                let data: [Vec<f32>; 3] = std::array::from_fn(|f| {
                    let w = if f == 2 && !slot.dsa { 0 } else { model.widths[f] };
                    (0..rows * tokens * w).map(|i| (step * 1000 + i) as f32 * 0.25).collect()
                });
                let valid = batch == 0
                    && model.round.is_none()
                    && tokens > 0
                    && prepared_rows(model).map_or(true, |n| n == rows)
                    && pads.len() == rows
                    && pads.iter().all(|&p| p <= tokens)
                    && pads.contains(&0)
                    && (slot.max_tokens == 0 || tokens <= slot.max_tokens);
                let keys = if slot.dsa { data[2].as_ptr() } else { std::ptr::null() };
                let status = unsafe {
                    latent_cache_append_host_padded(
                        slot.cache,
                        rows,
                        tokens,
                        pads.as_ptr(),
                        pads.len(),
                        data[0].as_ptr(),
                        data[0].len(),
                        data[1].as_ptr(),
                        data[1].len(),
                        keys,
                        data[2].len(),
                    )
                };
                expect(status, valid, &what);
                if valid {
                    model.append_padded(rows, tokens, &pads, &data);
                }
            }
            13 => {
                expect(unsafe { latent_cache_reset(slot.cache) }, true, &what);
                slot.model = slot.model.empty_like();
                slot.shared = 0;
            }
            14 => prefill_prepare(&mut bytes, slot, &what),
            16 => {
                // Row `row` becomes the shared prefix of `n` new rows.
                let (row, n) = (bytes.next() % 4, bytes.next() % 4);
                let len = if row < batch { model.len(row) } else { 0 };
                let valid = model.round.is_none()
                    && model.prefill.is_none()
                    && row < batch
                    && n > 0
                    && len > 0
                    && (slot.max_tokens == 0 || len < slot.max_tokens);
                expect(unsafe { latent_cache_fork_row(slot.cache, row, n) }, valid, &what);
                if valid {
                    model.rows = vec![model.rows[row].clone(); n];
                    model.pads = vec![0; n];
                    slot.shared = len;
                }
            }
            _ => prefill_finalize(slot, &what),
        }
        assert_equal(slots[k].cache, &slots[k].model, &what);
    }
    for slot in slots {
        unsafe { latent_cache_free(slot.cache) };
    }
}

/// Merges cache `k` with cache `other` (itself, or the cache of the other geometry) into a fresh
/// destination; sources must be unchanged; a small successful merge replaces cache `k`.
fn merge(slots: &mut [Slot], k: usize, other: usize, what: &str) {
    let destination = new_cache(k);
    let sources = [slots[k].cache.cast_const(), slots[other].cache.cast_const()];
    // Sources mid-prefill give their rows' prompts.
    let merged =
        Model::merge(&[&slots[k].model.prompts_above(slots[k].shared), &slots[other].model.prompts_above(slots[other].shared)]);
    let valid = other == k;
    expect(unsafe { latent_cache_merge_rows(destination, sources.as_ptr(), 2) }, valid, what);
    for slot in slots.iter() {
        assert_equal(slot.cache, &slot.model, what);
    }
    if valid {
        assert_equal(destination, &merged, what);
    }
    if valid && merged.rows.len() <= 6 && slots[k].model.round.is_none() {
        unsafe { latent_cache_free(slots[k].cache) };
        slots[k].cache = destination;
        slots[k].model = merged;
    } else {
        unsafe { latent_cache_free(destination) };
    }
}

/// The rows a prepared prefill's vectors name (None when no vector was given or none is open).
fn prepared_rows(model: &Model) -> Option<usize> {
    let p = model.prefill.as_ref()?;
    [&p.lengths, &p.left, &p.right].into_iter().flatten().map(Vec::len).next()
}

/// `latent_cache_prefill_prepare` with vectors decoded from the bytes, each present or NULL.
fn prefill_prepare(bytes: &mut Bytes<'_>, slot: &mut Slot, what: &str) {
    let model = &mut slot.model;
    let batch = model.rows.len();
    let n = if batch > 0 && bytes.next() % 4 != 0 { batch } else { bytes.next() % 4 };
    let mut vector =
        |max: usize| -> Option<Vec<usize>> { (bytes.next() % 2 == 0).then(|| (0..n).map(|_| bytes.next() % max).collect()) };
    let (lengths, mut left, right) = (vector(6), vector(3), vector(3));
    if let Some(l) = &mut left {
        if !l.is_empty() && bytes.next() % 4 != 0 {
            l[0] = 0; // usually a row without padding, as the longest prompt has
        }
    }
    let given = lengths.is_some() || left.is_some() || right.is_some();
    let valid = model.round.is_none()
        && model.prefill.is_none()
        && left.as_ref().map_or(true, |l| batch == 0 && l.contains(&0))
        && (!given || batch == 0 || n == batch);
    let ptr = |v: &Option<Vec<usize>>| v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
    let status = unsafe { latent_cache_prefill_prepare(slot.cache, ptr(&lengths), ptr(&left), ptr(&right), n) };
    expect(status, valid, what);
    if valid {
        model.prefill = Some(Prefill { lengths, left, right, base: model.row_offsets() });
    }
}

/// `latent_cache_prefill_finalize`: every row drops its right padding; `lengths` must match.
fn prefill_finalize(slot: &mut Slot, what: &str) {
    let shared = slot.shared;
    let model = &mut slot.model;
    let status = unsafe { latent_cache_prefill_finalize(slot.cache) };
    let Some(p) = model.prefill.clone() else {
        expect(status, true, what);
        return;
    };
    let rows = model.rows.len();
    let drops = p.right.clone().unwrap_or_else(|| vec![0; rows]);
    let now = model.row_offsets();
    let valid = drops.len() == rows
        && (0..rows).all(|b| drops[b] + shared <= now[b])
        && p.lengths.as_ref().map_or(true, |lengths| {
            lengths.len() == rows
                && (0..rows).all(|b| (now[b] - drops[b]).saturating_sub(p.base.get(b).copied().unwrap_or(0)) == lengths[b])
        });
    expect(status, valid, what);
    if valid {
        for (b, d) in drops.iter().enumerate() {
            model.truncate_row(b, now[b] - d);
        }
        model.prefill = None;
    }
}

//! Shared prefixes (`latent-cache-bench --shared-prefix`): one GLM-5.2 layer (bfloat16, DSA
//! index keys) holding a prompt of `context` positions under `n` continuations, two systems side
//! by side in one run:
//! - "shared prefix": the prompt forked (`fork_row`): held once, read once per step for every row;
//! - "copies": the prompt copied into every row (`merge_rows` of the prompt `n` times, what a
//!   cache without sharing does, and mlx-lm's deep copy per prefix hit).
//!
//! Records per context: the fork (or copy) itself, MLX's active memory held after every row
//! appended one position, and a decode step (one query per row, 64 heads) of dense attention and
//! of DSA (index scores, top-2048, selected attention), the two systems stepped alternately.
//! Beside them, today's join and leave of a running batch (`merge_rows`, `filter_rows`): every
//! row copied into new buffers, at `batch` rows of `context` positions; and the same over one
//! shared prompt of `context` positions, rows holding 64 of their own (only those are copied).
use std::time::Instant;

use latent_cache::core::mlx::eval::eval;
use latent_cache::core::mlx::{memory, ops};
use latent_cache::{Geometry, LatentCache, StorageMode};
use mlx_rs::{Array, Dtype};

use crate::attention::{summary, uniform};
use crate::model_step::{CHUNK, HEADS, INDEX, INDEX_HEADS, RANK, ROPE, TOPK};

fn geometry() -> Geometry {
    Geometry {
        kv_lora_rank: RANK,
        rope_head_dim: ROPE,
        index_head_dim: INDEX,
        latent_storage: StorageMode::Bf16,
        rope_storage: StorageMode::Bf16,
        index_storage: StorageMode::Bf16,
        ..Geometry::default()
    }
}

/// `rows` rows of `context` positions, reserved to exactly that (so a fork keeps the buffer).
fn filled(rows: usize, context: usize, seed: u64) -> LatentCache {
    let mut cache = LatentCache::new(geometry()).unwrap();
    cache.reserve(context).unwrap();
    let n = CHUNK.min(context);
    let chunk = [RANK, ROPE, INDEX].map(|w| uniform(&[rows, n, w], seed + w as u64));
    let mut done = 0;
    while done < context {
        let take = n.min(context - done);
        let factor = ops::scalar(1.0 + done as f32 / context as f32);
        let part = |a: &Array, w: usize| ops::multiply(&ops::slice(a, &[0, 0, 0], &[rows, take, w]).unwrap(), &factor).unwrap();
        cache.append(&part(&chunk[0], RANK), &part(&chunk[1], ROPE), Some(&part(&chunk[2], INDEX))).unwrap();
        cache.eval().unwrap();
        done += take;
    }
    cache
}

/// One position appended to every row, evaluated.
fn step_append(cache: &mut LatentCache, seed: u64) {
    let rows = cache.batch_size();
    let [l, r, k] = [RANK, ROPE, INDEX].map(|w| ops::astype(&uniform(&[rows, 1, w], seed + w as u64), Dtype::Bfloat16).unwrap());
    cache.append(&l, &r, Some(&k)).unwrap();
    cache.eval().unwrap();
}

fn active() -> usize {
    memory::clear_cache().unwrap();
    memory::info().active
}

fn us(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e6
}

fn record(system: &str, scenario: &str, batch: usize, context: usize, t: [f64; 3], samples: usize, held: usize) -> String {
    let line = format!(
        "{{\"system\": \"{system}\", \"scenario\": \"{scenario}\", \"batch\": {batch}, \"context\": {context}, \
         \"median_us\": {:.1}, \"p10_us\": {:.1}, \"p90_us\": {:.1}, \"samples\": {samples}, \"held_bytes\": {held}}}",
        t[0], t[1], t[2]
    );
    eprintln!("{line}");
    line
}

struct Queries {
    latent: Array,
    rope: Array,
    index: Array,
    weights: Array,
}

fn queries(rows: usize) -> Queries {
    let bf = |a: Array| ops::astype(&a, Dtype::Bfloat16).unwrap();
    let q = Queries {
        latent: bf(uniform(&[rows, HEADS, 1, RANK], 1)),
        rope: bf(uniform(&[rows, HEADS, 1, ROPE], 2)),
        index: bf(uniform(&[rows, INDEX_HEADS, 1, INDEX], 3)),
        weights: bf(uniform(&[rows, 1, INDEX_HEADS], 4)),
    };
    eval([&q.latent, &q.rope, &q.index, &q.weights]).unwrap();
    q
}

/// `samples` decode attentions over each of two caches, alternately (after two warm-up rounds),
/// each cache's times in microseconds.
fn side_by_side(caches: [&LatentCache; 2], q: &Queries, sparse: bool, samples: usize) -> [Vec<f64>; 2] {
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..samples + 2 {
        for (cache, t) in caches.iter().zip(times.iter_mut()) {
            let start = Instant::now();
            attend(cache, q, sparse);
            if i >= 2 {
                t.push(us(start));
            }
        }
    }
    times
}

/// One decode step's attention over `cache`'s rows, built and evaluated: dense, or DSA.
fn attend(cache: &LatentCache, q: &Queries, sparse: bool) {
    use latent_cache::core::attention::MaskMode;
    let donor = cache.capture_donor_rows().unwrap();
    let scale = 0.0625;
    let out = match sparse {
        false => donor.attend(&q.latent, &q.rope, scale, MaskMode::None, None).unwrap(),
        true => {
            let scores = donor.index_scores(&q.index, &q.weights, MaskMode::None).unwrap();
            match donor.select(&scores, TOPK).unwrap() {
                Some(idx) => donor.attend_selected(&q.latent, &q.rope, scale, MaskMode::None, &idx).unwrap(),
                None => donor.attend(&q.latent, &q.rope, scale, MaskMode::None, None).unwrap(),
            }
        }
    };
    eval([&out]).unwrap();
}

/// Fork against copies at one context, `n` continuations.
fn fork_and_step(out: &mut Vec<String>, context: usize, n: usize, samples: usize) {
    let before = active();
    let mut shared = filled(1, context, 7);
    let start = Instant::now();
    shared.fork_row(0, n).unwrap();
    let fork_us = us(start);
    step_append(&mut shared, 11);
    let shared_held = active() - before;
    let mut copied = LatentCache::new(geometry()).unwrap();
    let copy_us = {
        let prompt = filled(1, context, 7);
        let start = Instant::now();
        copied.merge_rows(&vec![&prompt; n]).unwrap();
        copied.eval().unwrap();
        us(start)
    };
    step_append(&mut copied, 11);
    let copied_held = active() - before - shared_held;
    out.push(record("shared prefix", "fork", n, context, [fork_us; 3], 1, shared_held));
    out.push(record("copies (merge_rows)", "fork", n, context, [copy_us; 3], 1, copied_held));
    let q = queries(n);
    for sparse in [false, true] {
        let [a, b] = side_by_side([&shared, &copied], &q, sparse, samples);
        let scenario = if sparse { "decode attention, DSA" } else { "decode attention, dense" };
        out.push(record("shared prefix", scenario, n, context, summary(a), samples, shared_held));
        out.push(record("copies (merge_rows)", scenario, n, context, summary(b), samples, copied_held));
    }
}

/// Median, p10, p90 of `samples` joins (`running` and `joiner` merged into a new cache) and
/// leaves (the merged batch's first row filtered out).
fn join_then_leave(running: &LatentCache, joiner: &LatentCache, samples: usize) -> [[f64; 3]; 2] {
    let (mut join, mut leave) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let mut merged = LatentCache::new(geometry()).unwrap();
        let start = Instant::now();
        merged.merge_rows(&[running, joiner]).unwrap();
        merged.eval().unwrap();
        join.push(us(start));
        let keep: Vec<usize> = (1..merged.batch_size()).collect();
        let start = Instant::now();
        merged.filter_rows(&keep).unwrap();
        merged.eval().unwrap();
        leave.push(us(start));
    }
    [summary(join), summary(leave)]
}

/// Median, p10, p90 of `samples` joins into the running batch itself (`merge_rows` into a
/// cache holding rows: the joiner takes a free slot), and of leaves three ways: row 0 with the
/// last row taking its slot (`filter_rows([last, 1, 2, ..])`: one row moves), the last row
/// (nothing moves), and the middle row with the order kept (the smaller side of it moves). The
/// batch holds `batch - 1` rows between samples, in `batch` slots.
fn join_then_leave_in_slots(running: &mut LatentCache, joiner: &LatentCache, samples: usize) -> [[f64; 3]; 4] {
    let (mut join, mut leaves) = (Vec::new(), [Vec::new(), Vec::new(), Vec::new()]);
    for _ in 0..samples {
        for (how, times) in leaves.iter_mut().enumerate() {
            let start = Instant::now();
            running.merge_rows(&[joiner]).unwrap();
            running.eval().unwrap();
            join.push(us(start));
            let n = running.batch_size();
            let keep: Vec<usize> = match how {
                0 => std::iter::once(n - 1).chain(1..n - 1).collect(),
                1 => (0..n - 1).collect(),
                _ => (0..n).filter(|&b| b != n / 2).collect(),
            };
            let start = Instant::now();
            running.filter_rows(&keep).unwrap();
            running.eval().unwrap();
            times.push(us(start));
        }
    }
    let [a, b, c] = leaves;
    [summary(join), summary(a), summary(b), summary(c)]
}

/// A join (a one-row request of `context` positions joining a running batch of `batch - 1`
/// rows) and leaves, side by side: the batch rebuilt (`merge_rows` into a new cache, every row
/// copied: the library's join before slots) and its first row leaving with the order kept
/// (`filter_rows(1..n)`: row 0's slot moves, nothing is copied; before slots every row was);
/// then the same in the running batch's slots (the joiner written into a free slot; the last
/// row moved into the leaver's slot, the last row leaving, the middle row leaving in order). Then the rebuilt join and ordered leave over one shared prompt: `batch - 1`
/// continuations of 64 positions each and a joining request of 64 over the same prompt, where
/// merge and filter copy the rows' own positions.
fn join_and_leave(out: &mut Vec<String>, batch: usize, context: usize, samples: usize) {
    let joiner = filled(1, context, 23);
    let [join, leave] = join_then_leave(&filled(batch - 1, context, 21), &joiner, samples);
    out.push(record("copies (merge_rows into a new cache)", "join", batch, context, join, samples, 0));
    out.push(record("first row leaves, order kept (filter_rows 1..n)", "leave", batch, context, leave, samples, 0));
    let mut running = filled(batch - 1, context, 21);
    running.reserve_rows(batch).unwrap();
    let [join, first, last, middle] = join_then_leave_in_slots(&mut running, &joiner, samples);
    let held = running.bytes_in_use();
    out.push(record("slots (merge_rows into the batch)", "join", batch, context, join, 3 * samples, held));
    out.push(record("slots (filter_rows, last row into the leaver's slot)", "leave", batch, context, first, samples, held));
    out.push(record("slots (filter_rows, last row leaves)", "leave", batch, context, last, samples, held));
    out.push(record("slots (filter_rows, middle row leaves, order kept)", "leave", batch, context, middle, samples, held));
    drop(running);
    let mut running = filled(1, context, 21);
    running.fork_row(0, batch - 1).unwrap();
    step_own(&mut running, 64);
    let mut joiner = running.extract_row(0).unwrap();
    joiner.trim(64, false).unwrap();
    step_own(&mut joiner, 64);
    let [join, leave] = join_then_leave(&running, &joiner, samples);
    out.push(record("shared prefix (merge_rows)", "join", batch, context, join, samples, 0));
    out.push(record("shared prefix (filter_rows)", "leave", batch, context, leave, samples, 0));
}

/// Requests churning through a running batch of `batch` rows with one spare slot, as engines
/// run continuous batching: each step one request leaves (the oldest: first in, first out; the
/// newest: last in, first out; or any, the order kept, chosen by a fixed pseudo-random walk) and
/// a one-row request of `context` positions joins (`merge_rows` into the batch). Median, p10 and
/// p90 of the joins and of the leaves over `steps` steps after a warm-up of `batch` steps (so
/// that first-in-first-out has wrapped around the slots); then a decode step's attention over
/// the rows as the churn left them beside the same rows in one run, `attention_samples` each
/// (none: not measured; a CPU takes about a second per attention of 16 rows at 4K).
fn churn(out: &mut Vec<String>, batch: usize, context: usize, steps: usize, attention_samples: usize) {
    let joiner = filled(1, context, 23);
    for pattern in ["first in, first out", "last in, first out", "any row leaves, order kept"] {
        let mut running = filled(batch, context, 21);
        running.reserve_rows(batch + 1).unwrap();
        let (mut join, mut leave, mut pick) = (Vec::new(), Vec::new(), 7usize);
        for step in 0..batch + steps {
            pick = (pick * 5 + 3) % batch;
            let gone = match pattern {
                "first in, first out" => 0,
                "last in, first out" => batch - 1,
                _ => pick,
            };
            let keep: Vec<usize> = (0..batch).filter(|&b| b != gone).collect();
            let start = Instant::now();
            running.filter_rows(&keep).unwrap();
            running.eval().unwrap();
            let left = us(start);
            let start = Instant::now();
            running.merge_rows(&[&joiner]).unwrap();
            running.eval().unwrap();
            if step >= batch {
                leave.push(left);
                join.push(us(start));
            }
        }
        let held = running.bytes_in_use();
        out.push(record(&format!("churn: {pattern}"), "join", batch, context, summary(join), steps, held));
        out.push(record(&format!("churn: {pattern}"), "leave", batch, context, summary(leave), steps, held));
        // A decode step's attention over the batch as the churn left it (its rows in up to four
        // runs of slots, one launch each) beside the same rows in one run (merged afresh).
        if attention_samples == 0 {
            continue;
        }
        let mut one_run = LatentCache::new(geometry()).unwrap();
        one_run.merge_rows(&[&running]).unwrap();
        one_run.eval().unwrap();
        let q = queries(batch);
        for sparse in [false, true] {
            let [runs, one] = side_by_side([&running, &one_run], &q, sparse, attention_samples);
            let step = if sparse { "decode attention, DSA" } else { "decode attention, dense" };
            out.push(record(
                &format!("churn: {pattern}, rows as left"),
                step,
                batch,
                context,
                summary(runs),
                attention_samples,
                held,
            ));
            out.push(record(
                &format!("churn: {pattern}, rows in one run"),
                step,
                batch,
                context,
                summary(one),
                attention_samples,
                held,
            ));
        }
    }
}

/// `n` positions appended to every row, one append.
fn step_own(cache: &mut LatentCache, n: usize) {
    let rows = cache.batch_size();
    let [l, r, k] = [RANK, ROPE, INDEX].map(|w| ops::astype(&uniform(&[rows, n, w], 5 + w as u64), Dtype::Bfloat16).unwrap());
    cache.append(&l, &r, Some(&k)).unwrap();
    cache.eval().unwrap();
}

/// Every part (`only`: "fork", "join" or "churn" for one of them; "join" runs the churn too).
/// `churn_attention`: also time attention over churned rows (GPU runs).
pub fn run(
    contexts: &[usize],
    n: usize,
    batches: &[usize],
    samples: usize,
    only: Option<&str>,
    churn_attention: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for &context in contexts {
        if only.is_none_or(|o| o == "fork") {
            fork_and_step(&mut out, context, n, samples);
        }
        for &batch in batches.iter().filter(|_| only.is_none_or(|o| o == "join")) {
            join_and_leave(&mut out, batch, context, 3);
        }
        for &batch in batches.iter().filter(|_| only.is_none_or(|o| o == "churn" || o == "join")) {
            churn(&mut out, batch, context, 16, if churn_attention { 3 } else { 0 });
        }
    }
    out
}

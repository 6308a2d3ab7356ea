//! The whole decode step as GLM-5.2 runs it (`latent-cache-bench --model-step`): its 78 target
//! layers each append one position per row and attend, built as one graph and evaluated once per
//! step (the MTP layer is not part of the step). Two systems side by side in one run (and on a
//! GPU a labelled variant of the sparse one, `EARLIER_SPARSE`):
//! - sparse: DSA as the model runs it: index scores and top-2048 on the 21 layers that run the
//!   indexer (`glm52_selects`), every layer attending over the selection of its source layer
//!   (`glm52_selection_source`);
//! - dense: every layer attending over its whole window.
//!
//! After each step every layer is trimmed back by the position it appended (a trim moves an
//! offset), so every step runs at the same context. Each system is timed two ways:
//! - single (`"timing": "single"`): build the step's graph, evaluate it and wait, one step at a
//!   time (the library's `eval`, on its evaluation thread);
//! - pipelined (`"timing": "pipelined"`): step n+1's graph is built (and its layers trimmed)
//!   while the device runs step n, as an engine's decode loop overlaps them: build n+1, MLX
//!   `async_eval` it, then wait for n. Timed is the interval between one step's completion and
//!   the next's, with the library's `eval_async` (`latent_cache_eval_async`) and `eval`, as an
//!   engine on the C API runs it. Appends into a layer step n still reads wait inside the append
//!   for those reads to finish (`LATENT_CACHE_WAIT_FOR_READERS=0` turns that off, to measure the
//!   copies it saves).
//! - build (`"timing": "build"`): building the step's graph alone (the appends, the index scores
//!   and selections, the attention; no evaluation), the host's share of a step; each graph is
//!   then evaluated and trimmed outside the timing.
//!
//! Records: median, p10, p90 (us) of the step after warmup, and the bytes of stored state the
//! step reads, for the bandwidth floor; beside the sparse step, MLX's own time for a plain graph
//! of as many operations (`ops_floor.rs`). mlx-lm's peer of this step: bench/mlx_lm_model_step.py.
use latent_cache::core::attention::{Donor, MaskMode};
use latent_cache::core::kernels::{cuda, decode, metal};
use latent_cache::core::mlx::eval::{eval, eval_async};
use latent_cache::core::mlx::{memory, ops};
use latent_cache::core::model::presets::{glm52_selection_source, glm52_selects, GLM52_TARGET_LAYERS};
use latent_cache::{Family, Geometry, LatentCache, StorageMode};
use mlx_rs::{Array, Dtype};
use std::time::Instant;

use crate::attention::{summary, time, uniform};
use crate::modes::ModeSet;
use crate::ops_floor;

pub(crate) const HEADS: usize = 64;
pub(crate) const INDEX_HEADS: usize = 32;
pub(crate) const TOPK: usize = 2048;
pub(crate) const RANK: usize = 512;
pub(crate) const ROPE: usize = 64;
pub(crate) const INDEX: usize = 128;
pub(crate) const CHUNK: usize = 4096;

/// GLM-5.2's 78 target layers stored as `set` says, filled to `context` positions per row.
fn model(set: &ModeSet, batch: usize, context: usize) -> Vec<LatentCache> {
    let n = CHUNK.min(context);
    let chunk = [RANK, ROPE, INDEX].map(|w| uniform(&[batch, n, w], w as u64));
    eval(chunk.iter()).unwrap();
    (0..GLM52_TARGET_LAYERS)
        .map(|l| {
            let index_head_dim = if glm52_selects(l) { INDEX } else { 0 };
            let g = Geometry {
                kv_lora_rank: RANK,
                rope_head_dim: ROPE,
                index_head_dim,
                latent_storage: set.storage[0],
                rope_storage: set.storage[1],
                index_storage: set.storage[2],
                hot_window: set.hot_window,
                hot_storage: StorageMode::Bf16,
                ..Geometry::default()
            };
            let mut cache = LatentCache::new(g).unwrap();
            cache.reserve(context + 1).unwrap();
            let mut done = 0;
            while done < context {
                let factor = ops::scalar(1.0 + (done + l) as f32 / context as f32);
                let take = n.min(context - done);
                let part = |a: &Array, w: usize| ops::multiply(&ops::slice(a, &[0, 0, 0], &[batch, take, w]).unwrap(), &factor);
                let (lat, rope) = (part(&chunk[0], RANK).unwrap(), part(&chunk[1], ROPE).unwrap());
                let keys = (index_head_dim > 0).then(|| part(&chunk[2], INDEX).unwrap());
                cache.append(&lat, &rope, keys.as_ref()).unwrap();
                cache.eval().unwrap();
                done += take;
            }
            cache
        })
        .collect()
}

struct Queries {
    latent: Array,
    rope: Array,
    index: Array,
    weights: Array,
    new: [Array; 3],
}

fn queries(batch: usize, dtype: Dtype) -> Queries {
    let q =
        |shape: &[usize], seed| ops::astype(&ops::multiply(&uniform(shape, seed), &ops::scalar(0.05)).unwrap(), dtype).unwrap();
    let qs = Queries {
        latent: q(&[batch, HEADS, 1, RANK], 1),
        rope: q(&[batch, HEADS, 1, ROPE], 2),
        index: q(&[batch, INDEX_HEADS, 1, INDEX], 3),
        weights: q(&[batch, 1, INDEX_HEADS], 4),
        new: [q(&[batch, 1, RANK], 5), q(&[batch, 1, ROPE], 6), q(&[batch, 1, INDEX], 7)],
    };
    eval([&qs.latent, &qs.rope, &qs.index, &qs.weights, &qs.new[0], &qs.new[1], &qs.new[2]]).unwrap();
    qs
}

/// One decode step of every layer as one graph (not evaluated): the outputs of the 78 layers.
fn build(layers: &mut [LatentCache], q: &Queries, sparse: bool) -> Vec<Array> {
    build_layers(layers, q, sparse, |_| true)
}

/// `build` of the layers `take` names (a layer reusing a selection needs its source's).
fn build_layers(layers: &mut [LatentCache], q: &Queries, sparse: bool, take: impl Fn(usize) -> bool) -> Vec<Array> {
    let scale = 1.0 / ((192 + ROPE) as f32).sqrt();
    let mut outs = Vec::with_capacity(layers.len());
    let mut selections: Vec<Option<Array>> = vec![None; layers.len()];
    for (l, cache) in layers.iter_mut().enumerate().filter(|(l, _)| take(*l)) {
        let keys = glm52_selects(l).then_some(&q.new[2]);
        cache.append(&q.new[0], &q.new[1], keys).unwrap();
        if keys.is_some() && !sparse {
            // Dense attention does not read the index keys it appends: the step evaluates them
            // (views of the stored keys among its outputs, as mlx-lm's dense step makes its
            // attention depend on the indexer cache), or their appends would pile up unevaluated.
            outs.extend(cache.stored_parts(Family::IndexKeys).unwrap());
        }
        let donor: Donor = cache.capture_donor_rows().unwrap();
        let out = if sparse {
            if glm52_selects(l) {
                selections[l] = donor.index_select(&q.index, &q.weights, MaskMode::None, TOPK).unwrap();
            }
            match &selections[glm52_selection_source(l)] {
                Some(indices) => donor.attend_selected(&q.latent, &q.rope, scale, MaskMode::None, indices).unwrap(),
                None => donor.attend(&q.latent, &q.rope, scale, MaskMode::None, None).unwrap(),
            }
        } else {
            donor.attend(&q.latent, &q.rope, scale, MaskMode::None, None).unwrap()
        };
        outs.push(out);
    }
    outs
}

/// The MLX operations of one step's graph, by primitive, as MLX prints the graph (see
/// `modes::printed_graph`): the whole step, and the operations one layer adds (a layer running
/// the indexer, a layer reusing its selection, a dense layer), counted from graphs of the
/// layers alone. Our kernels are a primitive each where they run (CUDA), so the count depends on
/// the device. Every layer is trimmed back after.
/// Returns the record and the step's slice updates and operations.
fn ops_record(
    layers: &mut [LatentCache],
    q: &Queries,
    sparse: bool,
    system: &str,
    mode: &str,
    at: (usize, usize),
) -> (String, usize, usize) {
    let mut count = |take: &dyn Fn(usize) -> bool| -> std::collections::BTreeMap<String, usize> {
        let outs = build_layers(layers, q, sparse, take);
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for line in crate::modes::printed_graph(&outs).lines().skip(2).collect::<std::collections::BTreeSet<_>>() {
            *counts.entry(line.split(' ').next().unwrap_or("").to_string()).or_default() += 1;
        }
        eval(outs.iter()).unwrap();
        for (l, cache) in layers.iter_mut().enumerate() {
            if take(l) {
                cache.trim(1, false).unwrap();
            }
        }
        counts
    };
    let total = |c: &std::collections::BTreeMap<String, usize>| c.values().sum::<usize>();
    let step = count(&|_| true);
    // Layer 2 runs the indexer; layer 3 reuses its selection (GLM-5.2's schedule).
    let source = total(&count(&|l| l == 2));
    let reusing = total(&count(&|l| l == 2 || l == 3)) - source;
    let by: Vec<String> = step.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
    let line = format!(
        "{{\"system\": \"model step, {system}\", \"mode\": \"{mode}\", \"scenario\": \"ops_per_step\", \"batch\": {}, \"context\": {}, \
         \"ops\": {}, \"layers\": {GLM52_TARGET_LAYERS}, \"ops_layer_2\": {source}, \"ops_layer_3\": {reusing}, \"by_primitive\": {{{}}}}}",
        at.0,
        at.1,
        total(&step),
        by.join(", ")
    );
    eprintln!("{line}");
    (line, step.get("SliceUpdate").copied().unwrap_or(0), total(&step))
}

/// `measure`'s result and the most memory MLX held during it above what it held at its start:
/// the step's transient arrays, and any buffer an append copied rather than wrote in place (on
/// MLX's GPU backends an append evaluated while an earlier step's kernels still hold its buffer
/// copies all of it: the pipelined timing shows it).
fn peak_above<T>(measure: impl FnOnce() -> T) -> (T, usize) {
    let start = memory::info().active;
    memory::reset_peak().unwrap();
    let out = measure();
    (out, memory::info().peak.saturating_sub(start))
}

/// Every layer trimmed back by the position its step appended.
fn trim(layers: &mut [LatentCache]) {
    for cache in layers.iter_mut() {
        cache.trim(1, false).unwrap();
    }
}

/// One decode step of every layer as one graph, evaluated once; then each layer trimmed back.
fn step(layers: &mut [LatentCache], q: &Queries, sparse: bool) {
    let outs = build(layers, q, sparse);
    eval(outs.iter()).unwrap();
    drop(outs);
    trim(layers);
}

/// Building one step's graph, timed alone; the graph is then evaluated and trimmed, untimed.
fn build_time(layers: &mut [LatentCache], q: &Queries, sparse: bool, warmup: usize, samples: usize) -> [f64; 3] {
    let mut us = Vec::with_capacity(samples);
    for i in 0..warmup + samples {
        let start = Instant::now();
        let outs = build(layers, q, sparse);
        let took = start.elapsed().as_secs_f64() * 1e6;
        eval(outs.iter()).unwrap();
        drop(outs);
        trim(layers);
        if i >= warmup {
            us.push(took);
        }
    }
    summary(us)
}

/// Pipelined steps: step n+1 is built and handed to MLX (`async_eval`) before waiting for step
/// n. Median, p10, p90 (us) of the intervals between successive steps' completions, after
/// `warmup` steps.
fn pipelined(layers: &mut [LatentCache], q: &Queries, sparse: bool, warmup: usize, samples: usize) -> [f64; 3] {
    pipelined_loop(warmup, samples, || {
        let next = build(layers, q, sparse);
        eval_async(next.iter()).unwrap();
        trim(layers);
        next
    })
}

/// The pipelined loop: `launch` builds a step and hands it to MLX, returning its arrays; each
/// step is launched before the one before it is waited for. Median, p10, p90 (us) of the
/// intervals between successive completions, after `warmup` steps.
pub(crate) fn pipelined_loop(warmup: usize, samples: usize, mut launch: impl FnMut() -> Vec<Array>) -> [f64; 3] {
    let mut prev = launch();
    let mut last = Instant::now();
    let mut us = Vec::with_capacity(samples);
    for i in 0..warmup + samples {
        let next = launch();
        eval(prev.iter()).unwrap();
        let now = Instant::now();
        if i >= warmup {
            us.push((now - last).as_secs_f64() * 1e6);
        }
        last = now;
        prev = next;
    }
    eval(prev.iter()).unwrap();
    drop(prev);
    summary(us)
}

/// Records of both systems at each (batch, context) of `points`, stored as `set` says (its
/// name less "latent-cache " is the records' `mode`: "bf16", "f32", "q8 (rope bf16)", ...).
pub fn run(set: &ModeSet, points: &[(usize, usize)], quick: bool, ops_only: bool, earlier: bool) -> Vec<String> {
    let (warmup, samples) = if quick { (1, 2) } else { (3, 10) };
    let mode = set.name.trim_start_matches("latent-cache ");
    let dtype = if set.storage[0] == StorageMode::F32 { Dtype::Float32 } else { Dtype::Bfloat16 };
    // Bytes a position holds per family, as stored (the hot side of composed storage is
    // written, not read: its step reads the packed parts, as `modes` says).
    let per_position = |f: usize, w: usize| set.storage[f].bytes_per_position(w);
    let mut out = Vec::new();
    for &(batch, context) in points {
        let mut layers = model(set, batch, context);
        let q = queries(batch, dtype);
        let dsa_layers = (0..GLM52_TARGET_LAYERS).filter(|&l| glm52_selects(l)).count();
        let attended = per_position(0, RANK) + per_position(1, ROPE);
        let dense_bytes = batch * context * GLM52_TARGET_LAYERS * attended;
        let selected = TOPK.min(context);
        let sparse_bytes = batch * (dsa_layers * context * per_position(2, INDEX) + GLM52_TARGET_LAYERS * selected * attended);
        let mut systems = vec![("dense", false, dense_bytes), ("sparse (DSA)", true, sparse_bytes)];
        if earlier && (cuda::launch::on_cuda() || metal::on_metal()) {
            systems.push((EARLIER_SPARSE, true, sparse_bytes));
        }
        for (system, sparse, bytes) in systems {
            // The labelled variant: the selection's positions gathered first and selected by
            // MLX's argpartition (the kernels' switches off for this system alone).
            let earlier = system == EARLIER_SPARSE;
            for switch in [&decode::THROUGH_INDICES, &cuda::dsa_topk::KERNEL, &metal::dsa_topk::KERNEL] {
                switch.set_enabled(!earlier);
            }
            let (ops, updates, total) = ops_record(&mut layers, &q, sparse, system, mode, (batch, context));
            out.push(ops);
            if ops_only {
                continue;
            }
            if system == "sparse (DSA)" {
                // MLX's own floor for the sparse step's count of operations, beside it.
                out.extend(ops_floor::records(updates, total - updates, mode, (batch, context), warmup, samples));
            }
            let single = peak_above(|| time(warmup, samples, || step(&mut layers, &q, sparse)));
            let overlapped = peak_above(|| pipelined(&mut layers, &q, sparse, warmup, samples));
            let building = peak_above(|| build_time(&mut layers, &q, sparse, warmup, samples));
            for (timing, (t, peak)) in [("single", single), ("pipelined", overlapped), ("build", building)] {
                let line = format!(
                    "{{\"system\": \"model step, {system}\", \"mode\": \"{mode}\", \"timing\": \"{timing}\", \
                     \"batch\": {batch}, \"context\": {context}, \"median_us\": {:.1}, \"p10_us\": {:.1}, \"p90_us\": {:.1}, \
                     \"samples\": {samples}, \"layers\": {}, \"bytes_read\": {bytes}, \"peak_bytes_above_start\": {peak}}}",
                    t[0], t[1], t[2], GLM52_TARGET_LAYERS
                );
                eprintln!("{line}");
                out.push(line);
            }
        }
        for switch in [&decode::THROUGH_INDICES, &cuda::dsa_topk::KERNEL, &metal::dsa_topk::KERNEL] {
            switch.set_enabled(true);
        }
    }
    out
}

/// The labelled variant of the sparse step on a GPU: each selection's positions gathered before
/// the decode kernel, and the top-k by MLX's argpartition, as the library ran DSA before reading
/// selections through their indices and selecting by radix select.
const EARLIER_SPARSE: &str = "sparse (DSA), gathered, argpartition top-k (earlier path)";

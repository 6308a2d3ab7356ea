//! One GLM-5.2 layer's decode attention through the read path (`latent-cache-bench --attention`):
//! `Donor::attend` over the stored latent and rope key (64 query heads, kv_lora_rank 512, rope
//! 64, one query per row) per storage mode, at batch 1 and 8; and at the largest context DSA's
//! sparse step (index scores over the stored index keys, top-2048 selection, attention over the
//! selected positions). mlx-lm's absorbed path is measured the same way by
//! bench/mlx_lm_attention_bench.py. One record per (system, scenario, batch, context): median,
//! p10 and p90 of the step (build + one evaluation) after warmup, and the bytes of stored state
//! the step reads (for bandwidth).
use std::time::Instant;

use latent_cache::core::attention::{Donor, MaskMode};
use latent_cache::core::mlx::eval::eval;

use latent_cache::{Family, Geometry, LatentCache, StorageMode};
use mlx_rs::{Array, Dtype};

use crate::modes::{ModeSet, MODE_SETS};
use crate::systems::WIDTHS;
use latent_cache::core::kernels::{cuda, metal};
use latent_cache::core::mlx::ops;

/// GLM-5.2's attention: 64 query heads (qk_nope 192 + rope 64 wide before absorption); its
/// indexer: 32 heads of width 128, top-2048.
const HEADS: usize = 64;
const INDEX_HEADS: usize = 32;
const TOPK: usize = 2048;
const RANK: usize = WIDTHS[0];
const ROPE: usize = WIDTHS[1];
const INDEX: usize = WIDTHS[2];
/// Attentions per evaluation in the amortized scenario.
const REPEAT: usize = 20;
/// Positions per fill append.
const CHUNK: usize = 4096;

/// Uniform values in [-1, 1) from a fixed xorshift stream, `[shape]` float32.
pub(crate) fn uniform(shape: &[usize], seed: u64) -> Array {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Array::from_slice(&data, &shape.iter().map(|&d| d as i32).collect::<Vec<_>>())
}

/// A layer stored as `set` says, filled to `context` positions per row.
fn filled(set: &ModeSet, batch: usize, context: usize) -> LatentCache {
    let [latent_storage, rope_storage, index_storage] = set.storage;
    let g = Geometry {
        kv_lora_rank: RANK,
        rope_head_dim: ROPE,
        index_head_dim: INDEX,
        latent_storage,
        rope_storage,
        index_storage,
        hot_window: set.hot_window,
        hot_storage: StorageMode::Bf16,
        ..Geometry::default()
    };
    let mut cache = LatentCache::new(g).unwrap();
    cache.reserve(context).unwrap();
    let n = CHUNK.min(context);
    let chunk = [RANK, ROPE, INDEX].map(|w| uniform(&[batch, n, w], w as u64));
    eval(chunk.iter()).unwrap();
    let mut done = 0;
    while done < context {
        // Each chunk scaled differently, so positions (and index scores) stay distinct.
        let factor = ops::scalar(1.0 + done as f32 / context as f32);
        let take = n.min(context - done);
        let part = |a: &Array, w: usize| ops::multiply(&ops::slice(a, &[0, 0, 0], &[batch, take, w]).unwrap(), &factor);
        let [l, r, k] = [(&chunk[0], RANK), (&chunk[1], ROPE), (&chunk[2], INDEX)].map(|(a, w)| part(a, w).unwrap());
        cache.append(&l, &r, Some(&k)).unwrap();
        cache.eval().unwrap();
        done += take;
    }
    cache
}

/// Median, p10, p90 (us) of `samples` timed calls of `step` after `warmup`.
pub(crate) fn time(warmup: usize, samples: usize, mut step: impl FnMut()) -> [f64; 3] {
    let us: Vec<f64> = (0..warmup + samples)
        .map(|_| {
            let start = Instant::now();
            step();
            start.elapsed().as_secs_f64() * 1e6
        })
        .skip(warmup)
        .collect();
    summary(us)
}

/// Median, p10 and p90 of `v` (nearest rank).
pub(crate) fn summary(mut v: Vec<f64>) -> [f64; 3] {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.1), at(0.9)]
}

fn record(system: &str, scenario: &str, batch: usize, context: usize, t: [f64; 3], samples: usize, bytes: usize) -> String {
    let line = format!(
        "{{\"system\": \"{system}\", \"scenario\": \"{scenario}\", \"batch\": {batch}, \"context\": {context}, \
         \"median_us\": {:.1}, \"p10_us\": {:.1}, \"p90_us\": {:.1}, \"samples\": {samples}, \"heads\": {HEADS}, \
         \"topk\": {TOPK}, \"bytes_read\": {bytes}}}",
        t[0], t[1], t[2]
    );
    eprintln!("{line}");
    line
}

/// The dense step and (when `sparse`) the DSA step of one mode at one point.
fn measure(out: &mut Vec<String>, set: &ModeSet, batch: usize, context: usize, sparse: bool, runs: (usize, usize)) {
    let cache = filled(set, batch, context);
    let donor: Donor = cache.capture_donor_rows().unwrap();
    // Queries in the dtype an engine forms them in: float32 for the f32 mode, bfloat16 else.
    let dtype = if set.storage[0] == StorageMode::F32 { Dtype::Float32 } else { Dtype::Bfloat16 };
    let q =
        |shape: &[usize], seed| ops::astype(&ops::multiply(&uniform(shape, seed), &ops::scalar(0.05)).unwrap(), dtype).unwrap();
    let (q_latent, q_rope) = (q(&[batch, HEADS, 1, RANK], 1), q(&[batch, HEADS, 1, ROPE], 2));
    let (q_index, weights) = (q(&[batch, INDEX_HEADS, 1, INDEX], 3), q(&[batch, 1, INDEX_HEADS], 4));
    eval([&q_latent, &q_rope, &q_index, &weights]).unwrap();
    let scale = 1.0 / ((192 + ROPE) as f32).sqrt(); // mlx-lm's q_head_dim^-0.5
    let g = donor.geometry();
    let per_position = |f: Family| g.storage(f).bytes_per_position(g.width(f).unwrap());
    let attended = per_position(Family::Latent) + per_position(Family::Rope);
    let attend = || donor.attend(&q_latent, &q_rope, scale, MaskMode::None, None).unwrap();
    let dense = time(runs.0, runs.1, || eval([&attend()]).unwrap());
    out.push(record(set.name, "attention", batch, context, dense, runs.1, batch * context * attended));
    // Where the split-K kernel ran (either backend's, each counting its own launches; and which
    // partial pass), the labelled variants below.
    let decode = [&cuda::mla_decode::KERNEL, &metal::mla_decode::KERNEL];
    let decode_launches = || decode.iter().map(|k| k.launches()).sum::<usize>();
    let decode_enabled = |enabled| decode.iter().for_each(|k| k.set_enabled(enabled));
    let (launched, launched_wgmma) = (decode_launches(), cuda::mla_decode_wgmma::KERNEL.launches());
    eval([&attend()]).unwrap();
    let wgmma = cuda::mla_decode_wgmma::KERNEL.launches() > launched_wgmma;
    if decode_launches() > launched {
        // Labelled variant: the same call with the split-K kernel off (MLX's ops, the fallback).
        decode_enabled(false);
        let t = time(runs.0, runs.1, || eval([&attend()]).unwrap());
        let name = format!("{} (MLX ops, kernel off)", set.name);
        out.push(record(&name, "attention", batch, context, t, runs.1, batch * context * attended));
        // The GPU's own time per attention, the host's share amortized: `REPEAT` attentions (as
        // many layers) built and evaluated together, per attention; kernel off, then on.
        let amortized = || {
            let t = time(runs.0, runs.1 / 5, || eval((0..REPEAT).map(|_| attend()).collect::<Vec<_>>().iter()).unwrap());
            t.map(|v| v / REPEAT as f64)
        };
        for (enabled, name) in [(false, name.as_str()), (true, set.name)] {
            decode_enabled(enabled);
            out.push(record(name, "attention_amortized", batch, context, amortized(), runs.1 / 5, batch * context * attended));
        }
        decode_enabled(true);
        if wgmma {
            // Labelled variant on a Hopper GPU: the kernel with its mma.sync partial pass (the one
            // other GPUs run) instead of the wgmma one.
            cuda::mla_decode_wgmma::KERNEL.set_enabled(false);
            let name = format!("{} (mma.sync kernel, wgmma off)", set.name);
            let t = time(runs.0, runs.1, || eval([&attend()]).unwrap());
            out.push(record(&name, "attention", batch, context, t, runs.1, batch * context * attended));
            out.push(record(&name, "attention_amortized", batch, context, amortized(), runs.1 / 5, batch * context * attended));
            cuda::mla_decode_wgmma::KERNEL.set_enabled(true);
        }
    }
    if sparse {
        let step = || {
            let scores = donor.index_scores(&q_index, &weights, MaskMode::None).unwrap();
            let indices = donor.select(&scores, TOPK).unwrap().expect("more positions than top-k");
            let o = donor.attend_selected(&q_latent, &q_rope, scale, MaskMode::None, &indices).unwrap();
            eval([&o]).unwrap();
        };
        let t = time(runs.0, runs.1, step);
        let bytes = batch * (context * per_position(Family::IndexKeys) + TOPK * attended);
        out.push(record(set.name, "attention_dsa", batch, context, t, runs.1, bytes));
        // The step's parts, cumulatively: the index scores alone, then with the top-k selection
        // (each evaluated as the step's end), so the attention over the selected positions is
        // what the whole step adds.
        let scores = || donor.index_scores(&q_index, &weights, MaskMode::None).unwrap();
        let t = time(runs.0, runs.1, || eval([&scores()]).unwrap());
        out.push(record(
            set.name,
            "attention_dsa_scores",
            batch,
            context,
            t,
            runs.1,
            batch * context * per_position(Family::IndexKeys),
        ));
        let selected = || time(runs.0, runs.1, || eval([&donor.select(&scores(), TOPK).unwrap().unwrap()]).unwrap());
        let select_bytes = batch * context * per_position(Family::IndexKeys);
        let topk_kernels = || cuda::dsa_topk::KERNEL.launches() + metal::dsa_topk::KERNEL.launches();
        let launched = topk_kernels();
        out.push(record(set.name, "attention_dsa_select", batch, context, selected(), runs.1, select_bytes));
        if topk_kernels() > launched {
            // Labelled variant: the selection by MLX's argpartition (the top-k kernels off).
            let name = format!("{} (MLX argpartition top-k)", set.name);
            cuda::dsa_topk::KERNEL.set_enabled(false);
            metal::dsa_topk::KERNEL.set_enabled(false);
            out.push(record(&name, "attention_dsa_select", batch, context, selected(), runs.1, select_bytes));
            out.push(record(&name, "attention_dsa", batch, context, time(runs.0, runs.1, step), runs.1, bytes));
            cuda::dsa_topk::KERNEL.set_enabled(true);
            metal::dsa_topk::KERNEL.set_enabled(true);
        }
        let launched = cuda::dsa_scores::KERNEL.launches();
        step();
        if cuda::dsa_scores::KERNEL.launches() > launched {
            // Labelled variant: the index scores by MLX's ops (the kernel off).
            cuda::dsa_scores::KERNEL.set_enabled(false);
            let t = time(runs.0, runs.1, step);
            out.push(record(&format!("{} (MLX-ops index scores)", set.name), "attention_dsa", batch, context, t, runs.1, bytes));
            cuda::dsa_scores::KERNEL.set_enabled(true);
        }
    }
}

/// The (batch, contexts) points: 4K to 128K at batch 1 and 8 (`gpu`); on a CPU (where one step
/// at batch 8 and 16K takes seconds per mode) 4K and 16K at batch 1, 4K at batch 8; `quick`: 1K
/// and 4K, 1K. DSA's sparse step is measured at each batch's largest context, where it exceeds top-k.
fn points_of(quick: bool, gpu: bool) -> [(usize, &'static [usize]); 2] {
    match (quick, gpu) {
        (true, _) => [(1, &[1024, 4096]), (8, &[1024])],
        (false, true) => [(1, &[4096, 16384, 65536, 131072]), (8, &[4096, 16384, 65536, 131072])],
        (false, false) => [(1, &[4096, 16384]), (8, &[4096])],
    }
}

/// `points` replaces the (batch, context) points (`--points`, each its own sparse point too);
/// `only` keeps the mode sets whose name contains it (`--only bf16`).
pub fn run(quick: bool, gpu: bool, points: Option<&[(usize, usize)]>, only: Option<&str>) -> Vec<String> {
    // The attention's output is evaluated on this thread, as mlx-lm's is and as an engine's
    // step evaluates it (inside its own evaluation); not through the library's evaluation thread.
    latent_cache::core::mlx::eval::set_evaluation_thread(false);
    // (warmup, samples), as bench/mlx_lm_attention_bench.py.
    let runs = match (quick, gpu) {
        (true, _) => (1, 5),
        (false, true) => (5, 50),
        (false, false) => (1, 5),
    };
    // The modes attend reads: f32, bf16, q8 and fp8 (rope bf16), and q8 composed with 1024 hot
    // bf16 positions; not q4.
    let sets: Vec<&ModeSet> =
        MODE_SETS.iter().filter(|s| s.storage[0] != StorageMode::Q4 && only.is_none_or(|o| s.name.contains(o))).collect();
    eprintln!("attention: MLX device {:?}", mlx_rs::Device::default());
    let mut out = Vec::new();
    let given: Vec<(usize, &[usize])> = match points {
        Some(points) => points.iter().map(|(b, c)| (*b, std::slice::from_ref(c))).collect(),
        None => points_of(quick, gpu).to_vec(),
    };
    for (batch, contexts) in given {
        for &context in contexts {
            for set in &sets {
                mlx_rs::memory::clear_cache().unwrap();
                measure(&mut out, set, batch, context, context == *contexts.last().unwrap() && context > TOPK, runs);
            }
        }
    }
    out
}

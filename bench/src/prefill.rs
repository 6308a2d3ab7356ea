//! Prefill through GLM-5.2's whole schedule (`latent-cache-bench --prefill`): a prompt of
//! `prompt` positions in chunks of `chunk` queries, each chunk one graph of the 78 target layers
//! evaluated once, as an engine prefills. Every layer appends the chunk's latent and rope (and
//! on the 21 indexer layers its index keys); the indexer layers score the chunk's queries
//! against every stored index key (causal) and select the top `topk`; every layer attends
//! causally over the selection of its source layer (`glm52_selection_source`), or over every
//! position while the row holds no more than `topk` (DeepSeek's indexer then selects them all).
//!
//! What an engine does around the attention is given, as in mlx-lm's peer
//! (bench/mlx_lm_prefill.py): the chunk's projected queries and new positions. Both sides do the
//! per-query projections their attention needs: here the absorption of the queries
//! (`q_nope @ embed_q`, 192 to 512 a head) and of the outputs (`@ unembed_out`, 512 to 256 a
//! head), as mlx-lm's decode does; mlx-lm's prefill instead expands every stored position through
//! both (its keys and values), which is its design and part of its measured cost.
//!
//! Records: tokens/s over the whole prompt (the sum of the chunks' times), the median chunk, and
//! MLX's peak memory above the start (the stored state included: it grows with the prompt).
use latent_cache::core::attention::MaskMode;
use latent_cache::core::mlx::eval::eval;
use latent_cache::core::mlx::{math, memory, ops};
use latent_cache::core::model::presets::{glm52_selection_source, glm52_selects, GLM52_TARGET_LAYERS};
use latent_cache::{Family, Geometry, LatentCache, StorageMode};
use mlx_rs::{Array, Dtype};
use std::time::Instant;

use crate::attention::uniform;
use crate::model_step::{HEADS, INDEX, INDEX_HEADS, RANK, ROPE};

/// The query's no-rope width and the value head's width (GLM-5.2's `qk_nope_head_dim`,
/// `v_head_dim`).
const NOPE: usize = 192;
const VALUE: usize = 256;

/// A prompt length, the chunk's queries and DSA's top-k.
#[derive(Clone, Copy)]
pub struct Point {
    pub prompt: usize,
    pub chunk: usize,
    pub topk: usize,
}

/// The points of a run: on a GPU GLM-5.2's own chunk and top-k at 32K and 128K (or the given
/// prompts); on the CPU a scaled-down selection (chunks of 64, top-64) so that a prompt of
/// 512 shows the shape of the comparison in minutes (GLM-5.2's 78 layers and 64 heads are kept).
pub fn points(gpu: bool, quick: bool, given: Option<&[(usize, usize)]>) -> Vec<Point> {
    let (chunk, topk) = if gpu { (2048, 2048) } else { (64, 64) };
    let prompts: Vec<usize> = match (given, gpu, quick) {
        (Some(given), _, _) => given.iter().map(|&(_, context)| context).collect(),
        (None, true, true) => vec![32768],
        (None, true, false) => vec![32768, 131072],
        (None, false, _) => vec![512],
    };
    prompts.into_iter().map(|prompt| Point { prompt, chunk: chunk.min(prompt), topk }).collect()
}

/// The chunk's given inputs, bfloat16: every layer reads the same ones (the values do not change
/// the work).
struct Inputs {
    q_nope: Array,
    q_rope: Array,
    q_index: Array,
    weights: Array,
    new: [Array; 3],
    embed_q: Array,
    unembed_out: Array,
}

fn inputs(chunk: usize) -> Inputs {
    let bf16 = |shape: &[usize], seed, by: f32| {
        ops::astype(&ops::multiply(&uniform(shape, seed), &ops::scalar(by)).unwrap(), Dtype::Bfloat16).unwrap()
    };
    let i = Inputs {
        q_nope: bf16(&[1, HEADS, chunk, NOPE], 11, 0.05),
        q_rope: bf16(&[1, HEADS, chunk, ROPE], 12, 0.05),
        q_index: bf16(&[1, INDEX_HEADS, chunk, INDEX], 13, 0.05),
        // weights_proj's output, times mlx-lm's n_heads^-0.5 * index_head_dim^-0.5.
        weights: bf16(&[1, chunk, INDEX_HEADS], 14, 0.05 / ((INDEX_HEADS * INDEX) as f32).sqrt()),
        new: [bf16(&[1, chunk, RANK], 15, 1.0), bf16(&[1, chunk, ROPE], 16, 1.0), bf16(&[1, chunk, INDEX], 17, 1.0)],
        // MultiLinear's weights as the model holds them, [H, out, in], read transposed.
        embed_q: bf16(&[HEADS, RANK, NOPE], 18, 1.0 / (NOPE as f32).sqrt()),
        unembed_out: bf16(&[HEADS, VALUE, RANK], 19, 1.0 / (RANK as f32).sqrt()),
    };
    let all = [&i.q_nope, &i.q_rope, &i.q_index, &i.weights, &i.new[0], &i.new[1], &i.new[2], &i.embed_q, &i.unembed_out];
    eval(all).unwrap();
    i
}

/// The 78 layers, bfloat16, empty, with room for the prompt.
fn layers(prompt: usize) -> Vec<LatentCache> {
    (0..GLM52_TARGET_LAYERS)
        .map(|l| {
            let g = Geometry {
                kv_lora_rank: RANK,
                rope_head_dim: ROPE,
                index_head_dim: if glm52_selects(l) { INDEX } else { 0 },
                latent_storage: StorageMode::Bf16,
                rope_storage: StorageMode::Bf16,
                index_storage: StorageMode::Bf16,
                ..Geometry::default()
            };
            let mut cache = LatentCache::new(g).unwrap();
            cache.reserve(prompt).unwrap();
            cache
        })
        .collect()
}

/// One chunk of every layer as one graph (not evaluated): the layers' outputs `[1, H, chunk,
/// 256]`, and the stored index keys where no selection read them (so their appends evaluate).
fn chunk_graph(layers: &mut [LatentCache], x: &Inputs, topk: usize) -> Vec<Array> {
    let scale = 1.0 / ((NOPE + ROPE) as f32).sqrt();
    let mut outs = Vec::with_capacity(layers.len() + 21);
    let mut selections: Vec<Option<Array>> = vec![None; layers.len()];
    for (l, cache) in layers.iter_mut().enumerate() {
        // Each layer absorbs its own queries (its embed_q; the same weights here, the same work).
        let q_latent = math::matmul(&x.q_nope, &math::swapaxes(&x.embed_q, -1, -2).unwrap()).unwrap();
        let keys = glm52_selects(l).then_some(&x.new[2]);
        cache.append(&x.new[0], &x.new[1], keys).unwrap();
        let donor = cache.capture_donor_rows().unwrap();
        if keys.is_some() {
            selections[l] = donor.index_select(&x.q_index, &x.weights, MaskMode::Causal, topk).unwrap();
            if selections[l].is_none() {
                outs.extend(cache.stored_parts(Family::IndexKeys).unwrap());
            }
        }
        let out = match &selections[glm52_selection_source(l)] {
            Some(indices) => donor.attend_selected(&q_latent, &x.q_rope, scale, MaskMode::Causal, indices).unwrap(),
            None => donor.attend(&q_latent, &x.q_rope, scale, MaskMode::Causal, None).unwrap(),
        };
        let out = ops::astype(&out, Dtype::Bfloat16).unwrap();
        outs.push(math::matmul(&out, &math::swapaxes(&x.unembed_out, -1, -2).unwrap()).unwrap());
    }
    outs
}

/// The prompt through every layer, chunk by chunk: each chunk's time (us).
fn prefill(point: Point, x: &Inputs) -> Vec<f64> {
    let mut layers = layers(point.prompt);
    let mut us = Vec::with_capacity(point.prompt.div_ceil(point.chunk));
    for _ in 0..point.prompt / point.chunk {
        let start = Instant::now();
        let outs = chunk_graph(&mut layers, x, point.topk);
        eval(outs.iter()).unwrap();
        us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    us
}

/// Records of one warm-up prompt's worth of chunks (untimed) then `runs` timed prompts at each
/// point.
pub fn run(points: &[Point], runs: usize) -> Vec<String> {
    let mut out = Vec::new();
    for &point in points {
        let x = inputs(point.chunk);
        // Warm-up: every kernel and graph shape compiled (a short prompt past the top-k).
        prefill(Point { prompt: (2 * point.topk).min(point.prompt).max(point.chunk), ..point }, &x);
        for run in 0..runs {
            let start = memory::info().active;
            memory::reset_peak().unwrap();
            let us = prefill(point, &x);
            let peak = memory::info().peak.saturating_sub(start);
            let total: f64 = us.iter().sum();
            let mut sorted = us.clone();
            sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let tokens = point.chunk * us.len();
            let line = format!(
                "{{\"system\": \"prefill, latent-cache sparse (DSA)\", \"scenario\": \"prefill\", \"mode\": \"bf16\", \"run\": {run}, \"prompt\": {}, \
                 \"chunk\": {}, \"topk\": {}, \"layers\": {}, \"tokens_per_s\": {:.1}, \"total_ms\": {:.1}, \
                 \"median_chunk_ms\": {:.2}, \"last_chunk_ms\": {:.2}, \"peak_bytes_above_start\": {peak}}}",
                point.prompt,
                point.chunk,
                point.topk,
                GLM52_TARGET_LAYERS,
                tokens as f64 / (total / 1e6),
                total / 1e3,
                sorted[sorted.len() / 2] / 1e3,
                us.last().copied().unwrap_or(0.0) / 1e3,
            );
            eprintln!("{line}");
            out.push(line);
        }
    }
    out
}

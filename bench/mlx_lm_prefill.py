"""mlx-lm's peer of `latent-cache-bench --prefill` (bench/src/prefill.rs): a prompt through
GLM-5.2's 78 target layers in chunks, each chunk one graph evaluated once, run through mlx-lm
0.32.2's own caches and its own GLM-5 attention code at prefill (L > 1). Same points, chunk,
top-k and record shape as the Rust driver, so the two files read side by side.

What mlx-lm runs at prefill, and which lines this follows (mlx-lm 0.32.2; GLM-5 is
models/glm_moe_dsa.py, whose Model is deepseek_v32.Model unchanged):

- The mask: DeepseekV32Model.__call__ (deepseek_v32.py lines 445-447) passes
  `create_attention_mask(h, cache[0][0], return_array=True)`: a boolean causal mask [L, offset + L]
  (KVCache.make_mask, models/cache.py).
- The caches: `CacheList(KVCache(), KVCache())` per layer (make_cache): cache[0] the latent (keys,
  [B, 1, T, 512]) and the rope key (values, [B, 1, T, 64]); cache[1] the indexer's keys.
- The indexer, Indexer.__call__ (lines 81-121) with s > 1: `cache.update_and_fetch(k, k)`, then
  `cache.values = mx.zeros_like(cache.keys)`; None while the keys hold at most top-k positions;
  else `scores = q @ k.swapaxes(-1, -2)`, `mx.maximum(scores, 0)`, the weights scaled by
  `n_heads ** -0.5 * softmax_scale`, `scores * weights`, the heads summed one by one (`sum(scores[:,
  h : h + 1] for h in range(...))`, mlx-lm's workaround for s > 1), `mx.where(mask, scores, -inf)`,
  `mx.argpartition(scores, kth=-topk, axis=-1)[..., -topk:]`.
- The attention, DeepseekV32Attention.__call__ (lines 185-268) with L > 1:
  `cache[0].update_and_fetch(kv_latent, k_pe)`; with top-k indices the sparse mask (`mx.zeros`
  bool [B, 1, L, T], `mx.put_along_axis(..., True)`, `& mask`); `mx.depends` of the latent cache on
  the indexer cache; `pe_scores = (q_pe * scale) @ k_pe.swapaxes(-1, -2)` then `mx.where(mask,
  pe_scores, finfo.min)`; the keys and values expanded from every stored position, `k =
  embed_q(kv_latent, transpose=False)` ([B, 64, T, 192]) and `v = unembed_out(kv_latent)` ([B, 64,
  T, 256]); `scaled_dot_product_attention(q_nope, k, v, cache=cache, scale=scale, mask=pe_scores)`
  (models/base.py, mx.fast's SDPA with pe_scores as the additive mask).

Left out, on both sides: every projection and norm of the hidden state (q_a_proj, q_b_proj,
kv_a_proj_with_mqa, the norms, the indexer's wq_b, wk, k_norm and weights_proj, o_proj) and the
rope of the new queries and keys: the chunk's queries, latent, rope key, index key and index
weights are given (before mlx-lm's weight scaling, which is kept). embed_q and unembed_out are
the model's own per-head weights (random here), applied as mlx-lm applies them.

Systems: "mlx-lm sparse (DSA)": the indexer on the preset's 21 layers (0, 1, 2, 6, 10, ..., 74),
the other layers masking with the indices of the nearest indexer layer before them, as
latent-cache runs the schedule (mlx-lm itself runs its indexer on every layer: more work than
this). Records: tokens/s over the prompt (the sum of the chunks' times), the median chunk, and
MLX's peak memory above the start.

With `--per-layer` each layer's output is evaluated as soon as it is built, so the chunk's layers
run one at a time rather than as one graph: on the H100 (80 GB) a chunk of 2048 over 32K
positions as one graph runs out of memory (each layer's `pe_scores` mask alone is [1, 64, 2048,
T] in bfloat16: 8.6 GB at 32K, and MLX's CUDA backend holds a graph's intermediates until it has
run). The records then say `"per_layer": true`.

Usage: python3 mlx_lm_prefill.py [--quick] [--gpu] [--points 1xP,...] --out FILE
"""
import argparse
import json
import os
import sys
import time

import mlx.core as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "interop"))
from mlx_lm_models import mlx_lm_models  # noqa: E402

from mlx_lm_model_step import (  # noqa: E402
    HEADS, INDEX, INDEX_HEADS, INDEX_WEIGHT_SCALE, LAYERS, NOPE, RANK, ROPE, SCALE, index_update, selection_source,
    selects,
)

VALUE = 256
base, cache_module, mla = mlx_lm_models("base", "cache", "mla")


def inputs(chunk):
    mx.random.seed(3)
    q = lambda *shape, by=0.05: (mx.random.uniform(-1, 1, shape) * by).astype(mx.bfloat16)
    embed_q = mla.MultiLinear(NOPE, RANK, HEADS)
    unembed_out = mla.MultiLinear(RANK, VALUE, HEADS)
    embed_q.weight = embed_q.weight.astype(mx.bfloat16)
    unembed_out.weight = unembed_out.weight.astype(mx.bfloat16)
    x = {
        "q_nope": q(1, HEADS, chunk, NOPE),
        "q_pe": q(1, HEADS, chunk, ROPE),
        "q_index": q(1, INDEX_HEADS, chunk, INDEX),
        "weights": q(1, chunk, INDEX_HEADS),
        "latent": q(1, 1, chunk, RANK, by=1.0),
        "k_pe": q(1, 1, chunk, ROPE, by=1.0),
        "index_key": q(1, 1, chunk, INDEX, by=1.0),
        "embed_q": embed_q,
        "unembed_out": unembed_out,
    }
    mx.eval([v for v in x.values() if isinstance(v, mx.array)], embed_q.weight, unembed_out.weight)
    return x


def indexer(cache, x, mask, topk):
    """Indexer.__call__ lines 99-121 at prefill (s > 1), given q and k (its cache update as at decode)."""
    k = index_update(cache, x["index_key"])
    if k.shape[2] <= topk:
        return None
    scores = x["q_index"] @ k.swapaxes(-1, -2)
    scores = mx.maximum(scores, 0)
    weights = x["weights"] * INDEX_WEIGHT_SCALE
    weights = weights.swapaxes(-1, -2)[..., None]
    scores = scores * weights
    scores = sum(scores[:, h : h + 1] for h in range(scores.shape[1]))
    scores = mx.where(mask, scores, -float("inf"))
    return mx.argpartition(scores, kth=-topk, axis=-1)[..., -topk:]


def chunk_graph(layers, x, topk, per_layer=False):
    """One chunk of every layer as one graph (not evaluated): the 78 attention outputs; with
    `per_layer`, each layer's output (and its caches) evaluated as it is built."""
    mask = base.create_attention_mask(x["q_nope"].swapaxes(1, 2), layers[0][0], return_array=True)
    outs = []
    selection = [None] * LAYERS
    for layer, cache in enumerate(layers):
        kv_latent, k_pe = cache[0].update_and_fetch(x["latent"], x["k_pe"])
        if selects(layer):
            selection[layer] = indexer(cache[1], x, mask, topk)
        topk_indices = selection[selection_source(layer)]
        layer_mask = mask
        if topk_indices is not None:
            topk_indices = mx.stop_gradient(topk_indices)
            shape = list(topk_indices.shape)
            shape[-1] = kv_latent.shape[2]
            sparse_mask = mx.zeros(shape, dtype=mx.bool_)
            sparse_mask = mx.put_along_axis(sparse_mask, topk_indices, mx.array(True), axis=-1)
            layer_mask = sparse_mask & mask
        if selects(layer):
            cache[0].keys = mx.depends(cache[0].keys, (cache[1].keys, cache[1].values))
        pe_scores = (x["q_pe"] * SCALE) @ k_pe.swapaxes(-1, -2)
        pe_scores = mx.where(layer_mask, pe_scores, mx.array(mx.finfo(pe_scores.dtype).min, pe_scores.dtype))
        k = x["embed_q"](kv_latent, transpose=False)
        v = x["unembed_out"](kv_latent)
        outs.append(base.scaled_dot_product_attention(x["q_nope"], k, v, cache=cache, scale=SCALE, mask=pe_scores))
        if per_layer:
            mx.eval(outs[-1], [c.state for c in cache])
    return outs


def layers_for():
    return [cache_module.CacheList(*([cache_module.KVCache()] + ([cache_module.KVCache()] if selects(l) else [])))
            for l in range(LAYERS)]


def prefill(prompt, chunk, topk, x, per_layer=False):
    layers = layers_for()
    us = []
    for _ in range(prompt // chunk):
        start = time.perf_counter()
        mx.eval(chunk_graph(layers, x, topk, per_layer))
        us.append((time.perf_counter() - start) * 1e6)
    return us


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--points", help="prompts as 1xP,1xP (as latent-cache-bench)")
    p.add_argument("--per-layer", action="store_true", help="evaluate each layer as it is built (see above)")
    a = p.parse_args()
    # bench/src/prefill.rs `points`: GLM-5.2's chunk and top-k on a GPU, scaled down on the CPU.
    chunk, topk = (2048, 2048) if a.gpu else (64, 64)
    prompts = [32768] if a.gpu and a.quick else [32768, 131072] if a.gpu else [512]
    if a.points:
        prompts = [int(point.split("x")[1]) for point in a.points.split(",")]
    runs = 1 if a.quick or not a.gpu else 3  # as bench/src/main.rs: one run on the CPU
    print(f"mlx-lm prefill: MLX {mx.__version__}, device {mx.default_device()}", file=sys.stderr)
    records = []
    for prompt in prompts:
        c = min(chunk, prompt)
        x = inputs(c)
        prefill(max(min(2 * topk, prompt), c), c, topk, x, a.per_layer)
        for run in range(runs):
            mx.clear_cache()
            start = mx.get_active_memory()
            mx.reset_peak_memory()
            us = prefill(prompt, c, topk, x, a.per_layer)
            peak = max(mx.get_peak_memory() - start, 0)
            total = sum(us)
            r = {"system": "prefill, mlx-lm sparse (DSA)", "scenario": "prefill", "mode": "bf16", "run": run, "prompt": prompt, "chunk": c,
                 "topk": topk, "layers": LAYERS, "tokens_per_s": round(c * len(us) / (total / 1e6), 1),
                 "total_ms": round(total / 1e3, 1), "median_chunk_ms": round(sorted(us)[len(us) // 2] / 1e3, 2),
                 "last_chunk_ms": round(us[-1] / 1e3, 2), "peak_bytes_above_start": peak, "per_layer": a.per_layer}
            print(json.dumps(r), file=sys.stderr)
            records.append(r)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()

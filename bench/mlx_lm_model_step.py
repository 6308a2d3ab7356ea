"""mlx-lm's peer of `latent-cache-bench --model-step` (bench/src/model_step.rs): GLM-5.2's whole
decode step, its 78 target layers each appending one position per row and attending (64 heads,
one query per row; kv_lora_rank 512, rope 64; DSA index keys 128 wide, 32 index heads, top-2048),
built as ONE graph per step and evaluated once, run through mlx-lm 0.32.2's own caches and its
own GLM-5 attention code. Same points, warmup, timing (median, p10, p90 of the step), both timings
(single and pipelined) and record shape as the Rust driver, so the two files read side by side.

What mlx-lm runs, and which lines this follows (mlx-lm 0.32.2; GLM-5 is
models/glm_moe_dsa.py, whose Model is deepseek_v32.Model unchanged):

- The caches: deepseek_v32.Model.make_cache (line 643-644), `CacheList(KVCache(), KVCache())` per
  layer: cache[0] holds the latent (keys, [B, 1, T, 512]) and the rope key (values, [B, 1, T, 64]);
  cache[1] the indexer's keys. KVCache (models/cache.py, lines 339-394) grows in steps of 256 by
  concatenation and writes each append in place (`self.keys[..., prev:offset, :] = keys`); trim
  moves the offset.
- The attention at decode, DeepseekV32Attention.__call__ (deepseek_v32.py lines 185-268) with
  L == 1 and mask None (what DeepseekV32Model.__call__ passes for one token: cache.py's
  create_attention_mask returns None for N == 1): `cache[0].update_and_fetch(kv_latent, k_pe)`
  (line 210); the indexer (line 214); with top-k indices, the L == 1 branch's `take_along_axis`
  gathers of the latent and the rope key along the positions (lines 215-226); `cache[0].keys =
  mx.depends(cache[0].keys, (cache[1].keys, cache[1].values))` (lines 243-244); `pe_scores =
  (q_pe * self.scale) @ k_pe.swapaxes(-1, -2)` (line 246); `scaled_dot_product_attention(q_nope,
  kv_latent, kv_latent, cache=cache, scale=self.scale, mask=pe_scores)` (lines 254-263;
  models/base.py lines 110-139: mx.fast's SDPA with pe_scores as the additive mask).
- The indexer at decode, Indexer.__call__ (deepseek_v32.py lines 81-121): `cache.update_and_fetch
  (k, k)` then `cache.values = mx.zeros_like(cache.keys)` (lines 101-104: a full-capacity zeros
  array each step, as mlx-lm does), `scores = q @ k.swapaxes(-1, -2)`, `mx.maximum(scores, 0)`,
  `weights * (n_heads ** -0.5 * softmax_scale)` swapped to [B, 32, 1, 1], the product summed over
  the heads (`scores.sum(axis=1, keepdims=True)`, s == 1), `mx.argpartition(scores,
  kth=-2048, axis=-1)[..., -2048:]` (lines 107-121).

Left out, on both sides (the Rust step does none of it either): every projection and norm
(q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, the indexer's wq_b, wk,
k_norm and weights_proj, embed_q, unembed_out, o_proj) and the rope of the new query and key: the
queries are given, already projected and absorbed (q_nope is embed_q's output, 512 wide), as are
the new position's latent, rope key and index key and the indexer's head weights
(weights_proj's output, before mlx-lm's scaling, which is kept). The MoE/MLP and the MTP layer
are not part of either step.

Systems:
- "mlx-lm sparse (DSA)": the schedule the Rust step runs (src/core/model/presets.rs
  `glm52_selects`): the indexer (its cache, scores and top-k) only on layers 0, 1, 2, 6, 10, ...,
  74, each other layer gathering with the indices of the nearest indexer layer before it. mlx-lm
  0.32.2 itself cannot share a selection across layers; here its code is called per layer with the
  source layer's indices, which only saves it work.
- "mlx-lm sparse (DSA, indexer on every layer)": what mlx-lm 0.32.2 really runs for GLM-5
  (make_cache gives every layer an indexer cache, and every layer's attention runs its indexer).
  Not with --quick (it is the slowest and the CPU run is long already).
- "mlx-lm dense": the same code with no top-k indices (mlx-lm's path when a layer's index holds
  at most 2048 positions): every layer attends over every position. The index keys are still
  appended on the indexer layers (as the Rust dense step does), with the indexer's zeros_like and
  depends, but not scored.

Timings (field "timing"): "single": build the step's graph, mx.eval it, trim every cache back by
one; "pipelined": step n+1's graph is built (and trimmed) and handed to mx.async_eval before
waiting for step n, as mlx-lm's generate_step overlaps steps; timed is the interval between
successive steps' completions; "build": building the step's graph alone (the Python calls into
mlx-lm's code, no evaluation), the host's share of a step, each graph then evaluated and trimmed
outside the timing. bytes_read is the Rust driver's count (the stored state the step
reads, for the bandwidth floor); mlx-lm's zeros_like and copies are not in it.

Usage: python3 mlx_lm_model_step.py [--quick] [--gpu] [--points BxT,...] --out FILE
"""
import argparse
import json
import os
import sys
import time

import mlx.core as mx

# The interop scripts' importer of mlx-lm's model modules.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "interop"))
from mlx_lm_models import mlx_lm_models  # noqa: E402

LAYERS, HEADS, INDEX_HEADS, TOPK = 78, 64, 32, 2048
RANK, ROPE, NOPE, INDEX = 512, 64, 192, 128
SCALE = (NOPE + ROPE) ** -0.5  # DeepseekV32Attention.scale (GLM-5: no rope scaling)
INDEX_WEIGHT_SCALE = INDEX_HEADS ** -0.5 * INDEX ** -0.5  # Indexer: n_heads ** -0.5 * softmax_scale
CHUNK = 4096

base, cache_module = mlx_lm_models("base", "cache")


def selects(layer):
    """src/core/model/presets.rs `glm52_selects`: layers 0, 1, 2, then every fourth from 6."""
    return layer < 3 or (layer >= 6 and (layer - 6) % 4 == 0)


def selection_source(layer):
    """`glm52_selection_source`: the nearest indexer layer at or before `layer`."""
    while not selects(layer):
        layer -= 1
    return layer


def stats(us):
    us = sorted(us)
    at = lambda q: us[round((len(us) - 1) * q)]
    return at(0.5), at(0.1), at(0.9)


def single(warmup, samples, step):
    us = []
    for i in range(warmup + samples):
        start = time.perf_counter()
        step()
        if i >= warmup:
            us.append((time.perf_counter() - start) * 1e6)
    return stats(us)


def pipelined(warmup, samples, build, trim):
    prev = build()
    mx.async_eval(prev)
    trim()
    last = time.perf_counter()
    us = []
    for i in range(warmup + samples):
        nxt = build()
        mx.async_eval(nxt)
        trim()
        mx.eval(prev)
        now = time.perf_counter()
        if i >= warmup:
            us.append((now - last) * 1e6)
        last = now
        prev = nxt
    mx.eval(prev)
    return stats(us)


def build_time(warmup, samples, build, trim):
    us = []
    for i in range(warmup + samples):
        start = time.perf_counter()
        outs = build()
        took = (time.perf_counter() - start) * 1e6
        mx.eval(outs)
        trim()
        if i >= warmup:
            us.append(took)
    return stats(us)


def index_update(cache, k):
    """Indexer.__call__ lines 101-104: the key appended, the values replaced by zeros."""
    k, _ = cache.update_and_fetch(k, k)
    cache.values = mx.zeros_like(cache.keys)
    return k


def model(batch, context, dtype):
    """The 78 layers' caches (CacheList(KVCache(), KVCache()) on the indexer layers, the main
    KVCache alone elsewhere), filled to `context` positions per row through update_and_fetch."""
    n = min(CHUNK, context)
    mx.random.seed(0)
    chunk = [mx.random.uniform(-1, 1, (batch, 1, n, w)).astype(dtype) for w in (RANK, ROPE, INDEX)]
    mx.eval(chunk)
    layers = []
    for layer in range(LAYERS):
        caches = [cache_module.KVCache()] + ([cache_module.KVCache()] if selects(layer) else [])
        fill(caches, chunk, context)
        layers.append(cache_module.CacheList(*caches))
    return layers


def fill(caches, chunk, context):
    n = chunk[-1].shape[2]
    done = 0
    while done < context:
        take = min(n, context - done)
        if caches[0] is not None:
            caches[0].update_and_fetch(chunk[0][:, :, :take], chunk[1][:, :, :take])
        for c in caches[1:]:
            index_update(c, chunk[2][:, :, :take])
        mx.eval([a for c in caches if c is not None for a in (c.keys, c.values)])
        done += take


def queries(batch, dtype):
    mx.random.seed(1)
    q = lambda *shape: (mx.random.uniform(-1, 1, shape) * 0.05).astype(dtype)
    qs = {
        "nope": q(batch, HEADS, 1, RANK),  # embed_q(q_nope): the absorbed query
        "pe": q(batch, HEADS, 1, ROPE),
        "index": q(batch, INDEX_HEADS, 1, INDEX),  # the indexer's q (wq_b(qr), roped)
        "weights": q(batch, 1, INDEX_HEADS),  # weights_proj(x)
        "latent": q(batch, 1, 1, RANK),  # kv_a_layernorm(compressed_kv), expand_dims'd
        "k_pe": q(batch, 1, 1, ROPE),
        "index_key": q(batch, 1, 1, INDEX),  # the indexer's k (wk, k_norm, rope)
    }
    mx.eval(list(qs.values()))
    return qs


def indexer(q, k, weights):
    """Indexer.__call__ lines 107-121 at decode (s == 1, mask None)."""
    scores = q @ k.swapaxes(-1, -2)
    scores = mx.maximum(scores, 0)
    weights = weights * INDEX_WEIGHT_SCALE
    weights = weights.swapaxes(-1, -2)[..., None]
    scores = scores * weights
    scores = scores.sum(axis=1, keepdims=True)
    return mx.argpartition(scores, kth=-TOPK, axis=-1)[..., -TOPK:]


def build(layers, q, system):
    """One decode step of every layer as one graph (not evaluated): the 78 attention outputs.
    system: "dense", "sparse" (the preset's indexer layers) or "every" (indexer on every layer)."""
    outs = []
    selection = [None] * LAYERS
    for layer, cache in enumerate(layers):
        # DeepseekV32Attention.__call__, L == 1, mask None.
        kv_latent, k_pe = cache[0].update_and_fetch(q["latent"], q["k_pe"])
        has_index = len(cache.caches) > 1
        topk_indices = None
        if has_index:
            k = index_update(cache[1], q["index_key"])
            if system != "dense":
                topk_indices = selection[layer] = indexer(q["index"], k, q["weights"])
        elif system == "sparse":
            topk_indices = selection[selection_source(layer)]
        if topk_indices is not None:
            topk_indices = mx.stop_gradient(topk_indices)
            idx = topk_indices[:, :, 0, :, None]
            kv_latent = mx.take_along_axis(
                kv_latent, mx.broadcast_to(idx, idx.shape[:-1] + (kv_latent.shape[-1],)), axis=2
            )
            k_pe = mx.take_along_axis(k_pe, mx.broadcast_to(idx, idx.shape[:-1] + (k_pe.shape[-1],)), axis=2)
        if has_index:
            cache[0].keys = mx.depends(cache[0].keys, (cache[1].keys, cache[1].values))
        pe_scores = (q["pe"] * SCALE) @ k_pe.swapaxes(-1, -2)
        outs.append(
            base.scaled_dot_product_attention(q["nope"], kv_latent, kv_latent, cache=cache, scale=SCALE, mask=pe_scores)
        )
    return outs


def measure(dtype_name, batch, context, runs, every):
    dtype = {"bf16": mx.bfloat16, "f32": mx.float32}[dtype_name]
    width = dtype.size
    mx.clear_cache()
    layers = model(batch, context, dtype)
    q = queries(batch, dtype)
    dsa_layers = sum(selects(l) for l in range(LAYERS))
    selected = min(TOPK, context)
    systems = [
        ("dense", "mlx-lm dense", batch * context * LAYERS * (RANK + ROPE) * width),
        ("sparse", "mlx-lm sparse (DSA)", batch * (dsa_layers * context * INDEX + LAYERS * selected * (RANK + ROPE)) * width),
    ]
    if context <= TOPK:
        # mlx-lm's own path at this length is dense (its index holds no more than top-k
        # positions, and its indexer's argpartition refuses k past the length).
        systems = systems[:1]
    elif every:
        systems.append(("every", "mlx-lm sparse (DSA, indexer on every layer)",
                        batch * LAYERS * (context * INDEX + selected * (RANK + ROPE)) * width))
    records = []

    def trim():
        for cache in layers:
            cache.trim(1)

    for system, name, bytes_read in systems:
        if system == "every":
            # mlx-lm's make_cache: an indexer cache on every layer.
            n = min(CHUNK, context)
            mx.random.seed(2)
            keys = mx.random.uniform(-1, 1, (batch, 1, n, INDEX)).astype(dtype)
            for layer, cache in enumerate(layers):
                if len(cache.caches) == 1:
                    extra = cache_module.KVCache()
                    fill([None, extra], [None, None, keys], context)
                    cache.caches = (cache.caches[0], extra)

        def step():
            outs = build(layers, q, system)
            mx.eval(outs)
            trim()

        for timing, t in (
            ("single", single(*runs, step)),
            ("pipelined", pipelined(*runs, lambda: build(layers, q, system), trim)),
            ("build", build_time(*runs, lambda: build(layers, q, system), trim)),
        ):
            r = {"system": name, "mode": dtype_name, "timing": timing, "batch": batch, "context": context,
                 "median_us": round(t[0], 1), "p10_us": round(t[1], 1), "p90_us": round(t[2], 1),
                 "samples": runs[1], "layers": LAYERS, "bytes_read": bytes_read}
            print(json.dumps(r), file=sys.stderr)
            records.append(r)
    del layers
    return records


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--points", help="batch x context points instead of the defaults, as BxT,BxT (as latent-cache-bench)")
    p.add_argument("--modes", default="bf16,f32", help="storage dtypes, in order (bf16,f32)")
    a = p.parse_args()
    # The points and runs of bench/src/main.rs (`--model-step`) and model_step.rs (`run`).
    if a.quick and not a.gpu:
        # As latent-cache-bench's `--model-step --quick` on the CPU: one small point, bf16.
        points = [(1, 1024)]
        a.modes = "bf16" if a.modes == "bf16,f32" else a.modes
    elif a.quick:
        points = [(1, 4096)]
    elif a.gpu:
        points = [(1, 16384), (1, 65536), (1, 131072), (8, 16384)]
    else:
        points = [(1, 4096), (1, 16384)]
    if a.points:
        points = [tuple(int(x) for x in point.split("x")) for point in a.points.split(",")]
    runs = (1, 2) if a.quick else (3, 10)
    print(f"mlx-lm model step: MLX {mx.__version__}, device {mx.default_device()}", file=sys.stderr)
    records = [
        r for mode in a.modes.split(",") for batch, context in points
        for r in measure(mode, batch, context, runs, every=not a.quick)
    ]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()

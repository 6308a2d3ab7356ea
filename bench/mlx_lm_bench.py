"""mlx-lm's caches as its DeepSeek-V3.2 / GLM-5 code uses them, on the same GLM-5.2 shape and the
same scenarios as the Rust driver (bench/src/main.rs), on PyPI's mlx of the same MLX version.
Modelled on mlx-lm 0.32.2 (the version the Makefile installs).

Systems (one record per system, scenario, batch and context):

- "mlx-lm caches (Python)", the headline, what mlx-lm builds for this model: glm_moe_dsa.Model
  subclasses deepseek_v32.Model and keeps its make_cache, which gives every layer (all 78, not
  only the ones whose index keys GLM-5.2 needs) a CacheList(KVCache(), KVCache()). Per layer,
  DeepseekV32Attention.__call__ appends through cache[0].update_and_fetch(kv_latent, k_pe),
  Indexer.__call__ through cache[1].update_and_fetch(k, k) followed by
  `cache.values = mx.zeros_like(cache.keys)`, and the attention then ties the two with
  `cache[0].keys = mx.depends(cache[0].keys, (cache[1].keys, cache[1].values))`
  (mlx_lm/models/deepseek_v32.py). bytes_per_token counts what the model stores:
  78 * 4 * (512 + 64 + 128).
- "mlx-lm caches, index keys on 21 layers (variant)": the same calls, with index caches on the 21
  layers where GLM-5.2 needs index keys and a single KVCache (latent and RoPE key) on the others.
  Not what mlx-lm builds; shows what its caches cost at GLM-5.2's own need.
- "mlx-lm QuantizedKVCache 8-bit (Python) (variant)": mlx-lm cannot quantize this model's caches,
  so this row is the closest use of its QuantizedKVCache, not something mlx-lm runs:
  - generate.py quantizes caches only in maybe_quantize_kv_cache (driven by kv_bits,
    kv_group_size and quantized_kv_start, from generate_step, speculative_generate_step and the
    server), which swaps a top-level cache entry for c.to_quantized(...) if the entry has that
    method. CacheList has none (KVCache, RotatingKVCache and BatchRotatingKVCache do), so with
    --kv-bits 8 every GLM-5 / DeepSeek-V3.2 layer is skipped without a word and the model runs
    on the unquantized caches of the headline row.
  - Nor could the model's code use quantized entries: QuantizedKVCache.update_and_fetch returns
    (packed uint32, scales, biases) triples, which the attention's `k_pe.swapaxes` and
    take_along_axis (cache[0]) and the indexer's zeros_like and `q @ k` (cache[1]) cannot take;
    and models/base.py's scaled_dot_product_attention picks its quantized path by
    hasattr(cache, "bits"), which a CacheList lacks.
  What is modelled: every layer a CacheList(QuantizedKVCache(group_size=64, bits=8), KVCache()),
  the quantized cache holding the latent (as keys) and the RoPE key (as values) that attention
  reads, the index keys left in a plain KVCache because the indexer needs arrays, and the
  zeros_like and depends lines as above. The cache is quantized from the first position
  (quantized_kv_start 0) instead of converted by to_quantized after 5000, so every position is
  stored quantized. Inputs are bfloat16, the dtype the model runs in, and QuantizedKVCache keeps
  scales and biases in its input's dtype: bytes_per_token = 78 * ((512 + 2 * 2 * 512 / 64)
  + (64 + 2 * 2 * 64 / 64) + 2 * 128) = 67704.

The two unquantized rows take float32 inputs, as the Rust driver's (bench/src/systems.rs), so
their bytes compare with its systems'. bytes_held_per_token is measured (MLX's active memory
after the fill), so it also shows what bytes_per_token leaves out: the zeros each index cache
keeps as values, and the growth chunks (256 positions) of KVCache and QuantizedKVCache.

Usage: python3 mlx_lm_bench.py [--quick] [--gpu] [--systems KEY,...] --out FILE
(keys: caches, index21, quantized8; default all)
"""
import argparse
import importlib
import json
import os
import sys
import time
import types

import mlx.core as mx


def load_mlx_lm_cache():
    # Import mlx_lm.models.cache without running mlx_lm/__init__.py, which pulls in transformers
    # for model loading; the cache module itself needs only mlx.
    spec = importlib.util.find_spec("mlx_lm")
    root = os.path.dirname(spec.origin)
    for name, path in (("mlx_lm", root), ("mlx_lm.models", os.path.join(root, "models"))):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    return importlib.import_module("mlx_lm.models.cache")


cache_module = load_mlx_lm_cache()
CacheList, KVCache, QuantizedKVCache = cache_module.CacheList, cache_module.KVCache, cache_module.QuantizedKVCache

LAYERS, DSA_LAYERS = 78, 21
RANK, ROPE, INDEX = 512, 64, 128
# mlx-lm's defaults for --kv-group-size, and the 8 bits asked of --kv-bits.
GROUP_SIZE, BITS = 64, 8


def is_dsa(layer):
    # GLM-5.2's config.json indexer_types: layers 0, 1, 2, then every fourth from 6 to 74.
    return layer < 3 or (layer >= 6 and (layer - 6) % 4 == 0)


class System:
    def __init__(self, name, index_on, quantized, dtype):
        self.name, self.index_on, self.quantized, self.dtype = name, index_on, quantized, dtype

    def bytes_per_token(self):
        size = self.dtype.size

        def stored(width):
            if not self.quantized:
                return width * size
            # Packed codes, then one scale and one bias per group, in the input's dtype.
            return width * BITS // 8 + 2 * (width // GROUP_SIZE) * size

        return sum(stored(RANK) + stored(ROPE) + (INDEX * size if self.index_on(l) else 0) for l in range(LAYERS))

    def model(self):
        return MlxLmModel(self)


SYSTEMS = {
    "caches": System("mlx-lm caches (Python)", lambda l: True, False, mx.float32),
    "index21": System("mlx-lm caches, index keys on 21 layers (variant)", is_dsa, False, mx.float32),
    "quantized8": System("mlx-lm QuantizedKVCache 8-bit (Python) (variant)", lambda l: True, True, mx.bfloat16),
}


def inputs(system, batch, tokens, seed):
    # [B, 1, N, width]: the head axis mlx-lm's attention uses.
    def make(width):
        n = batch * tokens * width
        x = (mx.arange(n, dtype=mx.float32) % 97 * 0.25 + seed).reshape(batch, 1, tokens, width)
        return x.astype(system.dtype)

    arrays = (make(RANK), make(ROPE), make(INDEX))
    mx.eval(arrays)
    return arrays


class MlxLmModel:
    def __init__(self, system):
        def latent_cache():
            if system.quantized:
                return QuantizedKVCache(group_size=GROUP_SIZE, bits=BITS)
            return KVCache()

        self.index_on = [system.index_on(l) for l in range(LAYERS)]
        self.caches = [CacheList(latent_cache(), KVCache()) if on else latent_cache() for on in self.index_on]

    def forward(self, x):
        latent, rope, index_keys = x
        # A quantized cache returns and stores triples; mx.eval takes the nested lists as they are.
        outputs = []
        for index_on, cache in zip(self.index_on, self.caches):
            if index_on:
                kv_latent, k_pe = cache[0].update_and_fetch(latent, rope)
                k, _ = cache[1].update_and_fetch(index_keys, index_keys)
                cache[1].values = mx.zeros_like(cache[1].keys)
                cache[0].keys = mx.depends(cache[0].keys, (cache[1].keys, cache[1].values))
                outputs += [kv_latent, k_pe, k, cache[0].keys]
            else:
                kv_latent, k_pe = cache.update_and_fetch(latent, rope)
                outputs += [kv_latent, k_pe]
        mx.eval(outputs)

    def trim(self, n):
        for cache in self.caches:
            cache.trim(n)


def stats(samples):
    samples = sorted(samples)
    at = lambda q: samples[round((len(samples) - 1) * q)]
    return at(0.5), at(0.1), at(0.9)


def record(out, system, scenario, batch, context, samples, held=None):
    median, p10, p90 = stats(samples)
    rec = {
        "system": system.name, "scenario": scenario, "batch": batch, "context": context,
        "median_us": round(median, 1), "p10_us": round(p10, 1), "p90_us": round(p90, 1),
        "samples": len(samples), "bytes_per_token": system.bytes_per_token(),
        "bytes_held_per_token": None if held is None else round(held, 1),
    }
    print(json.dumps(rec), file=sys.stderr)
    out.append(rec)


def timed(f):
    start = time.perf_counter()
    f()
    return (time.perf_counter() - start) * 1e6


def measure(out, system, batch, context, steps):
    mx.clear_cache()
    base = mx.get_active_memory()
    model = system.model()
    # At least two appends: see fill() in bench/src/main.rs (one input array serves every layer).
    done, chunk = 0, max(1, min(4096, (context + 1) // 2))
    while done < context:
        n = min(chunk, context - done)
        model.forward(inputs(system, batch, n, float(done)))
        done += n
    held = (mx.get_active_memory() - base) / (batch * context)
    one, four, warmup = inputs(system, batch, 1, 0.5), inputs(system, batch, 4, 0.75), 3
    samples = [timed(lambda: model.forward(one)) for _ in range(steps + warmup)][warmup:]
    record(out, system, "decode", batch, context, samples, held)

    def spec_round():
        model.forward(four)
        model.trim(2)

    samples = [timed(spec_round) for _ in range(steps + warmup)][warmup:]
    record(out, system, "spec_round", batch, context, samples)


def prefill(out, system, prefill_to):
    mx.clear_cache()
    model, chunk, window, done = system.model(), 512, [], 0
    x = inputs(system, 1, chunk, 0.25)
    while done < prefill_to:
        window.append(timed(lambda: model.forward(x)) / chunk)
        done += chunk
        if done in (1024, 4096, 16384, 32768):
            record(out, system, "prefill_per_position", 1, done, window)
            window = []


def main():
    parser = argparse.ArgumentParser(description="mlx-lm's caches on GLM-5.2's shape")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: " + ", ".join(SYSTEMS))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    keys = [k for k in args.systems.split(",") if k]
    unknown = [k for k in keys if k not in SYSTEMS]
    if unknown or not keys:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    systems = [SYSTEMS[k] for k in keys]

    if args.quick:
        points = [(1, 1024), (1, 4096), (8, 1024)]
    else:
        points = [(1, 1024), (1, 4096), (1, 16384), (1, 65536), (8, 1024), (8, 4096), (8, 8192)]
        if args.gpu:
            points.insert(4, (1, 131072))
    print(f"bench: mlx-lm on {mx.default_device()}", file=sys.stderr)
    out = []
    # Systems take turns at each point, so a slow stretch of a shared machine is spread over
    # all of them rather than landing on one system's whole run.
    for batch, context in points:
        for system in systems:
            measure(out, system, batch, context, 20 if args.quick else 60)
    for system in systems:
        prefill(out, system, 4096 if args.quick else 32768)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

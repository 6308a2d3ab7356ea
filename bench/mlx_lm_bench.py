"""mlx-lm's caches as its DeepSeek-V3.2 / GLM-5 code uses them, on the same GLM-5.2 shape and the
same scenarios as the Rust driver (bench/src/main.rs), on PyPI's mlx of the same MLX version.

DSA layers hold CacheList(KVCache(), KVCache()): the latent and RoPE key through
update_and_fetch(kv_latent, k_pe), the index keys through update_and_fetch(k, k) followed by the
model code's `values = zeros_like(keys)` and `mx.depends` lines (mlx_lm/models/deepseek_v32.py).
Other layers hold one KVCache. Writes one JSON record per (scenario, batch, context).

Usage: python3 mlx_lm_bench.py [--quick] [--gpu] --out FILE
"""
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
CacheList, KVCache = cache_module.CacheList, cache_module.KVCache

LAYERS, DSA_LAYERS = 78, 21
RANK, ROPE, INDEX = 512, 64, 128
SYSTEM = "mlx-lm caches (Python)"


def is_dsa(layer):
    return (layer * DSA_LAYERS) // LAYERS != ((layer + 1) * DSA_LAYERS) // LAYERS


def model_bytes_per_token():
    return sum(4 * (RANK + ROPE + (INDEX if is_dsa(l) else 0)) for l in range(LAYERS))


def inputs(batch, tokens, seed):
    # [B, 1, N, width]: the head axis mlx-lm's attention uses.
    def make(width):
        n = batch * tokens * width
        return (mx.arange(n, dtype=mx.float32) % 97 * 0.25 + seed).reshape(batch, 1, tokens, width)

    arrays = (make(RANK), make(ROPE), make(INDEX))
    mx.eval(arrays)
    return arrays


class MlxLmModel:
    def __init__(self):
        self.caches = [CacheList(KVCache(), KVCache()) if is_dsa(l) else KVCache() for l in range(LAYERS)]

    def forward(self, x):
        latent, rope, index_keys = x
        outputs = []
        for layer, cache in enumerate(self.caches):
            if is_dsa(layer):
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


def record(out, scenario, batch, context, samples, held=None):
    median, p10, p90 = stats(samples)
    rec = {
        "system": SYSTEM, "scenario": scenario, "batch": batch, "context": context,
        "median_us": round(median, 1), "p10_us": round(p10, 1), "p90_us": round(p90, 1),
        "samples": len(samples), "bytes_per_token": model_bytes_per_token(),
        "bytes_held_per_token": None if held is None else round(held, 1),
    }
    print(json.dumps(rec), file=sys.stderr)
    out.append(rec)


def timed(f):
    start = time.perf_counter()
    f()
    return (time.perf_counter() - start) * 1e6


def measure(out, batch, context, steps):
    mx.clear_cache()
    base = mx.get_active_memory()
    model = MlxLmModel()
    # At least two appends: see fill() in bench/src/main.rs (one input array serves every layer).
    done, chunk = 0, max(1, min(4096, (context + 1) // 2))
    while done < context:
        n = min(chunk, context - done)
        model.forward(inputs(batch, n, float(done)))
        done += n
    held = (mx.get_active_memory() - base) / (batch * context)
    one, four, warmup = inputs(batch, 1, 0.5), inputs(batch, 4, 0.75), 3
    samples = [timed(lambda: model.forward(one)) for _ in range(steps + warmup)][warmup:]
    record(out, "decode", batch, context, samples, held)

    def spec_round():
        model.forward(four)
        model.trim(2)

    samples = [timed(spec_round) for _ in range(steps + warmup)][warmup:]
    record(out, "spec_round", batch, context, samples)


def prefill(out, prefill_to):
    mx.clear_cache()
    model, chunk, window, done = MlxLmModel(), 512, [], 0
    x = inputs(1, chunk, 0.25)
    while done < prefill_to:
        window.append(timed(lambda: model.forward(x)) / chunk)
        done += chunk
        if done in (1024, 4096, 16384, 32768):
            record(out, "prefill_per_position", 1, done, window)
            window = []


def main():
    quick, gpu = "--quick" in sys.argv, "--gpu" in sys.argv
    out_path = sys.argv[sys.argv.index("--out") + 1]
    if quick:
        points = [(1, 1024), (1, 4096), (8, 1024)]
    else:
        points = [(1, 1024), (1, 4096), (1, 16384), (1, 65536), (8, 1024), (8, 4096), (8, 8192)]
        if gpu:
            points.insert(4, (1, 131072))
    print(f"bench: mlx-lm on {mx.default_device()}", file=sys.stderr)
    out = []
    for batch, context in points:
        measure(out, batch, context, 20 if quick else 60)
    prefill(out, 4096 if quick else 32768)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

"""mlx-lm's absorbed MLA decode attention for one GLM-5.2 layer, the peer of
`latent-cache-bench --attention` (bench/src/attention.rs): same shape (64 query heads,
kv_lora_rank 512, rope 64, one query per row), same points, same timing (median of the step
build + mx.eval after warmup), on the same MLX. Modelled on mlx-lm 0.32.2's
deepseek_v32.DeepseekV32Attention.__call__ at decode (L == 1, mask None), which GLM-5 uses:

    pe_scores = (q_pe * self.scale) @ k_pe.swapaxes(-1, -2)
    q_nope = self.embed_q(q_nope); k = v = kv_latent
    output = scaled_dot_product_attention(q_nope, k, v, cache=cache, scale=self.scale, mask=pe_scores)

The step timed is the first and last line, calling mlx-lm's own scaled_dot_product_attention
(models/base.py) over the arrays its KVCache returns (keys_and_values(), what update_and_fetch
hands the attention). The absorbed query comes from mlx-lm's own MultiLinear (embed_q), built
before timing, as our driver's queries are. What mlx-lm does around this (the cache append, the
indexer, unembed_out and o_proj) is left out on both sides.

Systems: "mlx-lm absorbed f32" and "mlx-lm absorbed bf16" (cache and queries in that dtype);
"MLX SDPA, 576-wide key bf16 (reference)": not mlx-lm's code, one SDPA over [latent | rope] stored
as one key, the latent as value (the bound issue 16 quotes for MLX's SDPA).
bytes_read: the stored state the step reads (batch x context x 576 values).

Usage: python3 mlx_lm_attention_bench.py [--quick] [--gpu] --out FILE
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

HEADS, RANK, ROPE, NOPE = 64, 512, 64, 192
SCALE = (NOPE + ROPE) ** -0.5  # DeepseekV32Attention.scale (GLM-5: no rope scaling)
CHUNK = 4096


base, cache_module, mla = mlx_lm_models("base", "cache", "mla")


def timed(warmup, samples, step):
    us = []
    for i in range(warmup + samples):
        start = time.perf_counter()
        step()
        if i >= warmup:
            us.append((time.perf_counter() - start) * 1e6)
    us.sort()
    at = lambda q: us[round((len(us) - 1) * q)]
    return at(0.5), at(0.1), at(0.9)


def filled(batch, context, dtype):
    """mlx-lm's KVCache holding the latent (keys) and rope key (values), as the model fills it."""
    cache = cache_module.KVCache()
    n = min(CHUNK, context)
    latent = mx.random.uniform(-1, 1, (batch, 1, n, RANK)).astype(dtype)
    rope = mx.random.uniform(-1, 1, (batch, 1, n, ROPE)).astype(dtype)
    done = 0
    while done < context:
        take = min(n, context - done)
        k, v = cache.update_and_fetch(latent[:, :, :take], rope[:, :, :take])
        mx.eval(k, v)
        done += take
    return cache


def measure(batch, context, runs):
    records = []

    def record(system, t, bytes_read):
        r = {"system": system, "scenario": "attention", "batch": batch, "context": context,
             "median_us": round(t[0], 1), "p10_us": round(t[1], 1), "p90_us": round(t[2], 1),
             "samples": runs[1], "heads": HEADS, "bytes_read": bytes_read}
        print(json.dumps(r), file=sys.stderr)
        records.append(r)

    for name, dtype in (("f32", mx.float32), ("bf16", mx.bfloat16)):
        mx.clear_cache()
        cache = filled(batch, context, dtype)
        kv_latent, k_pe = cache.keys_and_values()
        embed_q = mla.MultiLinear(NOPE, RANK, HEADS)
        embed_q.set_dtype(dtype)
        q_nope = embed_q((mx.random.uniform(-1, 1, (batch, HEADS, 1, NOPE)) * 0.05).astype(dtype))
        q_pe = (mx.random.uniform(-1, 1, (batch, HEADS, 1, ROPE)) * 0.05).astype(dtype)
        mx.eval(q_nope, q_pe)

        def step():
            pe_scores = (q_pe * SCALE) @ k_pe.swapaxes(-1, -2)
            out = base.scaled_dot_product_attention(q_nope, kv_latent, kv_latent, cache=cache, scale=SCALE, mask=pe_scores)
            mx.eval(out)

        record(f"mlx-lm absorbed {name}", timed(*runs, step), batch * context * (RANK + ROPE) * dtype.size)
        del cache, kv_latent, k_pe
        if name == "bf16":
            mx.clear_cache()
            key = mx.random.uniform(-1, 1, (batch, 1, context, RANK + ROPE)).astype(dtype)
            q = mx.concatenate([q_nope, q_pe], axis=-1)
            mx.eval(key, q)

            def reference():
                mx.eval(mx.fast.scaled_dot_product_attention(q, key, key[..., :RANK], scale=SCALE))

            record("MLX SDPA, 576-wide key bf16 (reference)", timed(*runs, reference),
                   batch * context * (RANK + ROPE) * dtype.size)
            del key
    return records


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--points", help="batch x context points instead of the defaults, as BxT,BxT (as latent-cache-bench)")
    a = p.parse_args()
    # The points and runs of bench/src/attention.rs (`points`, `run`).
    if a.quick:
        points = {1: [1024, 4096], 8: [1024]}
    elif a.gpu:
        points = {1: [4096, 16384, 65536, 131072], 8: [4096, 16384, 65536, 131072]}
    else:
        points = {1: [4096, 16384], 8: [4096]}
    if a.points:
        points = {}
        for point in a.points.split(","):
            batch, context = (int(x) for x in point.split("x"))
            points.setdefault(batch, []).append(context)
    runs = (5, 50) if a.gpu and not a.quick else (1, 5)
    print(f"mlx-lm attention: MLX {mx.__version__}, device {mx.default_device()}", file=sys.stderr)
    records = [r for batch, contexts in points.items() for c in contexts for r in measure(batch, c, runs)]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()

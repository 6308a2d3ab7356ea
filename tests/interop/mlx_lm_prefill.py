"""The mlx-lm side of tests/mlx_lm_interop.rs's prefill comparison: mlx-lm 0.32.2's BatchKVCache
runs prepare / update_and_fetch / finalize on the scenarios given, with keys the latent and values
the rope (as its DeepSeek-V3.2 / GLM-5 attention stores them), and prints every row's valid
positions: one line per row and family, "scenario row family v0 v1 ...".

Usage: python3 mlx_lm_prefill.py 'LEN,LEN,...;LEFT,...;RIGHT,...;CHUNK,...;DECODE' ...
"""
import sys

import mlx.core as mx

from mlx_lm_models import mlx_lm_models

WIDTHS = (8, 4)


def value(row, pos, family, width):
    # Both sides feed row `row`'s padded position `pos` with these values (pads included).
    base = row * 37 + pos * 11 + family * 5
    return (mx.arange(width, dtype=mx.float32) + base) % 251 * 0.25


def block(batch, start, tokens, family):
    width = WIDTHS[family]
    rows = [mx.stack([value(r, start + p, family, width) for p in range(tokens)]) for r in range(batch)]
    return mx.stack(rows)[:, None]  # [B, 1, T, W]


def run(index, scenario, cache_module):
    lengths, left, right, chunks, decode = [
        [int(x) for x in part.split(",") if x != ""] for part in scenario.split(";")
    ]
    batch = len(lengths)
    cache = cache_module.BatchKVCache([0] * batch)
    cache.prepare(left_padding=left or None, lengths=lengths, right_padding=right or None)
    pos = 0
    for tokens in chunks + decode:
        if pos == sum(chunks):
            cache.finalize()
        cache.update_and_fetch(block(batch, pos, tokens, 0), block(batch, pos, tokens, 1))
        pos += tokens
    if not decode:
        cache.finalize()
    keys, values = cache.keys_and_values()
    pads = cache.left_padding.tolist()
    for row in range(batch):
        for family, data in ((0, keys), (1, values)):
            flat = data[row, 0, pads[row]:].reshape(-1).tolist()
            print(index, row, family, " ".join(repr(v) for v in flat))


def main():
    (cache_module,) = mlx_lm_models("cache")
    for index, scenario in enumerate(sys.argv[1:]):
        run(index, scenario, cache_module)


if __name__ == "__main__":
    main()

"""The mlx-lm side of tests/mlx_lm_interop.rs: loads the file this library saved with mlx-lm
0.32.2's load_prompt_cache and checks every value, then saves a GLM-5-shaped prompt cache with
save_prompt_cache for the library to load. Values follow value() below on both sides.

Usage: python3 mlx_lm_exchange.py OURS_FILE MLX_LM_FILE
"""
import sys

import mlx.core as mx

from mlx_lm_models import mlx_lm_models


def value(layer, row, pos, family, width):
    base = (layer * 131 + row * 17 + pos * 7 + family * 3) % 997
    return (mx.arange(width, dtype=mx.float32) + base) % 1000 * 0.125


def expected(layer, family, batch, tokens, width):
    rows = [mx.stack([value(layer, r, p, family, width) for p in range(tokens)]) for r in range(batch)]
    return mx.stack(rows)[:, None]  # [B, 1, T, width]


def main():
    ours, theirs = sys.argv[1], sys.argv[2]
    (cache,) = mlx_lm_models("cache")
    loaded = cache.load_prompt_cache(ours)
    assert [type(c).__name__ for c in loaded] == ["CacheList", "CacheList"], loaded
    for layer, c in enumerate(loaded):
        keys, values, offset = c[0].state
        assert offset == 5 and keys.shape == (2, 1, 5, 512), (offset, keys.shape)
        assert mx.array_equal(keys, expected(layer, 0, 2, 5, 512)).item(), f"latent of layer {layer}"
        assert mx.array_equal(values, expected(layer, 1, 2, 5, 64)).item(), f"rope of layer {layer}"
        if layer == 0:
            assert mx.array_equal(c[1].state[0], expected(layer, 2, 2, 5, 128)).item(), "index keys"
        else:
            assert c[1].keys is None, "a layer without index keys has an empty index cache"
    # mlx-lm's own prompt cache for a GLM-5-shaped model, as its model code fills it.
    made = []
    for layer in range(2):
        c = cache.CacheList(cache.KVCache(), cache.KVCache())
        c[0].update_and_fetch(expected(layer, 0, 3, 4, 512), expected(layer, 1, 3, 4, 64))
        keys = expected(layer, 2, 3, 4, 128)
        c[1].update_and_fetch(keys, keys)
        c[1].values = mx.zeros_like(c[1].keys)
        made.append(c)
    cache.save_prompt_cache(theirs, made)
    print("mlx-lm: loaded the library's file, saved its own")


if __name__ == "__main__":
    main()

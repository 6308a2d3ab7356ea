"""The mlx-lm side of tests/mlx_lm_attention.rs: runs mlx-lm 0.32.2's own GLM-5 attention
(glm_moe_dsa.Model, whose layers are deepseek_v32's DeepseekV32Attention and Indexer) with small
random float32 weights and its own cache (prefill of 12 positions, then one decode step, batch 2),
and saves what it computed for the library to recompute: the cache it filled (latent, rope key,
index keys), the queries it formed (the absorbed q_latent from its embed_q, q_rope after its RoPE,
the indexer's queries and head weights), its scale, its index scores and top-k selections, and its
attention output before the output projection. Nothing of the attention is reimplemented here:
the values are taken from mlx-lm's calls by wrapping them (see `tap`).

Two runs on the same weights and inputs: "sparse" (index_topk 6: both steps select) and "dense"
(index_topk 64: the indexer returns None and attention reads every position).

Usage: python3 mlx_lm_attention.py OUT.safetensors
"""
import sys

import mlx.core as mx

from mlx_lm_models import mlx_lm_models

BATCH, PREFILL = 2, 12
# Small GLM-5-shaped attention: 4 heads, kv_lora_rank 32, rope 8, 4 index heads of width 16.
CONFIG = dict(
    model_type="glm_moe_dsa", vocab_size=32, hidden_size=64, index_head_dim=16, index_n_heads=4,
    index_topk=6, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=4, n_shared_experts=None, n_routed_experts=None,
    routed_scaling_factor=1.0, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16,
    qk_nope_head_dim=16, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
    n_group=1, topk_group=1, num_experts_per_tok=1, moe_layer_freq=1, first_k_dense_replace=0,
    max_position_embeddings=4096, rms_norm_eps=1e-6,
    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, attention_bias=False,
)


glm, dsv32, base = mlx_lm_models("glm_moe_dsa", "deepseek_v32", "base")
calls = {}  # name -> list of (args, result) of the current step


def recorded(name, fn):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        calls.setdefault(name, []).append((args, kwargs, out))
        return out
    return wrapper


class MxTap:
    """deepseek_v32's `mx`, with argpartition recorded (its input is the indexer's scores)."""

    def __getattr__(self, name):
        return getattr(mx, name)

    argpartition = staticmethod(recorded("argpartition", mx.argpartition))


def tap(attn):
    # Module attributes set to plain functions shadow the child modules they wrap.
    attn.rope = recorded("rope", attn.rope)  # called on q_pe, then k_pe
    attn.indexer.rope = recorded("index_rope", attn.indexer.rope)  # on the index q, then k
    attn.indexer.weights_proj = recorded("index_weights", attn.indexer.weights_proj)
    dsv32.mx = MxTap()
    dsv32.scaled_dot_product_attention = recorded("sdpa", dsv32.scaled_dot_product_attention)


def step(attn, x, cache, topk):
    """One call of mlx-lm's attention, as DeepseekV32Model makes it; returns what it computed."""
    calls.clear()
    attn.indexer.index_topk = topk
    mask = base.create_attention_mask(x, cache[0], return_array=True)
    attn(x, mask, cache)
    (q, k, v), kw, out = calls["sdpa"][0][0][:3], calls["sdpa"][0][1], calls["sdpa"][0][2]
    length = x.shape[1]
    got = {
        "scale": mx.array([kw["scale"]], dtype=mx.float32),
        # Decode: mlx-lm absorbs embed_q into the query itself; prefill: it attends in head
        # space, so its own embed_q absorbs the q_nope it formed.
        "q_latent": q if length == 1 else attn.embed_q(q),
        "q_rope": calls["rope"][0][2],
        # Before the output projection: latent space at decode (unembed_out comes after),
        # value-head space at prefill (values were unembedded first).
        "out": out,
    }
    if "argpartition" in calls:  # the indexer selected (the window holds more than topk)
        (scores,), _, order = calls["argpartition"][0]
        got["q_index"] = calls["index_rope"][0][2]  # [B, Hi, L, index_head_dim]
        # The indexer scales its head weights inline by n_heads^-0.5 * softmax_scale: [B, L, Hi].
        got["index_weights"] = calls["index_weights"][0][2] * (attn.indexer.n_heads**-0.5 * attn.indexer.softmax_scale)
        got["index_scores"] = scores  # [B, 1, L, T]
        got["selected"] = order[..., -topk:].astype(mx.int32)  # what Indexer returns
    return got


def main():
    path = sys.argv[1]
    mx.random.seed(7)
    model = glm.Model(glm.ModelArgs(**CONFIG))
    attn = model.model.layers[0].self_attn
    tap(attn)
    hidden = CONFIG["hidden_size"]
    xs = {"p": mx.random.normal((BATCH, PREFILL, hidden)), "d": mx.random.normal((BATCH, 1, hidden))}
    saved, caches = {}, {}
    for run, topk in (("sparse", 6), ("dense", 64)):
        cache = model.make_cache()[0]  # CacheList(KVCache(), KVCache())
        for name, x in xs.items():
            for key, value in step(attn, x, cache, topk).items():
                saved[f"{run}.{name}.{key}"] = value
        latent, rope = cache[0].keys_and_values()
        caches[run] = (latent, rope, cache[1].keys_and_values()[0])
    assert all(mx.array_equal(a, b).item() for a, b in zip(caches["sparse"], caches["dense"]))
    assert "sparse.d.selected" in saved and "dense.d.selected" not in saved
    saved["latent"], saved["rope"], saved["index_keys"] = caches["dense"]  # [B, 1, T, width]
    saved["unembed_out"] = attn.unembed_out.weight  # [H, v_head_dim, kv_lora_rank]
    saved = {k: mx.contiguous(v.astype(mx.int32 if v.dtype == mx.int32 else mx.float32)) for k, v in saved.items()}
    mx.save_safetensors(path, saved)
    print(f"mlx-lm: saved {len(saved)} arrays, scale {saved['dense.d.scale'].item():.6f}")


if __name__ == "__main__":
    main()

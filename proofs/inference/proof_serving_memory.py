# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How much memory does it take to serve a model?
#
# Proofs for `docs/inference/serving-memory.md`. Serving memory = weights + key/value cache + one decode step's
# activations. The formulas are in `proofs/serving_memory.py`. Section 1 counts the tiny shared model (LLaMA's
# configuration, `proofs/transformer/presets.py`): its tensors' bytes equal the formulas, an identity of our code.
# Section 2 builds Llama-2-7B, Llama-3-8B and Mistral-7B (and OPT-13B for Kwon et al.'s figure) from Hugging Face
# `transformers`' own config classes on the meta device (shapes, no memory, nothing downloaded) and counts them.
# Section 3 measures the transient bytes of one decode step on the tiny model against its cache at long context.
# Section 4 computes what fits in a 24 GiB and an 80 GiB card. Everything is exact counting: no seed enters.
# Run: `pytest proofs/inference/proof_serving_memory.py`.

# %%
from __future__ import annotations

import os
from functools import cache

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model here comes from a config object: nothing to download

import torch

from proofs.measure import TransientBytes
from proofs.serving_memory import (GB, KiB, MiB, GiB, CacheShape, crossover_tokens, int8_weight_bytes,
                                   kv_bytes, kv_bytes_per_token, largest_batch, weight_bytes)
from proofs.transformer import DecoderLM
from proofs.transformer.config import ConfigError
from proofs.transformer.presets import llama_config

# transformers is imported inside hf(), on first use: the import takes seconds, and sections 1 and 3 do not need it.

# %% [markdown]
# ## 1. The tiny model: bytes of real tensors against the formulas
#
# The tiny shared model in LLaMA's configuration (d_model 32, 4 heads of 8, SwiGLU width 64, 2 layers, vocabulary
# 32). Weights: `nbytes` of every parameter in fp32 and bf16, and the int8 storage of proofs.transformer.quant
# (codes plus one fp32 scale per output row of every linear layer; embeddings and norms stay fp32). Cache: prefill
# a prompt, decode a few tokens, add up `KVCache.nbytes`.

# %%
# --8<-- [start:tiny]
VOCAB, C, NH, HS, FF, LAYERS = 32, 32, 4, 8, 64, 2


def tiny(n_kv: int | None = None, **switches) -> DecoderLM:
    """The tiny shared model in LLaMA's configuration (n_kv None: multi-head attention)."""
    torch.manual_seed(0)
    return DecoderLM(llama_config(vocab_size=VOCAB, d_model=C, n_heads=NH, n_kv_heads=n_kv, d_ff=FF, n_layers=LAYERS,
                                  max_len=64, **switches)).eval()


def llama_params(vocab: int, d: int, layers: int, n_heads: int, n_kv: int, d_head: int, d_ff: int) -> int:
    """Closed form of a LLaMA-type decoder: untied embedding and head, per layer W_Q, W_O (d × n_h·d_h), W_K, W_V
    (d × n_kv·d_h), three SwiGLU matrices (d × d_ff), two RMSNorm gains; one final norm. No biases."""
    per_layer = 2 * d * n_heads * d_head + 2 * d * n_kv * d_head + 3 * d * d_ff + 2 * d
    return 2 * vocab * d + layers * per_layer + d


@torch.no_grad()
def tiny_cache_bytes(lm: DecoderLM, dtype: torch.dtype, batch: int, prompt: int, decode: int) -> int:
    """Bytes of the self-attention caches after a prompt of `prompt` tokens and `decode` greedy steps."""
    lm = lm.to(dtype)
    cache = lm.decoder.new_cache()
    ids = torch.randint(1, VOCAB, (batch, prompt), generator=torch.Generator().manual_seed(1))
    logits = lm(ids, cache=cache)
    for _ in range(decode):
        logits = lm(logits[:, -1:].argmax(-1), cache=cache)
    return sum(layer["self"].nbytes for layer in cache)
# --8<-- [end:tiny]


# %% [markdown]
# ## 2. Three 7B-class models from transformers' configs, on the meta device
#
# The published sizes are written here (sources in the page): Llama-2-7B (Touvron et al. 2023; the config of
# meta-llama/Llama-2-7b-hf), Llama-3-8B (the Meta-Llama-3-8B model card and config: 8 KV heads, vocabulary 128,256,
# SwiGLU width 14,336, untied head), Mistral-7B v0.1 (Jiang et al. 2023, Table 1: 32 layers, dim 4096, head_dim 128,
# hidden_dim 14336, 32 heads, 8 KV heads, window 4096, vocabulary 32000). OPT-13B (Zhang et al. 2022, Table 1:
# 40 layers, 40 heads, d_model 5120) only for Kwon et al.'s per-token figure.

# %%
# --8<-- [start:configs]
SIZES = {  # transformers class family, config keyword arguments
    "Llama-2-7B": ("Llama", dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                                 tie_word_embeddings=False)),
    "Llama-3-8B": ("Llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                                 tie_word_embeddings=False)),
    "Mistral-7B": ("Mistral", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=128, sliding_window=4096,
                                   tie_word_embeddings=False)),
    "OPT-13B": ("OPT", dict(vocab_size=50272, hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
                            ffn_dim=20480)),  # only for Kwon et al.'s per-token figure
}
MODELS = ("Llama-2-7B", "Llama-3-8B", "Mistral-7B")


def hf(family: str):
    """transformers' (config, model class) for a family, imported on first use."""
    import transformers
    return getattr(transformers, f"{family}Config"), getattr(transformers, f"{family}ForCausalLM")


def config_of(name: str, **overrides):
    family, kwargs = SIZES[name]
    return hf(family)[0](**{**kwargs, **overrides})


def meta_model(name: str, **overrides):
    """transformers' model class built from its config under torch.device('meta'): every shape, no storage."""
    with torch.device("meta"):
        return hf(SIZES[name][0])[1](config_of(name, **overrides))


def cache_shape(config) -> CacheShape:
    """Layers, KV heads, head width and window, read from a transformers config."""
    n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return CacheShape(config.num_hidden_layers, n_kv, d_head, getattr(config, "sliding_window", None))


@cache
def count(name: str) -> dict:
    """Parameters of transformers' model, bf16 bytes, and cache bytes per token (bf16) from its config."""
    model, config = meta_model(name), config_of(name)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "bf16": weight_bytes(params, 2), "per_token": kv_bytes_per_token(cache_shape(config), 2),
            "shape": cache_shape(config)}
# --8<-- [end:configs]


# %% [markdown]
# ## 3. One decode step's activations against the cache
#
# A cache of T tokens is written straight into the tiny model's `KVCache` objects (random entries at positions
# 0..T-1: a prefill of 32,768 tokens would need a 32k × 32k score matrix), then one token per sequence is decoded
# under `TransientBytes`: the peak bytes of the tensors the step creates and frees again (the new cache entries and
# the logits survive the step and are not activations). Two arms: the fused attention (`attn_impl="auto"`, torch's
# SDPA: its internal buffers are not operator outputs and so not seen) and the explicit softmax, which materialises
# one row of scores per query head.

# %%
# --8<-- [start:step]
@torch.no_grad()
def decode_step(tokens: int, batch: int, impl: str = "auto") -> dict:
    """Transient bytes of one decode step of the tiny model (fp32) with `tokens` cached per sequence, and the cache."""
    lm = tiny(attn_impl=impl)  # the one switch: fused SDPA ("auto") or explicit softmax(QKᵀ)
    g = torch.Generator().manual_seed(2)
    cache = lm.decoder.new_cache()
    for layer in cache:
        layer["self"].entries = tuple(torch.randn(batch, NH, tokens, HS, generator=g) for _ in range(2))
        layer["self"].pos = torch.arange(tokens)[None]  # (1, T)
    token = torch.randint(1, VOCAB, (batch, 1), generator=g)
    # the old entries are watched too: our KVCache appends by torch.cat, a new copy of each layer's entries
    with TransientBytes(released=[e for layer in cache for e in layer["self"].entries]) as watch:
        lm(token, cache=cache)
    return {"transient": watch.peak, "net": watch.net_peak, "survivors": watch.survivors,
            "cache": sum(layer["self"].nbytes for layer in cache)}
# --8<-- [end:step]


# %%
if __name__ == "__main__":
    print({name: count(name) for name in MODELS})
    print(decode_step(4096, 4), decode_step(4096, 4, "explicit"))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_tiny]
@pytest.mark.claim("C-SERVE-1", "confirmed")
def test_tiny_model_bytes_equal_the_formulas(ev):
    """An identity of our code: the tiny model's parameter bytes are params × 4 (fp32) and × 2 (bf16); its int8
    storage is one byte per linear weight plus a 4-byte scale per row plus the float rest; its cache after a
    prefill and a decode is 2·L·n_kv·d_head·T·B·bytes, for MHA and for GQA-2. GQA halves the cache but shrinks the
    weights only by W_K and W_V. Would be refuted by any byte of difference, or by GQA halving the weights too."""
    lm = tiny()
    n = sum(p.numel() for p in lm.parameters())
    assert n == llama_params(VOCAB, C, LAYERS, NH, NH, HS, FF)
    ev.record("tiny model parameters (measured = closed form)", n)
    for dtype, b in ((torch.float32, 4), (torch.bfloat16, 2)):
        got = sum(p.nbytes for p in tiny().to(dtype).parameters())
        ev.record(f"weight bytes {str(dtype)[6:]} / (params × {b})", got / weight_bytes(n, b), expect="1 exactly")
        assert got == weight_bytes(n, b)
    q = int8_weight_bytes(lm)
    want = q["linear_params"] * 1 + q["linear_rows"] * 4 + (n - q["linear_params"]) * 4
    ev.record("int8 weight-only bytes / (linear params × 1 + rows × 4 + rest × 4)", q["total"] / want, expect="1 exactly")
    ev.record("int8 weight-only bytes / fp32 bytes (embeddings and norms stay fp32)", q["total"] / (4 * n),
              expect="above 1/4: scales and float parts")
    assert q["total"] == want and q["total"] > n
    batch, prompt, decode = 3, 7, 4
    for n_kv in (NH, 2):
        for dtype, b in ((torch.float32, 4), (torch.bfloat16, 2)):
            got = tiny_cache_bytes(tiny(n_kv), dtype, batch, prompt, decode)
            want = kv_bytes(CacheShape(LAYERS, n_kv, HS), prompt + decode, batch, b)
            ev.record(f"cache bytes / formula, n_kv={n_kv}, {str(dtype)[6:]}, B={batch}, T={prompt + decode}",
                      got / want, expect="1 exactly", key=n_kv == 2 and b == 2)
            assert got == want
    mha, gqa = tiny(), tiny(2)
    w_ratio = sum(p.numel() for p in gqa.parameters()) / n
    c_ratio = tiny_cache_bytes(gqa, torch.float32, batch, prompt, decode) / tiny_cache_bytes(mha, torch.float32, batch,
                                                                                             prompt, decode)
    ev.record("GQA-2 / MHA: parameters", w_ratio, expect="a little below 1: only W_K, W_V shrink")
    ev.record("GQA-2 / MHA: cache bytes", c_ratio, expect="1/2 = n_kv / n_heads")
    assert c_ratio == 0.5 and 0.5 < w_ratio < 1
# --8<-- [end:test_tiny]


# --8<-- [start:test_seven_b]
@pytest.mark.claim("C-SERVE-1", "confirmed")
def test_seven_b_models_weights_and_cache(ev):
    """Counts of transformers' own models built on the meta device: parameters equal the closed form; bf16 bytes are
    ≈ 13.5 / 16.1 / 14.5 GB (decimal GB; 12.55 / 14.96 / 13.49 GiB); the cache is exactly 0.5 MiB per token for
    Llama-2-7B (2 GiB per 4096 tokens) and 128 KiB for the two 8-KV-head models; Mistral's window caps a sequence at
    4096 tokens. OPT-13B's 2·40·5120·2 bytes is 800 KiB = 819.2 kB (Kwon et al.'s "800 KB"). GQA applied to
    Llama-2-7B cuts its cache 4× but its weights by about an eighth. Would be refuted by any count off the
    closed form or by a figure off by more than its rounding."""
    claimed_gb = {"Llama-2-7B": 13.5, "Llama-3-8B": 16.1, "Mistral-7B": 14.5}  # the claim's figures, rounded to 0.1 GB
    for name in MODELS:
        c, cfg = count(name), config_of(name)
        d_head = cfg.hidden_size // cfg.num_attention_heads
        closed = llama_params(cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                              cfg.num_key_value_heads, d_head, cfg.intermediate_size)
        ev.record(f"{name}: parameters (transformers, meta device)", c["params"], expect="= closed form")
        ev.record(f"{name}: bf16 weights, GB (1e9 bytes)", c["bf16"] / GB, expect=f"≈ {claimed_gb[name]}")
        ev.record(f"{name}: bf16 weights, GiB (2^30 bytes)", c["bf16"] / GiB, key=False)
        ev.record(f"{name}: cache per token, KiB (bf16)", c["per_token"] / KiB)
        assert c["params"] == closed
        assert abs(c["bf16"] / GB - claimed_gb[name]) < 0.05  # the claim's rounding
        assert abs(c["bf16"] / GiB - claimed_gb[name]) > 0.5  # the same figure read as GiB would be wrong
    l2, l3, mi = count("Llama-2-7B"), count("Llama-3-8B"), count("Mistral-7B")
    assert l2["per_token"] == MiB // 2 and kv_bytes(l2["shape"], 4096, 1, 2) == 2 * GiB
    assert l3["per_token"] == mi["per_token"] == 128 * KiB
    ev.record("Llama-2-7B: cache of one 4096-token sequence, GiB", kv_bytes(l2["shape"], 4096, 1, 2) / GiB,
              expect="2 exactly")
    capped = {t: kv_bytes(mi["shape"], t, 1, 2) / MiB for t in (4096, 8192, 32768)}
    ev.record("Mistral-7B (window 4096): cache of one sequence of 4096 / 8192 / 32768 tokens, MiB",
              list(capped.values()), expect="512 each: the window caps it")
    assert len(set(capped.values())) == 1 and capped[4096] == 512
    no_window = CacheShape(mi["shape"].layers, mi["shape"].n_kv, mi["shape"].d_head)  # the switch: no window
    assert kv_bytes(no_window, 32768, 1, 2) == 8 * kv_bytes(mi["shape"], 32768, 1, 2)
    opt = kv_bytes_per_token(cache_shape(config_of("OPT-13B")), 2)
    ev.record("OPT-13B: cache per token, KiB / kB", [opt / KiB, opt / 1000], expect="800 KiB = 819.2 kB")
    ev.record("OPT-13B: cache of one 2048-token sequence, GiB / GB", [opt * 2048 / GiB, opt * 2048 / GB],
              expect="Kwon et al.: 1.6 GB")
    assert opt == 800 * KiB
    # "GQA shrinks the weights": Llama-2-7B with 8 KV heads instead of 32, the only change.
    gqa_cfg = config_of("Llama-2-7B", num_key_value_heads=8)
    gqa_params = sum(p.numel() for p in meta_model("Llama-2-7B", num_key_value_heads=8).parameters())
    w_ratio, c_ratio = gqa_params / l2["params"], kv_bytes_per_token(cache_shape(gqa_cfg), 2) / l2["per_token"]
    ev.record("Llama-2-7B with 8 KV heads / with 32: parameters", w_ratio, expect="≈ 0.88")
    ev.record("Llama-2-7B with 8 KV heads / with 32: cache per token", c_ratio, expect="0.25")
    assert c_ratio == 0.25 and 0.85 < w_ratio < 0.9
# --8<-- [end:test_seven_b]


# --8<-- [start:test_step]
@pytest.mark.claim("C-SERVE-1", "confirmed")
def test_decode_step_activations_are_small_next_to_a_long_cache(ev):
    """Measured on the tiny model (fp32, batch 4): the transient bytes of one decode step against its cache at 16,
    4096 and 32,768 cached tokens, fused and explicit attention. At long context the step's activations are a small
    fraction of the cache (fused: under 1 %; explicit: the score rows, a constant share n_h/(2·L·n_kv·d_h) per
    score-sized tensor); the fraction is largest at 16 tokens. Would be refuted if the step's activations grew as fast
    as the cache, or were not small at 32k. Also measured: what the step needs above the memory it started with. Our
    KVCache (like transformers' DynamicCache) appends by torch.cat, so each layer briefly holds its old and its new
    entries: about 1/L of the cache (1/2 here), far above the activations. An in-place cache (static or paged) avoids
    that copy; it is a cost of the cache's layout, not of the model."""
    ratios, nets = {}, {}
    for impl in ("auto", "explicit"):
        for tokens in (16, 4096, 32768):
            r = decode_step(tokens, 4, impl)
            ratios[impl, tokens], nets[impl, tokens] = r["transient"] / r["cache"], r["net"] / r["cache"]
            ev.record(f"{impl} attention, {tokens} tokens cached: step transient bytes / cache bytes",
                      ratios[impl, tokens], key=tokens == 32768)
            ev.record(f"{impl} attention, {tokens} tokens cached: step transient KiB, cache KiB",
                      [r["transient"] / KiB, r["cache"] / KiB], key=False)
            ev.record(f"{impl} attention, {tokens} tokens cached: step peak above its start (torch.cat cache) / cache",
                      nets[impl, tokens], expect=f"≈ 1/L = {1 / LAYERS}", key=impl == "auto" and tokens == 32768)
            assert r["survivors"] >= r["cache"]  # the step allocated a whole new cache (plus logits)
    for tokens in (4096, 32768):  # the copy's overlap is one layer's cache, the activations a sliver beside it
        assert 1 / LAYERS <= nets["auto", tokens] < 1 / LAYERS + 0.01
    for impl in ("auto", "explicit"):
        assert ratios[impl, 32768] < ratios[impl, 4096] < ratios[impl, 16]  # falls with context
        assert ratios[impl, 16] > 0.05  # at a short context the step's activations are not negligible
    assert ratios["auto", 32768] < 0.01 and ratios["explicit", 32768] < 0.1
    assert ratios["explicit", 32768] > ratios["auto", 32768]  # the materialised scores grow with T
# --8<-- [end:test_step]


# --8<-- [start:test_fit]
CARDS = {"24 GiB": 24 * GiB, "80 GiB": 80 * GiB}
CONTEXTS = (4096, 8192, 32768)


@pytest.mark.claim("C-SERVE-1", "confirmed")
def test_largest_batch_that_fits(ev):
    """Arithmetic of the formulas on the counted models: for each card (24 and 80 GiB) and context, the most sequences
    whose bf16 cache fits beside the bf16 weights (no reserve for activations or runtime: an upper bound), and the
    batch × context at which the cache outweighs the weights. Checked both ways: one more sequence no longer fits;
    at batch 1 × 512 tokens the cache is under 2 % of the weights ("parameters × 2" holds there), beyond the
    crossover it exceeds them. Would be refuted by a fit that does not fit or a crossover on the wrong side."""
    for name in MODELS:
        c = count(name)
        cross = crossover_tokens(c["bf16"], c["per_token"])
        ev.record(f"{name}: cached tokens (batch × context) where cache = weights", round(cross))
        assert kv_bytes(CacheShape(c["shape"].layers, c["shape"].n_kv, c["shape"].d_head), 512, 1, 2) < 0.02 * c["bf16"]
        assert kv_bytes(CacheShape(c["shape"].layers, c["shape"].n_kv, c["shape"].d_head), int(cross) + 1, 1, 2) > c["bf16"]
        for card, cap in CARDS.items():
            for ctx in CONTEXTS:
                b = largest_batch(cap, c["bf16"], c["shape"], ctx, 2)
                ev.record(f"{name}, {card}, context {ctx}: largest batch", b, key=False)
                assert c["bf16"] + kv_bytes(c["shape"], ctx, b, 2) <= cap < c["bf16"] + kv_bytes(c["shape"], ctx, b + 1, 2)
    with pytest.raises(ConfigError):
        largest_batch(80 * GiB, 0, CacheShape(1, 1, 1), 0, 2)
# --8<-- [end:test_fit]

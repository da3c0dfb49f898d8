# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Prefill vs decode: why is one compute-bound and the other memory-bound?
#
# Proofs for `docs/inference/prefill-decode.md`. Arithmetic intensity of one forward pass of the shared
# `DecoderLM` (bfloat16 weights and cache): FLOPs counted by `FlopCounterMode`, divided by the bytes the pass
# must read from memory, every weight once plus the whole key/value cache. Prefill feeds T prompt tokens
# per sequence into an empty cache; decode feeds one token per sequence into a cache of T tokens. What the
# hardware does with that ratio (peak FLOP/s against memory bandwidth) is cited from datasheets, not
# measured: this runs on a CPU.
# Run: `pytest proofs/inference/proof_prefill_decode.py`.

# %%
from __future__ import annotations

import math
from functools import cache

import torch
from torch.utils.flop_counter import FlopCounterMode

from proofs.transformer import DecoderLM, TransformerConfig

VOCAB, C, NH, LAYERS = 64, 64, 4, 2
HS = C // NH


def lm_cfg(**switches) -> TransformerConfig:
    base = dict(vocab_size=VOCAB, d_model=C, n_heads=NH, d_ff=4 * C, n_layers=LAYERS, dropout_emb=0.0,
                dropout_residual=0.0, positions="rope", norm_position="pre", max_len=64,
                attn_impl="explicit")  # explicit: FlopCounterMode sees the attention matrix products
    return TransformerConfig(**{**base, **switches})


@cache
def model(n_kv: int | None = None) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(lm_cfg(n_kv_heads=n_kv)).to(torch.bfloat16).eval()


# %% [markdown]
# ## 1. FLOPs and bytes of one forward pass
#
# A decode step's cache is filled with T entries directly (their values do not change the counts), so a
# long context costs no prefill here. Bytes read = every parameter's bytes + the cache's bytes after the
# step (the step reads all cached keys and values, its own included). Activations are left out: a fused
# kernel keeps most of them on chip, and leaving them out can only flatter prefill, never decode.

# %%
# --8<-- [start:intensity]
@cache
@torch.no_grad()
def pass_cost(batch: int, new: int, context: int = 0, n_kv: int | None = None) -> dict:
    """One forward pass: `new` tokens per sequence after `context` cached ones. FLOPs, bytes read, FLOPs per byte."""
    lm = model(n_kv)
    cache = lm.decoder.new_cache()
    if context:  # a cache of `context` tokens, filled directly
        kv = lm.cfg.kv_heads
        entry = torch.zeros(batch, kv, context, HS, dtype=torch.bfloat16)  # (B, n_kv, T, hs)
        for layer in cache:
            layer["self"].update((entry, entry.clone()), torch.arange(context)[None])
    ids = torch.randint(1, VOCAB, (batch, new))
    with FlopCounterMode(display=False) as fc:
        lm(ids, cache=cache)
    weights = sum(p.nbytes for p in lm.parameters())
    kv_bytes = sum(layer["self"].nbytes for layer in cache)
    flops = fc.get_total_flops()
    return {"flops": flops, "weight_bytes": weights, "cache_bytes": kv_bytes, "intensity": flops / (weights + kv_bytes)}


def prefill(batch: int, tokens: int, n_kv: int | None = None) -> dict:
    return pass_cost(batch, tokens, 0, n_kv)


def decode(batch: int, context: int, n_kv: int | None = None) -> dict:
    return pass_cost(batch, 1, context, n_kv)
# --8<-- [end:intensity]


# %% [markdown]
# ## 2. The hardware side, cited
#
# A step takes at least max(FLOPs / peak FLOP/s, bytes / bandwidth). The two are equal at the "ridge"
# intensity peak / bandwidth; below it memory bandwidth sets the time, above it compute does. Figures from
# NVIDIA's datasheets (dense bfloat16 tensor-core peak, HBM bandwidth).

# %%
# --8<-- [start:hardware]
ACCELERATORS = {  # name: (peak dense BF16 FLOP/s, memory bandwidth bytes/s), NVIDIA datasheets
    "A100 SXM 80GB": (312e12, 2.039e12),
    "H100 SXM": (989e12, 3.35e12),
}


def ridge(name: str) -> float:
    peak, bandwidth = ACCELERATORS[name]
    return peak / bandwidth  # FLOPs per byte at which compute time = memory time


def roofline_ms(flops: float, bytes_read: float, name: str = "A100 SXM 80GB") -> dict:
    peak, bandwidth = ACCELERATORS[name]
    return {"compute_ms": 1e3 * flops / peak, "memory_ms": 1e3 * bytes_read / bandwidth}


# A 7B decoder by arithmetic (not run): LLaMA-2-7B, 6.74e9 parameters, 32 layers × 32 heads × 128, MHA, bfloat16.
PARAMS_7B, CACHE_PER_TOKEN_7B = 6.74e9, 2 * 32 * 32 * 128 * 2  # bytes of keys and values per token and sequence


def decode_step_7b(batch: int, context: int, kv_heads: int = 32) -> dict:
    """FLOPs ≈ 2·params per token + attention 4·L·d·T per token; bytes = weights + the cache of every sequence.
    kv_heads < 32 is the same model with a GQA cache (attention FLOPs unchanged, cache bytes × kv_heads/32)."""
    flops = batch * (2 * PARAMS_7B + 4 * 32 * 4096 * context)
    bytes_read = 2 * PARAMS_7B + batch * context * CACHE_PER_TOKEN_7B * kv_heads / 32
    return {"intensity": flops / bytes_read, **roofline_ms(flops, bytes_read)}


def longest_compute_bound_context_7b(kv_heads: int = 32, name: str = "A100 SXM 80GB") -> float:
    """As B → ∞ decode's intensity tends to n_h/n_kv + 2N/(T·c) (weights shared, caches not). It can reach the
    ridge R only while T < 2N / ((R − n_h/n_kv)·c), whatever the batch or the memory."""
    c = CACHE_PER_TOKEN_7B * kv_heads / 32
    return 2 * PARAMS_7B / ((ridge(name) - 32 / kv_heads) * c)


def batch_to_reach_ridge_7b(context: int, name: str = "A100 SXM 80GB") -> float:
    """Solve B(2N + 4LdT) / (2N + B·T·c) = R for B (MHA); infinite when T is past the bound above."""
    R, w = ridge(name), 2 * PARAMS_7B
    denominator = w + 4 * 32 * 4096 * context - R * context * CACHE_PER_TOKEN_7B
    return w * R / denominator if denominator > 0 else float("inf")
# --8<-- [end:hardware]


# %%
if __name__ == "__main__":
    print({T: round(prefill(1, T)["intensity"], 1) for T in (8, 32, 128, 512)})
    print({T: round(decode(1, T)["intensity"], 2) for T in (8, 32, 128, 512)})
    print({B: round(decode(B, 16)["intensity"], 1) for B in (1, 8, 64)})
    print({B: round(decode(B, 1024)["intensity"], 2) for B in (1, 8, 64)})
    print({k: ridge(k) for k in ACCELERATORS}, decode_step_7b(1, 0), decode_step_7b(64, 4096))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402

TOKENS = (8, 32, 128, 512)
SHORT, LONG = 4, 1024  # cached tokens; the toy's cache equals its weights at about 6·d_model = 384 tokens


def _plot(ev, prefill_i: list[float], decode_i: list[float], batch_short: dict, batch_long: dict):
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4), constrained_layout=True)
    a.loglog(TOKENS, prefill_i, "o-", label="prefill: T prompt tokens, batch 1")
    a.loglog(TOKENS, decode_i, "s-", label="decode: 1 token after T cached, batch 1")
    for name, style in zip(ACCELERATORS, ("--", ":")):
        a.axhline(ridge(name), ls=style, color="grey", lw=1, label=f"ridge, {name} (datasheet)")
    a.set(xlabel="tokens T", ylabel="FLOPs per byte read")
    a.set_xticks(TOKENS, [str(t) for t in TOKENS])
    a.legend(fontsize=7)
    bs = list(batch_short)
    b.loglog(bs, list(batch_short.values()), "o-", label=f"decode, {SHORT} cached tokens")
    b.loglog(bs, list(batch_long.values()), "s-", label=f"decode, {LONG} cached tokens")
    b.axhline(ridge("A100 SXM 80GB"), ls="--", color="grey", lw=1, label="ridge, A100 (datasheet)")
    b.set(xlabel="batch (sequences decoded together)", ylabel="FLOPs per byte read")
    b.set_xticks(bs, [str(x) for x in bs])
    b.legend(fontsize=7)
    ev.figure(fig, "intensity", "Arithmetic intensity (FLOPs counted ÷ bytes of weights and cache) of the toy decoder "
              "in bfloat16. Left: prefill against decode. Right: decode against batch, with a short and a long cache. "
              "Ridge lines: peak FLOP/s ÷ bandwidth from NVIDIA's datasheets.")


# --8<-- [start:test_phases]
@pytest.mark.claim("C-PREFILL-1", "nuanced")
def test_prefill_intensity_grows_with_tokens_decode_stays_near_one(ev, seed):
    """FLOPs per byte of weights and cache: prefill's grows about linearly with the prompt (every weight is read once
    and used for all T tokens), decode's stays near 1 at batch 1 whatever the context (each weight is used once).
    A count of our module (bfloat16). Would be refuted if decode reused its weights (intensity growing with T) or
    prefill did not."""
    pre = [prefill(1, T)["intensity"] for T in TOKENS]
    dec = [decode(1, T)["intensity"] for T in TOKENS]
    ev.record(f"prefill FLOPs/byte, batch 1, T = {', '.join(map(str, TOKENS))}", pre, expect="≈ T: grows with the prompt")
    ev.record(f"decode FLOPs/byte, batch 1, after T = {', '.join(map(str, TOKENS))} cached", dec, expect="≈ 1")
    growth = [math.log(b / a) / math.log(4) for a, b in zip(pre, pre[1:])]
    ev.record("prefill growth exponent per ×4 of T", growth, expect="≈ 1: linear")
    for name in ACCELERATORS:
        ev.record(f"ridge intensity, {name} (datasheet peak ÷ bandwidth)", ridge(name), key=name.startswith("A100"))
    crossing = min((T for T, i in zip(TOKENS, pre) if i > ridge("A100 SXM 80GB")), default=None)
    ev.record("shortest prompt tried whose prefill is above the A100 ridge (tokens)", crossing)
    assert all(0.85 < g < 1.1 for g in growth)
    assert all(0.5 < d < 1.5 for d in dec)
    assert pre[-1] > ridge("H100 SXM") > ridge("A100 SXM 80GB") > 100 * max(dec)
# --8<-- [end:test_phases]


# --8<-- [start:test_batch]
@pytest.mark.claim("C-PREFILL-1", "nuanced")
def test_batching_lifts_decode_until_the_cache_dominates(ev, seed):
    """Decoding B sequences together reads the weights once for B tokens: with a short cache the intensity grows
    about like B, so a large enough batch is compute-bound. With a long cache every sequence brings its own keys
    and values and the intensity flattens near n_heads/n_kv FLOPs per byte (plus the weights' share): more batch no
    longer helps, fewer key/value heads do. Would be refuted if batch did not raise short-context intensity, or if the long-context one
    kept growing with B. Fewer key/value heads cut bytes, not attention FLOPs: MHA and MQA counts differ by exactly
    the K/V projection FLOPs (would be refuted by any other difference)."""
    batches = (1, 4, 16, 64)
    short = [decode(B, SHORT)["intensity"] for B in batches]
    long_mha = [decode(B, LONG)["intensity"] for B in batches]
    long_mqa = [decode(B, LONG, n_kv=1)["intensity"] for B in batches]
    ev.record(f"decode FLOPs/byte, {SHORT} cached tokens, batch {', '.join(map(str, batches))}", short, expect="≈ B")
    ev.record(f"decode FLOPs/byte, {LONG} cached tokens, MHA, batch {', '.join(map(str, batches))}", long_mha,
              expect="flattens near 1 (+ the weights' share)")
    ev.record(f"decode FLOPs/byte, {LONG} cached tokens, MQA (1 KV head of 4), batch {', '.join(map(str, batches))}",
              long_mqa, expect="flattens near 4 = n_heads/n_kv (+ the weights' share)")
    mha4, mqa4 = decode(4, LONG), decode(4, LONG, n_kv=1)
    proj = 2 * 4 * C * 2 * (NH - 1) * HS * LAYERS  # the K/V projection columns MQA drops: 2·B·d_model·2(n_h−n_kv)·hs·L
    mix = 2 * 2 * 4 * NH * (LONG + 1) * HS * LAYERS  # q·kᵀ and p·v of every query head over T+1 keys
    ev.record(f"decode FLOPs, batch 4, {LONG} cached tokens: MHA, MQA", [mha4["flops"], mqa4["flops"]],
              expect="MQA fewer only by its smaller K/V projections")
    ev.record("MHA − MQA FLOPs; K/V projection FLOPs saved (formula); score-and-mix FLOPs (formula, same in both)",
              [mha4["flops"] - mqa4["flops"], proj, mix], expect="first two equal")
    assert mha4["flops"] - mqa4["flops"] == proj  # so the attention scores and mixing cost the same FLOPs
    c = decode(64, LONG)
    ev.record(f"cache bytes / weight bytes at batch 64, {LONG} cached tokens (toy)", c["cache_bytes"] / c["weight_bytes"])
    one = decode(1, 1)
    ev.record("toy: tokens of cache per sequence that weigh as much as the weights", one["weight_bytes"] / (one["cache_bytes"] / 2),
              expect="≈ 6·d_model: the toy's cache overtakes its weights early", key=False)
    ev.record("7B (LLaMA-2 shape): tokens of cache that weigh as much as the weights", 2 * PARAMS_7B / CACHE_PER_TOKEN_7B,
              expect="arithmetic", key=False)
    # arithmetic: at the ridge batch (≈ 153 on an A100) how many cached tokens per sequence fit in 80 GB beside the
    # weights? MHA LLaMA-2-7B shape (512 KiB per token) against a GQA-8 cache of the same model (128 KiB per token)
    # ("80 GB" = 8e10 bytes less the weights, ignoring activations, workspace and fragmentation: an order of magnitude)
    b_ridge = round(ridge("A100 SXM 80GB"))
    room = 80e9 - 2 * PARAMS_7B
    fit_mha, fit_gqa = room / (b_ridge * CACHE_PER_TOKEN_7B), room / (b_ridge * CACHE_PER_TOKEN_7B / 4)
    ev.record("7B on A100 80GB at the ridge batch: batch, cached tokens per sequence that fit (MHA), same with GQA-8",
              [b_ridge, fit_mha, fit_gqa], expect="arithmetic: ≈ 830 tokens with MHA, ≈ 3300 with GQA-8: a memory limit")
    # ...but memory is the looser limit: at that batch and those contexts the step is far below the ridge.
    at_fit = [decode_step_7b(b_ridge, round(fit_mha))["intensity"], decode_step_7b(b_ridge, round(fit_gqa), 8)["intensity"]]
    ev.record("7B on A100 at the ridge batch with the caches that fit: FLOPs/byte (MHA, GQA-8)", at_fit,
              expect="arithmetic: far below the ridge ≈ 153")
    bound = [longest_compute_bound_context_7b(32), longest_compute_bound_context_7b(8),
             longest_compute_bound_context_7b(32, "H100 SXM")]
    ev.record("7B decode: longest context per sequence that can reach the ridge at any batch, 2N/((R − n_h/n_kv)c): "
              "A100 MHA, A100 GQA-8, H100 MHA", bound, expect="arithmetic: ≈ 170, ≈ 690, ≈ 87 tokens")
    ev.record("7B decode, A100 MHA: batch needed to reach the ridge with 100 cached tokens per sequence",
              batch_to_reach_ridge_7b(100), expect="arithmetic: several hundred")
    assert max(at_fit) < ridge("A100 SXM 80GB") / 3  # the intensity bound, not memory, is what binds
    assert bound[0] < fit_mha and bound[1] < fit_gqa
    assert decode_step_7b(10**6, round(bound[0]) - 1)["intensity"] > ridge("A100 SXM 80GB") > decode_step_7b(10**6, round(bound[0]) + 1)["intensity"]
    for B, T in ((1, 0), (64, 0), (16, 4096)):
        r = decode_step_7b(B, T)
        ev.record(f"7B (LLaMA-2 shape) decode step on A100, batch {B}, {T} cached: FLOPs/byte, compute ms, memory ms",
                  [r["intensity"], r["compute_ms"], r["memory_ms"]], expect="arithmetic from datasheet figures")
    _plot(ev, [prefill(1, T)["intensity"] for T in TOKENS], [decode(1, T)["intensity"] for T in TOKENS],
          dict(zip(batches, short)), dict(zip(batches, long_mha)))
    assert short[-1] > 25 * short[0]  # 64 sequences share one read of the weights
    assert long_mha[-1] < 2 * long_mha[1] and long_mha[-1] < 1.5  # the cache dominates: no more gain
    assert 3 < long_mqa[-1] / long_mha[-1] < 4.5  # fewer key/value heads raise the plateau
# --8<-- [end:test_batch]

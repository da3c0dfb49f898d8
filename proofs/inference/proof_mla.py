# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # What does multi-head latent attention save?
#
# Proofs for `docs/inference/mla.md`. Switches of the shared model: `cfg.kv_latent` (d_c > 0 turns the
# self-attention into MLA, `proofs/transformer/latent.py`), `cfg.mla_rope_dim` (d_r, the decoupled rotary
# key of DeepSeek-V2 §2.1.3) and `cfg.mla_absorb` (attend over the latents with W_UK and W_UV folded into
# the query and output maps). Everything runs in float64 where an identity is checked.
# Run: `pytest proofs/inference/proof_mla.py`.

# %%
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from proofs.transformer import (AbsorbedLatentAttention, DecoderLM, LatentAttention, TransformerConfig, apply_rope,
                                rope_cos_sin, rope_inv_freq)

VOCAB, C, NH = 16, 32, 4
HS = C // NH  # d_head = 8
D_C, D_R = 4 * HS, HS // 2  # DeepSeek-V2's ratios: d_c = 4·d_h, d_r = d_h/2


def mla_cfg(**switches) -> TransformerConfig:
    base = dict(vocab_size=VOCAB, d_model=C, n_heads=NH, d_ff=64, n_layers=2, dropout_emb=0.0, dropout_residual=0.0,
                kv_latent=D_C, norm_position="pre", max_len=64)
    return TransformerConfig(**{**base, **switches})


ROPE = dict(positions="rope", mla_rope_dim=D_R)


# %% [markdown]
# ## 1. Absorbed equals materialised
#
# The same weights in `LatentAttention` (up-project every cached latent to keys and values, attend as
# usual) and `AbsorbedLatentAttention` (queries mapped into latent space, weights applied to the latents,
# W_UV after the sum). Then the literal fold: W_Q'_h = W_UK,hᵀ W_Q,h (d_c × C) and W_O'_h = W_O,h W_UV,h
# (C × d_c), two plain matrices computed once, used on the cached latents with no key or value formed.

# %%
# --8<-- [start:absorb]
def twins(seed: int, **switches) -> tuple[LatentAttention, AbsorbedLatentAttention]:
    torch.manual_seed(seed)
    mat = LatentAttention(mla_cfg(**switches)).double().eval()
    absorbed = AbsorbedLatentAttention(mla_cfg(mla_absorb=True, **switches)).double().eval()
    absorbed.load_state_dict(mat.state_dict())
    return mat, absorbed


def folded_matrices(mla: LatentAttention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W_Q' (nh, d_c, C), its bias (nh, d_c) and W_O' (nh, C, d_c): the up-projections folded in, once."""
    w_q = mla.w_q.weight.view(NH, HS, C)  # W_Q,h
    b_q = mla.w_q.bias.view(NH, HS)
    w_uk = mla.w_uk.weight.view(NH, HS, D_C)  # W_UK,h
    w_uv = mla.w_uv.weight.view(NH, HS, D_C)  # W_UV,h
    w_o = mla.w_o.weight.view(C, NH, HS).transpose(0, 1)  # W_O,h (nh, C, hs)
    return w_uk.transpose(1, 2) @ w_q, (w_uk.transpose(1, 2) @ b_q[..., None])[..., 0], w_o @ w_uv


@torch.no_grad()
def attend_folded(mla: LatentAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal MLA from the latents c = W_DKV x and the folded matrices alone: no key, no value is formed."""
    w_qf, b_qf, w_of = folded_matrices(mla)
    c = mla.w_dkv(x)  # (B, T, d_c): what the cache holds
    q_lat = torch.einsum("btc,hdc->bhtd", x, w_qf) + b_qf[:, None]  # (B, nh, T, d_c)
    s = (q_lat @ c[:, None].transpose(-2, -1)) * mla.scale  # (B, nh, T, T)
    T = x.shape[1]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    pooled = torch.softmax(s, -1) @ c[:, None]  # (B, nh, T, d_c): Σ_j a_ij c_j
    return torch.einsum("bhtd,hcd->btc", pooled, w_of) + mla.w_o.bias


@torch.no_grad()
def absorption_gaps(seed: int) -> dict:
    x = torch.randn(3, 11, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    out = {}
    for name, switches in (("no RoPE", {}), ("decoupled RoPE", ROPE)):
        mat, absorbed = twins(seed, **switches)
        y = mat(x, causal=True)
        out[name] = (y - absorbed(x, causal=True)).abs().max().item() / y.abs().max().item()
    mat, _ = twins(seed)
    y = mat(x, causal=True)
    out["folded"] = (y - attend_folded(mat, x)).abs().max().item() / y.abs().max().item()
    return out
# --8<-- [end:absorb]


@torch.no_grad()
def cached_absorbed_vs_full(seed: int) -> float:
    """An absorbed, decoupled-RoPE DecoderLM decoding token by token from its latent cache, against the
    materialised model's full pass (same weights): max |Δ logits| relative to max |logits|."""
    torch.manual_seed(seed)
    mat = DecoderLM(mla_cfg(**ROPE)).double().eval()
    absorbed = DecoderLM(mla_cfg(mla_absorb=True, **ROPE)).double().eval()
    absorbed.load_state_dict(mat.state_dict())
    ids = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(seed))
    cache = absorbed.decoder.new_cache()
    steps = [absorbed(ids[:, :4], cache=cache)] + [absorbed(ids[:, t:t + 1], cache=cache) for t in range(4, 10)]
    full = mat(ids)
    return ((torch.cat(steps, 1) - full).abs().max() / full.abs().max()).item()


# %% [markdown]
# ## 2. What the cache holds per token
#
# Fill the caches of five decoders that differ only in their attention (MHA, GQA-2, MQA, MLA, MLA with
# the decoupled rotary key) and divide the cached bytes by layers × batch × tokens × bytes per element.

# %%
# --8<-- [start:bytes]
ARMS = {"MHA": {}, "GQA-2": {"n_kv_heads": 2}, "MQA": {"n_kv_heads": 1},
        "MLA": {"kv_latent": D_C}, "MLA + decoupled RoPE": {"kv_latent": D_C, **ROPE}}


@torch.no_grad()
def elements_per_token(switches: dict, layers: int = 2, batch: int = 3, tokens: int = 7) -> float:
    """Cached numbers per token and layer, counted from the cache tensors of a DecoderLM."""
    torch.manual_seed(0)
    lm = DecoderLM(mla_cfg(**{"kv_latent": 0, "n_layers": layers, **switches})).eval()
    cache = lm.decoder.new_cache()
    lm(torch.randint(1, VOCAB, (batch, tokens)), cache=cache)
    return sum(layer["self"].nbytes for layer in cache) / (layers * batch * tokens * 4)  # fp32: 4 bytes


def formula(name: str, n_h: int, d_h: int, d_c: int, d_r: int) -> int:
    """DeepSeek-V2 Table 1, per token and layer: 2·n_h·d_h, 2·n_g·d_h, 2·d_h, d_c (+ d_r)."""
    return {"MHA": 2 * n_h * d_h, "GQA-2": 2 * 2 * d_h, "MQA": 2 * d_h, "MLA": d_c, "MLA + decoupled RoPE": d_c + d_r}[name]
# --8<-- [end:bytes]


# DeepSeek-V2 (§3.1.2): 60 layers, n_h = 128 heads of d_h = 128, d_c = 512, d_r = 64.
DEEPSEEK_V2 = dict(layers=60, n_h=128, d_h=128, d_c=512, d_r=64)


# %% [markdown]
# ## 3. Why RoPE cannot sit on the up-projected keys
#
# Put RoPE on the keys made from the latent, k_j = R_j W_UK c_j, and on the queries, q_i = R_i W_Q x_i.
# Then q_i·k_j = x_iᵀ W_Qᵀ R_iᵀ R_j W_UK c_j = x_iᵀ (W_Qᵀ R_{j−i} W_UK) c_j: the matrix between x_i and c_j
# changes with the offset j − i. Absorption needs ONE matrix M with q_i·k_j = x_iᵀ M c_j for every pair.
# Fit the best such M by least squares over many (i, j) pairs; without the rotation it is exact, with it
# it is not (M is fitted in query space, d_head × d_c: the scores see x_i only through q_i = W_Q x_i). The decoupled design rotates only a separate key (W_KR x_j, shared by the heads), so the
# latent part keeps its single folded matrix (section 1 checked the outputs with it).

# %%
# --8<-- [start:rope]
@torch.no_grad()
def best_single_matrix(seed: int, rotate: bool, T: int = 32) -> dict:
    """Least-squares fit of one M (d_head × d_c) with q_iᵀ M c_j = score_ij over all T×T pairs of head 0.

    Without the rotation M = W_UK,h fits exactly (q_i·W_UK,h c_j is the score); it is the matrix absorption
    folds into the query map. Fitting against q_i = W_Q,h x_i instead of x_i loses nothing: the scores depend
    on x_i only through q_i.
    """
    torch.manual_seed(seed)
    mla = LatentAttention(mla_cfg()).double().eval()
    g = torch.Generator().manual_seed(seed)
    x, h = torch.randn(T, C, generator=g, dtype=torch.float64), torch.randn(T, C, generator=g, dtype=torch.float64)
    q = x @ mla.w_q.weight[:HS].T  # (T, hs) head 0's queries (no bias)
    c = mla.w_dkv(h)  # (T, d_c) latents of the keys' tokens
    k = c @ mla.w_uk.weight[:HS].T  # (T, hs) head 0's keys, up-projected from the latents
    q_rot, k_rot = q, k
    if rotate:  # RoPE on both, at positions 0..T-1
        cos, sin = rope_cos_sin(torch.arange(T)[None], rope_inv_freq(HS), torch.float64)
        q_rot, k_rot = apply_rope(q[None, None], cos, sin)[0, 0], apply_rope(k[None, None], cos, sin)[0, 0]
    scores = q_rot @ k_rot.T  # (T, T): what absorption would have to reproduce from q_i and c_j
    design = torch.einsum("ia,jb->ijab", q, c).reshape(T * T, HS * D_C)  # row (i, j): q_i ⊗ c_j
    m = torch.linalg.lstsq(design, scores.reshape(-1, 1)).solution  # vec(M)
    residual = (design @ m).reshape(T, T) - scores
    return {"relative_residual": (residual.norm() / scores.norm()).item(), "pairs": T * T, "unknowns": HS * D_C}


@torch.no_grad()
def offset_matrices(seed: int, offsets=(0, 1, 2, 5, 20)) -> list[float]:
    """‖W_Qᵀ R_Δ W_UK − W_Qᵀ W_UK‖ / ‖W_Qᵀ W_UK‖ for head 0 at offsets Δ: the 'absorbed' matrix of each offset."""
    torch.manual_seed(seed)
    mla = LatentAttention(mla_cfg()).double().eval()
    w_q, w_uk = mla.w_q.weight[:HS], mla.w_uk.weight[:HS]  # (hs, C), (hs, d_c)
    out = []
    for d in offsets:
        cos, sin = rope_cos_sin(torch.tensor([[d]]), rope_inv_freq(HS), torch.float64)
        r_wuk = apply_rope(w_uk.T[None, None], cos, sin)[0, 0].T  # rows of R_Δ W_UK (rotate each column of W_UK)
        m_d, m_0 = w_q.T @ r_wuk, w_q.T @ w_uk
        out.append(((m_d - m_0).norm() / m_0.norm()).item())
    return out
# --8<-- [end:rope]


# %% [markdown]
# ## 4. What absorption saves at decode time
#
# One decode step with T latents cached: the materialised form up-projects all T latents to keys and values
# (2·T·d_c·n_h·d_h multiply-adds) at every step; the absorbed form never does. Counted by FlopCounterMode, on
# the explicit path for both (torch's fused CPU attention kernel is not counted by FlopCounterMode).

# %%
@torch.no_grad()
def decode_step_flops(absorb: bool, cached: int, latent: bool = True) -> int:
    """FLOPs of one decode step of a 1-layer model with `cached` tokens in its cache; latent=False: plain MHA with
    the same heads and head size (keys and values cached per head)."""
    torch.manual_seed(0)
    switches = dict(mla_absorb=absorb) if latent else dict(kv_latent=0)
    lm = DecoderLM(mla_cfg(n_layers=1, attn_impl="explicit", **switches)).eval()  # FlopCounterMode sees QKᵀ, PV
    cache = lm.decoder.new_cache()
    lm(torch.randint(1, VOCAB, (1, cached)), cache=cache)
    with FlopCounterMode(display=False) as fc:
        lm(torch.randint(1, VOCAB, (1, 1)), cache=cache)
    return fc.get_total_flops()


# %% [markdown]
# ## 5. The decoupled rotary key really turns
#
# Sections 1-4 would stay exact if the rotary key were cached unrotated: absorbed, materialised and cached
# paths all share `place`. So the scores of `LatentAttention` are checked against the geometry itself: the same
# when query and key positions shift together, different when only the key moves, and equal to a score built by
# hand, (q_h·k_h + (R_i q^R_h)·(R_j k^R)) / √(d_h + d_r), with R from `torch.polar` at θ_i = 10000^(−2i/d_r)
# (not from `apply_rope`). The decode cache's rotary entries must be the rotary keys turned at their positions.

# %%
# --8<-- [start:decoupled]
def rotate_by_hand(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """(..., T, d) float64, positions (T,): pairs (2i, 2i+1) read as complex numbers, times e^{i·pos·θ_i}."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    turn = torch.polar(torch.ones(len(pos), d // 2, dtype=torch.float64), pos.double()[:, None] * theta)  # (T, d/2)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * turn).flatten(-2)


@torch.no_grad()
def decoupled_rotary_checks(seed: int, T: int = 9) -> dict:
    torch.manual_seed(seed)
    mla = LatentAttention(mla_cfg(**ROPE)).double().eval()
    x = torch.randn(2, T, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    q, kv = mla.project_q(x), mla.project_kv(x)
    pos = torch.arange(T)[None]

    def scores(q_pos, k_pos):  # the module's own pieces: place, keys_values, score
        q_placed, kv_placed = mla.place(q, kv, q_pos, k_pos)
        return mla.score(q_placed, mla.keys_values(kv_placed)[0])

    s0 = scores(pos, pos)
    out = {"shift both by %d" % d: (scores(pos + d, pos + d) - s0).abs().max().item() for d in (1, 37, 1000)}
    out["shift the key only by 5"] = (scores(pos, pos + 5) - s0).abs().max().item()
    # by hand, from the weights: q_h = W_Q,h x + b, q^R_h = W_QR,h x, k_h = W_UK,h W_DKV x, k^R = W_KR x
    q_c = (x @ mla.w_q.weight.T + mla.w_q.bias).view(2, T, NH, HS).transpose(1, 2)
    q_r = (x @ mla.w_qr.weight.T).view(2, T, NH, D_R).transpose(1, 2)
    k_c = (x @ mla.w_dkv.weight.T @ mla.w_uk.weight.T).view(2, T, NH, HS).transpose(1, 2)
    k_r = (x @ mla.w_kr.weight.T)[:, None]  # (B, 1, T, d_r): one rotary key for all heads
    at = torch.arange(T)
    hand = (q_c @ k_c.transpose(-2, -1) + rotate_by_hand(q_r, at) @ rotate_by_hand(k_r, at).transpose(-2, -1))
    hand = hand / (HS + D_R) ** 0.5
    out["module vs hand-built score"] = (s0 - hand).abs().max().item()
    out["score scale"] = s0.abs().max().item()
    # the decode cache: rotary entries against W_KR h turned at their own positions (h = layer 0's input)
    lm = DecoderLM(mla_cfg(**ROPE)).double().eval()
    ids = torch.randint(1, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))
    seen = []
    handle = lm.decoder.layers[0].self_attn.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    cache = lm.decoder.new_cache()
    lm(ids[:, :4], cache=cache)
    for t in range(4, T):
        lm(ids[:, t:t + 1], cache=cache)
    handle.remove()
    k_r_raw = lm.decoder.layers[0].self_attn.w_kr(torch.cat(seen, 1))[:, None]  # (B, 1, T, d_r)
    cached = cache[0]["self"].entries[1]
    out["cached rotary key vs W_KR h rotated at its position"] = (cached - rotate_by_hand(k_r_raw, at)).abs().max().item()
    out["cached rotary key vs W_KR h unrotated"] = (cached - k_r_raw).abs().max().item()
    return out
# --8<-- [end:decoupled]


# %%
if __name__ == "__main__":
    print(absorption_gaps(0), cached_absorbed_vs_full(0))
    print({name: elements_per_token(s) for name, s in ARMS.items()})
    print(best_single_matrix(0, False), best_single_matrix(0, True), offset_matrices(0))
    print(decode_step_flops(False, 32), decode_step_flops(True, 32))
    print(decoupled_rotary_checks(0))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_absorb]
@pytest.mark.claim("C-MLA-1", "confirmed")
def test_absorbed_equals_materialised(ev, seed):
    """Absorbed and materialised MLA give the same outputs in float64 (with and without the decoupled rotary key),
    as do the two folded matrices W_UK,hᵀW_Q,h and W_O,hW_UV,h applied to the latents alone; an absorbed model
    decoding from its latent cache reproduces the materialised full pass. Exact, by construction of the
    algebra (a check of our module). Would be refuted by a gap above float64 rounding."""
    r = absorption_gaps(seed)
    ev.record("max |absorbed − materialised| / max |output|, no RoPE (fp64)", r["no RoPE"], expect="≈ 1e-16")
    ev.record("same, with the decoupled rotary key", r["decoupled RoPE"], expect="≈ 1e-16")
    ev.record("max |folded W_Q', W_O' on latents − materialised| / max |output|", r["folded"], expect="≈ 1e-16")
    ev.record("folded query map W_Q' per head (rows × cols), folded output map W_O' per head",
              [f"{D_C}×{C}", f"{C}×{D_C}"], key=False)
    gap = cached_absorbed_vs_full(seed)
    ev.record("max |Δ logits| / max |logits|, absorbed + decoupled RoPE decoding from its latent cache vs "
              "materialised full pass (fp64)", gap, expect="≈ 1e-16")
    assert max(r.values()) < 1e-12 and gap < 1e-12
# --8<-- [end:test_absorb]


# --8<-- [start:test_bytes]
@pytest.mark.claim("C-MLA-1", "confirmed")
def test_mla_caches_one_latent_per_token(ev, seed):
    """Counted from the cache tensors: MLA keeps d_c numbers per token and layer (d_c + d_r with the rotary key)
    against 2·n_h·d_h for MHA, 2·n_kv·d_h for GQA and 2·d_h for MQA (a count of our module; DeepSeek-V2's sizes
    by arithmetic). Would be refuted if the cache held per-head keys and values."""
    counted = {name: elements_per_token(switches) for name, switches in ARMS.items()}
    for name, value in counted.items():
        want = formula(name, NH, HS, D_C, D_R)
        ev.record(f"cached numbers per token and layer, {name} (toy: n_h={NH}, d_h={HS}, d_c={D_C}, d_r={D_R})", value,
                  expect=f"{want}")
        assert value == want
    ev.record("MLA + decoupled RoPE cache / MHA cache (toy)", counted["MLA + decoupled RoPE"] / counted["MHA"],
              expect=f"{(D_C + D_R) / (2 * NH * HS):.4g} = (d_c + d_r)/(2·n_h·d_h)")
    v2 = DEEPSEEK_V2
    mla_v2, mha_v2 = v2["d_c"] + v2["d_r"], 2 * v2["n_h"] * v2["d_h"]
    ev.record("DeepSeek-V2 sizes, numbers per token and layer: MLA (d_c + d_r), MHA with the same heads (2·n_h·d_h)",
              [mla_v2, mha_v2], expect="576, 32768 (arithmetic)")
    ev.record("DeepSeek-V2 sizes: MLA cache as a GQA with this many groups, (d_c + d_r)/(2·d_h)", mla_v2 / (2 * v2["d_h"]),
              expect="2.25 (Table 1)")
    ev.record("DeepSeek-V2 sizes: MLA cache per token, 60 layers, bf16, KiB", mla_v2 * v2["layers"] * 2 / 1024,
              expect="67.5 (arithmetic)")
    ev.record("toy: MLA + decoupled RoPE cache / MQA cache, (d_c + d_r)/(2·d_h)",
              counted["MLA + decoupled RoPE"] / counted["MQA"], expect="> 1: larger than MQA's unless d_c + d_r ≤ 2·d_h")
    assert counted["MLA"] < counted["MHA"]  # a count of our module (the per-arm formula is asserted above)
    assert mla_v2 / (2 * v2["d_h"]) == 2.25  # arithmetic on DeepSeek-V2's constants (guards a typo), not a measurement
# --8<-- [end:test_bytes]


# --8<-- [start:test_rope]
@pytest.mark.claim("C-MLA-1", "confirmed")
def test_rope_on_the_up_projected_keys_breaks_absorption(ev, seed):
    """With RoPE on the keys made from the latent, no single matrix M gives the score as q_iᵀ M c_j for all pairs: the
    best least-squares M leaves a large residual, while without the rotation it is exact; the per-offset matrix
    W_Qᵀ R_Δ W_UK moves with Δ. Would be refuted if one M fitted the rotated scores to float64 rounding."""
    plain, rotated = best_single_matrix(seed, rotate=False), best_single_matrix(seed, rotate=True)
    ev.record("relative residual of the best single absorbed matrix, no rotation", plain["relative_residual"],
              expect="≈ 1e-15: one matrix absorbs W_UK")
    ev.record("relative residual of the best single absorbed matrix, RoPE on the up-projected keys",
              rotated["relative_residual"], expect="of order 0.1–1: no single matrix exists")
    ev.record("least-squares problem: pairs (i, j), unknowns in M", [rotated["pairs"], rotated["unknowns"]], key=False)
    drift = offset_matrices(seed)
    ev.record("‖W_Qᵀ R_Δ W_UK − W_Qᵀ W_UK‖ / ‖W_Qᵀ W_UK‖ at Δ = 0, 1, 2, 5, 20", drift,
              expect="0 at Δ = 0 (float rounding), then of order 1")
    # over seeds 100-139: rotated residual 0.55 ± 0.06 (min 0.41), unrotated at most 2e-15, smallest drift
    # 0.48 ± 0.03 (min 0.41); the thresholds 0.1 and 0.01 sit more than 7 sd below
    assert plain["relative_residual"] < 1e-10
    assert rotated["relative_residual"] > 0.1
    assert drift[0] < 1e-12 and min(drift[1:]) > 0.01
# --8<-- [end:test_rope]


def test_absorption_skips_the_per_token_up_projection(ev, seed):
    """FLOPs of one decode step with T latents cached: the materialised form grows by the up-projection of every
    cached latent (2·2·T·d_c·n_h·d_h), the absorbed form only by its scores over the latents; and plain MHA with the
    same heads and head size grows by less than the absorbed form (d_h-wide scores instead of d_c-wide ones). Also
    records, by arithmetic, the absorbed step's FLOPs per byte of cache at DeepSeek-V2's sizes: near an H100's ridge,
    not ≈ 1. Would be refuted if the materialised step did not grow by the up-projection of every cached latent beyond
    the absorbed step's growth, or if the absorbed step grew no faster than MHA's. The DeepSeek-V2 figures are
    arithmetic on the paper's sizes, not measurements."""
    rows = {T: (decode_step_flops(False, T), decode_step_flops(True, T)) for T in (8, 32)}
    for T, (mat, absorbed) in rows.items():
        ev.record(f"decode-step FLOPs with {T} latents cached: materialised, absorbed (1 layer)", [mat, absorbed])
    grow_mat = rows[32][0] - rows[8][0]
    grow_abs = rows[32][1] - rows[8][1]
    ev.record("extra FLOPs per extra cached token: materialised, absorbed", [grow_mat / 24, grow_abs / 24],
              expect=f"materialised includes 2·2·d_c·n_h·d_h = {4 * D_C * NH * HS} of up-projection")
    assert grow_mat - grow_abs >= 24 * 4 * D_C * NH * HS * 0.5
    grow_mha = decode_step_flops(False, 32, latent=False) - decode_step_flops(False, 8, latent=False)
    ev.record("extra FLOPs per extra cached token: MHA with the same heads and head size", grow_mha / 24,
              expect="2·2·n_h·d_h: d_h-wide scores and values")
    ev.record("extra FLOPs per extra cached token: absorbed MLA / MHA", grow_abs / grow_mha,
              expect=f"(2·d_c + 2·d_c) / (4·d_h) = {D_C // HS} here (no rotary key in this arm)")
    assert grow_abs > grow_mha  # against MHA over a full K/V cache, absorption costs arithmetic per cached token
    # arithmetic at DeepSeek-V2's sizes, per cached token and layer of an absorbed decode step: each head scores a
    # (d_c + d_r)-wide query against the latent and its rotary key and mixes d_c-wide values: n_h·(2(d_c+d_r) + 2d_c)
    # FLOPs, while reading (d_c + d_r) bf16 numbers
    v2 = DEEPSEEK_V2
    flops = v2["n_h"] * (2 * (v2["d_c"] + v2["d_r"]) + 2 * v2["d_c"])
    read = (v2["d_c"] + v2["d_r"]) * 2
    ev.record("DeepSeek-V2 sizes, absorbed MLA per cached token and layer: FLOPs, bytes read (bf16), FLOPs per byte",
              [flops, read, flops / read], expect="278528, 1152, ≈ 242 (arithmetic); MHA ≈ 1, GQA ≈ n_h/n_kv")
    ridge = 989e12 / 3.35e12  # H100 SXM dense bf16 peak / HBM bandwidth, the datasheet figures of prefill-decode.md
    ev.record("H100 SXM ridge, FLOPs per byte (datasheet arithmetic)", ridge, expect="≈ 295")
    assert flops == 278528 and read == 1152  # arithmetic, checked against the formula in the comment


# --8<-- [start:test_decoupled]
@pytest.mark.claim("C-MLA-1", "confirmed")
def test_decoupled_rotary_key_turns_with_position(ev, seed):
    """What the built MLA computes with the decoupled rotary key (float64): its scores are unchanged when query and key
    positions shift together by 1, 37 or 1000, change when only the key moves by 5, and equal a score built by hand
    from the weights with rotations from torch.polar; the decode cache holds the rotary keys turned at their own
    positions. This pins down that both q^R and the cached k^R are rotated (the absorbed-equals-materialised identity
    would survive an unrotated key). Would be refuted by a shift gap or hand gap above float64 rounding, or an
    unchanged score when only the key moves."""
    r = decoupled_rotary_checks(seed)
    for d in (1, 37, 1000):
        ev.record(f"max |Δ score|, query and key positions both shifted by {d}", r[f"shift both by {d}"],
                  expect="≈ 1e-14: relative position only")
    ev.record("max |Δ score|, only the key positions shifted by 5", r["shift the key only by 5"],
              expect="of order the scores: the key turns")
    ev.record("max |module score − hand-built score (torch.polar rotations)|", r["module vs hand-built score"],
              expect="≈ 1e-16")
    ev.record("max |cached rotary key − W_KR h rotated at its position|, decoding token by token",
              r["cached rotary key vs W_KR h rotated at its position"], expect="≈ 1e-16")
    ev.record("max |cached rotary key − W_KR h unrotated| (control)", r["cached rotary key vs W_KR h unrotated"],
              expect="of order 1")
    # seeds 100-139: key-only shift at least 0.38 of max |score|, unrotated-cache gap at least 2.4, every
    # exact gap at most 1.8e-15; the bounds 1e-2 and 1e-9 / 1e-12 are far on either side
    assert max(r[f"shift both by {d}"] for d in (1, 37, 1000)) < 1e-9
    assert r["shift the key only by 5"] > 1e-2 * r["score scale"]
    assert r["module vs hand-built score"] < 1e-12
    assert r["cached rotary key vs W_KR h rotated at its position"] < 1e-12
    assert r["cached rotary key vs W_KR h unrotated"] > 1e-2
# --8<-- [end:test_decoupled]

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How does RoPE work, and why is q·k relative?
#
# Proofs for the page `docs/relative/rope.md`. Everything runs on the shared module:
# `positions="rope"` makes the self-attention a `RotaryAttention`, whose only change to
# `MultiHeadAttention` is `place`: rotate the new queries and keys by their positions
# before the keys are cached. The control is the 2017 scheme, `positions="sinusoidal"`,
# where the position vector is added to the input of W_Q and W_K.
# Run it with `pytest proofs/relative/proof_rope.py`, or open it as a notebook with
# `jupytext --to notebook proofs/relative/proof_rope.py`.

# %%
from __future__ import annotations

import torch

from proofs.transformer import (
    DecoderLM,
    MultiHeadAttention,
    RotaryAttention,
    TransformerConfig,
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
    sinusoidal_table,
)

# d_model 32, 4 heads of d_head 8 (4 rotated pairs); float64 where a check is exact up to rounding
CFG = TransformerConfig(d_model=32, n_heads=4, positions="rope", dropout_emb=0.0, dropout_residual=0.0,
                        attn_impl="explicit")
HS = CFG.d_head


# %% [markdown]
# ## 1. A rotation is a complex multiplication, and it keeps norms
#
# Pair i of a query holds two numbers (a, b). Read them as the complex number a + ib and
# multiply by e^{i m θ_i}: that is the rotation by the angle m·θ_i. The reference here is
# `torch.polar` / `torch.view_as_complex`, independent of `apply_rope`'s real arithmetic.

# %%
# --8<-- [start:complex]
def rotation_vs_complex(seed: int, T: int = 50, start: int = 0) -> dict:
    """apply_rope (real, interleaved pairs) against complex multiplication, and the norms before/after."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, T, HS, generator=g, dtype=torch.float64)  # (B, h, T, d)
    pos = torch.arange(start, start + T)[None]  # (1, T)
    cos, sin = rope_cos_sin(pos, rope_inv_freq(HS), torch.float64)
    rotated = apply_rope(x, cos, sin, "interleaved")
    turn = torch.polar(torch.ones(T, HS // 2, dtype=torch.float64), pos[0, :, None] * rope_inv_freq(HS))
    as_complex = torch.view_as_complex(x.reshape(2, 3, T, HS // 2, 2)) * turn  # (a + ib) e^{i m theta}
    return {
        "vs complex": (rotated - torch.view_as_real(as_complex).flatten(-2)).abs().max().item(),
        "norm change": (rotated.norm(dim=-1) - x.norm(dim=-1)).abs().max().item(),
        "largest norm": x.norm(dim=-1).max().item(),
    }
# --8<-- [end:complex]


# %% [markdown]
# ## 2. The score depends on m − n only
#
# Rotate q by m·θ and k by n·θ: (R_m q)·(R_n k) = q·R_{n−m} k. Move both tokens by the same
# shift s and nothing changes. The test takes the projected queries and keys of a random
# input, places them at positions p..p+T−1 for several starts p, and compares the score
# matrices; it also checks that one query/key pair, repeated at every position, gives a
# score matrix that is constant along its diagonals (a function of m − n alone). The
# control adds the sinusoid of each position to the input of W_Q and W_K instead.

# %%
# --8<-- [start:shift]
def rope_scores(attn: RotaryAttention, q: torch.Tensor, k: torch.Tensor, start: int) -> torch.Tensor:
    """(B, nh, T, T) logits of RoPE attention with the tokens at positions start .. start+T-1."""
    pos = torch.arange(start, start + q.shape[2])[None]
    rq, (rk, _) = attn.place(q, (k, k), pos, pos)
    return attn.score(rq, rk)


def sinusoidal_scores(attn: MultiHeadAttention, x: torch.Tensor, start: int) -> torch.Tensor:
    """The 2017 scheme: the sinusoid of each position added to x before W_Q and W_K."""
    T, C = x.shape[1], x.shape[2]
    x = x + sinusoidal_table(start + T, C).to(x.dtype)[start:]
    q, k, _ = attn.project(x, x)
    return attn.score(q, k)


def shift_gaps(seed: int, T: int = 12, starts=(0, 1, 37, 1000, 100_000)) -> dict:
    """Largest change of the score matrix when every token moves by the same shift, RoPE and sinusoidal."""
    torch.manual_seed(seed)
    rope = RotaryAttention(CFG).double()
    plain = MultiHeadAttention(CFG.replace(positions="sinusoidal")).double()
    plain.load_state_dict(rope.state_dict())  # the same W_Q, W_K, W_V, W_O
    x = torch.randn(1, T, CFG.d_model, dtype=torch.float64)
    q, k, _ = rope.project(x, x)
    ref_r, ref_s = rope_scores(rope, q, k, 0), sinusoidal_scores(plain, x, 0)
    out = {"rope": [], "sinusoidal": [], "scale": ref_r.abs().max().item()}
    for s in starts[1:]:
        out["rope"].append((rope_scores(rope, q, k, s) - ref_r).abs().max().item())
        out["sinusoidal"].append((sinusoidal_scores(plain, x, s) - ref_s).abs().max().item())
    # one query and one key at every position: S[m, n] must depend on m - n only (Toeplitz)
    same = rope_scores(rope, q[:, :, :1].expand(-1, -1, T, -1), k[:, :, :1].expand(-1, -1, T, -1), 5)
    out["toeplitz"] = (same[..., 1:, 1:] - same[..., :-1, :-1]).abs().max().item()
    out["curve"] = same[0, 0, -1].flip(0).detach()  # score against offset 0, 1, ..., T-1 (head 0)
    return out
# --8<-- [end:shift]


# %% [markdown]
# ## 3. Values are not rotated; keys are cached rotated
#
# RoPE acts on the scores only: the weights change, the values v_j they average do not.
# The module's output must equal softmax((R q)(R k)ᵀ/√d) V W_O, built here by hand from
# its own projections and the rotation functions. In decoding, each key is rotated once, at
# its own position, before it enters the cache; a later query rotates itself and reads the
# cached keys as they are. Token-by-token decoding must then give the full pass's logits.

# %%
# --8<-- [start:values]
def by_hand(attn: RotaryAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax((R q)(R k)^T / sqrt(d), causal) v, then W_O; v as projected."""
    q, k, v = attn.project(x, x)
    T = x.shape[1]
    cos, sin = rope_cos_sin(torch.arange(T)[None], rope_inv_freq(HS), x.dtype)
    s = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-2, -1) / HS**0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.softmax(s, -1) @ v  # (B, nh, T, hs): the values are never rotated
    return attn.w_o(y.transpose(1, 2).reshape(x.shape))


def values_and_cache(seed: int, T: int = 10) -> dict:
    torch.manual_seed(seed)
    attn = RotaryAttention(CFG).double().eval()
    x = torch.randn(2, T, CFG.d_model, dtype=torch.float64)
    out = {"vs by hand": (attn(x, causal=True) - by_hand(attn, x)).abs().max().item()}
    q, k, v = attn.project(x, x)
    pos = torch.arange(T)[None]
    _, (_, placed_v) = attn.place(q, (k, v), pos, pos)
    out["values changed by place"] = (placed_v - v).abs().max().item()
    lm = DecoderLM(CFG.replace(vocab_size=20, n_layers=2, attn_impl="auto")).eval()
    ids = torch.randint(1, 20, (3, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = lm(ids)
        cache = lm.decoder.new_cache()
        steps = torch.cat([lm(ids[:, t: t + 1], cache=cache) for t in range(T)], dim=1)
        keys = lm.decoder.layers[0].self_attn.project_kv(lm.embed(ids))[0]  # layer 0 (Post-LN: sees embeddings)
        rotated = lm.decoder.layers[0].self_attn.rotate(keys, pos)
    out["cached vs full logits"] = (steps - full).abs().max().item()
    out["logit scale"] = full.abs().max().item()
    out["cache vs rotated keys"] = (cache[0]["self"].entries[0] - rotated).abs().max().item()
    out["cache vs unrotated keys"] = (cache[0]["self"].entries[0] - keys).abs().max().item()
    return out
# --8<-- [end:values]


# %%
if __name__ == "__main__":
    print(rotation_vs_complex(0))
    print({k: v for k, v in shift_gaps(0).items() if k != "curve"})
    print(values_and_cache(0))


# %% [markdown]
# ## Tests
#
# All three are exact checks of our module (float64), labelled as such: they confirm that the
# implementation has the properties the paper derives. What makes them able to fail is the
# control (the sinusoidal scheme is not shift-invariant) and the tolerances at rounding level.

# %%
import pytest  # noqa: E402


def _plot(ev, gaps: dict) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    curve = gaps["curve"]
    ax.plot(range(len(curve)), curve.numpy(), "o-", label="RoPE: one query/key pair, any start")
    ax.set(xlabel="offset m − n", ylabel="score q·k / √d (head 0)", title="the RoPE score is a function of m − n")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "offset", "The score of one (random) query and key, repeated at every position, against their "
                            "offset: every row of the score matrix gives this same curve.")


# --8<-- [start:test_complex]
@pytest.mark.claim("C-ROPE-1", "confirmed")
def test_rotation_is_complex_multiplication_and_keeps_norms(ev, seed):
    """apply_rope equals multiplying each pair, read as a complex number, by e^{i m θ_i} (torch.polar), at positions
    0..49 and 10^6..10^6+49; the norm of every vector is unchanged. Exact up to float64 rounding, by construction."""
    near, far = rotation_vs_complex(seed), rotation_vs_complex(seed, start=1_000_000)
    ev.record("max |apply_rope − complex product|, positions 0..49", near["vs complex"], expect="≈ 1e-15")
    ev.record("the same at positions 10^6..10^6+49", far["vs complex"], expect="≈ 1e-15")
    ev.record("max | ‖R_m x‖ − ‖x‖ |", max(near["norm change"], far["norm change"]), expect="≈ 1e-15",
              note=f"norms up to {near['largest norm']:.1f}")
    assert near["vs complex"] < 1e-12 and far["vs complex"] < 1e-12
    assert max(near["norm change"], far["norm change"]) < 1e-12
# --8<-- [end:test_complex]


# --8<-- [start:test_shift]
@pytest.mark.claim("C-ROPE-1", "confirmed")
def test_scores_depend_on_the_offset_only(ev, seed):
    """Moving every token by the same shift (1, 37, 1000, 100000) leaves RoPE's scores unchanged up to rounding;
    with the sinusoid added to the input (same weights) the scores change. One query/key pair placed at every
    position gives a score matrix that is constant along its diagonals. Would be refuted if RoPE's scores moved
    with the shift as the sinusoidal ones do."""
    g = shift_gaps(seed)
    ev.record("RoPE: max |Δ score| for shifts 1, 37, 1000, 100000", g["rope"], expect="≈ 1e-12 (rounding)",
              note=f"scores up to {g['scale']:.2f}")
    ev.record("sinusoidal added to the input: max |Δ score| for the same shifts", g["sinusoidal"],
              expect="of order the scores")
    ev.record("RoPE, one q/k pair at every position: max |S[m+1, n+1] − S[m, n]|", g["toeplitz"], expect="≈ 0")
    _plot(ev, g)
    assert max(g["rope"]) < 1e-9 and g["toeplitz"] < 1e-12
    assert min(g["sinusoidal"]) > 1e-2
# --8<-- [end:test_shift]


# --8<-- [start:test_values]
@pytest.mark.claim("C-ROPE-1", "confirmed")
def test_values_untouched_and_keys_cached_rotated(ev, seed):
    """The module's output is softmax((R q)(R k)ᵀ/√d) V W_O with V as projected; `place` returns the values
    unchanged; the cache holds each key rotated at its own position, and token-by-token decoding gives the full
    pass's logits. Exact, by construction (rounding only)."""
    r = values_and_cache(seed)
    ev.record("max |module − softmax((Rq)(Rk)ᵀ/√d)V W_O|", r["vs by hand"], expect="≈ 1e-15")
    ev.record("max |values after place − values before|", r["values changed by place"], expect="0 exactly")
    ev.record("max |cached decoding − full pass| (logits)", r["cached vs full logits"], expect="≈ 1e-6 (float32)",
              note=f"logits up to {r['logit scale']:.1f}")
    ev.record("max |cached keys − keys rotated at their positions| (layer 0)", r["cache vs rotated keys"],
              expect="≈ 0")
    ev.record("max |cached keys − unrotated keys| (layer 0)", r["cache vs unrotated keys"],
              expect="> 0: the cache holds rotated keys", key=False)
    assert r["vs by hand"] < 1e-12 and r["values changed by place"] == 0.0
    assert r["cached vs full logits"] < 1e-4 and r["cache vs rotated keys"] < 1e-5
    assert r["cache vs unrotated keys"] > 1e-2
# --8<-- [end:test_values]

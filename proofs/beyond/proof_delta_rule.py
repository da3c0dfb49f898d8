# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # The delta rule: overwrite instead of add
#
# Proofs for `docs/beyond/delta-rule.md`. The mixer is the shared model's `DeltaRule`
# (`proofs/transformer/mixers.py`): `DeltaRule.scan` runs S_t = α_t S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ token
# by token, `DeltaRule.chunkwise` computes the same numbers with one triangular solve per chunk, and the switch
# `erase=False` (the config field `delta_erase`) drops the erasing term, leaving the additive state
# S_t = α_t S_{t-1} + β_t v_t k_tᵀ of linear attention with the same keys, values and gates. Everything here is
# exact arithmetic in fp64 on written or random unit keys (no training): one switch, both arms measured.
# Run: `pytest proofs/beyond/proof_delta_rule.py`.

# %%
from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import ConfigError, DeltaRule

D = 16  # key dimension of the state (hs_k); the state is D × D
f64 = torch.float64


def write(keys: torch.Tensor, values: torch.Tensor, beta=1.0, erase: bool = True,
          log_alpha: torch.Tensor | None = None, chunkwise: bool = False) -> torch.Tensor:
    """The state after writing the pairs (k_i, v_i) in order from an empty state: keys, values (B, n, D), beta a
    number or (B, n); returns S (B, D_v, D). The shared DeltaRule.scan with one head (or its chunkwise form, equal
    to it to rounding: test 4); the queries are not needed (keys stand in)."""
    k, v = keys[:, None], values[:, None]  # (B, 1, n, D): one head
    b = (torch.full(k.shape[:3], beta, dtype=k.dtype) if isinstance(beta, float)
         else beta.to(k.dtype)[:, None].expand(k.shape[:3]))  # (B, 1, n)
    la = None if log_alpha is None else log_alpha[:, None]
    form = DeltaRule.chunkwise if chunkwise else DeltaRule.scan
    return form(k, k, v, b, la, None, erase)[1][:, 0]


def read(S: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """What the state returns for each key: S k_i, (B, n, D_v)."""
    return keys @ S.transpose(-2, -1)


def unit(g: torch.Generator, *shape) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=g, dtype=f64), dim=-1)


# %% [markdown]
# ## 1. One key, two values
#
# Write (k, v₁) then (k, v₂) under the same unit key. The additive state holds v₁kᵀ + v₂kᵀ and returns
# S k = v₁ + v₂. The delta rule first reads the old value S k = v₁ and writes β(v₂ − v₁) on top: with β = 1 the
# state returns v₂ and v₁ is gone; with β < 1 it returns v₁ + β(v₂ − v₁), a step of size β from the old value
# towards the new one. Gated DeltaNet's decay α multiplies the whole state (every key) by α before the write.

# %%
# --8<-- [start:same_key]
def same_key(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    k = unit(g, 1, 1, D).expand(1, 2, D)  # the same unit key twice
    v = torch.randn(1, 2, D, generator=g, dtype=f64)  # v₁, v₂
    v1, v2 = v[0, 0], v[0, 1]
    out = {"v1": v1, "v2": v2}
    out["additive"] = read(write(k, v, erase=False), k[:, :1])[0, 0]
    out["delta"] = read(write(k, v), k[:, :1])[0, 0]
    out["delta, beta 0.5"] = read(write(k, v, beta=torch.tensor([[1.0, 0.5]])), k[:, :1])[0, 0]  # v₁ written fully
    # gated: store (k, v1), then 3 writes under keys orthogonal to k with α = 0.9 each; k now returns 0.9^3 · v1
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=f64))
    keys = q.T[None, :4]  # (1, 4, D) orthonormal rows
    vals = torch.randn(1, 4, D, generator=g, dtype=f64)
    la = torch.full((1, 4), math.log(0.9), dtype=f64)
    out["gated, after 3 writes"] = read(write(keys, vals, log_alpha=la), keys[:, :1])[0, 0]
    out["gated v"] = vals[0, 0]
    return out
# --8<-- [end:same_key]


# %% [markdown]
# ## 2. Orthonormal keys, rewritten keys, and overlapping keys
#
# With D orthonormal keys each written once, both states retrieve every pair exactly: S k_i = v_i + Σ_{j≠i}
# v_j (k_jᵀk_i) and every cross term is zero. Then half the keys get new values. The delta rule returns the new
# value for every rewritten key and the old one for the others; the additive state returns old + new for the
# rewritten ones. With keys that are not orthogonal (n < D random unit keys), the additive state picks up cross
# terms on every pair; the delta rule returns the latest pair exactly, but each later write under k_j changes what
# an earlier key k_i reads by (k_jᵀk_i)(v_j − S k_j), so it is exact only for the last key.

# %%
# --8<-- [start:orthonormal]
def orthonormal(seed: int, n_rewrite: int = D // 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=f64))
    keys = q.T[None]  # (1, D, D): D orthonormal keys
    old = torch.randn(1, D, D, generator=g, dtype=f64)
    new = torch.randn(1, n_rewrite, D, generator=g, dtype=f64)
    want = old.clone()
    want[:, :n_rewrite] = new  # the latest value under each key
    seq_k = torch.cat([keys, keys[:, :n_rewrite]], 1)  # every key once, then the first n_rewrite again
    seq_v = torch.cat([old, new], 1)
    err = lambda S, target: (read(S, keys) - target).norm(dim=-1)[0]  # (D,) per key
    out = {}
    for name, erase in (("additive", False), ("delta", True)):
        out[name, "once"] = err(write(keys, old, erase=erase), old)
        out[name, "rewritten"] = err(write(seq_k, seq_v, erase=erase), want)
    out["old norms"] = old[0, :n_rewrite].norm(dim=-1)
    rk = unit(g, 1, D // 2, D)  # D/2 random unit keys: linearly independent, not orthogonal
    rv = unit(g, 1, D // 2, D)
    for name, erase in (("additive", False), ("delta", True)):
        out[name, "overlapping"] = (read(write(rk, rv, erase=erase), rk) - rv).norm(dim=-1)[0]  # (D/2,)
    out["n_rewrite"] = n_rewrite
    return out
# --8<-- [end:orthonormal]


# %% [markdown]
# ## 3. More pairs than the state holds
#
# n random unit keys in D = 16 dimensions, unit random values, written once with β = 1, n from D/4 to 4D
# (400 independent draws per n). Two readings of "how well does it recall":
#
# - the **error** ‖S k_i − v_i‖, averaged over pairs. For the additive state the expected squared error is exactly
#   (n − 1)/D (each of the n − 1 other pairs adds v_j (k_jᵀk_i), with E[(k_jᵀk_i)²] = 1/D): it grows without bound.
# - **nearest-value recall**: is v_i the stored value closest (by dot product) to S k_i? This is what a model's
#   readout has to do on MQAR: pick the right value among the stored ones.
#
# Both are split by age: the last quarter of pairs written (recent) and the first quarter (old). The delta rule runs
# twice: with β = 1 (a hard overwrite) and with β = ¼ (a softer step), the knob a trained model sets per token.

# %%
NS = (4, 8, 16, 32, 64)
DRAWS = 400


# --8<-- [start:capacity]
@functools.cache
def capacity(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n in NS:
        k, v = unit(g, DRAWS, n, D), unit(g, DRAWS, n, D)
        q = max(1, n // 4)
        for name, erase, beta in (("additive", False, 1.0), ("delta", True, 1.0), ("delta, β = ¼", True, 0.25)):
            r = read(write(k, v, beta=beta, erase=erase), k)  # (DRAWS, n, D)
            err = (r - v).norm(dim=-1)  # (DRAWS, n)
            hit = ((r @ v.transpose(-2, -1)).argmax(-1) == torch.arange(n)).to(f64)  # nearest stored value is v_i
            out[name, n] = {"mse": (err ** 2).mean().item(), "err": err.mean().item(), "last": err[:, -1].max().item(),
                            "recall": hit.mean().item(), "recent": hit[:, -q:].mean().item(),
                            "old": hit[:, :q].mean().item(), "old norm": r[:, :q].norm(dim=-1).mean().item()}
    # the same n = D/2 pairs written 60 times over (the state keeps learning them): the delta rule converges to
    # S k_i = v_i for every pair (with β = 1 and unit keys it is Kaczmarz's method for S K = V); the additive
    # state, divided by 60, keeps its cross terms
    n, passes = D // 2, 60
    k, v = unit(g, DRAWS // 4, n, D), unit(g, DRAWS // 4, n, D)
    for name, erase in (("additive", False), ("delta", True)):
        r = read(write(k.repeat(1, passes, 1), v.repeat(1, passes, 1), erase=erase), k)
        if not erase:
            r = r / passes  # best scale for the additive state: its sum holds each pair `passes` times
        out[name, "passes"] = (r - v).norm(dim=-1).mean().item()
    return out
# --8<-- [end:capacity]


# %% [markdown]
# ## 4. The same numbers without a loop over tokens
#
# Training needs every output of a sequence at once. Writing the update as S_t = α_t S_{t−1} + u_t k_tᵀ with
# u_t = β_t(v_t − α_t S_{t−1}k_t), the u_t of a chunk solve one unit lower-triangular system (the UT/WY form of
# Yang et al. 2024), after which every output is a matrix product. `chunkwise` against `scan`, fp64.

# %%
# --8<-- [start:chunkwise]
def chunk_vs_scan(seed: int, T: int = 150, chunk: int = 64) -> dict:
    g = torch.Generator().manual_seed(seed)
    q, k = unit(g, 2, 3, T, 8), unit(g, 2, 3, T, 8)
    v = torch.randn(2, 3, T, 8, generator=g, dtype=f64)
    beta = torch.rand(2, 3, T, generator=g, dtype=f64)
    la = F.logsigmoid(torch.randn(2, 3, T, generator=g, dtype=f64) + 2)
    S0 = torch.randn(2, 3, 8, 8, generator=g, dtype=f64)
    out = {}
    for gated in (False, True):
        for erase in (True, False):
            a = DeltaRule.scan(q, k, v, beta, la if gated else None, S0, erase)
            b = DeltaRule.chunkwise(q, k, v, beta, la if gated else None, S0, erase, chunk=chunk)
            out[gated, erase] = max((a[0] - b[0]).abs().max().item(), (a[1] - b[1]).abs().max().item())
    out["steps"] = (T, -(-T // chunk))  # sequential steps: one per token, one per chunk
    return out
# --8<-- [end:chunkwise]


# %%
if __name__ == "__main__":
    print(same_key(0))
    print(orthonormal(0))
    c = capacity(0)
    for n in NS:
        print(n, {m: {k2: round(x, 3) for k2, x in c[m, n].items()} for m in ("additive", "delta")})
    print(c["additive", "passes"], c["delta", "passes"])
    print(chunk_vs_scan(0))


# %% [markdown]
# ## Tests

# %%
TOL = 1e-12  # fp64: exact up to rounding


# --8<-- [start:test_same_key]
@pytest.mark.claim("C-LIN-3", "nuanced")
def test_same_key_additive_sums_delta_overwrites(ev, seed):
    """Two values written under one unit key: the additive state returns their sum, the delta rule (β = 1) the latest,
    and with β = 0.5 the midpoint. Gated DeltaNet's α scales every stored value: after 3 writes under other keys
    with α = 0.9, a key returns 0.9³ of its value. Exact in fp64. Would be refuted if the delta state returned
    anything but v₂ (within rounding), or if the additive state did not return v₁ + v₂ (the switch did nothing)."""
    r = same_key(seed)
    v1, v2 = r["v1"], r["v2"]
    gaps = {"additive − (v₁ + v₂)": (r["additive"] - (v1 + v2)).norm().item(),
            "delta (β = 1) − v₂": (r["delta"] - v2).norm().item(),
            "delta (β = 0.5) − (v₁ + v₂)/2": (r["delta, beta 0.5"] - (v1 + v2) / 2).norm().item(),
            "gated − 0.9³ v": (r["gated, after 3 writes"] - 0.9 ** 3 * r["gated v"]).norm().item()}
    for name, gap in gaps.items():
        ev.record(f"‖{name}‖", gap, expect="0 (fp64 rounding)")
        assert gap < TOL
    off = (r["additive"] - v2).norm().item()
    ev.record("‖additive − v₂‖ (the old value left in)", off, expect="= ‖v₁‖ > 0")
    assert off == pytest.approx(v1.norm().item(), rel=1e-9) and off > 0.1
# --8<-- [end:test_same_key]


# --8<-- [start:test_orthonormal]
@pytest.mark.claim("C-LIN-3", "nuanced")
def test_orthonormal_keys_retrieve_exactly_and_rewrites_need_the_delta(ev, seed):
    """D = 16 orthonormal keys written once: both states return every value exactly. Rewrite 8 of them with new
    values: the delta state returns the latest value under all 16 keys; the additive state is off by exactly the
    old value on each rewritten key. D/2 random (non-orthogonal) unit keys: the additive state errs on every pair;
    the delta rule returns the last pair exactly but not the earlier ones. Would be refuted by a retrieval error on
    orthonormal keys written once, by a delta error after rewriting, or by no additive error after rewriting."""
    r = orthonormal(seed)
    for name in ("additive", "delta"):
        ev.record(f"max error, {name}, {D} orthonormal keys written once", r[name, "once"].max().item(), expect="0")
        assert r[name, "once"].max().item() < TOL
    ev.record("max error, delta, 8 of 16 keys rewritten", r["delta", "rewritten"].max().item(), expect="0")
    assert r["delta", "rewritten"].max().item() < TOL
    add = r["additive", "rewritten"]
    n = r["n_rewrite"]
    ev.record("error on rewritten keys, additive (mean)", add[:n].mean().item(), expect="= ‖old value‖")
    ev.record("max error on keys not rewritten, additive", add[n:].max().item(), expect="0")
    assert torch.allclose(add[:n], r["old norms"], rtol=1e-9) and add[n:].max().item() < TOL
    a, d = r["additive", "overlapping"], r["delta", "overlapping"]
    ev.record(f"mean error, additive, {D // 2} random unit keys", a.mean().item(), expect="> 0 on every pair")
    ev.record(f"error on the last pair, delta, {D // 2} random unit keys", d[-1].item(), expect="0")
    ev.record(f"mean error on the earlier pairs, delta, {D // 2} random unit keys", d[:-1].mean().item(),
              expect="> 0: exact only for the last")
    assert a.min().item() > 1e-6 and d[-1].item() < TOL and d[:-1].min().item() > 1e-6
# --8<-- [end:test_orthonormal]


def _plot_capacity(ev, c: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), constrained_layout=True)
    for name, marker in (("additive", "o"), ("delta", "s"), ("delta, β = ¼", "^")):
        axes[0].plot(NS, [c[name, n]["mse"] for n in NS], marker=marker, ms=4, label=name)
        axes[1].plot(NS, [c[name, n]["recall"] for n in NS], marker=marker, ms=4, label=f"{name}, all pairs")
        axes[1].plot(NS, [c[name, n]["recent"] for n in NS], marker=marker, ms=3, alpha=0.5, ls=":",
                     label=f"{name}, latest quarter")
    axes[0].plot(NS, [(n - 1) / D for n in NS], color="grey", lw=0.8, ls="--", label="(n − 1)/D")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.axvline(D, color="grey", lw=0.6)
        ax.set_xlabel(f"pairs written n (state {D} × {D})")
    axes[0].set(ylabel="mean ‖S k_i − v_i‖²", yscale="log")
    axes[1].set(ylabel="nearest-value recall")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    ev.figure(fig, "capacity", f"Random unit keys and values, {DRAWS} draws per n: squared error and "
                               "nearest-stored-value recall of the additive state and the delta state at β = 1 and "
                               "β = ¼.")


# --8<-- [start:test_capacity]
@pytest.mark.claim("C-LIN-3", "nuanced")
def test_past_capacity_delta_trades_old_pairs_for_recent_ones(ev, seed):
    """n random unit keys in D = 16 dimensions, β = 1, 400 draws per n. The additive state's squared error matches
    (n − 1)/D and grows without bound; the delta rule's is smaller at every n and its last pair is exact. By
    nearest-value recall the picture turns: the additive state recalls more pairs in all at n = 16 and 32, as the
    delta rule keeps the recent pairs and overwrites the old ones (its recall of the latest quarter beats the
    additive state's, its recall of the oldest quarter falls far below, and what it returns for the oldest keys is
    shorter than the additive state's). With β = ¼ the delta rule still favours recent pairs, yet recalls more pairs
    in all than the additive state at n = 32 and 64: the loss in total recall is the price of β = 1's hard overwrite,
    not of the rule. Written 60 times over, the delta rule converges to exact retrieval of n = 8 < D overlapping
    pairs; the additive state does not. Would be refuted (the delta rule uniformly better) if its total recall at
    β = 1 were at least the additive one's at n = 16 and 32, (no overwrite) if its recent-quarter recall were not
    above the additive one's, or (the loss built into the rule, whatever β) if at β = ¼ its total recall were not
    above the additive one's at n = 32 and 64."""
    c = capacity(seed)
    for n in NS:
        a, d = c["additive", n], c["delta", n]
        for name, m in (("additive", a), ("delta", d), ("delta, β = ¼", c["delta, β = ¼", n])):
            ev.record(f"mean squared error, {name}, n = {n}", m["mse"], key=n == 32 and name != "delta, β = ¼",
                      expect=f"(n − 1)/D = {(n - 1) / D:.3f}" if name == "additive" else "")
            ev.record(f"nearest-value recall, {name}, n = {n}", m["recall"], key=n in (8, 32))
            ev.record(f"recall of the latest quarter, {name}, n = {n}", m["recent"], key=n == 32)
            ev.record(f"recall of the oldest quarter, {name}, n = {n}", m["old"], key=n == 32)
            ev.record(f"mean ‖S k_i‖ of the oldest quarter, {name}, n = {n}", m["old norm"], key=False)
        ev.record(f"error on the last pair written, delta, n = {n}", d["last"], expect="0", key=False)
        assert d["last"] < TOL  # seeds 100-139: at most 8.8e-16
        # additive MSE / ((n − 1)/D) − 1, seeds 100-139: widest at n = 4, 0.005 ± 0.031 (min −0.053, max 0.063);
        # n = 32: −0.0003 ± 0.0049. 0.16 is 5 sd at n = 4
        assert a["mse"] == pytest.approx((n - 1) / D, rel=0.16)
        # additive − delta MSE, seeds 100-139: n = 4 0.074 ± 0.003 (min 0.068) … n = 64 2.44 ± 0.02 (min 2.40)
        assert d["mse"] < a["mse"]
    # seeds 100-139 (40 seeds, 400 draws each):
    # additive − delta total recall: n = 16 0.179 ± 0.004 (min 0.171), n = 32 0.211 ± 0.005 (min 0.201)
    # delta − additive, latest quarter: n = 16 0.082 ± 0.008 (min 0.064), n = 32 0.275 ± 0.011 (min 0.256)
    # additive − delta, oldest quarter: n = 16 0.469 ± 0.011 (min 0.449), n = 32 0.527 ± 0.009 (min 0.508)
    for n in (16, 32):
        assert c["additive", n]["recall"] - c["delta", n]["recall"] > 0.1
        assert c["delta", n]["recent"] - c["additive", n]["recent"] > 0.03
        assert c["additive", n]["old"] - c["delta", n]["old"] > 0.3
    # what the state returns for the oldest keys shrinks under the delta rule (part of its lower squared error)
    ev.record("mean ‖S k_i‖ of the oldest quarter: delta ÷ additive, n = 32",
              c["delta", 32]["old norm"] / c["additive", 32]["old norm"], expect="< 1")
    # seeds 100-139: ratio 0.554 ± 0.002 (max 0.558)
    assert c["delta", 32]["old norm"] < c["additive", 32]["old norm"]
    # β = ¼: still recency-weighted, more pairs recalled in all than the additive state past capacity
    b4 = {n: c["delta, β = ¼", n] for n in (32, 64)}
    for n in (32, 64):
        ev.record(f"total recall, delta (β = ¼) − additive, n = {n}", b4[n]["recall"] - c["additive", n]["recall"],
                  expect="> 0")
        # seeds 100-139: n = 32 0.033 ± 0.004 (min 0.025), n = 64 0.037 ± 0.003 (min 0.031); 0.01 is 6 sd at n = 32
        assert b4[n]["recall"] - c["additive", n]["recall"] > 0.01
    # seeds 100-139, n = 32: β = ¼ latest quarter 0.876 ± 0.004 against additive ≈ 0.61, oldest 0.417 ± 0.008 against ≈ 0.61
    assert b4[32]["recent"] - c["additive", 32]["recent"] > 0.1 and c["additive", 32]["old"] - b4[32]["old"] > 0.1
    ev.record("mean error after 60 passes over 8 pairs, delta", c["delta", "passes"], expect="→ 0")
    ev.record("mean error after 60 passes over 8 pairs, additive (÷ 60)", c["additive", "passes"], expect="stays")
    # seeds 100-139: delta 7.7e-5 ± 1.2e-4 (max 4.4e-4; Kaczmarz converges more slowly on ill-conditioned draws),
    # additive 0.635 ± 0.008 (min 0.619)
    assert c["delta", "passes"] < 1e-2 and c["additive", "passes"] > 0.3
    _plot_capacity(ev, c)
# --8<-- [end:test_capacity]


# --8<-- [start:test_chunkwise]
@pytest.mark.claim("C-LIN-3", "nuanced")
def test_chunkwise_form_equals_the_recurrence(ev, seed):
    """An identity of our module: `DeltaRule.chunkwise` (one triangular solve per chunk of 64 tokens) returns the
    outputs and final state of `DeltaRule.scan` (one step per token) to fp64 rounding, with and without the gate
    α, with and without the erasing term, from a non-zero initial state, over T = 150 tokens (3 chunks). Would be
    refuted by any gap above 1e-10."""
    r = chunk_vs_scan(seed)
    for gated in (False, True):
        for erase in (True, False):
            name = ("gated " if gated else "") + ("delta" if erase else "additive")
            ev.record(f"max |chunkwise − scan|, {name}", r[gated, erase], expect="fp64 rounding")
            assert r[gated, erase] < 1e-10
    ev.record("sequential steps for T = 150: scan, chunkwise (chunks of 64)", f"{r['steps'][0]}, {r['steps'][1]}")
    with pytest.raises(ConfigError):
        DeltaRule.chunkwise(*(torch.zeros(1, 1, 4, 2),) * 3, torch.ones(1, 1, 4), chunk=0)
# --8<-- [end:test_chunkwise]

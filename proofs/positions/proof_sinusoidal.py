# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How does the sinusoidal encoding work?
#
# Proofs for the page `docs/positions/sinusoidal-encoding.md`. Most claims here are
# theorems about one table, so most proofs are exact checks of the shared module's
# `sinusoidal_table` and `Embeddings` (positions="sinusoidal") against an
# independent implementation and against the algebra, at many positions and offsets.
# Run it with `pytest proofs/positions/proof_sinusoidal.py`, or open it as a
# notebook with `jupytext --to notebook proofs/positions/proof_sinusoidal.py`.

# %%
from __future__ import annotations

import math

import torch

from proofs.transformer import Embeddings, TransformerConfig, sinusoidal_table


# %% [markdown]
# ## 1. The formula, written out independently
#
# A plain-Python double loop over positions and dimensions, straight from §3.5 of
# the paper: even dimension 2i holds sin(pos / 10000^(2i/d)), odd dimension 2i+1
# holds cos of the same angle. No torch, no vectorisation, nothing shared with the
# module's code.

# %%
# --8<-- [start:reference]
def reference_pe(length: int, d_model: int) -> list[list[float]]:
    table = []
    for pos in range(length):
        row = []
        for dim in range(d_model):
            i = dim // 2  # dimensions 2i and 2i+1 share one frequency
            angle = pos / 10000 ** (2 * i / d_model)
            row.append(math.sin(angle) if dim % 2 == 0 else math.cos(angle))
        table.append(row)
    return table
# --8<-- [end:reference]


# %% [markdown]
# ### The paper's code lays it out differently
#
# tensor2tensor's `get_timing_signal_1d` (`add_timing_signal_1d` in the 2017 release,
# `tensor2tensor/layers/common_attention.py`), written out again here from its text: d/2
# timescales spaced geometrically from 1 to exactly 10000 (log-increment
# ln(10000)/(d/2 − 1)), all the sines in the first half of the channels and all the cosines
# in the second. Same idea, two differences: the layout (concatenated halves, not
# interleaved pairs) and the frequencies (the last timescale is 10000 itself, not
# 10000^((d−2)/d)).

# %%
# --8<-- [start:t2t]
def t2t_timing_signal(length: int, channels: int, min_timescale: float = 1.0, max_timescale: float = 1.0e4):
    """(length, channels) as tensor2tensor builds it: [sin(pos·inv_ts) | cos(pos·inv_ts)], timescales 1 .. 10000."""
    n = channels // 2
    log_inc = math.log(max_timescale / min_timescale) / (n - 1)
    inv_ts = min_timescale * torch.exp(torch.arange(n, dtype=torch.float64) * -log_inc)  # (d/2,)
    scaled = torch.arange(length, dtype=torch.float64)[:, None] * inv_ts[None, :]  # (T, d/2)
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


def interleave(table: torch.Tensor) -> torch.Tensor:
    """[s_0 .. s_{n-1} | c_0 .. c_{n-1}] -> [s_0, c_0, s_1, c_1, ...]: a permutation of the channels."""
    n = table.shape[1] // 2
    return torch.stack([table[:, :n], table[:, n:]], dim=2).reshape(table.shape)
# --8<-- [end:t2t]


# %% [markdown]
# ## 2. A shift by k positions is one fixed rotation
#
# Pair i of PE(pos) is (sin(pos·ω_i), cos(pos·ω_i)) with ω_i = 10000^(-2i/d). By the
# angle-sum formulas, the pair at pos+k is a 2×2 rotation of the pair at pos by the
# angle k·ω_i, and that rotation does not involve pos. R_k stacks the d/2 rotations
# on the diagonal.

# %%
# --8<-- [start:rotation]
def frequencies(d_model: int) -> torch.Tensor:
    return 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # ω_i, (d/2,)


def shift_matrix(k: int, d_model: int) -> torch.Tensor:
    """(d, d) block-diagonal R_k with PE(pos + k) = R_k PE(pos) for every pos."""
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(frequencies(d_model)):
        c, s = math.cos(k * w), math.sin(k * w)
        # (sin(a+b), cos(a+b)) = (sin a cos b + cos a sin b, cos a cos b − sin a sin b)
        R[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return R
# --8<-- [end:rotation]


# %% [markdown]
# ## 3. Dot products and distances depend on the offset only
#
# PE(p)·PE(p+k) = Σ_i [sin(pω)sin((p+k)ω) + cos(pω)cos((p+k)ω)] = Σ_i cos(kω_i):
# a function of k alone, and even in k. A bilinear form PE(p)ᵀ A PE(p+k) with a
# matrix A that is not symmetric can be odd in k: A below rotates each pair by 90°,
# which turns the sum into −Σ_i sin(kω_i).

# %%
# --8<-- [start:offsets]
def dot_by_offset(pe: torch.Tensor, p: int, offsets: range, A: torch.Tensor | None = None) -> torch.Tensor:
    """PE(p)ᵀ A PE(p+k) for each k (A = identity: the plain dot product)."""
    A = torch.eye(pe.shape[1], dtype=pe.dtype) if A is None else A
    return torch.stack([pe[p] @ A @ pe[p + k] for k in offsets])


def quarter_turns(d_model: int) -> torch.Tensor:
    """Block-diagonal A with [[0, 1], [-1, 0]] per pair: (sin a, cos a)ᵀ A (sin b, cos b) = sin(a − b)."""
    A = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(0, d_model, 2):
        A[i, i + 1], A[i + 1, i] = 1.0, -1.0
    return A
# --8<-- [end:offsets]


# %% [markdown]
# ## 4. Added, not concatenated
#
# Concatenating [e; p] and applying a linear map W = [W₁ W₂] gives W₁e + W₂p: the
# sum of two separately projected vectors. Adding e + p and applying W gives
# W e + W p: the same thing with W₁ = W₂. What adding gives up is room: token and
# position share d dimensions. A linear probe (least squares from the sum back to
# the token id and the position id, over every token at every position) measures
# how much of each survives at a given width.

# %%
# --8<-- [start:probe]
def linear_probe_accuracy(d_model: int, seed: int, vocab: int = 32, length: int = 64) -> dict:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab, d_model=d_model, n_heads=1, max_len=length, dropout_emb=0.0)
    emb = Embeddings(cfg, vocab).eval()
    ids = torch.arange(vocab)[:, None].expand(vocab, length)  # every token at every position
    with torch.no_grad():
        x = emb(ids).reshape(-1, d_model).double()  # (V*T, d): √d·e + PE
    tok, pos = ids.reshape(-1), torch.arange(length).repeat(vocab)
    X = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)  # with a bias column
    out = {}
    for name, y, n in (("token", tok, vocab), ("position", pos, length)):
        W = torch.linalg.pinv(X) @ torch.nn.functional.one_hot(y, n).double()  # least squares
        out[name] = ((X @ W).argmax(1) == y).double().mean().item()
    return out


def effective_rank(length: int, d_model: int, energy: float = 0.99) -> int:
    """How many directions hold `energy` of the (centred) PE of the first `length` positions."""
    pe = sinusoidal_table(length, d_model).double()
    s2 = torch.linalg.svdvals(pe - pe.mean(0)) ** 2
    return int((s2.cumsum(0) / s2.sum() < energy).sum()) + 1
# --8<-- [end:probe]


# %%
if __name__ == "__main__":  # notebook / script
    pe = sinusoidal_table(200, 64).double()
    print("max |table - reference|", (pe - torch.tensor(reference_pe(200, 64), dtype=torch.float64)).abs().max())
    print("shift error", (pe[10:] - pe[:-10] @ shift_matrix(10, 64).T).abs().max())
    print("dot by offset", dot_by_offset(pe, 100, range(-5, 6)))
    for d in (16, 32, 64, 128):
        print(d, linear_probe_accuracy(d, 0))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


@pytest.mark.claim("C-PE-1", "confirmed")
def test_table_matches_the_formula(ev, seed):
    """The module's table, its Embeddings buffer and its on-the-fly table for long inputs all equal the paper's formula
    written out independently (exact up to float32). Would be refuted by any entry off by more than rounding."""
    L, d = 128, 64
    ref = torch.tensor(reference_pe(L, d), dtype=torch.float64)
    table = sinusoidal_table(L, d).double()
    cfg = TransformerConfig(vocab_size=8, d_model=d, n_heads=1, max_len=32, dropout_emb=0.0)
    emb = Embeddings(cfg, 8).eval()
    with torch.no_grad():
        emb.tok.weight.zero_()  # token part 0: the output is the position signal alone
        out = emb(torch.zeros(1, L, dtype=torch.long))[0].double()  # L > max_len: computed on the fly
    err_table = (table - ref).abs().max().item()
    err_module = (out - ref).abs().max().item()
    ev.record("max |sinusoidal_table − plain-Python formula|, 128 positions, d=64", err_table, expect="float32 rounding")
    ev.record("max |Embeddings output (zero tokens) − formula|, 128 positions", err_module, expect="float32 rounding")
    ev.record("max |PE| over 128 positions", ref.abs().max().item(), expect="≤ 1")
    assert err_table < 1e-6 and err_module < 1e-6


@pytest.mark.claim("C-PE-2", "confirmed")
def test_shift_is_a_rotation_independent_of_pos(ev, seed):
    """PE(pos+k) = R_k PE(pos) for every pos, with R_k block-diagonal 2×2 rotations; R_j R_k = R_(j+k). An identity of
    the formula, checked exactly on our module's table; it would be refuted by one position where the map differs."""
    d, L = 64, 2048
    pe = sinusoidal_table(L, d).double()
    worst = 0.0
    for k in (1, 2, 7, 50, 300, -1, -25):
        R = shift_matrix(k, d)
        lo, hi = max(0, -k), L - max(0, k)  # every pos whose pos+k is in the table
        err = (pe[lo + k: hi + k] - pe[lo:hi] @ R.T).abs().max().item()
        worst = max(worst, err)
        ev.record(f"max |PE(pos+{k}) − R_{k} PE(pos)| over {hi - lo} positions", err, key=k in (1, 300))
    R5, R7 = shift_matrix(5, d), shift_matrix(7, d)
    orth = (R5 @ R5.T - torch.eye(d, dtype=torch.float64)).abs().max().item()
    comp = (R5 @ R7 - shift_matrix(12, d)).abs().max().item()
    off_block = (R5 * (1 - torch.block_diag(*[torch.ones(2, 2, dtype=torch.float64)] * (d // 2)))).abs().max().item()
    ev.record("max |R_5 R_5ᵀ − I|", orth, expect="0: a rotation")
    ev.record("max |R_5 R_7 − R_12|", comp, expect="0: shifts compose")
    ev.record("largest entry of R_5 outside the 2×2 blocks", off_block, expect="0: pairs never mix")
    assert worst < 1e-6  # float32 table entries; the algebra itself is exact
    assert orth < 1e-12 and comp < 1e-12 and off_block == 0.0


@pytest.mark.claim("C-PE-4", "nuanced")
def test_geometric_wavelengths_and_distinct_positions(ev, seed):
    """Wavelengths grow geometrically from 2π, but with the paper's formula the last one is 2π·10000^((d−2)/d), not
    2π·10000; no two positions share a vector, and the nearest are always neighbours. Exact (read back from our module's
    table). The endpoint half of C-PE-4 would be confirmed if the longest wavelength were 2π·10000 at every d."""
    rows = {}
    for d in (64, 512):
        pe1 = sinusoidal_table(2, d).double()[1]  # PE(1): pair i is (sin ω_i, cos ω_i)
        omega = torch.atan2(pe1[0::2], pe1[1::2])  # read each frequency back from the table
        lam = 2 * math.pi / omega
        ratio = lam[1:] / lam[:-1]
        rows[d] = (lam, ratio)
        ev.record(f"shortest wavelength / 2π, d={d}", lam[0].item() / (2 * math.pi), expect="1")
        ev.record(f"longest wavelength / 2π, d={d}", lam[-1].item() / (2 * math.pi),
                  expect=f"10000^((d−2)/d) = {10000 ** ((d - 2) / d):.0f}, approaching 10000 as d grows")
        ev.record(f"spread of λ(i+1)/λ(i), d={d}", (ratio.max() - ratio.min()).item(),
                  expect=f"0: constant ratio 10000^(2/d) = {10000 ** (2 / d):.4f}", key=False)
        assert lam[0].item() == pytest.approx(2 * math.pi, rel=1e-6)
        assert lam[-1].item() == pytest.approx(2 * math.pi * 10000 ** ((d - 2) / d), rel=1e-4)
        assert ratio.min().item() == pytest.approx(10000 ** (2 / d), rel=1e-4)
        assert ratio.max().item() == pytest.approx(10000 ** (2 / d), rel=1e-4)
    # distinct positions: every pair among the first 1024 (d=64), then offsets up to 20 000
    pe = sinusoidal_table(1024, 64).double()
    D = torch.cdist(pe, pe)
    D.fill_diagonal_(float("inf"))
    i, j = divmod(D.argmin().item(), 1024)
    far = sinusoidal_table(20_000, 64).double()
    dist_k = (far[1:] - far[0]).norm(dim=1)  # ‖PE(0) − PE(k)‖, k = 1 .. 19 999 (depends on k only)
    ev.record("min distance between two of the first 1024 positions, d=64", D.min().item(), expect="> 0")
    ev.record("offset |i − j| of that closest pair", abs(i - j), expect="1: neighbours")
    ev.record("min over k = 1..19 999 of ‖PE(0) − PE(k)‖, d=64", dist_k.min().item(), expect="> 0")
    ev.record("the k where it is reached", dist_k.argmin().item() + 1)
    ks = torch.arange(1, 513)
    ps = 299 + 7 * ks  # a different start p for every offset k
    same = ((far[ps] - far[ps + ks]).norm(dim=1) - dist_k[ks - 1]).abs()
    ev.record("max |‖PE(p)−PE(p+k)‖ − ‖PE(0)−PE(k)‖|, 512 offsets, p up to 3883", same.max().item(),
              expect="0: distance depends on k only")
    assert D.min().item() > 1.0 and abs(i - j) == 1
    assert dist_k.min().item() > 1.0 and dist_k.argmin().item() == 0
    assert same.max().item() < 1e-5


def _plot_pe(ev, pe, offsets, dots, odd):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1.1, 1]})
    im = axes[0].imshow(pe[:100].T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    axes[0].set(xlabel="position", ylabel="dimension", title="PE(pos), d_model=64")
    fig.colorbar(im, ax=axes[0])
    axes[1].plot(list(offsets), dots.numpy(), label="PE(p)·PE(p+k): even in k")
    axes[1].plot(list(offsets), odd.numpy(), "--", label="PE(p)ᵀ A PE(p+k), A = 90° per pair: odd")
    axes[1].axvline(0, color="grey", lw=0.8)
    axes[1].set(xlabel="offset k", title="p = 500, d_model=64")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "pe", "Left: the encoding of the first 100 positions. Right: the dot product between two "
                         "positions against their offset (symmetric), and a bilinear form that is not (antisymmetric).")


# --8<-- [start:test_direction]
@pytest.mark.claim("C-FOLK-14", "refuted")
def test_dot_product_cannot_tell_left_from_right(ev, seed):
    """PE(p)·PE(p+k) = PE(p)·PE(p−k) for every p and k; only a non-symmetric bilinear form (W_Qᵀ W_K) can read
    direction. Exact (an identity of the formula); the folk claim would hold if the two dot products differed."""
    d = 64
    pe = sinusoidal_table(1200, d).double()
    offsets = range(-100, 101)
    worst_sym, worst_p = 0.0, 0.0
    for p in (100, 500, 1000):
        dots = dot_by_offset(pe, p, offsets)
        worst_sym = max(worst_sym, (dots - dots.flip(0)).abs().max().item())  # k against −k
        worst_p = max(worst_p, (dots - dot_by_offset(pe, 500, offsets)).abs().max().item())  # p against 500
    A = quarter_turns(d)
    dots, odd = dot_by_offset(pe, 500, offsets), dot_by_offset(pe, 500, offsets, A)
    _plot_pe(ev, pe, offsets, dots, odd)
    ev.record("max |PE(p)·PE(p+k) − PE(p)·PE(p−k)|, |k| ≤ 100, p ∈ {100, 500, 1000}", worst_sym,
              expect="0: left and right look the same")
    ev.record("max |PE(p)·PE(p+k) − PE(500)·PE(500+k)|", worst_p, expect="0: depends on k only")
    ev.record("PE(500)ᵀ A PE(503) and PE(500)ᵀ A PE(497)", [odd[103].item(), odd[97].item()],
              expect="opposite signs: this form tells direction")
    assert worst_sym < 1e-5 and worst_p < 1e-5
    assert (odd + odd.flip(0)).abs().max().item() < 1e-5  # exactly odd in k
    assert odd[103].item() * odd[97].item() < 0 and abs(odd[103].item()) > 1.0
# --8<-- [end:test_direction]


# --8<-- [start:test_add]
@pytest.mark.claim("C-PE-6", "confirmed")
def test_added_not_concatenated(ev, seed):
    """The module adds √d·e + PE (exact); concatenation followed by a linear map is such a sum (exact); adding costs
    room only at small d (linear probe, thresholds from the seed spread). Would be refuted if the module concatenated,
    or if the probe lost the position at d=128 as it does at d=16."""
    torch.manual_seed(seed)
    d = 32
    cfg = TransformerConfig(vocab_size=16, d_model=d, n_heads=1, max_len=20, dropout_emb=0.0)
    emb = Embeddings(cfg, 16).eval()
    ids = torch.randint(0, 16, (4, 20))
    with torch.no_grad():
        out = emb(ids)
        by_hand = emb.tok(ids) * math.sqrt(d) + sinusoidal_table(20, d)
    err_add = (out - by_hand).abs().max().item()
    # concatenation then a linear map = two linear maps, then a sum
    e, p = torch.randn(100, d, dtype=torch.float64), torch.randn(100, d, dtype=torch.float64)
    W = torch.randn(d, 2 * d, dtype=torch.float64)
    err_cat = ((torch.cat([e, p], 1) @ W.T) - (e @ W[:, :d].T + p @ W[:, d:].T)).abs().max().item()
    ev.record("max |Embeddings output − (√d·E[id] + PE)|", err_add, expect="0: added")
    ev.record("max |W[e;p] − (W₁e + W₂p)|", err_cat, expect="0: concat + linear = sum of two projections")
    assert err_add < 1e-6 and err_cat < 1e-10

    seeds = [seed, seed + 1, seed + 2]  # the token embeddings are random: worst case over three draws
    probes = {w: [linear_probe_accuracy(w, s) for s in seeds] for w in (16, 32, 64, 128)}
    worst = {w: {k: min(a[k] for a in accs) for k in ("token", "position")} for w, accs in probes.items()}
    for w, acc in worst.items():
        ev.record(f"linear probe from the sum, d={w}: token / position accuracy (worst of 3 seeds)",
                  [acc["token"], acc["position"]], expect="≈ 1 for both once d leaves room" if w >= 64 else "")
    for w in (64, 512):
        ev.record(f"directions holding 99% of the PE of 64 positions, d={w}", effective_rank(64, w),
                  expect="far fewer than d")
    assert max(a["position"] for a in probes[16]) < 0.6  # 32 tokens + 64 positions in 16 dimensions: they collide
    assert min(worst[128].values()) > 0.99  # room for both: next to nothing lost by adding
    assert effective_rank(64, 64) < 32
# --8<-- [end:test_add]


@pytest.mark.claim("C-PE-4", "nuanced")
def test_tensor2tensor_layout_reaches_10000(ev, seed):
    """The paper's code (tensor2tensor) concatenates a sine half and a cosine half and spaces d/2 timescales from 1 to
    exactly 10000: its longest wavelength is 2π·10000. Interleaving its channels is a permutation (an orthogonal map),
    so it changes no dot product or distance: only the frequencies differ from the formula in the paper. Exact; it
    would be wrong if the reimplementation's last timescale were not 10000 or the interleaved table were not a
    permutation of channels."""
    d = 64
    t2t = t2t_timing_signal(200, d)
    inv_ts = torch.atan2(t2t[1, : d // 2], t2t[1, d // 2:])  # pos 1: (sin ω, cos ω) of each timescale
    timescales = 1 / inv_ts
    ratio = timescales[1:] / timescales[:-1]
    ev.record("tensor2tensor layout: channels 0-31 are sines, 32-63 cosines at the same frequencies",
              (t2t[:, : d // 2].pow(2) + t2t[:, d // 2:].pow(2) - 1).abs().max().item(), expect="0: sin² + cos² = 1 pairwise")
    ev.record("tensor2tensor: longest timescale (wavelength / 2π), d=64", timescales[-1].item(), expect="10000 exactly")
    ev.record("paper's formula: longest timescale, d=64", 10000 ** ((d - 2) / d), expect="10000^(62/64)")
    ev.record("tensor2tensor: spread of the timescale ratio", (ratio.max() - ratio.min()).item(), expect="0: geometric")
    assert timescales[0].item() == pytest.approx(1.0, rel=1e-9) and timescales[-1].item() == pytest.approx(1e4, rel=1e-9)
    assert (ratio - ratio[0]).abs().max().item() < 1e-9
    # layout alone is a permutation: distances between positions are unchanged by interleaving
    inter = interleave(t2t)
    exact = "donot_use_mm_for_euclid_dist"  # pairwise differences, not the |a|²+|b|²−2ab shortcut
    same_dist = (torch.cdist(inter, inter, compute_mode=exact) - torch.cdist(t2t, t2t, compute_mode=exact)).abs().max().item()
    ev.record("max |Δ distance between positions| after interleaving the tensor2tensor channels", same_dist,
              expect="0: a permutation of channels")
    assert same_dist < 1e-9
    # frequencies: the paper's table and tensor2tensor's interleaved one are different tables
    ours = sinusoidal_table(200, d).double()
    gap = (inter - ours).abs().max().item()
    ev.record("max |tensor2tensor (interleaved) − the paper's formula|, 200 positions", gap,
              expect="> 0: the slow frequencies differ")
    assert gap > 0.1
    # the first pair agrees (timescale 1 in both)
    assert (inter[:, :2] - ours[:, :2]).abs().max().item() < 1e-6

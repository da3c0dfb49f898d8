# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Sigmoid attention and gated attention: what replaces or follows the softmax
#
# Proofs for `docs/beyond/sigmoid-and-gated-attention.md`. The mixers are in `proofs/transformer/sigmoid_attention.py`
# (`SigmoidAttention`, `GatedAttention`, subclasses of the shared `MultiHeadAttention` that override its `score`/`mix`
# hooks and wrap its W_O); `mixer_lm` swaps them into the shared `DecoderLM`. The switches: `MixerConfig.mixer`
# ("softmax", "sigmoid", "gated") and `sigmoid_bias` (None = −log n_i, n_i the keys query i sees; or a constant:
# 0, or −log T for the training length T as in Ramapuram et al.'s released configs).
#
# 1. Row sums and output norms against the number of keys n ∈ {16 … 1024}, one freshly initialised layer, the same
#    weights under the three weightings (exact for softmax; sampled inputs for the sigmoid rows).
# 2. A small LM with each weighting, equal steps and data (trained): b = −log T (one constant, the paper's), b = 0,
#    and our module's per-row −log(i + 1) (recorded).
# 3. The value-to-output path with and without the gate (exact, from the weights).
# 4. A small LM with and without the gate, texts starting with BOS: attention on position 0 measured as the
#    sliding-window page measures the sink, the largest activation and the mean gate (trained).
#
# Run: `pytest proofs/beyond/proof_sigmoid_gated.py`.

# %%
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from proofs.train import train
from proofs.transformer import (GatedAttention, MixerConfig, MultiHeadAttention, SigmoidAttention, mixer_lm,
                                record_attention)

D, NH = 32, 4  # d_model, heads: d_head = 8
HS = D // NH
LENGTHS = (16, 64, 256, 1024)
QUERIES = 64  # query rows measured per n
WEIGHTINGS = ("softmax", "sigmoid, b = 0", "sigmoid, b = -log n")


def config(**kw) -> MixerConfig:
    base = dict(vocab_size=16, d_model=D, n_heads=NH, d_ff=64, n_layers=2, max_len=2048, dropout_emb=0.0,
                dropout_residual=0.0, norm_position="pre")
    return MixerConfig(**{**base, **kw})


# %% [markdown]
# ## 1. Row sums and output norms against n
#
# One attention layer, Xavier-initialised as the shared model initialises its matrices, copied into a softmax layer,
# a sigmoid layer with b = 0 and one with b = −log n. Inputs: 64 unit-Gaussian query tokens reading n unit-Gaussian
# key/value tokens, every query seeing all n keys. Per n: the mean row sum of the weights, the mean of e^s over the
# same logits (E[e^s]) and the mean norm of the layer's output per query.

# %%
# --8<-- [start:rows]
def same_layers(seed: int) -> dict:
    """The same initial weights under the three weightings (fp64)."""
    torch.manual_seed(seed)
    cfg = config(n_layers=1)
    ref = MultiHeadAttention(cfg)
    for p in ref.parameters():
        if p.dim() == 2:
            nn.init.xavier_uniform_(p)  # what init_weights does to every weight matrix
    layers = {"softmax": MultiHeadAttention(cfg), "sigmoid, b = 0": SigmoidAttention(cfg.replace(sigmoid_bias=0.0)),
              "sigmoid, b = -log n": SigmoidAttention(cfg)}
    for m in layers.values():
        m.load_state_dict(ref.state_dict())
        m.double().eval()
    return layers


@functools.cache
@torch.no_grad()
def rows_against_n(seed: int) -> dict:
    layers, g, out = same_layers(seed), torch.Generator().manual_seed(seed), {}
    for n in LENGTHS:
        q = torch.randn(1, QUERIES, D, generator=g, dtype=torch.float64)  # query tokens
        x = torch.randn(1, n, D, generator=g, dtype=torch.float64)  # n key/value tokens
        for name, m in layers.items():
            with record_attention(m):
                y = m(q, x)  # (1, QUERIES, D); no mask: every row sees the n keys
            out[name, n] = {"row sum": m.weights.sum(-1).mean().item(), "out norm": y.norm(dim=-1).mean().item()}
        s = layers["sigmoid, b = -log n"]._logits  # (1, nh, n, n): the logits q·k/√d of the last call
        out["E[e^s]", n] = s.exp().mean().item()
        out["E[sigmoid(s)]", n] = torch.sigmoid(s).mean().item()
    return out
# --8<-- [end:rows]


# %% [markdown]
# ## 2. A small LM with each weighting
#
# Text from a random Markov chain over 15 tokens behind a BOS token (the sliding-window page's sink experiment), 32
# tokens per sequence; a 2-layer Pre-LN `mixer_lm` (d = 32, 4 heads) per weighting, the same initial seed and batches,
# 60 Adam steps. Loss on 128 held-out sequences. The −log n arm is the paper's: one constant b = −log T for the
# training length T (Ramapuram et al.'s released LM config sets sigmoid_bias = −7.62 = −ln 2048 for 2048-token
# training); our module's default, −log(i + 1) per causal row, is a fourth arm, recorded.

# %%
# --8<-- [start:lm]
V, BOS, T, W = 16, 0, 32, 8  # vocabulary (token 0 = BOS), sequence length, first query position measured


def chain(seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 + seed)
    P = torch.softmax(scale * torch.randn(V, V, generator=g), dim=-1)
    P[:, BOS] = 0.0
    return P / P.sum(-1, keepdim=True)


def text(P: torch.Tensor, g: torch.Generator, rows: int) -> torch.Tensor:
    """(rows, T + 1): BOS, then the chain."""
    x = torch.zeros(rows, T, dtype=torch.long)
    x[:, 0] = torch.randint(1, V, (rows,), generator=g)
    for t in range(1, T):
        x[:, t] = torch.multinomial(P[x[:, t - 1]], 1, generator=g)[:, 0]
    return torch.cat([torch.full((rows, 1), BOS), x], 1)


ARMS = {"softmax": {}, "gated": dict(mixer="gated"),
        "sigmoid, b = -log n": dict(mixer="sigmoid", sigmoid_bias=-math.log(T)),  # one constant, n = T (the paper's)
        "sigmoid, b = 0": dict(mixer="sigmoid", sigmoid_bias=0.0),
        "sigmoid, b = -log(i+1) per row": dict(mixer="sigmoid")}  # our module's default: n_i = keys row i sees


@functools.cache
def trained(seed: int, arm: str, steps: int = 60, batch: int = 16):
    P, g = chain(seed), torch.Generator().manual_seed(seed)
    data = text(P, g, steps * batch).view(steps, batch, T + 1)
    torch.manual_seed(seed)
    model = mixer_lm(config(**ARMS[arm]))
    train(model, lambda s: (data[s][:, :-1], data[s][:, 1:]), steps, lr=3e-3)
    return model.eval(), text(P, g, 128)


@torch.no_grad()
def measure(model, held: torch.Tensor) -> dict:
    """Held-out loss; share of attention on key 0 (queries >= W, all layers and heads, each row over its own sum);
    the largest |activation| of each layer's output, averaged over layers (Qiu et al.'s M-Act, §4.3); the mean gate
    of gated layers."""
    x, y = held[:, :-1], held[:, 1:]
    acts = []
    hooks = [layer.register_forward_hook(lambda mod, i, o: acts.append(o.abs().max().item()))
             for layer in model.decoder.layers]
    with record_attention(model) as mods:
        loss = F.cross_entropy(model(x).transpose(1, 2), y).item()
    for h in hooks:
        h.remove()
    per_layer = []
    for m in mods:
        w = m.weights[:, :, W:]  # (B, nh, T - W, T)
        per_layer.append((w[..., 0] / w.sum(-1)).mean().item())  # softmax rows sum to 1 already
    uniform = (1.0 / torch.arange(W + 1, T + 1).double()).mean().item()
    gates = [m.w_o.last_gate.mean().item() for m in mods if isinstance(m, GatedAttention)]
    return {"loss": loss, "share": sum(per_layer) / len(per_layer), "uniform": uniform,
            "max act": sum(acts) / len(acts),
            "gate": sum(gates) / len(gates) if gates else float("nan")}


@functools.cache
def lm_results(seed: int) -> dict:
    return {arm: measure(*trained(seed, arm)) for arm in ARMS}
# --8<-- [end:lm]


# %% [markdown]
# ## 3. The value-to-output path, with and without the gate
#
# For head h with the attention weights a_ij held fixed, the output of query i is
# Σ_j a_ij x_j W_V^h M_i^h with M_i^h = diag(g_i^h) W_O^h: without the gate g = 1 and every query shares the one
# matrix W_V^h W_O^h (d × d, rank ≤ d_head), so the head is linear in its value inputs; with it g_i = σ(x_i W_θ)
# changes the matrix from query to query. `value_path` recomputes the layer from its weights with the weights a
# held fixed; with a = the layer's own softmax weights it must give the layer's output.

# %%
# --8<-- [start:path]
def head_maps(m: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """(T, nh, D, D): per query token and head, the value-to-output matrix W_V^h diag(g_i^h) W_O^h (g = 1 ungated)."""
    Tn = x.shape[1]
    g = torch.sigmoid(m.w_o.w_theta(x))[0] if isinstance(m, GatedAttention) else x.new_ones(Tn, D)  # (T, D)
    wv = m.w_v.weight.T.reshape(D, NH, HS).permute(1, 0, 2)  # (nh, D, hs)
    wo = m.w_o.weight.T.reshape(NH, HS, D)  # (nh, hs, D)
    gh = g.reshape(Tn, NH, HS)  # (T, nh, hs)
    return torch.einsum("hdk,thk,hke->thde", wv, gh, wo)


def value_path(m: MultiHeadAttention, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The layer's output with the attention weights a (1, nh, T, T) held fixed and x feeding values (and gate)."""
    maps = head_maps(m, x)  # (T, nh, D, D)
    return torch.einsum("htj,jd,thde->te", a[0], x[0], maps)[None]  # Σ_h Σ_j a_tj x_j M_t^h (bias=False layers)


@functools.cache
@torch.no_grad()
def path_measurements(seed: int) -> dict:
    torch.manual_seed(seed)
    cfg = config(n_layers=1, bias=False)
    out = {}
    for name, m in (("no gate", MultiHeadAttention(cfg)), ("gate", GatedAttention(cfg))):
        for p in m.parameters():
            if p.dim() == 2:
                nn.init.xavier_uniform_(p)
        m.double().eval()
        g = torch.Generator().manual_seed(seed)
        x1, x2 = (torch.randn(1, 12, D, generator=g, dtype=torch.float64) for _ in range(2))
        with record_attention(m):
            y = m(x1, causal=True)
        a = m.weights
        maps = head_maps(m, x1)  # (T, nh, D, D)
        sv = torch.linalg.svdvals(maps)  # (T, nh, D)
        out[name] = {
            "reproduces the layer": (value_path(m, a, x1) - y).abs().max().item(),
            "rank per head": int((sv > 1e-10 * sv[..., :1]).sum(-1).max()),
            "map spread over queries": ((maps - maps[:1]).norm(dim=(-2, -1)) / maps[:1].norm(dim=(-2, -1))).max().item(),
            "additivity gap": (value_path(m, a, x1 + x2) - value_path(m, a, x1) - value_path(m, a, x2)).abs().max().item(),
        }
    return out
# --8<-- [end:path]


# %%
if __name__ == "__main__":
    r = rows_against_n(0)
    for n in LENGTHS:
        print(n, {k: round(r[k, n]["row sum"], 3) for k in WEIGHTINGS}, round(r["E[e^s]", n], 3),
              {k: round(r[k, n]["out norm"], 3) for k in WEIGHTINGS})
    print(path_measurements(0))
    print(lm_results(0))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


def _plot_rows(ev, r: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), constrained_layout=True)
    for name in WEIGHTINGS:
        axes[0].plot(LENGTHS, [r[name, n]["row sum"] for n in LENGTHS], marker="o", ms=3, label=name)
        axes[1].plot(LENGTHS, [r[name, n]["out norm"] for n in LENGTHS], marker="o", ms=3, label=name)
    axes[0].plot(LENGTHS, [r["E[e^s]", n] for n in LENGTHS], color="grey", ls=":", label="E[e^s]")
    for ax, lab in zip(axes, ("mean row sum of the weights", "mean output norm per token")):
        ax.set(xscale="log", yscale="log", xlabel="keys per query n", ylabel=lab)
    axes[0].legend(fontsize=7)
    ev.figure(fig, "rows", "Row sums and output norms of one initialised layer against n, the same weights under "
                           "softmax, sigmoid with b = 0 and sigmoid with b = −log n.")


# --8<-- [start:test_rows]
@pytest.mark.claim("C-SIGATT-1", "confirmed")
def test_sigmoid_row_sums_grow_with_n_unless_biased_by_minus_log_n(ev, seed):
    """Softmax rows sum to 1 at every n (an identity). Sigmoid rows with b = 0 sum to about n·E[σ(s)] ≈ n/2, so the
    sum grows 64-fold from n = 16 to 1024; with b = −log n, σ(s − log n) ≈ e^s/n and the sum stays near E[e^s] at
    every n. The output norm follows: it grows many-fold with n under b = 0, falls under softmax (an average) and stays
    about level under −log n. Would be refuted by b = 0 sums that do not grow about in proportion to n, or by −log n
    sums (and outputs) that drift with n."""
    r = rows_against_n(seed)
    for n in LENGTHS:
        for name in WEIGHTINGS:
            ev.record(f"mean row sum, {name}, n = {n}", r[name, n]["row sum"], key=n in (16, 1024))
            ev.record(f"mean output norm, {name}, n = {n}", r[name, n]["out norm"], key=False)
        ev.record(f"E[e^s] over the same logits, n = {n}", r["E[e^s]", n], key=n in (16, 1024))
        ev.record(f"row sum / n, sigmoid b = 0, n = {n}", r["sigmoid, b = 0", n]["row sum"] / n, expect="≈ E[σ(s)] ≈ 1/2",
                  key=False)
        assert abs(r["softmax", n]["row sum"] - 1) < 1e-12
        assert 0.4 < r["sigmoid, b = 0", n]["row sum"] / n < 0.6
    big, small = r["sigmoid, b = -log n", 1024]["row sum"], r["sigmoid, b = -log n", 16]["row sum"]
    grow0 = r["sigmoid, b = 0", 1024]["row sum"] / r["sigmoid, b = 0", 16]["row sum"]
    ev.record("row sum n = 1024 / n = 16, sigmoid b = 0", grow0, expect="≈ 64")
    ev.record("row sum n = 1024 / n = 16, sigmoid b = -log n", big / small, expect="≈ 1")
    ev.record("row sum / E[e^s], sigmoid b = -log n, n = 1024", big / r["E[e^s]", 1024], expect="→ 1 as n grows")
    ev.record("row sum / E[e^s], sigmoid b = -log n, n = 16", small / r["E[e^s]", 16], expect="< 1: e^s/(n + e^s) < e^s/n")
    norm = {k: r[k, 1024]["out norm"] / r[k, 16]["out norm"] for k in WEIGHTINGS}
    for k in WEIGHTINGS:
        ev.record(f"output norm n = 1024 / n = 16, {k}", norm[k],
                  expect={"softmax": "< 1", "sigmoid, b = 0": "≫ 1"}.get(k, "≈ 1"))
    _plot_rows(ev, r)
    # Seeds 100-139 (40 layers): row sum / n with b = 0 0.4996 ± 0.0034 at n = 16 (min 0.490) and tighter at larger n;
    # growth 1024/16 with b = 0 64.04 ± 0.50 (min 62.9); with -log n 1.318 ± 0.053 (max 1.49, bound 2 is 13 sd);
    # -log n sum / E[e^s] at n = 1024 0.987 ± 0.0043 (min 0.975, bound 0.95 is 8.5 sd). Output norm 1024/16: b = 0
    # 28.6 ± 6.3 (min 17.1; 10 is 3 sd below), softmax 0.58 ± 0.068 (max 0.71; 1 is 6 sd), -log n 0.84 ± 0.115
    # (max 1.09; 1.5 is 5.7 sd): level, not falling (a first version asserted < 1 and failed 4 of 40 seeds).
    assert grow0 > 50
    assert big / small < 2 and 0.95 < big / r["E[e^s]", 1024] <= 1
    assert norm["sigmoid, b = 0"] > 10 and norm["softmax"] < 1 and norm["sigmoid, b = -log n"] < 1.5
# --8<-- [end:test_rows]


# --8<-- [start:test_lm]
@pytest.mark.claim("C-SIGATT-1", "confirmed")
def test_a_sigmoid_lm_with_minus_log_n_trains_like_softmax_and_without_it_lags(ev, seed):
    """Equal steps, data and initial seed: the sigmoid LM with the paper's b = −log n (one constant, n = T, the
    training length) reaches about the softmax LM's held-out loss; with b = 0 (rows summing to about n/2 at init) it
    ends higher. Our module's per-row variant −log(i + 1) is recorded beside it, not asserted. Would be refuted by the
    b = 0 arm ending no worse than the −log n arm, or by the −log n arm ending as far from softmax as b = 0 does on
    average (the bound below sits under that gap)."""
    r = lm_results(seed)
    for arm in ("softmax", "sigmoid, b = -log n", "sigmoid, b = 0", "sigmoid, b = -log(i+1) per row"):
        ev.record(f"held-out loss, {arm}", r[arm]["loss"], key=arm != "sigmoid, b = -log(i+1) per row")
    d_bias = r["sigmoid, b = 0"]["loss"] - r["sigmoid, b = -log n"]["loss"]
    d_soft = r["sigmoid, b = -log n"]["loss"] - r["softmax"]["loss"]
    ev.record("loss(sigmoid, b = 0) − loss(sigmoid, b = −log n)", d_bias, expect="> 0")
    ev.record("loss(sigmoid, b = −log n) − loss(softmax)", d_soft, expect="≈ 0")
    ev.record("loss(sigmoid, b = 0) − loss(softmax)", r["sigmoid, b = 0"]["loss"] - r["softmax"]["loss"], key=False)
    ev.record("loss(sigmoid, −log(i+1) per row) − loss(sigmoid, b = −log n)",
              r["sigmoid, b = -log(i+1) per row"]["loss"] - r["sigmoid, b = -log n"]["loss"], expect="recorded")
    ev.record("attention share on position 0 / uniform, sigmoid b = -log n (each row over its own sum)",
              r["sigmoid, b = -log n"]["share"] / r["sigmoid, b = -log n"]["uniform"], key=False)
    # Seeds 100-139 (40 models per arm, b = -log n the constant -log T): loss(b = 0) - loss(-log n) 0.125 ± 0.027
    # (min 0.063), so > 0 holds at 4.6 sd; loss(-log n) - loss(softmax) -0.010 ± 0.026 (min -0.050, max 0.096), so
    # |.| < 0.1 is 4.3 sd from the mean and above the max; b = 0's own gap to softmax is 0.116 ± 0.040 (min 0.052): the
    # bound fails it in most models but not all, so the per-seed separation rests on d_bias. Per-row -log(i+1) minus the
    # constant: 0.022 ± 0.015 (recorded). (The first version trained the per-row variant as its -log n arm and bounded
    # |.| by 0.25, which the b = 0 arm passes too.)
    assert d_bias > 0
    assert abs(d_soft) < 0.1
# --8<-- [end:test_lm]


# --8<-- [start:test_path]
@pytest.mark.claim("C-GATE-1", "nuanced")
def test_without_the_gate_the_value_path_is_one_low_rank_linear_map(ev, seed):
    """With the attention weights held fixed, an ungated head maps its values to the output through one matrix
    W_V^h W_O^h for every query (rank ≤ d_head = 8 of 32), so the layer is additive in its value inputs (gap at
    rounding level). The gate keeps each matrix's rank ≤ d_head but makes it depend on the query token, and additivity
    fails. An identity of our module, checked from its weights; `value_path` reproduces the layer's own output. Would
    be refuted by an ungated map that varies across queries or a gated one that does not."""
    r = path_measurements(seed)
    for arm in ("no gate", "gate"):
        for k, v in r[arm].items():
            ev.record(f"{k}, {arm}", v, key=k in ("map spread over queries", "additivity gap"))
        assert r[arm]["reproduces the layer"] < 1e-12
        assert r[arm]["rank per head"] <= HS
    assert r["no gate"]["map spread over queries"] == 0.0 and r["no gate"]["additivity gap"] < 1e-12
    assert r["gate"]["map spread over queries"] > 0.1 and r["gate"]["additivity gap"] > 1e-3
# --8<-- [end:test_path]


# --8<-- [start:test_sink]
@pytest.mark.claim("C-GATE-1", "nuanced")
def test_the_output_gate_and_the_sink_on_position_0(ev, seed):
    """Texts start with BOS, so the softmax LM parks attention on position 0 (the sliding-window page's sink). The same
    LM with the G1 gate, equal steps and data: share on position 0, the largest activation in the residual stream, the
    mean gate. Qiu et al. tie the sink's removal to gates that are sparse (mostly near 0; their non-sparse control,
    gates in [0.5, 1], keeps the sink: Table 4 row 7); here the trained gates stay dense, near σ(0) = 1/2, and the toy
    does NOT reproduce the removal: the share with the gate goes up in some models and down in others (its spread over
    seeds is recorded, nothing about it is asserted). Would be refuted (the gate sparse on the toy too) by a mean gate
    below 0.35."""
    r = lm_results(seed)
    soft, gated = r["softmax"], r["gated"]
    for arm, m in (("softmax", soft), ("gated", gated)):
        ev.record(f"attention share on position 0 / uniform, {arm}", m["share"] / m["uniform"])
        ev.record(f"largest absolute activation per layer, mean over layers, {arm}", m["max act"])
        ev.record(f"held-out loss, {arm}", m["loss"], key=False)
    ev.record("mean gate value, gated", gated["gate"], expect="about 1/2: dense, not sparse")
    ev.record("log(share softmax / share gated)", math.log(soft["share"] / gated["share"]), expect="> 0 in some models")
    # Seeds 100-139 (40 models): mean gate 0.477 ± 0.012 (min 0.452, max 0.509), so (0.35, 0.65) is 10 sd either side;
    # share / uniform softmax 1.98 ± 0.73 (min 0.94), gated 1.80 ± 0.67 (min 0.98); log(softmax / gated) 0.095 ± 0.49
    # (min -0.84, max 1.13): the gate lowers the share in some models and raises it in others, so it is not asserted.
    assert 0.35 < gated["gate"] < 0.65
# --8<-- [end:test_sink]

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why several heads, and why split d_model among them?
#
# Proofs for `docs/attention/multi-head.md`. The switch is `n_heads` of the shared
# `MultiHeadAttention` at a fixed `d_model`: every head gets d_k = d_v = d_model / h.
# Costs are counted, not timed: parameters by `numel`, matrix-product FLOPs by
# `torch.utils.flop_counter.FlopCounterMode`, the softmax's work by the size of the
# weight tensor it normalises. Run: `pytest proofs/attention/proof_multi_head.py`.

# %%
from __future__ import annotations

from functools import cache

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from proofs.train import accuracy, fixed_batches, train
from proofs.transformer import EncoderTagger, MultiHeadAttention, TransformerConfig, record_attention

D_MODEL, BATCH, SEQ = 512, 2, 64  # the paper's width; every count below is exact for any B and T
HEADS = [1, 2, 4, 8]


# %% [markdown]
# ## 1. What one attention layer costs, for h heads at a fixed d_model
#
# The explicit path (`record_attention`) is counted: on CPU, `FlopCounterMode` does not
# count the fused `scaled_dot_product_attention` kernel, which does the same products.
# Modules and inputs live on the `meta` device: tensors with shapes and no numbers, so
# counting the paper-sized layer computes nothing.

# %%
# --8<-- [start:cost]
def attention_cost(make, d_model: int = D_MODEL, batch: int = BATCH, seq: int = SEQ) -> dict:
    """Parameters, matmul FLOPs (projections; QKᵀ and weights·V) and softmax entries of one self-attention call."""
    with torch.device("meta"):  # shapes only: FLOPs and sizes follow from shapes
        attn, x = make(), torch.randn(batch, seq, d_model)
    with FlopCounterMode(display=False) as fc, torch.no_grad(), record_attention(attn) as mods:
        attn(x)
    ops = {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}
    return {
        "params": sum(p.numel() for p in attn.parameters()),
        "proj_flops": ops.get("aten.addmm", 0) + ops.get("aten.mm", 0),  # x W_Q, x W_K, x W_V, concat W_O
        "core_flops": ops.get("aten.bmm", 0),  # Q Kᵀ and weights · V, all heads
        "softmax_entries": sum(m.weights.numel() for m in mods),  # B · h · T²: what scale + softmax touch
    }


def split_heads(h: int, d_model: int = D_MODEL, **switches) -> MultiHeadAttention:
    """The paper's layout: h heads of d_k = d_model / h, one fused matrix per role."""
    return MultiHeadAttention(TransformerConfig(d_model=d_model, n_heads=h, **switches)).eval()
# --8<-- [end:cost]


# %% [markdown]
# ## 2. The alternative: h heads that each keep the full width
#
# A head of size d_model maps d_model → d_model for each of Q, K, V, and W_O reads
# h·d_model channels. Concat(head_1, …, head_h) W_O = Σ_i head_i W_O^i, where W_O^i is the
# i-th block of rows of W_O; so h one-head attentions of the shared module with their
# outputs summed are exactly that layer (without biases, so no bias is counted h times).

# %%
# --8<-- [start:full_width]
class FullWidthHeads(nn.Module):
    """h heads with d_k = d_v = d_model each: h one-head shared attentions, outputs summed (= concat then W_O)."""

    def __init__(self, h: int, d_model: int = D_MODEL):
        super().__init__()
        cfg = TransformerConfig(d_model=d_model, n_heads=1, bias=False)
        self.heads = nn.ModuleList(MultiHeadAttention(cfg) for _ in range(h))

    def forward(self, x):
        return sum(head(x) for head in self.heads)  # Σ_i head_i W_O^i
# --8<-- [end:full_width]


# %% [markdown]
# ## 3. The paper's 3h + 1 matrices are the module's four, cut into heads
#
# §3.2.2 writes head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) with W_i^Q ∈ ℝ^{d_model × d_k}.
# The module keeps one d_model × d_model matrix per role; cutting its rows into blocks of d_k
# (nn.Linear stores Wᵀ, output channels as rows) gives the per-head maps.

# %%
# --8<-- [start:per_head]
def cut_into_heads(attn: MultiHeadAttention) -> tuple[list[tuple[nn.Linear, nn.Linear, nn.Linear]], nn.Linear]:
    """W_Q^i, W_K^i, W_V^i (d_model → d_k) for every head i, cut from the fused maps, and the one W_O."""
    dk = attn.d_head

    def cut(lin: nn.Linear, i: int) -> nn.Linear:
        part = nn.Linear(lin.in_features, dk, bias=lin.bias is not None, dtype=lin.weight.dtype)
        with torch.no_grad():
            part.weight.copy_(lin.weight[i * dk:(i + 1) * dk])  # rows i·d_k … (i+1)·d_k − 1
            if lin.bias is not None:
                part.bias.copy_(lin.bias[i * dk:(i + 1) * dk])
        return part

    heads = [(cut(attn.w_q, i), cut(attn.w_k, i), cut(attn.w_v, i)) for i in range(attn.n_heads)]
    return heads, attn.w_o


def paper_multi_head(x, heads, w_o):
    """MultiHead(x) = Concat(head_1, …, head_h) W_O, head_i = softmax(x W_Q^i (x W_K^i)ᵀ / √d_k) x W_V^i."""
    outs = []
    for wq, wk, wv in heads:  # one head at a time, as the paper writes it
        q, k, v = wq(x), wk(x), wv(x)  # (B, T, d_k) each
        weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)  # (B, T, T)
        outs.append(weights @ v)
    return w_o(torch.cat(outs, dim=-1))  # (B, T, h·d_v) → (B, T, d_model)
# --8<-- [end:per_head]


# %% [markdown]
# ## 4. A task that needs two relations at once
#
# Inputs are n = 4 symbols; the target at t is the *ordered* pair (x[t−1], x[t+1]), one of
# n² tokens (at the two ends the missing neighbour is the token itself). One encoder layer,
# so the two lookups must happen in one attention sub-layer: with two layers one head could
# fetch one neighbour per layer. d_model = 32, the same for both arms: 1 head of 32 against
# 2 heads of 16. 400 Adam steps at learning rate 6e-3, batch 32, length 10; same seed and batches
# for both arms, each trained once per seed (cached). 400 and not 300: at 300 steps the one-head run
# of seed 0 was still at a training loss of 0.64 when training stopped (accuracy 0.83), a run cut
# short rather than one that cannot learn; at 400 it is at 0.09 (accuracy 0.98).

# %%
N_SYMBOLS, T = 4, 10
VOCAB = N_SYMBOLS**2 + 1  # token 0 unused; 1..n inputs; 1..n² pair targets
OFFSETS = [-2, -1, 0, 1, 2]  # key offset j − t shown in the attention profiles


# --8<-- [start:task]
def neighbours_task(g: torch.Generator, batch: int, length: int, vocab: int = VOCAB):
    """Target at t = the ordered pair (x[t−1], x[t+1]) as one token in 1..n²."""
    x = torch.randint(1, N_SYMBOLS + 1, (batch, length), generator=g)
    t = torch.arange(length)
    left, right = x[:, (t - 1).clamp(min=0)], x[:, (t + 1).clamp(max=length - 1)]
    return x, 1 + (left - 1) * N_SYMBOLS + (right - 1)


def attention_profile(model: EncoderTagger, x) -> torch.Tensor:
    """(h, 5): mean weight each head puts on offsets −2 … +2, over positions that have all five."""
    with torch.no_grad(), record_attention(model) as mods:
        model(x)
    w = mods[0].weights  # (B, h, T, T)
    t = torch.arange(2, x.shape[1] - 2)
    return torch.stack([w[:, :, t, t + o].mean((0, 2)) for o in OFFSETS], dim=-1)


def equalised_neighbours(model: EncoderTagger, x) -> dict:
    """Accuracy on the ordered pair, and on the reversed pair, at positions whose two neighbours differ: as trained,
    and with every head's weights on t−1 and t+1 both set to their mean (all other weights untouched)."""
    attn = next(m for m in model.modules() if isinstance(m, MultiHeadAttention))
    t = torch.arange(1, x.shape[1] - 1)  # positions with both neighbours
    left, right = x[:, t - 1], x[:, t + 1]
    pair, reversed_pair, differ = 1 + (left - 1) * N_SYMBOLS + (right - 1), 1 + (right - 1) * N_SYMBOLS + (left - 1), left != right

    def mix_equal(a, v, pos=None):  # wraps the module's own mix; only the two neighbour weights change
        a = a.clone()
        a[..., t, t - 1] = a[..., t, t + 1] = (a[..., t, t - 1] + a[..., t, t + 1]) / 2
        return MultiHeadAttention.mix(attn, a, v, pos)

    out = {}
    for name, mix in (("trained", None), ("equalised", mix_equal)):
        if mix is not None:
            attn.mix = mix  # instance attribute: read by the explicit path, which record_attention selects
        try:
            with torch.no_grad(), record_attention(model):
                pred = model.eval()(x).argmax(-1)[:, t]
        finally:
            attn.__dict__.pop("mix", None)
        out[name] = {"pair": (pred == pair)[differ].float().mean().item(),
                     "reversed": (pred == reversed_pair)[differ].float().mean().item()}
    return out


@cache
def train_heads(n_heads: int, seed: int, d_model: int = 32, steps: int = 400) -> dict:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=d_model, n_heads=n_heads, d_ff=2 * d_model, n_layers=1,
                            dropout_emb=0.0, dropout_residual=0.0)
    model = EncoderTagger(cfg)
    log = train(model, fixed_batches(neighbours_task, 100 + seed, batch=32, length=T, vocab=VOCAB), steps, lr=6e-3)
    x, y = neighbours_task(torch.Generator().manual_seed(10_000 + seed), 512, T)
    smooth = [sum(log.loss[i:i + 20]) / 20 for i in range(steps - 19)]  # 20-step running mean of the loss
    return {
        "acc": accuracy(model, x, y),
        "steps_to_fit": next((i + 20 for i, v in enumerate(smooth) if v < 0.3), steps),  # first time below 0.3
        "loss": smooth,
        "profile": attention_profile(model, x),
        "equalised": equalised_neighbours(model, x),
    }
# --8<-- [end:task]


# %%
if __name__ == "__main__":
    for h in HEADS:
        print(h, attention_cost(lambda h=h: split_heads(h)))
    print(train_heads(1, 0)["acc"], train_heads(2, 0)["acc"])


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_cost]
@pytest.mark.claim("C-MHA-2", "confirmed")
@pytest.mark.claim("C-FOLK-8", "refuted")
def test_splitting_heads_keeps_parameters_and_matmul_flops(ev, seed):
    """Counts of our module (parameters by numel, matrix-product FLOPs by FlopCounterMode on shapes alone): at fixed
    d_model, 1, 2, 4 or 8 heads have the same parameters and the same matmul FLOPs; only the softmax, B·h·T²
    entries, grows with h. Would be refuted if any count fell as h grows (C-FOLK-8) or depended on h (C-MHA-2)."""
    torch.manual_seed(seed)
    costs = {h: attention_cost(lambda h=h: split_heads(h)) for h in HEADS}
    B, T, d = BATCH, SEQ, D_MODEL
    for h, c in costs.items():
        ev.record(f"parameters, h={h}", c["params"], expect="4·d² + 4·d for every h", key=h in (1, 8))
        ev.record(f"projection FLOPs, h={h}", c["proj_flops"], expect="2·4·B·T·d²", key=False)
        ev.record(f"QKᵀ + weights·V FLOPs, h={h}", c["core_flops"], expect="2·2·B·h·T²·d_k = 4·B·T²·d", key=h in (1, 8))
        ev.record(f"softmax entries, h={h}", c["softmax_entries"], expect="B·h·T²: grows with h", key=h in (1, 8))
    total = {h: c["proj_flops"] + c["core_flops"] for h, c in costs.items()}
    ev.record("softmax entries / matmul FLOPs, h=8", costs[8]["softmax_entries"] / total[8],
              expect="< 1%: a few elementwise ops per entry")
    for c in costs.values():
        assert c["params"] == 4 * d * d + 4 * d
        assert c["proj_flops"] == 2 * 4 * B * T * d * d
        assert c["core_flops"] == 2 * 2 * B * T * T * d  # B·h·T²·d_k multiply-adds, twice, with h·d_k = d
        assert c["softmax_entries"] > 0
    assert len({c["params"] for c in costs.values()}) == 1 and len(set(total.values())) == 1  # C-MHA-2
    for h in HEADS:  # C-FOLK-8: no saving anywhere; the elementwise work grows
        assert total[h] >= total[1] and costs[h]["softmax_entries"] == h * costs[1]["softmax_entries"]
    assert costs[8]["softmax_entries"] / total[8] < 0.01
# --8<-- [end:test_cost]


@pytest.mark.claim("C-MHA-3", "confirmed")
def test_full_width_heads_multiply_the_cost_by_h(ev, seed):
    """Counts of our module: h heads that each keep d_k = d_model cost exactly h times the split layer, in parameters
    and FLOPs. An identity of construction (h copies of the one-head layer, whose cost C-MHA-2 shows equals the split
    layer's): what it checks is that the counter, the module and the formula 4hd², h(8BTd² + 4BT²d) agree. Would be
    refuted if the ratio were anything but h."""
    torch.manual_seed(seed)
    d = D_MODEL
    split = {h: attention_cost(lambda h=h: split_heads(h, bias=False)) for h in HEADS}
    full = {h: attention_cost(lambda h=h: FullWidthHeads(h)) for h in HEADS}
    for h in HEADS:
        flops_full = full[h]["proj_flops"] + full[h]["core_flops"]
        flops_split = split[h]["proj_flops"] + split[h]["core_flops"]
        ev.record(f"parameters, full-width / split, h={h}", full[h]["params"] / split[h]["params"], expect=f"{h}",
                  key=h == 8)
        ev.record(f"FLOPs, full-width / split, h={h}", flops_full / flops_split, expect=f"{h}", key=h == 8)
        assert full[h]["params"] == h * split[h]["params"] == h * 4 * d * d
        assert flops_full == h * flops_split
    # The score/mix part of full-width heads is that of a layer with d_model' = h·d, n_heads = h (heads of d):
    wide = attention_cost(lambda: split_heads(8, d_model=8 * d, bias=False), d_model=8 * d)
    ev.record("QKᵀ + weights·V FLOPs, 8 full-width heads / layer with d_model'=8·d, 8 heads",
              full[8]["core_flops"] / wide["core_flops"], expect="1")
    assert full[8]["core_flops"] == wide["core_flops"]
    # Same output as one multi-head layer whose W_O reads h·d channels: concat then W_O = Σ_i head_i W_O^i.
    layer = FullWidthHeads(2, d_model=16).eval()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        concat = []
        for h in layer.heads:  # head_i with d_k = d_v = d_model = 16
            q, k, v = x @ h.w_q.weight.T, x @ h.w_k.weight.T, x @ h.w_v.weight.T
            concat.append(torch.softmax(q @ k.transpose(-2, -1) / 16**0.5, -1) @ v)
        w_o = torch.cat([h.w_o.weight.T for h in layer.heads], dim=0)  # (h·d, d): the blocks W_O^i stacked
        err = (torch.cat(concat, -1) @ w_o - layer(x)).abs().max().item()
    ev.record("max |concat·W_O − Σ_i head_i W_O^i|", err, expect="float rounding")
    assert err < 1e-5


# --8<-- [start:test_per_head]
@pytest.mark.claim("C-MHA-4", "confirmed")
def test_per_head_matrices_are_the_fused_matrix_cut_into_heads(ev, seed):
    """The paper's 3h+1 matrices, cut from the module's four, give the module's output (exact up to float64
    rounding: an identity of our module, by construction). Would be refuted if the outputs differed beyond
    rounding or the matrix count were not 3h+1."""
    torch.manual_seed(seed)
    h = 8
    attn = MultiHeadAttention(TransformerConfig(d_model=64, n_heads=h)).double().eval()
    heads, w_o = cut_into_heads(attn)
    x = torch.randn(4, 12, 64, dtype=torch.float64)
    with torch.no_grad():
        err = (paper_multi_head(x, heads, w_o) - attn(x)).abs().max().item()
    matrices = [m for triple in heads for m in triple] + [w_o]
    ev.record("matrices in the paper's form, h=8", len(matrices), expect="3h + 1 = 25")
    ev.record("parameters, per-head form / fused form", sum(p.numel() for m in matrices for p in m.parameters())
              / sum(p.numel() for p in attn.parameters()), expect="1")
    ev.record("max |per-head − fused| output, float64", err, expect="≈ 1e-16: the same function")
    assert len(matrices) == 3 * h + 1
    assert all(m.weight.shape == (8, 64) for triple in heads for m in triple)  # each W^i: d_model → d_k
    assert sum(p.numel() for m in matrices for p in m.parameters()) == sum(p.numel() for p in attn.parameters())
    assert err < 1e-12
# --8<-- [end:test_per_head]


def _plot(ev, one: dict, two: dict) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(13, 3), gridspec_kw={"width_ratios": [1.6, 1, 1, 1]})
    axes[0].plot(one["loss"], "-", color="C0", label="1 head of 32")
    axes[0].plot(two["loss"], "--", color="C1", label="2 heads of 16")
    axes[0].set(title="training loss (20-step mean)", xlabel="step", yscale="log")
    axes[0].legend()
    panels = [(one["profile"][0], "1-head model"), (two["profile"][0], "2-head model, head 1"),
              (two["profile"][1], "2-head model, head 2")]
    for ax, (p, title) in zip(axes[1:], panels):
        ax.bar(OFFSETS, p.tolist(), color=["C7", "C2", "C7", "C3", "C7"])
        ax.set(title=title, xlabel="key offset j − t", ylim=(0, 0.7), xticks=OFFSETS)
    axes[1].set_ylabel("mean attention weight")
    fig.tight_layout()
    ev.figure(fig, "heads", "Left: training loss of the neighbour-pair task, one head of 32 against two heads of 16. "
                           "Right: where each head of the trained models looks (green: t−1, red: t+1).")


# --8<-- [start:test_heads]
@pytest.mark.claim("C-MHA-1", "nuanced")
def test_one_head_mixes_two_relations_and_still_learns(ev, seed):
    """Two relations at once (left and right neighbour): one head of the same total width splits its softmax
    between them, with unequal weights, and learns the task about as well as two heads. A run whose training loss is
    still above 0.3 when training stops did not fit within the budget; such a run (of either arm) is restarted once
    from another initialisation, and the restart is recorded. Would be confirmed as stated (one head mixes them less
    well) if the one-head model fell clearly behind, refuted on the mechanism if the one head did not put weight on
    both neighbours, or if giving t−1 and t+1 the same weight left the ordered pair readable (then the order would
    come from somewhere other than the unequal weights)."""
    two = train_heads(2, seed)
    one = train_heads(1, seed)
    if one["loss"][-1] > THRESHOLDS_HEADS["fitted"]:  # a run that did not fit in the budget: one restart
        ev.record("1 head: the first initialisation did not fit; its final training loss", one["loss"][-1], key=False)
        one = train_heads(1, seed + 1000)
    if two["loss"][-1] > THRESHOLDS_HEADS["fitted"]:  # the same rule for the other arm
        ev.record("2 heads: the first initialisation did not fit; its final training loss", two["loss"][-1], key=False)
        two = train_heads(2, seed + 1000)
    _plot(ev, one, two)
    left, right = OFFSETS.index(-1), OFFSETS.index(1)
    p = one["profile"][0]
    ev.record("test accuracy, 1 head of 32", one["acc"], expect="≈ 1: one head suffices")
    ev.record("test accuracy, 2 heads of 16", two["acc"], expect="≈ 1")
    ev.record("accuracy, 2 heads − 1 head", two["acc"] - one["acc"], expect="small", key=False)
    ev.record("1 head: weight on t−1, t+1", [round(p[left].item(), 3), round(p[right].item(), 3)],
              expect="both neighbours, unequal weights")
    ev.record("1 head: smaller neighbour weight", min(p[left], p[right]).item(), key=False)
    ev.record("1 head: smaller neighbour weight − largest weight at offset ±2",
              min(p[left], p[right]).item() - max(p[OFFSETS.index(-2)], p[OFFSETS.index(2)]).item(), key=False)
    ev.record("1 head: |weight on t−1 − weight on t+1|", abs(p[left] - p[right]).item(), key=False)
    eq = one["equalised"]
    ev.record("1 head, neighbours differ: ordered pair right, as trained", eq["trained"]["pair"], key=False)
    ev.record("1 head, t−1 and t+1 given their mean weight: ordered pair right", eq["equalised"]["pair"],
              expect="≈ ½: the order is lost")
    ev.record("1 head, t−1 and t+1 given their mean weight: reversed pair", eq["equalised"]["reversed"],
              expect="≈ ½: the other half")
    ev.record("1 head, t−1 and t+1 given their mean weight: either order", eq["equalised"]["pair"]
              + eq["equalised"]["reversed"], expect="≈ 1: the two symbols are still read", key=False)
    lean = [(two["profile"][i, left] - two["profile"][i, right]).item() for i in range(2)]
    ev.record("2 heads: weight on t−1 minus weight on t+1, per head", [round(v, 3) for v in lean],
              expect="opposite signs = the heads split the neighbours")
    ev.record("2 heads lean opposite ways (1 = yes; its mean over seeds is the share)", float(lean[0] * lean[1] < 0))
    ev.record("steps to training loss < 0.3, 1 head", one["steps_to_fit"])
    ev.record("steps to training loss < 0.3, 2 heads", two["steps_to_fit"])
    ev.record("steps to fit, 1 head − 2 heads (> 0: two heads faster)", one["steps_to_fit"] - two["steps_to_fit"],
              key=False)
    ev.record("training loss over the last 20 steps, 1 head", one["loss"][-1], key=False)
    ev.record("training loss over the last 20 steps, 2 heads", two["loss"][-1], key=False)
    # thresholds: THRESHOLDS_HEADS, from the spread over seeds 100-139 (comment there)
    assert min(p[left], p[right]) > THRESHOLDS_HEADS["both neighbours"]  # one softmax takes both neighbours ...
    assert min(p[left], p[right]) - max(p[OFFSETS.index(-2)], p[OFFSETS.index(2)]) > THRESHOLDS_HEADS["beyond ±2"]
    assert abs(p[left] - p[right]) > THRESHOLDS_HEADS["unequal"]  # ... with unequal weights: the order stays readable
    assert one["loss"][-1] < THRESHOLDS_HEADS["fitted"]  # fitted, after at most one restart
    assert one["acc"] > THRESHOLDS_HEADS["one head learns"]
    assert two["acc"] - one["acc"] < THRESHOLDS_HEADS["close to two heads"]
    # the order is read from the inequality: with equal weights the ordered pair becomes a coin flip between the two
    # orders, while the two symbols themselves are still read
    assert eq["equalised"]["pair"] < THRESHOLDS_HEADS["equal weights: ordered pair"]
    assert eq["equalised"]["pair"] + eq["equalised"]["reversed"] > THRESHOLDS_HEADS["equal weights: either order"]


# Thresholds, from seeds 100-139 at 400 steps (one seed per value, as in the test; seed 0 in brackets): smaller
# neighbour weight 0.213 ± 0.007 (min 0.190) [0.224], threshold 0.1; smaller neighbour weight minus the largest weight
# at offset ±2 0.155 ± 0.010 (min 0.123), threshold 0.05; |left − right| 0.193 ± 0.014 (min 0.171), threshold 0.05;
# accuracy of one head 0.980 ± 0.019 (min 0.906) [0.976], threshold 0.8; two heads − one head 0.010 ± 0.022
# (max 0.057) [0.007], threshold 0.1 (4.1 sd); final training loss (20-step mean) of one head 0.071 ± 0.048
# (max 0.21) [0.09], of two heads 0.025 ± 0.032 (max 0.11): a run above 0.3 (4.8 sd above the one-head mean) has
# not fitted and is restarted once; no run of the sweep needed it. At 300 steps seed 0's one-head run ended at loss
# 0.64 (accuracy 0.83, about 7 sd below the 0.975 mean of a 20-seed sweep at 300 steps): a run cut short, hence 400
# steps and a restart rule on the loss, not on the accuracy. A one-head model that fails to fit twice still fails the test.
# Recorded, not asserted: the two heads lean opposite ways on 37 of the 40 seeds (not on seed 0, where one head
# mixes both neighbours like the single head: leans [0.205, 0.037]); two heads reach a training loss below 0.3
# sooner on most seeds (one head − two heads: 30 ± 39 steps, from −33 to 128) [103].
# Equal weights on t−1 and t+1 in the trained one-head model (positions whose neighbours differ): ordered pair right
# 0.482 ± 0.018 (max 0.505) [0.412], threshold 0.7 (12 sd above the mean); ordered or reversed pair 0.981 ± 0.035
# (min 0.82) [0.84], threshold 0.6 (11 sd below). As trained: 0.980 ± 0.020 (min 0.91). The same intervention on
# t−2 and t+2 instead leaves the ordered pair at 0.97 on seed 0, which fails the first threshold: the test tells them apart.
THRESHOLDS_HEADS = {"fitted": 0.3, "both neighbours": 0.1, "beyond ±2": 0.05, "unequal": 0.05, "one head learns": 0.8,
                    "close to two heads": 0.1, "equal weights: ordered pair": 0.7, "equal weights: either order": 0.6}
# --8<-- [end:test_heads]

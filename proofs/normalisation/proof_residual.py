# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why residual connections?
#
# Proofs for the page `docs/normalisation/residual-connections.md`. Every function
# below builds the shared module (`proofs/transformer/`) and flips one switch:
# `residual` (True: x + f(x) around every sub-layer; False: f(x) alone). Some
# measurements also set `norm="none"` to show a stack without any normalisation.
# Run it with `pytest proofs/normalisation/proof_residual.py`, or open it as a
# notebook with `jupytext --to notebook proofs/normalisation/proof_residual.py`.

# %%
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from proofs.tasks import lookup_task
from proofs.train import accuracy, fixed_batches, token_loss, train
from proofs.transformer import EncoderLayer, EncoderTagger, TransformerConfig

DEPTHS = [1, 2, 4, 8, 16]  # encoder layers swept at initialisation
DEEP = 4  # the "deep" stack of the LayerNorm measurements and of the training test
V = 16  # vocabulary: token 0 is padding, 1..15 are real tokens


def tiny(n_layers: int, **switches) -> TransformerConfig:
    """d_model 32, 4 heads, dropout off: the stack whose depth we vary."""
    return TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=n_layers,
                             dropout_emb=0.0, dropout_residual=0.0).replace(**switches)


# %% [markdown]
# ## 1. What reaches the first layer at initialisation
#
# One batch, one backward pass of the token loss. We compare the gradient at the
# input of the stack (what the first layer receives) with the gradient at its
# output (what the last layer receives): the ratio is 1 when the stack passes the
# gradient on unchanged. We also measure how different the tokens still are when
# they leave the stack: the part of the output that is not the sequence mean.

# %%
# --8<-- [start:gradient]
def stack_gradient(seed: int, n_layers: int, **switches) -> dict:
    """||dL/d(input of layer 1)|| / ||dL/d(output of the last layer)|| and the tokens' spread at the output."""
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(n_layers, **switches))
    x, y = lookup_task(torch.Generator().manual_seed(seed), 16, 8, V)
    h0 = model.embed(x)  # (B, T, C): what the first layer receives
    h0.retain_grad()
    hL = model.encoder(h0)  # (B, T, C): what leaves the last layer
    hL.retain_grad()
    token_loss(model.head(hL), y).backward()
    centred = hL - hL.mean(dim=1, keepdim=True)  # what distinguishes one token from the others
    return {
        "grad_ratio": (h0.grad.norm() / hL.grad.norm()).item(),
        "token_spread": (centred.norm() / hL.norm()).item(),  # 0: every token left the stack as the same vector
    }


class KeepInput(torch.nn.Module):
    """Stands in for a layer's self-attention: returns its input, so no token reads any other."""

    def forward(self, h, **_):
        return h


def spread_without_attention(seed: int, n_layers: int) -> float:
    """The tokens' spread after the no-residual LayerNorm stack with every attention replaced by its input
    (LayerNorm and FFN only): the control that tells whether attention is what makes the tokens identical."""
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(n_layers, residual=False))
    for layer in model.encoder.layers:
        layer.self_attn = KeepInput()
    x, _ = lookup_task(torch.Generator().manual_seed(seed), 16, 8, V)
    with torch.no_grad():
        hL = model.encoder(model.embed(x))
    return ((hL - hL.mean(dim=1, keepdim=True)).norm() / hL.norm()).item()
# --8<-- [end:gradient]


# %% [markdown]
# ## 2. Training a deep stack with and without residuals
#
# Four Post-LN layers learn the lookup above for 50 Adam steps (lr 2e-3). The
# one-layer stack is the control: the task itself is easy without residuals.

# %%
# --8<-- [start:train]
def lookup_accuracy(seed: int, n_layers: int, steps: int = 50, **switches) -> float:
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(n_layers, **switches))
    train(model, fixed_batches(lookup_task, 1000 + seed, batch=16, length=8, vocab=V), steps, lr=2e-3)
    x, y = lookup_task(torch.Generator().manual_seed(10_000 + seed), 256, 8, V)
    return accuracy(model, x, y)
# --8<-- [end:train]


# %% [markdown]
# ## 3. The paper's sub-layer, computed by hand
#
# §3.1: the output of each sub-layer is LayerNorm(x + Sublayer(x)). We take one
# encoder layer of the shared module (Post-LN, dropout off), give its LayerNorms
# random gains and biases, and recompute its output from the formula with a
# LayerNorm written out by hand.

# %%
# --8<-- [start:by_hand]
def layer_norm_by_hand(z: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = z.mean(-1, keepdim=True)
    var = z.var(-1, unbiased=False, keepdim=True)  # over the d_model features of one token
    return (z - mean) / torch.sqrt(var + eps) * gain + bias


def post_ln_by_hand(layer: EncoderLayer, x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm(x + Sublayer(x)) twice: self-attention, then the feed-forward network."""
    n1, n2 = layer.sub_attn.norm, layer.sub_ffn.norm
    h = layer_norm_by_hand(x + layer.self_attn(x), n1.weight, n1.bias, eps)
    return layer_norm_by_hand(h + layer.ffn(h), n2.weight, n2.bias, eps)
# --8<-- [end:by_hand]


def random_layer(seed: int, **switches) -> EncoderLayer:
    torch.manual_seed(seed)
    layer = EncoderLayer(tiny(1, **switches)).eval()
    with torch.no_grad():  # non-trivial gains and biases, so the check cannot pass by accident
        for p in layer.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p))
    return layer


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    for depth in DEPTHS:
        print(depth, stack_gradient(0, depth), stack_gradient(0, depth, residual=False))
    print(DEEP, "layers:", lookup_accuracy(0, DEEP), "without residuals:", lookup_accuracy(0, DEEP, residual=False))


# %% [markdown]
# ## Tests: each asserts the difference the switch makes

# %%
def _plot(ev, rows):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    styles = {("layer", True): ("o-", "LayerNorm, residual"), ("layer", False): ("s--", "LayerNorm, no residual"),
              ("none", True): ("^-", "no norm, residual"), ("none", False): ("v--", "no norm, no residual")}
    for arm, (style, label) in styles.items():
        worst = [min(r[arm]["grad_ratio"] for r in rows[d]) for d in DEPTHS]
        best = [max(r[arm]["grad_ratio"] for r in rows[d]) for d in DEPTHS]
        line, = axes[0].semilogy(DEPTHS, worst, style, label=label)
        axes[0].fill_between(DEPTHS, worst, best, color=line.get_color(), alpha=0.15)
        if arm[0] == "layer":
            axes[1].semilogy(DEPTHS, [max(r[arm]["token_spread"] for r in rows[d]) for d in DEPTHS], style, label=label)
    axes[0].axhline(1, color="grey", lw=0.8)
    axes[0].set(title="gradient at layer 1 / gradient at the top", xlabel="layers")
    axes[1].set(title="tokens' spread at the output (largest of 3 seeds)", xlabel="layers")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "depth", "Left: how much of the gradient reaches the first layer, against depth (band: 3 seeds). "
                            "Right: the part of the output that still differs between tokens.")


@functools.cache
def init_sweep(seed: int) -> dict:
    """stack_gradient for every depth and arm (norm layer/none x residual on/off) at one seed (cached)."""
    return {(d, norm, res): stack_gradient(seed, d, norm=norm, residual=res)
            for d in DEPTHS for norm in ("layer", "none") for res in (True, False)}


# --8<-- [start:test_gradient]
@pytest.mark.claim("C-RES-1", "nuanced")
def test_residuals_and_the_gradient_at_initialisation(ev, seed):
    """Without any norm, dropping the residuals makes the gradient reaching layer 1 vanish geometrically with
    depth (with them it does not vanish; it explodes). With LayerNorm its size survives 4 layers either way, but
    without residuals every token leaves the stack as the same vector. Would refute "residuals are there to stop
    vanishing gradients" outright if the plain stack's gradient did not vanish, and would make the page's nuance
    wrong if the LayerNorm stack's gradient vanished without residuals or its tokens stayed distinct."""
    seeds = [seed, seed + 1, seed + 2]
    sweeps = [init_sweep(s) for s in seeds]
    rows = {d: [{(norm, res): sw[d, norm, res] for norm in ("layer", "none") for res in (True, False)}
                for sw in sweeps] for d in DEPTHS}
    _plot(ev, rows)

    def stat(d, norm, res, key):
        return [sw[d, norm, res][key] for sw in sweeps]

    # Without normalisation: the classic picture.
    plain, plain_res = stat(16, "none", False, "grad_ratio"), stat(16, "none", True, "grad_ratio")
    ev.record("grad ratio, 16 layers, no norm, no residual (3 seeds)", plain, expect="vanishes")
    ev.record("grad ratio, 16 layers, no norm, residual (3 seeds)", plain_res, expect="does not vanish (it explodes: no norm)")
    # over seeds 100-139 (one seed each): no residual 6e-4 (max 2.8e-3), residual at least 6e5: magnitudes spread
    # over decades, so the margin that counts is the factor (above 3 to the largest value, 10^5 to the smallest)
    assert max(plain) < 1e-2 and min(plain_res) > 1.0
    # With LayerNorm (the paper's Post-LN): the size of the gradient survives DEEP layers either way ...
    ln_res, ln_plain = stat(DEEP, "layer", True, "grad_ratio"), stat(DEEP, "layer", False, "grad_ratio")
    ev.record(f"grad ratio, {DEEP} layers, LayerNorm, residual (3 seeds)", ln_res, expect="order 1")
    ev.record(f"grad ratio, {DEEP} layers, LayerNorm, no residual (3 seeds)", ln_plain,
              expect="order 1: no vanishing at this depth")
    # over seeds 100-139 (one seed each): residual 0.78 ± 0.17 (min 0.51), no residual 0.69 ± 0.25 (min 0.26);
    # the mean of three seeds has sd ≈ 0.10 and 0.15: 0.1 is more than 4 sd below both
    assert sum(ln_res) / 3 > 0.1 and sum(ln_plain) / 3 > 0.1
    # ... but without residuals every token leaves the stack as the same vector.
    spread_res, spread_plain = stat(DEEP, "layer", True, "token_spread"), stat(DEEP, "layer", False, "token_spread")
    ev.record(f"tokens' spread after {DEEP} layers, residual (3 seeds)", spread_res, expect="tokens still differ")
    ev.record(f"tokens' spread after {DEEP} layers, no residual (3 seeds)", spread_plain, expect="≈ 0: all tokens identical")
    # over seeds 100-139: residual 0.30 ± 0.06 (min 0.18; 0.05 is 4.2 sd below the mean), no residual 2e-7 (max 2e-6)
    assert min(spread_res) > 0.05 and max(spread_plain) < 1e-3
    # Control: the same no-residual stack with attention replaced by its input (LayerNorm + FFN only, no token reads
    # another). If the tokens stay apart, the collapse comes from attention's averaging, not from the LN/FFN chain.
    spread_no_attn = [spread_without_attention(s, DEEP) for s in seeds]
    ev.record(f"tokens' spread after {DEEP} layers, no residual, attention replaced by its input (3 seeds)",
              spread_no_attn, expect="tokens still differ: attention does the collapsing")
    # THRESHOLD_NO_ATTN: from the spread over seeds 100-139 (comment there)
    assert min(spread_no_attn) > THRESHOLD_NO_ATTN


# Spread after 4 no-residual layers with attention replaced by its input, seeds 100-139 (one seed each):
# 0.47 ± 0.08, min 0.34, max 0.70 (against ≈ 1e-7 with attention); 0.1 is 4.6 sd below the mean.
THRESHOLD_NO_ATTN = 0.1
# --8<-- [end:test_gradient]


# --8<-- [start:test_train]
@pytest.mark.claim("C-RES-1", "nuanced")
def test_without_residuals_a_deep_stack_does_not_train(ev, seed):
    """With LayerNorm, 4 layers without residuals stay near chance on the lookup task after the budget in which the
    same stack with residuals learns it, and one layer without residuals learns it too. Would contradict the page
    if the deep stack without residuals learned the task (then the collapse of the tokens would not matter)."""
    deep, deep_plain = lookup_accuracy(seed, DEEP), lookup_accuracy(seed, DEEP, residual=False)
    shallow_plain = lookup_accuracy(seed, 1, residual=False)
    ev.record(f"lookup accuracy, {DEEP} layers, residual", deep, expect="learns")
    ev.record(f"lookup accuracy, {DEEP} layers, no residual", deep_plain, expect="stalls near chance (1/15)")
    ev.record("lookup accuracy, 1 layer, no residual", shallow_plain, expect="learns: the task is easy")
    # over seeds 100-139: residual 1.000 (min 0.999), no residual 0.138 ± 0.016 (max 0.173; 0.3 is 10 sd above),
    # one layer without residual 0.981 ± 0.011 (min 0.949; 0.9 is 7 sd below)
    assert deep > 0.9 and shallow_plain > 0.9 and deep_plain < 0.3
# --8<-- [end:test_train]


# --8<-- [start:test_formula]
@pytest.mark.claim("C-RES-2", "confirmed")
def test_post_ln_sublayer_is_the_papers_formula(ev, seed):
    """The module's default layer equals LayerNorm(x + Sublayer(x)) computed by hand; Pre-LN does not; widths must match."""
    cfg = tiny(1)
    x = torch.randn(4, 10, cfg.d_model, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        post = random_layer(seed)
        diff_post = (post(x) - post_ln_by_hand(post, x, cfg.norm_eps)).abs().max().item()
        pre = random_layer(seed, norm_position="pre")  # the same weights, the other switch position
        diff_pre = (pre(x) - post_ln_by_hand(pre, x, cfg.norm_eps)).abs().max().item()
        # every sub-layer maps d_model to d_model, so x + Sublayer(x) is defined
        widths = {post.self_attn(x).shape[-1], post.ffn(x).shape[-1], x.shape[-1]}
    ev.record("max |module − LayerNorm(x + Sublayer(x))|, Post-LN", diff_post, expect="0 (float32 rounding)")
    ev.record("max |module − that formula|, Pre-LN", diff_pre, expect="large: a different function")
    ev.record("widths of x, Attention(x), FFN(x)", sorted(widths), expect="one width: d_model = 32")
    assert diff_post < 1e-5 and diff_pre > 0.1 and widths == {cfg.d_model}
    hidden = F.relu(post.ffn.lin1(x))  # the FFN's inner layer is d_ff = 64 wide
    with pytest.raises(RuntimeError):
        x + hidden  # a residual sum needs equal widths
    ev.record("x (width 32) + FFN hidden (width 64)", "RuntimeError", expect="cannot be added")
# --8<-- [end:test_formula]

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # What does a Transformer layer cost?
#
# Proofs for the page `docs/cost/layer-cost.md`. Everything here is counted, not timed:
# parameters with `numel`, FLOPs with `torch.utils.flop_counter.FlopCounterMode`
# (2 FLOPs per multiply-add; it counts matrix products and convolutions, nothing
# elementwise), sequential steps as the depth of the autograd graph, path length as
# the layers (or recurrent steps) that separate two positions.
# Run it with `pytest proofs/cost/proof_layer_cost.py`, or open it as a notebook
# with `jupytext --to notebook proofs/cost/proof_layer_cost.py`.

# %%
from __future__ import annotations

import math
import time
from collections import deque

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from proofs.layer_activations import PAPER_LAYER, layer_config, saved_activations
from proofs.transformer import (DecoderLM, EncoderDecoder, EncoderLayer, EncoderTagger, FeedForward,
                                MultiHeadAttention, TransformerConfig)

WIDTHS = [32, 64, 128, 256, 512]  # H swept by the parameter count
SHAPES = [(1, 16, 32), (2, 32, 64), (4, 64, 128), (2, 256, 64), (1, 128, 256)]  # (B, S, H) for the FLOP count


# %% [markdown]
# ## 1. Parameters of one layer
#
# One `EncoderLayer` of the shared model at width H, with the paper's FFN width
# d_ff = 4H (a switch away from the model's small default), counted part by part.

# %%
# --8<-- [start:params]
def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def layer_params(H: int, **switches) -> dict:
    """Parameters of one EncoderLayer, by part."""
    layer = EncoderLayer(layer_config(H, **switches))
    return {
        "attention": n_params(layer.self_attn),  # W_Q, W_K, W_V, W_O and their biases
        "ffn": n_params(layer.ffn),  # H -> d_ff -> H
        "norms": n_params(layer.sub_attn.norm) + n_params(layer.sub_ffn.norm),  # two LayerNorms (gain, bias)
        "total": n_params(layer),
    }
# --8<-- [end:params]


def lm_params(V: int, H: int, L: int, **switches) -> int:
    """All parameters of a decoder-only language model (embedding, L layers, output layer)."""
    return n_params(DecoderLM(layer_config(H, vocab_size=V, n_layers=L, **switches)))


def base_model_params() -> tuple[int, int]:
    """Transformer base (d=512, d_ff=2048, 6+6 layers, vocabulary 37000 shared and tied), built on the meta
    device (shapes only, no memory): total parameters, and those of one decoder layer."""
    cfg = TransformerConfig(vocab_size=37000, d_model=512, n_heads=8, d_ff=2048, n_layers=6)
    with torch.device("meta"):
        model = EncoderDecoder(cfg)
    return n_params(model), n_params(model.decoder.layers[0])


# %% [markdown]
# ## 2. Forward and backward FLOPs
#
# `FlopCounterMode` sees every matrix product the layer dispatches. With the fast path
# on, attention is one `F.scaled_dot_product_attention` call, and whether its FLOPs are
# counted depends on which kernel runs; the proof counts the explicit path
# (`attn_impl="explicit"`) and reports what the fast path shows.

# %%
# --8<-- [start:flops]
def forward_flops(B: int, S: int, H: int, causal: bool = False, attn_impl: str = "explicit", **switches) -> dict:
    """Forward FLOPs of one EncoderLayer, by part, as FlopCounterMode counts them."""
    layer = EncoderLayer(layer_config(H, attn_impl=attn_impl, **switches)).eval()
    x = torch.randn(B, S, H)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        layer(x, causal=causal)
    by_module = {name: sum(ops.values()) for name, ops in fc.get_flop_counts().items()}
    projections = sum(by_module.get(f"EncoderLayer.self_attn.w_{p}", 0) for p in "qkvo")
    return {
        "total": fc.get_total_flops(),
        "projections": projections,  # Q, K, V and output projections
        "scores and mixing": by_module["EncoderLayer.self_attn"] - projections,  # QKᵀ and A·V
        "ffn": by_module["EncoderLayer.ffn"],
    }


def forward_backward_flops(module: nn.Module, x: Tensor) -> tuple[int, int]:
    """FLOPs of one forward pass and of the backward pass of a scalar loss on its output."""
    with FlopCounterMode(display=False) as fwd:
        out = module(x)
    loss = (out * torch.randn_like(out)).sum()  # any scalar loss: its own cost is elementwise
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    return fwd.get_total_flops(), bwd.get_total_flops()
# --8<-- [end:flops]


class OpCounter(TorchDispatchMode):
    """Counts what runs below autograd: every operation (kernel call), the matrix-product calls,
    and the elements written by the elementwise operations the FLOP formula leaves out."""

    MATMULS = {"mm", "addmm", "bmm"}
    ELEMENTWISE = {"_softmax", "native_layer_norm", "relu", "gelu", "add", "mul", "div", "sub", "tanh", "masked_fill"}

    def __init__(self):
        super().__init__()
        self.ops, self.matmuls, self.elementwise, self.names = 0, 0, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip("_")  # add_ -> add
        self.ops += 1
        self.names.append(name)
        self.matmuls += name in self.MATMULS
        if name in self.ELEMENTWISE:
            self.elementwise += (out[0] if isinstance(out, (tuple, list)) else out).numel()
        return out


# %% [markdown]
# ## 3. The position-wise FFN
#
# The FFN acts on each position alone with one set of weights, so it must give the same
# result position by position, and the same as two convolutions of kernel size 1.

# %%
# --8<-- [start:ffn]
def ffn_as_convolutions(ffn: FeedForward) -> nn.Sequential:
    """The same FFN as two 1×1 Conv1d over (B, C, T), with the Linear weights copied in."""
    conv1 = nn.Conv1d(ffn.lin1.in_features, ffn.lin1.out_features, kernel_size=1)
    conv2 = nn.Conv1d(ffn.lin2.in_features, ffn.lin2.out_features, kernel_size=1)
    with torch.no_grad():
        for conv, lin in ((conv1, ffn.lin1), (conv2, ffn.lin2)):
            conv.weight.copy_(lin.weight[:, :, None])  # (out, in) -> (out, in, kernel=1)
            conv.bias.copy_(lin.bias)
    return nn.Sequential(conv1, nn.ReLU(), conv2)


def position_wise_gaps(seed: int, T: int = 12, d: int = 32) -> dict:
    """Largest |difference| between ways of computing the FFN (and, for contrast, attention), float64."""
    torch.manual_seed(seed)
    cfg = layer_config(d)
    ffn, attn = FeedForward(cfg).double(), MultiHeadAttention(cfg).double().eval()
    convs = ffn_as_convolutions(ffn).double()
    x = torch.randn(4, T, d, dtype=torch.float64)

    def one_position_at_a_time(f):
        return torch.cat([f(x[:, t:t + 1]) for t in range(T)], dim=1)

    with torch.no_grad():
        return {
            "FFN: whole sequence vs one position at a time": (ffn(x) - one_position_at_a_time(ffn)).abs().max().item(),
            "FFN vs two 1×1 convolutions": (ffn(x) - convs(x.transpose(1, 2)).transpose(1, 2)).abs().max().item(),
            "attention: whole sequence vs one position at a time":
                (attn(x) - one_position_at_a_time(attn)).abs().max().item(),
        }
# --8<-- [end:ffn]


# %% [markdown]
# ## 4. Attention, recurrence, convolution
#
# One layer of each kind over n positions of width d: the shared attention layer, a plain
# tanh recurrence (`nn.RNN`, and `nn.GRU`), and a convolution of kernel k. FLOPs by
# `FlopCounterMode`; sequential steps as the longest chain of dependent operations in the
# autograd graph; path length as the layers (or recurrent steps) from input 0 to the last output.

# %%
# --8<-- [start:layers]
def layer_flops(n: int, d: int, k: int = 3) -> dict:
    """Forward FLOPs of one layer of each kind over n positions of width d (batch 1)."""
    torch.manual_seed(0)
    x = torch.randn(1, n, d)
    attn = MultiHeadAttention(layer_config(d, attn_impl="explicit")).eval()
    rnn, gru = nn.RNN(d, d, batch_first=True), nn.GRU(d, d, batch_first=True)
    conv = nn.Conv1d(d, d, k, padding=k // 2)
    out = {}
    for name, run in (("attention layer", lambda: attn(x)), ("RNN", lambda: rnn(x)), ("GRU", lambda: gru(x)),
                      (f"conv k={k}", lambda: conv(x.transpose(1, 2)))):
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            run()
        out[name] = fc.get_total_flops()
        if name == "attention layer":  # QKᵀ and A·V are the batched products; the projections are addmm
            out["attention core"] = fc.get_flop_counts()["Global"].get(torch.ops.aten.bmm, 0)
    return out
# --8<-- [end:layers]


# --8<-- [start:steps]
def graph_depth(out: Tensor) -> int:
    """The longest chain of dependent operations behind `out`: nodes on the longest path of its autograd graph."""
    depth, stack = {}, [(out.grad_fn, False)]
    while stack:
        node, children_done = stack.pop()
        children = [c for c, _ in node.next_functions if c is not None]
        if children_done:
            depth[node] = 1 + max((depth[c] for c in children), default=0)
        elif node not in depth:
            stack.append((node, True))
            stack.extend((c, False) for c in children if c not in depth)
    return depth[out.grad_fn]


def sequential_depths(n: int, d: int = 16) -> dict:
    """Depth of the autograd graph of one layer of each kind over n positions."""
    torch.manual_seed(0)
    x = torch.randn(1, n, d, requires_grad=True)
    attn = MultiHeadAttention(layer_config(d, attn_impl="explicit"))
    return {
        "attention": graph_depth(attn(x)),
        "RNN": graph_depth(nn.RNN(d, d, batch_first=True)(x)[0]),
        "conv k=3": graph_depth(nn.Conv1d(d, d, 3, padding=1)(x.transpose(1, 2))),
    }
# --8<-- [end:steps]


# --8<-- [start:path]
def conv_receptive_fields(n: int, k: int, dilated: bool, seed: int, c: int = 2) -> list[int]:
    """After 1, 2, ... stacked causal Conv1d layers (kernel k; dilation k^l in layer l if dilated), how many
    input positions the last output depends on (gradient ≠ 0); stops when it sees all n."""
    torch.manual_seed(seed)
    x = torch.randn(1, c, n, dtype=torch.float64, requires_grad=True)
    h, seen = x, []
    while not seen or seen[-1] < n:
        dilation = k ** len(seen) if dilated else 1
        conv = nn.Conv1d(c, c, k, dilation=dilation, bias=False).double()
        h = conv(F.pad(h, ((k - 1) * dilation, 0)))  # causal: output t sees t, t-dil, ..., t-(k-1)·dil
        (g,) = torch.autograd.grad(h[0, :, n - 1].sum(), x, retain_graph=True)
        seen.append(int((g[0].abs().sum(0) > 0).sum()))
    return seen


def attention_receptive_field(n: int, d: int = 16) -> int:
    """Input positions that output 0 of ONE attention layer depends on (gradient ≠ 0)."""
    x = torch.randn(1, n, d, requires_grad=True)
    y = MultiHeadAttention(layer_config(d, attn_impl="explicit"))(x)
    (g,) = torch.autograd.grad(y[0, 0].sum(), x)
    return int((g[0].abs().sum(-1) > 0).sum())


def steps_between(out: Tensor, leaf: Tensor, step: str = "TanhBackward") -> int:
    """Fewest `step` nodes on any autograd path from `out` back to `leaf` (0-1 breadth-first search)."""
    cost = lambda node: int(node.name().startswith(step))  # noqa: E731
    dist, queue = {out.grad_fn: cost(out.grad_fn)}, deque([out.grad_fn])
    while queue:
        node = queue.popleft()
        if getattr(node, "variable", None) is leaf:
            return dist[node]
        for child, _ in node.next_functions:
            if child is not None and dist[node] + cost(child) < dist.get(child, math.inf):
                dist[child] = dist[node] + cost(child)
                (queue.append if cost(child) else queue.appendleft)(child)
    raise ValueError("leaf not reached")


def recurrent_path_steps(n: int, d: int = 8) -> int:
    """Recurrent steps (tanh applications) between input 0 and the last output of a tanh RNN, unrolled."""
    xs = [torch.randn(1, d, requires_grad=True) for _ in range(n)]
    cell, h = nn.RNNCell(d, d), torch.zeros(1, d)
    for x in xs:
        h = cell(x, h)  # h_t = tanh(x_t W_ihᵀ + b_ih + h_{t-1} W_hhᵀ + b_hh)
    return steps_between(h, xs[0])
# --8<-- [end:path]


# --8<-- [start:calls]
def dispatch_counts(n: int, d: int = 32, train: bool = False) -> dict:
    """Operations and matrix-product calls dispatched by one attention layer and one nn.RNN over n positions
    (forward, or forward + backward when train)."""
    torch.manual_seed(0)
    attn, rnn = MultiHeadAttention(layer_config(d, attn_impl="explicit")), nn.RNN(d, d, batch_first=True)
    out = {}
    for name, layer in (("attention", attn), ("RNN", rnn)):
        x = torch.randn(2, n, d, requires_grad=train)
        with OpCounter() as c, torch.set_grad_enabled(train):
            y = layer(x)
            y = y[0] if isinstance(y, tuple) else y
            if train:
                y.sum().backward()
        out[name] = {"ops": c.ops, "matmul calls": c.matmuls}
    return out
# --8<-- [end:calls]


# %% [markdown]
# ## 5. Activation memory: what a training step keeps for backward
#
# `torch.autograd.graph.saved_tensors_hooks` sees every tensor autograd saves during the
# forward pass of one `EncoderLayer`; we add up the bytes of their distinct storages,
# leaving out the weights. Korthikanti et al. (2022, §4.1) count sbh(34 + 5as/h) bytes per
# layer (s tokens, b sequences, h = d_model, a heads) for a GPT layer in 16-bit with GeLU,
# d_ff = 4h, dropout after the attention softmax and on both residual branches, and 1-byte
# dropout masks. The "paper" setting below matches those assumptions where our module can
# (bfloat16, activation="gelu", dropout_attn = dropout_residual = 0.1, Pre-LN); the default
# setting is ours (float32, ReLU, no attention dropout, Post-LN).

# %%
# The activation count lives in proofs/layer_activations.py (the training-memory proof counts the same layer).


def wall_seconds(n: int = 256, d: int = 64, repeats: int = 5) -> dict:
    """Median forward time of one attention layer and one nn.RNN (recorded only: machine-dependent)."""
    x = torch.randn(8, n, d)
    attn, rnn = MultiHeadAttention(layer_config(d, attn_impl="explicit")).eval(), nn.RNN(d, d, batch_first=True)
    out = {}
    for name, run in (("attention", lambda: attn(x)), ("RNN", lambda: rnn(x))):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.no_grad():
                run()
            times.append(time.perf_counter() - t0)
        out[name] = sorted(times)[repeats // 2]
    return out


# %%
if __name__ == "__main__":  # notebook / script: change a width or a length and rerun
    print({H: layer_params(H) for H in (64, 512)})
    print(forward_flops(2, 32, 64))
    print(position_wise_gaps(0))
    for n in (16, 64, 256):
        print(n, layer_flops(n, 64), sequential_depths(n))
    print(conv_receptive_fields(64, 3, dilated=False, seed=0), conv_receptive_fields(64, 3, dilated=True, seed=0))
    print(recurrent_path_steps(32), dispatch_counts(64))


# %% [markdown]
# ## Tests: each asserts an exact count or a difference

# %%
import pytest  # noqa: E402


# --8<-- [start:test_params]
@pytest.mark.claim("C-PARAM-1", "nuanced")
def test_layer_parameters_are_12H2_plus_13H(ev, seed):
    """With d_ff = 4H, biases and two LayerNorms a layer has exactly 12H²+13H parameters; other choices change it. A count
    of our module (exact); the formula would be refuted by any width where the count differs."""
    for H in WIDTHS:
        p = layer_params(H)
        ev.record(f"parameters of one layer, H={H}", p["total"], expect=f"12H²+13H = {12 * H * H + 13 * H}",
                  key=H in (64, 512))
        assert p == {"attention": 4 * H * H + 4 * H, "ffn": 8 * H * H + 5 * H, "norms": 4 * H,
                     "total": 12 * H * H + 13 * H}
    H, V, L = 64, 1000, 2
    p = layer_params(H)
    ev.record("attention / FFN / norms at H=64", [p["attention"], p["ffn"], p["norms"]],
              expect="4H²+4H / 8H²+5H / 4H", key=False)
    ev.record("share of 12H² in the layer, H=512", 12 * 512**2 / layer_params(512)["total"],
              expect="≈ 1: the 13H is 13/(12H) of it")
    variants = {  # what each choice does to the count, measured against its own formula
        "no biases": (layer_params(H, bias=False)["total"], 12 * H * H + 4 * H),
        "d_ff = 2H": (layer_params(H, d_ff=2 * H)["total"], 8 * H * H + 11 * H),
        "no LayerNorm": (layer_params(H, norm="none")["total"], 12 * H * H + 9 * H),
    }
    for name, (measured, formula) in variants.items():
        ev.record(f"one layer, {name}, H=64", measured, expect=f"{formula} ≠ 12H²+13H = {12 * H * H + 13 * H}")
        assert measured == formula != 12 * H * H + 13 * H
    # the whole model: the embedding adds VH only when the output layer reuses it
    tied, untied = lm_params(V, H, L), lm_params(V, H, L, tie_embeddings="none")
    learned = lm_params(V, H, L, positions="learned")
    ev.record("decoder-only LM, V=1000, H=64, L=2, tied output layer", tied,
              expect=f"VH + L(12H²+13H) = {V * H + L * (12 * H * H + 13 * H)}")
    ev.record("same, untied output layer", untied, expect="+ VH")
    ev.record("same, learned positions (max_len=64)", learned, expect="+ max_len·H")
    assert tied == V * H + L * (12 * H * H + 13 * H)
    assert untied - tied == V * H and learned - tied == 64 * H
    # a decoder layer with cross-attention (the 2017 encoder-decoder) is not 12H²+13H
    total, dec_layer = base_model_params()
    ev.record("decoder layer with cross-attention, H=512", dec_layer, expect=f"16H²+19H = {16 * 512**2 + 19 * 512}")
    ev.record("Transformer base, V=37000 tied, 6+6 layers", total, expect="Table 3 of the paper lists 65M")
    assert dec_layer == 16 * 512**2 + 19 * 512
    assert total == 37000 * 512 + 6 * (12 * 512**2 + 13 * 512) + 6 * (16 * 512**2 + 19 * 512)
# --8<-- [end:test_params]


# --8<-- [start:test_forward]
@pytest.mark.claim("C-FLOP-1", "nuanced")
def test_forward_flops_are_24BSH2_plus_4BS2H(ev, seed):
    """FlopCounterMode on one layer (explicit attention path) counts exactly 24BSH² + 4BS²H when d_ff = 4H. A count of
    our module (exact); it would be refuted by any shape where the count differs, and is nuanced by what it leaves out
    (other d_ff, the fused kernel's uncounted FLOPs, elementwise work)."""
    torch.manual_seed(seed)
    for B, S, H in SHAPES:
        f = forward_flops(B, S, H)
        formula = 24 * B * S * H * H + 4 * B * S * S * H
        ev.record(f"forward FLOPs / (24BSH²+4BS²H), B={B} S={S} H={H}", f["total"] / formula, expect="1 exactly",
                  key=(B, S, H) == (2, 32, 64))
        assert f == {"total": formula, "projections": 8 * B * S * H * H, "scores and mixing": 4 * B * S * S * H,
                     "ffn": 16 * B * S * H * H}
    B, S, H = 2, 256, 64
    f = forward_flops(B, S, H)
    ev.record("share of the S² term, B=2 S=256 H=64", f["scores and mixing"] / f["total"],
              expect="S/(6H+S) = 0.4: it dominates once S > 6H")
    # the conditions: another d_ff, a causal mask, the fast path, what is left out
    for d_ff in (2 * H, 8 * H):
        g = forward_flops(B, 32, H, d_ff=d_ff)["total"]
        ev.record(f"forward FLOPs with d_ff={d_ff // H}H / (24BSH²+4BS²H), S=32",
                  g / (24 * B * 32 * H * H + 4 * B * 32 * 32 * H), expect="(8H + 4d_ff + 4S)/(24H + 4S)")
        assert g == 8 * B * 32 * H * H + 4 * B * 32 * H * d_ff + 4 * B * 32 * 32 * H
    causal = forward_flops(B, S, H, causal=True)["total"]
    ev.record("causal mask / no mask, dense kernel", causal / f["total"], expect="1: masked scores are still computed")
    assert causal == f["total"]
    fast = forward_flops(B, S, H, attn_impl="auto")
    with OpCounter() as c, torch.no_grad():
        EncoderLayer(layer_config(H)).eval()(torch.randn(B, S, H))
    kernel = next(n for n in c.names if "scaled_dot_product" in n)
    ev.record("kernel the fast path dispatched (CPU)", kernel)
    ev.record("attention-score FLOPs FlopCounterMode sees on the fast path", fast["scores and mixing"],
              expect=f"4BS²H = {4 * B * S * S * H} if the kernel is in its registry, else 0")
    assert fast["projections"] + fast["ffn"] == 24 * B * S * H * H
    assert fast["scores and mixing"] in (0, 4 * B * S * S * H)
    for S_ in (32, 256):
        with OpCounter() as c, torch.no_grad():
            EncoderLayer(layer_config(H, attn_impl="explicit")).eval()(torch.randn(B, S_, H))
        flops = 24 * B * S_ * H * H + 4 * B * S_ * S_ * H
        ev.record(f"elements written by softmax, LayerNorm, ReLU, adds, scale / matmul FLOPs, S={S_}",
                  c.elementwise / flops, expect="small: each costs a few FLOPs, so a few % at most")
        assert c.elementwise / flops < 0.05
# --8<-- [end:test_forward]


# --8<-- [start:test_backward]
@pytest.mark.claim("C-FLOP-2", "confirmed")
def test_backward_costs_twice_the_forward(ev, seed):
    """Every weight matmul needs two matmuls backward (input and weight gradient): backward = 2 × forward in FLOPs. A
    count of our module (exact); it would be refuted by a layer whose backward count is not twice its forward."""
    torch.manual_seed(seed)
    B, S, H = 2, 32, 64
    layer = EncoderLayer(layer_config(H, attn_impl="explicit"))
    fwd, bwd = forward_backward_flops(layer, torch.randn(B, S, H, requires_grad=True))
    ev.record("backward / forward FLOPs, one layer", bwd / fwd, expect="2")
    assert bwd == 2 * fwd
    # the first layer of a stack fed a constant (no input gradient): the Q, K, V projections skip dX
    fwd0, bwd0 = forward_backward_flops(layer, torch.randn(B, S, H))
    ev.record("backward / forward, input needs no gradient", bwd0 / fwd0, expect="2 − 6BSH²/forward")
    assert fwd0 == fwd and bwd0 == 2 * fwd - 6 * B * S * H * H
    # frozen weights (only the input gradient): one matmul per weight matmul, two for QKᵀ and A·V
    layer.requires_grad_(False)
    fwd1, bwd1 = forward_backward_flops(layer, torch.randn(B, S, H, requires_grad=True))
    ev.record("backward / forward, weights frozen", bwd1 / fwd1, expect="≈ 1: no weight gradients")
    assert bwd1 == fwd1 + 4 * B * S * S * H
    # a whole decoder-only LM: forward + backward = 72·B·L·S·H²·(1 + S/(6H) + V/(12HL)) (Korthikanti et al.)
    V, L = 512, 2
    lm = DecoderLM(layer_config(H, vocab_size=V, n_layers=L, attn_impl="explicit", dropout_emb=0.0))
    f, b = forward_backward_flops(lm, torch.randint(0, V, (B, S)))
    ev.record("backward / forward, decoder-only LM with tied embeddings", b / f, expect="2")
    ev.record("forward + backward / 72BLSH²(1 + S/6H + V/12HL)",
              (f + b) / (72 * B * L * S * H * H * (1 + S / (6 * H) + V / (12 * H * L))), expect="1 exactly")
    ev.record("forward + backward FLOPs per token / 6N, N = 12LH²", (f + b) / (B * S) / (6 * 12 * L * H * H),
              expect="1 + S/(6H) + V/(12HL): 6N is the large-H limit")
    assert b == 2 * f
    assert f + b == 72 * B * L * S * H * H + 12 * B * L * S * S * H + 6 * B * S * H * V
# --8<-- [end:test_backward]


# --8<-- [start:test_ffn]
@pytest.mark.claim("C-FFN-1", "confirmed")
def test_ffn_is_position_wise_and_a_1x1_convolution(ev, seed):
    """The FFN gives the same output position by position and as two 1×1 convolutions; attention does not. Exact
    (float64, our module); it would be refuted if the FFN's output at one position depended on another."""
    for s in (seed, seed + 1, seed + 2):
        gaps = position_wise_gaps(s)
        for name, gap in gaps.items():
            ev.record(f"max |difference|, {name}, seed {s}", gap, expect="≈ 0 (float64 rounding)" if "FFN" in name
                      else "large: attention mixes positions", key=s == seed)
        assert gaps["FFN: whole sequence vs one position at a time"] < 1e-12
        assert gaps["FFN vs two 1×1 convolutions"] < 1e-12
        assert gaps["attention: whole sequence vs one position at a time"] > 1e-2
    # one FFN per layer: distinct parameters, different outputs on the same input
    torch.manual_seed(seed)
    model = EncoderTagger(layer_config(32, n_layers=2))
    f0, f1 = model.encoder.layers[0].ffn, model.encoder.layers[1].ffn
    shared = {id(p) for p in f0.parameters()} & {id(p) for p in f1.parameters()}
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        diff = (f0(x) - f1(x)).abs().max().item()
    ev.record("parameters shared by the FFNs of layers 1 and 2", len(shared), expect="0")
    ev.record("max |FFN₁(x) − FFN₂(x)|", diff, expect="> 0: different weights per layer")
    ev.record("FFN parameters, any sequence length, H=32", n_params(f0), expect="8H²+5H, independent of T")
    assert not shared and diff > 1e-2 and n_params(f0) == 8 * 32 * 32 + 5 * 32
# --8<-- [end:test_ffn]


def _plot_flops(ev, ns, d, rows):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    styles = {"attention core": "o-", "attention layer": "o--", "RNN": "s-", "GRU": "s--", "conv k=3": "^-"}
    for name, style in styles.items():
        ax.loglog(ns, [r[name] for r in rows], style, label=name)
    ax.axvline(d, color="grey", lw=0.8, ls=":")
    ax.set(title=f"forward FLOPs of one layer, d={d}", xlabel="sequence length n", ylabel="FLOPs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "flops", f"FLOPs counted by FlopCounterMode for one layer of each kind, d={d}; the dotted "
                            "line is n = d. 'attention core' is QKᵀ and A·V; 'attention layer' adds the projections.")


def _plot_paths(ev, paths):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, style in (("attention", "o-"), ("RNN", "s-"), ("conv k=3, contiguous", "^-"),
                        ("conv k=3, dilated", "v--")):
        ax.loglog(list(paths), [p[name] for p in paths.values()], style, label=name)
    ax.set(title="path length: input 0 → last output", xlabel="sequence length n",
           ylabel="layers (RNN: recurrent steps)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "paths", "Layers (for the RNN, recurrent steps) between input 0 and the last output, "
                            "measured by gradients (layers) and by the autograd graph (steps).")


# --8<-- [start:test_complexity]
@pytest.mark.claim("C-CPLX-1", "nuanced")
def test_per_layer_flops_attention_recurrence_convolution(ev, seed):
    """Attention's core costs 4n²d, an RNN 4nd², a convolution 2knd²: they cross at n = d, but the attention
    layer's own projections add 8nd². FLOP counts (exact); "cheaper than an RNN when n < d" would hold for the whole
    layer only if the projections were free."""
    d, ns = 64, [8, 16, 32, 64, 128, 256, 512]
    rows = [layer_flops(n, d) for n in ns]
    for n, r in zip(ns, rows):
        assert r == {"attention layer": 8 * n * d * d + 4 * n * n * d, "attention core": 4 * n * n * d,
                     "RNN": 4 * n * d * d, "GRU": 12 * n * d * d, "conv k=3": 6 * n * d * d}
    doubling = {name: rows[-1][name] / rows[-2][name] for name in rows[0]}
    ev.record("FLOPs when n doubles (512 vs 256): attention core / RNN / conv",
              [doubling["attention core"], doubling["RNN"], doubling["conv k=3"]], expect="4 / 2 / 2: n² vs n vs n")
    wide = layer_flops(64, 2 * d)
    narrow = rows[ns.index(64)]
    ev.record("FLOPs when d doubles (n=64): attention core / RNN / conv",
              [wide[k] / narrow[k] for k in ("attention core", "RNN", "conv k=3")], expect="2 / 4 / 4: d vs d² vs d²")
    # the crossover, found on the measured counts at three widths
    for width in (32, 64, 128):
        below, at, above = (layer_flops(n, width) for n in (width - 8, width, width + 8))
        ev.record(f"attention core / RNN at n = d−8, d, d+8 (d={width})",
                  [below["attention core"] / below["RNN"], at["attention core"] / at["RNN"],
                   above["attention core"] / above["RNN"]], expect="< 1, 1, > 1: crossover at n = d (§4)",
                  key=width == 64)
        assert below["attention core"] < below["RNN"] and at["attention core"] == at["RNN"]
        assert above["attention core"] > above["RNN"]
    ratio = [r["attention layer"] / r["RNN"] for r in rows]
    ev.record("attention layer (with projections) / RNN, smallest over n = 8…512", min(ratio),
              expect="> 2: never cheaper than a tanh RNN")
    gru_cross = next(n for n, r in zip(ns, rows) if r["attention layer"] >= r["GRU"])
    ev.record("first n where the attention layer costs as much as a GRU (d=64)", gru_cross, expect="n = d")
    assert min(ratio) > 2 and gru_cross == d
    _plot_flops(ev, ns, d, rows)
# --8<-- [end:test_complexity]


# --8<-- [start:test_paths]
@pytest.mark.claim("C-CPLX-2", "confirmed")
@pytest.mark.claim("C-FOLK-13", "nuanced")
def test_sequential_steps_and_path_length(ev, seed):
    """Sequential depth: constant for attention and convolution, linear in n for an RNN. Path length: 1 layer for
    attention, n steps for an RNN, ⌈(n−1)/(k−1)⌉ contiguous or ⌈log_k n⌉ dilated convolution layers. Exact counts on
    autograd graphs; any other count would refute Table 1's row."""
    depths = {n: sequential_depths(n) for n in (16, 32, 64, 128)}
    for n, dep in depths.items():
        ev.record(f"autograd depth (attention, RNN, conv), n={n}", [dep["attention"], dep["RNN"], dep["conv k=3"]],
                  expect="constant, ∝ n, constant", key=n in (16, 128))
    per_step = (depths[128]["RNN"] - depths[64]["RNN"]) / 64
    ev.record("RNN depth added per extra position", per_step, expect="a constant ≥ 1: one step per position")
    for kind in ("attention", "conv k=3"):
        assert len({dep[kind] for dep in depths.values()}) == 1  # the same depth at every n
    assert per_step >= 1 and depths[32]["RNN"] - depths[16]["RNN"] == per_step * 16
    # path length from input 0 to the last output
    paths = {}
    for n in (8, 16, 32, 64, 128):
        rnn_steps = recurrent_path_steps(n)
        attention_sees = attention_receptive_field(n)
        for k in (2, 3):
            contiguous = conv_receptive_fields(n, k, dilated=False, seed=seed)
            dilated = conv_receptive_fields(n, k, dilated=True, seed=seed)
            if k == 3:
                paths[n] = {"attention": 1 if attention_sees == n else math.nan, "RNN": rnn_steps,
                            "conv k=3, contiguous": len(contiguous), "conv k=3, dilated": len(dilated)}
            ev.record(f"layers to connect n={n}, k={k}: contiguous / dilated conv", [len(contiguous), len(dilated)],
                      expect=f"⌈(n−1)/(k−1)⌉ = {math.ceil((n - 1) / (k - 1))} / "
                             f"⌈log_k n⌉ = {math.ceil(math.log(n, k) - 1e-9)}",
                      key=(n, k) in ((16, 3), (128, 3)))
            assert contiguous == [min(n, 1 + L * (k - 1)) for L in range(1, len(contiguous) + 1)]
            assert dilated == [min(n, k**L) for L in range(1, len(dilated) + 1)]
            assert len(contiguous) == math.ceil((n - 1) / (k - 1)) and len(dilated) == math.ceil(math.log(n, k) - 1e-9)
        ev.record(f"recurrent steps from input 0 to output {n - 1}", rnn_steps, expect=f"n = {n}", key=n == 128)
        ev.record(f"inputs output 0 depends on after ONE attention layer, n={n}", attention_sees, expect=f"all {n}",
                  key=n == 128)
        assert rnn_steps == n and attention_sees == n
    _plot_paths(ev, paths)
# --8<-- [end:test_paths]


# --8<-- [start:test_parallel]
@pytest.mark.claim("C-PAR-1", "confirmed")
def test_attention_processes_all_positions_in_one_call(ev, seed):
    """A training step of attention dispatches the same operations at every n; an RNN's adds a loop per position.
    Exact dispatch counts (wall times recorded only); it would be refuted if attention's count grew with n."""
    torch.manual_seed(seed)
    counts = {n: dispatch_counts(n, train=True) for n in (16, 32, 64)}
    for n, c in counts.items():
        ev.record(f"ops dispatched, forward + backward, n={n}: attention / RNN",
                  [c["attention"]["ops"], c["RNN"]["ops"]],
                  expect="constant / grows with n", key=n in (16, 64))
        ev.record(f"matmul calls, forward + backward, n={n}: attention / RNN",
                  [c["attention"]["matmul calls"], c["RNN"]["matmul calls"]], expect="constant / ∝ n", key=False)
    fwd = {n: dispatch_counts(n) for n in (16, 64)}
    ev.record("matmul calls in the RNN forward, n=16 / n=64",
              [fwd[16]["RNN"]["matmul calls"], fwd[64]["RNN"]["matmul calls"]],
              expect="n + 1: one input projection, then one per step")
    assert len({c["attention"]["ops"] for c in counts.values()}) == 1
    rnn_ops = {n: c["RNN"]["ops"] for n, c in counts.items()}
    assert rnn_ops[64] - rnn_ops[32] == 2 * (rnn_ops[32] - rnn_ops[16]) > 0  # the same cost per extra position
    assert [fwd[n]["RNN"]["matmul calls"] for n in (16, 64)] == [17, 65]
    assert fwd[16]["attention"]["matmul calls"] == fwd[64]["attention"]["matmul calls"] == 6
    t = wall_seconds()
    for name in ("attention", "RNN"):
        ev.record(f"wall time, forward, n=256, d=64, batch 8: {name} (s)", t[name], expect="recorded, not asserted",
                  key=False)
# --8<-- [end:test_parallel]


# --8<-- [start:test_activations]
def test_activation_memory_per_layer(ev, seed):
    """Bytes a training step keeps for backward in one layer. With the paper's assumptions reproduced (16-bit, GeLU,
    attention and residual dropout, d_ff = 4h) our layer keeps exactly Korthikanti et al.'s sbh(34 + 5as/h), plus two
    items their count leaves out or sizes differently: LayerNorm's per-token mean and 1/σ, and dropout masks that
    PyTorch's CPU kernel stores at 2 bytes (the input's dtype), not 1. Our default layer (float32, ReLU, no attention
    dropout) keeps exactly sbh(56 + 4as/h) + statistics; the fused attention kernel keeps no s×s tensor at all, so its
    memory grows linearly in s. Counts of our module (exact); the paper formula would be refuted by any other
    remainder."""
    shapes = [(2, 16, 64, 4), (1, 32, 64, 8), (2, 8, 32, 2)]  # (b, s, h, a): as/h = 1, 4, 0.5
    for b, s, h, a in shapes:
        sbh, as2b = s * b * h, a * s * s * b
        paper = saved_activations(b, s, h, a, dtype=torch.bfloat16, **PAPER_LAYER)
        formula = sbh * (34 + 5 * a * s / h)
        masks_at_two_bytes = 2 * sbh + as2b  # two residual masks (sbh each) and the attention mask (as²b), 1 byte more
        ev.record(f"paper setting (bf16, GeLU, dropouts), b={b} s={s} h={h} a={a}: saved bytes / sbh(34 + 5as/h)",
                  paper["bytes"] / formula, key=(b, s, h, a) == shapes[0])
        ev.record(f"paper setting, b={b} s={s} h={h} a={a}: bytes beyond the formula = LayerNorm statistics + masks at "
                  "2 bytes", [paper["bytes"] - formula, paper["norm statistics"], masks_at_two_bytes], key=False)
        assert paper["bytes"] == formula + masks_at_two_bytes + paper["norm statistics"]
        assert paper["norm statistics"] == 2 * 2 * b * s * 2  # two norms, mean and 1/σ, one bf16 number per token
        ours = saved_activations(b, s, h, a, dropout_residual=0.1)
        ev.record(f"our default layer (fp32, ReLU, no attention dropout), b={b} s={s} h={h} a={a}: bytes / sbh(56 + 4as/h)",
                  (ours["bytes"] - ours["norm statistics"]) / (sbh * (56 + 4 * a * s / h)), key=False)
        assert ours["bytes"] == sbh * (56 + 4 * a * s / h) + ours["norm statistics"]
    # the fused kernel: no s×s tensor is kept, so the bytes grow linearly in s (explicit path: the s² term)
    growth = {}
    for impl in ("explicit", "auto"):
        small, big = (saved_activations(2, s_, 64, 4, dropout_residual=0.1, attn_impl=impl) for s_ in (16, 64))
        growth[impl] = big["bytes"] / small["bytes"]
        ev.record(f"saved bytes at s=64 / at s=16, attn_impl={impl}", growth[impl],
                  expect="4 exactly: linear in s" if impl == "auto" else "> 4: the s² term")
        ev.record(f"largest saved tensor at s=64, attn_impl={impl} (bytes)", big["largest"], key=False)
    assert growth["auto"] == 4 and growth["explicit"] > 4.5
# --8<-- [end:test_activations]

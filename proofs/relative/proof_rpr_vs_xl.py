# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # RPR or Transformer-XL?
#
# Proofs for the page `docs/relative/rpr-vs-transformer-xl.md`. It puts Shaw et al.'s
# relative position representations (`positions="shaw"`) and Transformer-XL
# (`positions="xl"`, with or without `mem_len`) side by side, with the 2017
# absolute sinusoids (`positions="sinusoidal"`) as the baseline. Everything runs
# on the shared module (`proofs/transformer/`); the measurements of the two
# single-method pages are imported from their proof files, not copied:
# `influence`, `predicted_reach`, `gradient_reach` (Transformer-XL) and
# `shift_change` (Shaw). Run it with `pytest proofs/relative/proof_rpr_vs_xl.py`,
# or open it as a notebook with `jupytext --to notebook proofs/relative/proof_rpr_vs_xl.py`.

# %%
from __future__ import annotations

import math
import time
from fractions import Fraction
from functools import cache

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from proofs.shaw_setup import row_usage, shift_change
from proofs.xl_setup import BASE, V, gradient_reach, influence, lm, predicted_reach
from proofs.transformer import (
    DecoderLayer,
    DecoderLM,
    Embeddings,
    MultiHeadAttention,
    ShawAttention,
    TransformerConfig,
    XLAttention,
)

# BASE (from the Transformer-XL proof): vocabulary V = 16, d_model 32, 2 heads, d_ff 64, dropout off.
CHANCE = 1 / (V - 1)  # tokens are drawn from 1..V-1: a blind guess is right 1 time in 15
KINDS = {"absolute": "sinusoidal", "Shaw": "shaw", "XL": "xl"}  # the three columns of the page's table
# the paper-sized layer for counting: the 2017 base model, Shaw's base clipping distance
PAPER = TransformerConfig(d_model=512, n_heads=8, d_ff=2048, rel_clip=16, max_len=512, attn_impl="explicit")


def attention(kind: str, cfg: TransformerConfig) -> MultiHeadAttention:
    """The self-attention module of one column: plain (positions live in the input), Shaw or XL."""
    return {"absolute": MultiHeadAttention, "Shaw": ShawAttention, "XL": XLAttention}[kind](
        cfg.replace(positions=KINDS[kind]))


# %% [markdown]
# ## 1. Which score terms does each have?
#
# Every score here is affine in the query for a fixed key and in the key for a
# fixed query, so four evaluations split it into its terms without looking inside:
#
# - S(0, 0): neither content, position only: the global position bias (d);
# - S(0, k) − S(0, 0): key content without the query: the global content bias (c);
# - S(q, 0) − S(0, 0): query content against position: the content-dependent position bias (b);
# - the rest, S(q, k) − S(q, 0) − S(0, k) + S(0, 0): content against content (a).
#
# The same function runs on all three modules. For XL it must agree with the
# module's own `score_terms`; for Shaw, zeroing the tables must leave plain
# attention. A fifth probe looks at the values: the output for all-zero values is
# what position adds to the values (Shaw's a^V).

# %%
# --8<-- [start:terms]
def split_terms(attn: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor) -> dict[str, torch.Tensor]:
    """(a)-(d) of any score that is affine in q and in k, from four calls of attn.score (each (B, nh, Tq, Tk))."""
    zq, zk = torch.zeros_like(q), torch.zeros_like(k)
    s00, s0k, sq0, sqk = attn.score(zq, zk), attn.score(zq, k), attn.score(q, zk), attn.score(q, k)
    return {"a": sqk - sq0 - s0k + s00, "b": sq0 - s00, "c": s0k - s00, "d": s00}


def score_anatomy(seed: int, t_q: int = 6, mem: int = 5) -> dict:
    """Terms present (RMS) and the value-side position term, for plain, Shaw and XL attention on the same inputs."""
    torch.manual_seed(seed)
    mods = {kind: attention(kind, BASE.replace(attn_impl="explicit")).double().eval() for kind in KINDS}
    with torch.no_grad():
        mods["XL"].u.normal_()  # trained biases are not ~0: give (c) and (d) the size of (a) and (b)
        mods["XL"].v.normal_()
        kv = torch.randn(2, mem + t_q, BASE.d_model, dtype=torch.float64)  # [memory ∘ segment]
        out = {}
        for kind, attn in mods.items():
            q, k, v = attn.project(kv[:, mem:], kv)  # (2, nh, Tq, hs), (2, nh, Tk, hs) x2
            terms = split_terms(attn, q, k)
            weights = torch.softmax(attn.score(q, k), -1)  # (2, nh, Tq, Tk)
            out[kind] = {
                "rms": {name: t.pow(2).mean().sqrt().item() for name, t in terms.items()},
                "value term": attn.mix(weights, torch.zeros_like(v)).abs().max().item(),  # position added to values
                "terms": terms, "q": q, "k": k,
            }
        xl = mods["XL"]
        own = xl.score_terms(out["XL"]["q"], out["XL"]["k"])  # the module's pair-by-pair terms
        out["XL gap to score_terms"] = max((own[n] - out["XL"]["terms"][n]).abs().max().item() for n in "abcd")
        shaw = mods["Shaw"]
        q, k = out["Shaw"]["q"], out["Shaw"]["k"]
        a_k = shaw.rel_k[0][shaw.rel_index(t_q, mem + t_q)[0, 0]]  # (Tq, Tk, hs): a^K_ij = w^K[clip(j-i, k) + k]
        direct = torch.einsum("bhid,ijd->bhij", q, a_k) * shaw.scale  # q_i·a^K_ij, pair by pair
        out["Shaw (b) gap to q·a^K"] = (out["Shaw"]["terms"]["b"] - direct).abs().max().item()
        shaw.rel_k.zero_()
        shaw.rel_v.zero_()
        out["Shaw zero tables: max (b)"] = split_terms(shaw, q, k)["b"].abs().max().item()
        plain_score = q @ k.transpose(-2, -1) * shaw.scale  # (2, nh, Tq, Tk) q_i·k_j
        out["Shaw zero tables: gap to q·k"] = (shaw.score(q, k) - plain_score).abs().max().item()
    plain = {n for n, _ in mods["absolute"].named_parameters()}
    out["added parameters"] = {kind: sorted({n for n, _ in mods[kind].named_parameters()} - plain) for kind in KINDS}
    return out
# --8<-- [end:terms]


def present(rms: dict[str, float], tol: float = 1e-9) -> str:
    """'(a) (b)' for the terms whose RMS is above rounding."""
    return " ".join(f"({n})" for n in "abcd" if rms[n] > tol)


# %% [markdown]
# The probes above split the score in the projected q and k. A projection with a
# bias, q = W_Q x + b_Q, moves part of the query out of the content: with no content
# at all (x = 0) the query is b_Q, not 0. So the same four probes are repeated on the
# *inputs* of the attention module (x_q = 0 and/or x_k = 0, through its own W_Q, W_K,
# biases included), counting a term only where it varies across the keys of a row (a
# constant added to a whole row changes no softmax weight). `bias` is the switch:
# our module's default has biases, the papers' code has none (tensor2tensor's
# `compute_attention_component`, `use_bias=False`; Transformer-XL's `qkv_net`,
# `bias=False`).

# %%
# --8<-- [start:bias_terms]
def input_terms(attn: MultiHeadAttention, xq: torch.Tensor, xkv: torch.Tensor) -> dict[str, torch.Tensor]:
    """(a)-(d) of the score as a function of the attention module's INPUTS, each centred along the keys of a row."""
    def S(a, b):
        q, k, _ = attn.project(a, b)  # through W_Q, W_K and their biases, if any
        return attn.score(q, k)  # (B, nh, Tq, Tk)
    zq, zk = torch.zeros_like(xq), torch.zeros_like(xkv)
    s00, s0k, sq0, sqk = S(zq, zk), S(zq, xkv), S(xq, zk), S(xq, xkv)
    terms = {"a": sqk - sq0 - s0k + s00, "b": sq0 - s00, "c": s0k - s00, "d": s00}
    return {n: t - t.mean(-1, keepdim=True) for n, t in terms.items()}  # only what varies across keys matters


def bias_anatomy(seed: int, t_q: int = 6, mem: int = 5) -> dict:
    """Terms present as functions of the inputs, with and without projection biases; for Shaw with biases, the check
    that its query-free terms use one vector b_Q for both content and position (XL's u and v, tied)."""
    torch.manual_seed(seed)
    xkv = torch.randn(2, mem + t_q, BASE.d_model, dtype=torch.float64)  # [memory ∘ segment]
    xq = xkv[:, mem:]
    out = {}
    for bias in (True, False):
        for kind in KINDS:
            torch.manual_seed(seed)
            attn = attention(kind, BASE.replace(attn_impl="explicit", bias=bias)).double().eval()
            with torch.no_grad():
                if bias:  # default biases init at 0: draw them at the scale of trained ones
                    for lin in (attn.w_q, attn.w_k):
                        lin.bias.normal_()
                if kind == "XL":
                    attn.u.normal_()
                    attn.v.normal_()
                terms = input_terms(attn, xq, xkv)
            out[kind, bias] = {n: t.pow(2).mean().sqrt().item() for n, t in terms.items()}
            if kind == "Shaw" and bias:
                with torch.no_grad():
                    b_q = attn.w_q.bias.view(BASE.n_heads, 1, 1, BASE.d_head)  # (nh, 1, 1, hs) per head
                    k = attn.project(xq, xkv)[1] - attn.w_k.bias.view(BASE.n_heads, 1, BASE.d_head)  # W_K x_j only
                    a_k = attn.rel_k[0][attn.rel_index(t_q, mem + t_q)[0, 0]]  # (Tq, Tk, hs) a^K_ij
                    u_term = (b_q * k[:, :, None]).sum(-1) * attn.scale  # b_Q·W_K x_j, (B, nh, Tq, Tk)
                    v_term = (b_q * a_k).sum(-1) * attn.scale  # b_Q·a^K_ij, (nh, Tq, Tk)
                    centre = lambda t: t - t.mean(-1, keepdim=True)  # noqa: E731
                out["Shaw tied u = v = b_Q: gap in (c)"] = (terms["c"] - centre(u_term)).abs().max().item()
                out["Shaw tied u = v = b_Q: gap in (d)"] = (terms["d"] - centre(v_term)).abs().max().item()
    return out
# --8<-- [end:bias_terms]


# %% [markdown]
# ## 2. What each one adds: parameters and position vectors
#
# Count the parameters of one decoder layer (self-attention and FFN) at the 2017
# base size, d_model 512, 8 heads, d_ff 2048, k = 16, for each `positions`, on the
# meta device (shapes only, no memory). A learned absolute table belongs to the
# embedding, once per model, so it is counted there. Then count how many different
# position vectors a layer uses inside a window of 64 tokens.

# %%
# --8<-- [start:params]
def layer_parameters(**switches) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in DecoderLayer(PAPER.replace(**switches), cross=False).parameters())


def position_parameters() -> dict[str, int]:
    """Parameters a position scheme adds to one layer (or, for a learned table, to the model) at the base size."""
    plain = layer_parameters(positions="sinusoidal")  # the absolute layers: positions are not their business
    with torch.device("meta"):  # an absolute scheme lives in the embedding: its parameters beyond the token table
        tokens = 100 * PAPER.d_model  # a 100-token vocabulary's embedding, not counted
        table = {p: sum(w.numel() for w in Embeddings(PAPER.replace(positions=p), 100).parameters()) - tokens
                 for p in ("sinusoidal", "learned")}
    return {
        "sinusoidal, per model": table["sinusoidal"],
        "learned table, per model (512 positions)": table["learned"],
        "Shaw, per layer": layer_parameters(positions="shaw") - plain,
        "Shaw keys only, per layer": layer_parameters(positions="shaw", rel_on_values=False) - plain,
        "Shaw per-head tables, per layer": layer_parameters(positions="shaw", rel_per_head=True) - plain,
        "XL, per layer": layer_parameters(positions="xl") - plain,
    }


def distinct_position_vectors(window: int = 64) -> dict[str, int]:
    """How many different position vectors the scores of one layer use among all pairs of a window (both directions)."""
    torch.manual_seed(0)
    shaw, xl = attention("Shaw", PAPER), attention("XL", PAPER)
    with torch.no_grad():
        a_k = shaw.rel_k[0][shaw.rel_index(window, window)[0, 0]]  # (T, T, hs): the a^K_ij of every pair
        i, j = torch.arange(window)[:, None], torch.arange(window)[None, :]
        r = xl.sinusoids(i - j)  # (T, T, C): R_{i-j} of every pair (W_kR then maps each one)
    return {"Shaw": len(torch.unique(a_k.reshape(-1, a_k.shape[-1]), dim=0)),
            "XL": len(torch.unique(r.reshape(-1, r.shape[-1]), dim=0))}
# --8<-- [end:params]


# %% [markdown]
# ## 3. Compute and activation memory of one attention call
#
# One self-attention call at the base size (batch 8, a segment of 128 tokens),
# three instruments on the same call:
#
# - `FlopCounterMode` counts the matrix-product FLOPs;
# - a `TorchDispatchMode` sees every tensor the call's operators create: it adds up
#   the numbers written by the operators that are not matrix products (the
#   element-wise work: gathers, scatters, sinusoids, pads, masks, softmax) and keeps
#   the largest tensor created: a measurement, which the test checks against the
#   size predicted from the shapes;
# - `saved_tensors_hooks` add up the bytes autograd keeps for the backward pass
#   (distinct storages, weights excluded): the activation memory a training step holds.
#
# The plain baseline runs its explicit path (`attn_impl="explicit"`), the one the relative
# variants must take: they override `score`, so `F.scaled_dot_product_attention`'s
# fused kernel cannot compute them. Wall time is measured and recorded, never asserted.

# %%
# --8<-- [start:cost]
MATMUL = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
          torch.ops.aten.baddbmm.default}
NO_NEW_MEMORY = {torch.ops.aten._unsafe_view.default}  # a reshape of a fresh result: no new storage


class TensorTally(TorchDispatchMode):
    """Element-wise numbers written and the largest tensor created by the operators that run inside the block."""

    def __init__(self):
        super().__init__()
        self.elementwise, self.largest, self.largest_op = 0, 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in NO_NEW_MEMORY or any(r.alias_info is not None for r in func._schema.returns):
            return out  # views and in-place ops create no tensor
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.elementwise += 0 if func in MATMUL else t.numel()
                if t.numel() * t.element_size() > self.largest:
                    self.largest, self.largest_op = t.numel() * t.element_size(), f"{func} {tuple(t.shape)}"
        return out


def attention_cost(kind: str, batch: int = 8, seg: int = 128, mem: int = 0) -> dict:
    """FLOPs, element-wise work, largest intermediate and bytes saved for backward of one causal self-attention call."""
    torch.manual_seed(0)
    attn = attention(kind, PAPER)
    x = torch.randn(batch, seg, PAPER.d_model)  # (B, T, C) the segment
    kv = torch.cat([torch.randn(batch, mem, PAPER.d_model), x], 1)  # (B, M+T, C) [memory ∘ segment]
    with torch.no_grad(), FlopCounterMode(display=False) as flops, TensorTally() as tally:
        attn(x, kv, causal=True)
    weights = {p.untyped_storage().data_ptr() for p in attn.parameters()}
    saved: dict[int, int] = {}

    def keep(t):
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        attn(x.requires_grad_(), kv, causal=True)
    fused = attention(kind, PAPER.replace(attn_impl="auto")).eval()
    return {"flops": flops.get_total_flops(), "elementwise": tally.elementwise, "largest": tally.largest,
            "largest op": tally.largest_op, "saved": sum(saved.values()), "fused kernel": fused.uses_fast_path()}


def layer_flops(kind: str, batch: int = 8, seg: int = 128, mem: int = 0) -> int:
    """Matrix-product FLOPs of a whole decoder layer (attention + FFN) on the meta device."""
    with torch.device("meta"):
        layer = DecoderLayer(PAPER.replace(positions=KINDS[kind]), cross=False)
        x, m = torch.randn(batch, seg, PAPER.d_model), torch.randn(batch, mem, PAPER.d_model)
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        layer(x, mem=m if mem else None)
    return flops.get_total_flops()


def wall_time(kind: str, batch: int = 2, seg: int = 128, reps: int = 5) -> float:
    """Median seconds of one forward + backward of the attention call (this machine; recorded, not asserted)."""
    torch.manual_seed(0)
    attn = attention(kind, PAPER)
    x = torch.randn(batch, seg, PAPER.d_model, requires_grad=True)
    times = []
    for _ in range(reps + 1):  # the first run warms up
        t0 = time.perf_counter()
        attn(x, causal=True).sum().backward()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[reps // 2]
# --8<-- [end:cost]


# %% [markdown]
# ## 4. How far back can the last output see?
#
# The Transformer-XL proof's `influence` changes one input token at a time and
# reruns a stream segment by segment; the reach is how far back the earliest token
# that changes the last output lies. Here it runs on all three encodings, with and
# without memory: the recurrence belongs to `forward_with_memory`, not to the
# encoding, so Shaw's attention can be given a memory too (XL's own ablation,
# "Shaw encoding + recurrence").

# %%
# --8<-- [start:reach]
def reach(kind: str, n_layers: int, mem_len: int, seed: int, seg: int = 8) -> tuple[int, int]:
    """(measured, predicted) reach of the last output of a stream of segments."""
    n = 2 * n_layers + 3  # enough segments that the stream's start never cuts the reach
    infl = influence(lm(seed, n_layers=n_layers, mem_len=mem_len, positions=KINDS[kind]), seg, n, mem_len, seed)
    return seg * n - 1 - int(torch.nonzero(infl)[0]), predicted_reach(n_layers, seg, mem_len, n)
# --8<-- [end:reach]


# %% [markdown]
# ## 5. Train short, test long
#
# A one-layer causal LM learns to copy the token 3 positions back, on sequences of 8
# tokens (one pass, no memory), and is tested on 8, 16, 32 and 64 tokens. Same
# seeds, batches and budget for every arm; only `positions` changes. Shaw uses
# k = 4, below the training length, for the reason the RPR page gives: a table row
# is trained only if a training offset reaches it.

# %%
SHORT_LAG, TRAIN_LEN, TEST_LENS, SHORT_K = 3, 8, (8, 16, 32, 64), 4
STEPS, LR = 150, 8e-3  # Adam steps and learning rate of every trained arm


# --8<-- [start:short_long]
def lag_batch(g: torch.Generator, batch: int, length: int, lag: int = SHORT_LAG) -> tuple[torch.Tensor, torch.Tensor]:
    """Target at t is the token at t - lag; the first `lag` positions have none (-100: ignored)."""
    x = torch.randint(1, V, (batch, length), generator=g)
    y = torch.full_like(x, -100)
    y[:, lag:] = x[:, :-lag]
    return x, y


@cache
def short_model(kind: str, seed: int) -> DecoderLM:
    """A 1-layer LM trained on length 8 to copy the token SHORT_LAG back."""
    torch.manual_seed(seed)
    model = DecoderLM(BASE.replace(n_layers=1, positions=KINDS[kind], mem_len=0, rel_clip=SHORT_K)).train()
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98), fused=True)  # fused: same update, faster
    g = torch.Generator().manual_seed(1000 + seed)
    for _ in range(STEPS):
        x, y = lag_batch(g, 32, TRAIN_LEN)
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


@cache
def train_short_test_long(kind: str, seed: int) -> dict[int, float]:
    """Accuracy at each test length of the 1-layer LM trained on length 8."""
    model = short_model(kind, seed)
    out = {}
    for n in TEST_LENS:
        x, y = lag_batch(torch.Generator().manual_seed(10_000 + seed), 64, n)
        with torch.no_grad():
            hit = model(x).argmax(-1) == y
        out[n] = hit[y != -100].float().mean().item()
    return out
# --8<-- [end:short_long]


# %% [markdown]
# ## 6. A dependency that crosses the segment boundary
#
# The target at every position is the token DIST = 12 positions back, and segments
# are 8 tokens: every answer lies in an earlier segment. A one-layer LM is trained
# the way Transformer-XL trains: a stream of segments, each reading the memory the
# previous ones left (detached). With a memory of 8 states, query p of a segment
# sees offsets up to p + 8, so the answer is within reach for p >= 4 ("in memory")
# and out of every arm's reach for p < 4 ("beyond memory": a built-in control).
#
# Arms (same seed, data and budget): XL with memory; Shaw with the memory (XL's
# "Shaw encoding + recurrence" ablation), with k = 16 and with k = 8 < DIST; absolute
# sinusoids with the memory. Shaw as published, inside one segment, is the Shaw model
# with its memory switched off at evaluation (and the XL model likewise: a model
# without memory cannot see 12 back at all, which the reach test shows exactly). One layer makes the ceilings exact: when several keys carry the same
# position signal, the best a model can do is predict the most common token among
# them (`mode_ceiling`).

# %%
SEG, DIST, MEM, GROWN = 8, 12, 8, 16  # segment length, dependency distance, memory in training / at evaluation
ARMS = {  # name -> switches of the one-layer DecoderLM
    "XL + memory": dict(positions="xl", mem_len=MEM),
    "Shaw + memory, k=16": dict(positions="shaw", mem_len=MEM, rel_clip=16),
    "Shaw + memory, k=8": dict(positions="shaw", mem_len=MEM, rel_clip=8),
    "absolute + memory": dict(positions="sinusoidal", mem_len=MEM),
}


# --8<-- [start:long_range]
def boundary_stream(model: DecoderLM, g: torch.Generator, batch: int, segments: int, mem_len: int):
    """Feed a random stream segment by segment; yield each segment's logits and the tokens DIST back."""
    warm = math.ceil(DIST / SEG)  # earlier segments, so that every target exists
    ids = torch.randint(1, V, (batch, (warm + segments) * SEG), generator=g)
    mems = None
    with torch.no_grad():
        for s in range(warm):
            _, mems = model.forward_with_memory(ids[:, s * SEG:(s + 1) * SEG], mems, mem_len)
    for s in range(warm, warm + segments):
        logits, mems = model.forward_with_memory(ids[:, s * SEG:(s + 1) * SEG], mems, mem_len)  # mems detached
        yield logits, ids[:, s * SEG - DIST:(s + 1) * SEG - DIST]


def per_position_accuracy(model: DecoderLM, seed: int, mem_len: int) -> torch.Tensor:
    """(SEG,) accuracy of each query position of a segment, over 128 streams of 4 segments."""
    with torch.no_grad():
        hits = [(logits.argmax(-1) == target).float()
                for logits, target in boundary_stream(model, torch.Generator().manual_seed(10_000 + seed), 128, 4,
                                                      mem_len)]
    return torch.cat(hits).mean(0)


@cache
def cross_boundary(arm: str, seed: int) -> dict[str, torch.Tensor]:
    """Train one arm on the stream; per-position accuracy with the trained memory (and with a grown one)."""
    switches = ARMS[arm]
    torch.manual_seed(seed)
    model = DecoderLM(BASE.replace(n_layers=1, **switches)).train()
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98), fused=True)  # fused: same update, faster
    for logits, target in boundary_stream(model, torch.Generator().manual_seed(1000 + seed), 32, STEPS,
                                          switches["mem_len"]):
        loss = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    out = {"trained memory": per_position_accuracy(model, seed, switches["mem_len"])}
    if switches["mem_len"]:
        out["grown memory"] = per_position_accuracy(model, seed, GROWN)  # the memory may grow at evaluation
        out["memory off"] = per_position_accuracy(model, seed, 0)  # the same weights inside one segment
    return out


def mode_ceiling(n: int, values: int = V - 1) -> float:
    """Best accuracy when the answer is one of n i.i.d. uniform tokens that the model cannot tell apart:
    predict the most common one, right with probability E[max count] / n (exact, by generating functions)."""
    def at_most(m: int) -> Fraction:  # P(no token appears more than m times among n draws)
        poly = [Fraction(1)]
        for _ in range(values):
            nxt = [Fraction(0)] * (len(poly) + m)
            for i, c in enumerate(poly):
                for j in range(m + 1):
                    nxt[i + j] += c / math.factorial(j)
            poly = nxt[: n + 1]
        return poly[n] * math.factorial(n) / Fraction(values) ** n if len(poly) > n else Fraction(0)
    return float(sum(1 - at_most(m - 1) for m in range(1, n + 1)) / n)
# --8<-- [end:long_range]


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    print({kind: present(r["rms"]) for kind, r in score_anatomy(0).items() if kind in KINDS})
    print(position_parameters(), distinct_position_vectors())
    print({kind: attention_cost(kind) for kind in KINDS})
    print({kind: reach(kind, 3, 8, 0) for kind in KINDS})
    print({kind: train_short_test_long(kind, 0) for kind in KINDS})
    print({arm: cross_boundary(arm, 0) for arm in ARMS})


# %% [markdown]
# ## Tests: each asserts a difference between the columns

# %%
import pytest  # noqa: E402



# --8<-- [start:test_terms]
@pytest.mark.claim("C-RPR-1", "confirmed")
@pytest.mark.claim("C-XL-3", "confirmed")
def test_score_terms_side_by_side(ev, seed):
    """Split by the same four probes on q and k, Shaw's score has terms (a) and (b) and a position term on the values;
    XL's has (a)-(d) and none on the values; plain attention only (a). Split on the module's INPUTS instead, Shaw with
    projection biases (our default) also has query-free (c) and (d) terms, both made of b_Q (a tied u = v); without
    biases (the papers' code) it has none. Exact (float64), properties of our module; "Shaw has no query-independent
    term" would be refuted for biased projections if the input-level (c), (d) came out non-zero, as they do."""
    r = score_anatomy(seed)
    for kind in KINDS:
        ev.record(f"score terms present, {kind}", present(r[kind]["rms"]), expect={
            "absolute": "(a): positions live in the input", "Shaw": "(a) (b)", "XL": "(a) (b) (c) (d)"}[kind])
        ev.record(f"RMS of (a), (b), (c), (d), {kind}", [r[kind]["rms"][n] for n in "abcd"], key=False)
        ev.record(f"position term on the values, {kind}", "yes" if r[kind]["value term"] > 1e-9 else "no",
                  expect="yes for Shaw (a^V) only")
    ev.record("XL: max gap between the probes and XLAttention.score_terms", r["XL gap to score_terms"],
              expect="0 (rounding)")
    ev.record("Shaw: max gap between (b) and q·a^K built pair by pair", r["Shaw (b) gap to q·a^K"],
              expect="0 (rounding)")
    ev.record("Shaw with zeroed tables: max (b)", r["Shaw zero tables: max (b)"], expect="0: the tables are all of (b)")
    assert [present(r[kind]["rms"]) for kind in KINDS] == ["(a)", "(a) (b)", "(a) (b) (c) (d)"]
    assert min(min(r[kind]["rms"][n] for n in "ab") for kind in ("Shaw", "XL")) > 0.05
    assert min(r["XL"]["rms"][n] for n in "cd") > 0.05
    assert r["XL gap to score_terms"] < 1e-12 and r["Shaw (b) gap to q·a^K"] < 1e-12
    assert r["Shaw zero tables: max (b)"] == 0 and r["Shaw zero tables: gap to q·k"] < 1e-12
    assert r["Shaw"]["value term"] > 0.05 and r["XL"]["value term"] == r["absolute"]["value term"] == 0
    # what each adds to plain attention: Shaw two tables; XL its own key map for R (no table: R is computed), u, v
    for kind in ("Shaw", "XL"):
        ev.record(f"parameters added to plain attention, {kind}", r["added parameters"][kind])
    assert r["added parameters"] == {"absolute": [], "Shaw": ["rel_k", "rel_v"], "XL": ["u", "v", "w_r.weight"]}
    # the same question on the inputs: with biases, b_Q is a query-free query
    b = bias_anatomy(seed)
    for kind in KINDS:
        for bias in (True, False):
            ev.record(f"terms that vary across keys, as functions of the inputs, {kind}, bias={bias}",
                      present(b[kind, bias], tol=1e-9),
                      key=kind != "absolute")
    ev.record("Shaw with biases: max |(c) − b_Q·W_K x_j| and |(d) − b_Q·a^K_ij| (centred)",
              [b["Shaw tied u = v = b_Q: gap in (c)"], b["Shaw tied u = v = b_Q: gap in (d)"]],
              expect="0: one vector b_Q plays u and v")
    assert present(b["Shaw", False]) == "(a) (b)" and present(b["Shaw", True]) == "(a) (b) (c) (d)"
    assert present(b["XL", False]) == present(b["XL", True]) == "(a) (b) (c) (d)"
    assert present(b["absolute", False]) == "(a)" and present(b["absolute", True]) == "(a) (c)"
    assert max(b["Shaw tied u = v = b_Q: gap in (c)"], b["Shaw tied u = v = b_Q: gap in (d)"]) < 1e-12
# --8<-- [end:test_terms]


def test_parameters_and_position_vectors(ev, seed):
    """At the 2017 base size Shaw adds 2(2k+1)·d_head parameters per layer, XL adds d_model² + 2·d_model; Shaw's
    layer uses 2k+1 distinct position vectors in any window, XL's one per distance. Counts of our module (exact)."""
    p = position_parameters()
    C, hs, k, nh = PAPER.d_model, PAPER.d_head, PAPER.rel_clip, PAPER.n_heads
    expect = {
        "sinusoidal, per model": 0,
        "learned table, per model (512 positions)": 512 * C,
        "Shaw, per layer": 2 * (2 * k + 1) * hs,
        "Shaw keys only, per layer": (2 * k + 1) * hs,
        "Shaw per-head tables, per layer": 2 * (2 * k + 1) * hs * nh,
        "XL, per layer": C * C + 2 * C,
    }
    formula = {"learned table, per model (512 positions)": "max_len·d_model, once per model",
               "Shaw, per layer": "2(2k+1)·d_head", "Shaw keys only, per layer": "(2k+1)·d_head",
               "Shaw per-head tables, per layer": "2(2k+1)·d_model",
               "XL, per layer": "d_model² + 2·d_model (W_kR, u, v)",
               "sinusoidal, per model": "0: a fixed table (a buffer)"}
    for name, count in p.items():
        ev.record(f"parameters added, {name}", count, expect=f"{formula[name]} = {expect[name]:,}")
    ev.record("XL / Shaw parameters per layer", p["XL, per layer"] / p["Shaw, per layer"], key=False)
    assert p == expect
    distinct = distinct_position_vectors()
    ev.record("distinct position vectors in a 64-token window, Shaw k=16", distinct["Shaw"], expect="2k+1 = 33")
    ev.record("distinct position vectors in a 64-token window, XL", distinct["XL"],
              expect="2·64−1 = 127: one per distance")
    assert distinct == {"Shaw": 2 * k + 1, "XL": 2 * 64 - 1}


# --8<-- [start:test_cost]
def test_compute_and_memory_of_the_score(ev, seed):
    """Per attention call (base size, batch 8, 128 tokens): Shaw adds 4·B·nh·T·(2k+1)·d_head FLOPs and no tensor
    larger than the score matrix; XL adds the W_kR projection and a second product over T_k+T_q−1 distances, and its
    relative shift builds a tensor (T_k+T_q)/T_k times the score matrix. Counts of our module's implementation (exact;
    wall times recorded, not asserted)."""
    B, T, C, nh, hs, k = 8, 128, PAPER.d_model, PAPER.n_heads, PAPER.d_head, PAPER.rel_clip
    cost = {kind: attention_cost(kind) for kind in KINDS}
    cost["XL + memory 128"] = attention_cost("XL", mem=T)
    base = cost["absolute"]
    for kind, c in cost.items():
        ev.record(f"attention FLOPs, {kind}", c["flops"], key=False)
        ev.record(f"attention FLOPs / absolute, {kind}", c["flops"] / base["flops"])
        ev.record(f"element-wise numbers written / absolute, {kind}", c["elementwise"] / base["elementwise"],
                  expect="gathers, scatters, sinusoids, pads", key=False)
        ev.record(f"largest intermediate (MB), {kind}", c["largest"] / 2**20, expect=c["largest op"])
        ev.record(f"bytes saved for backward (MB), {kind}", c["saved"] / 2**20, key=False)
        ev.record(f"can use the fused attention kernel, {kind}", c["fused kernel"], key=False)
    layers = {kind: layer_flops(kind) for kind in KINDS}
    for kind in KINDS:
        ev.record(f"decoder-layer FLOPs (attention + FFN) / absolute, {kind}", layers[kind] / layers["absolute"])
    ev.record("decoder-layer FLOPs / absolute, XL + memory 128", layer_flops("XL", mem=T) / layers["absolute"],
              key=False)
    times = {kind: wall_time(kind) for kind in KINDS}
    for kind in ("Shaw", "XL"):
        ev.record(f"wall time forward+backward / absolute, {kind} (this CPU; recorded, not asserted)",
                  times[kind] / times["absolute"], expect="Shaw et al.: 7% fewer steps per second (whole model, GPU)")
    # exact FLOP counts: every extra product, and nothing else
    n_dist = 2 * T - 1  # distances T_k + T_q - 1 without memory
    assert cost["Shaw"]["flops"] - base["flops"] == 2 * 2 * B * nh * T * (2 * k + 1) * hs  # q·w^K rows, buckets·w^V
    assert cost["XL"]["flops"] - base["flops"] == 2 * n_dist * C * C + 2 * B * nh * T * n_dist * hs  # W_kR R, (q+v)·r
    # memory: Shaw never builds more than the score matrix; XL's shift builds (T_k + T_q)/T_k of it
    scores = B * nh * T * T * 4  # float32 bytes of the (B, nh, T_q, T_k) score matrix
    assert base["largest"] == cost["Shaw"]["largest"] == scores
    assert cost["XL"]["largest"] == B * nh * T * (T + T) * 4
    assert cost["XL + memory 128"]["largest"] == B * nh * T * (2 * T + T) * 4
    assert cost["Shaw"]["saved"] > base["saved"] and cost["XL"]["saved"] > cost["Shaw"]["saved"]
    assert base["fused kernel"] and not cost["Shaw"]["fused kernel"] and not cost["XL"]["fused kernel"]
    assert layers["absolute"] < layers["Shaw"] < layers["XL"]
# --8<-- [end:test_cost]


def test_translation_invariance(ev, seed):
    """Move a sentence 6 slots inside a padded context: Shaw's and XL's outputs do not change, absolute ones do. Exact
    (float64, our module); it would be refuted by a relative model whose logits moved beyond rounding."""
    change = {kind: shift_change(KINDS[kind], seed) for kind in KINDS}
    change["learned absolute"] = shift_change("learned", seed)
    for kind, c in change.items():
        ev.record(f"max logit change after the move, {kind}", c,
                  expect="0 (rounding): only offsets enter" if kind in ("Shaw", "XL") else "O(1)")
    assert max(change["Shaw"], change["XL"]) < 1e-12
    assert min(change["absolute"], change["learned absolute"]) > 1e-2


# --8<-- [start:test_reach]
@pytest.mark.claim("C-XL-1", "confirmed")
def test_reach_comes_from_the_memory(ev, seed):
    """Without memory every encoding sees one segment back; with it, every encoding reaches (N+1)L−1: the reach is
    the recurrence's, whatever the encoding. No gradient crosses the boundary in either relative model. Exact (bitwise
    influence, our module); "XL's encoding gives the reach" would hold if Shaw or absolute positions reached less."""
    rows = {(kind, n, mem): reach(kind, n, mem, seed) for kind in KINDS for n in (1, 2, 3) for mem in (0, 8)}
    for (kind, n, mem), (measured, predicted) in rows.items():
        ev.record(f"reach, {kind}, {n} layer{'s' * (n > 1)}, memory {mem}", measured,
                  expect=f"{predicted} predicted", key=n == 3)
    assert all(measured == predicted for measured, predicted in rows.values())
    assert all(rows[(kind, n, 0)][0] == 7 and rows[(kind, n, 8)][0] == 8 * (n + 1) - 1
               for kind in KINDS for n in (1, 2, 3))
    for kind in ("Shaw", "XL"):
        grad = gradient_reach(lm(seed, n_layers=3, positions=KINDS[kind]), 8, 5, seed)
        ev.record(f"inputs before the last segment that receive gradient, {kind}", int((grad[:-8] != 0).sum()),
                  expect="0: the memory is detached")
        assert (grad[:-8] == 0).all() and (grad[-8:] != 0).all()
# --8<-- [end:test_reach]


@pytest.mark.claim("C-RPR-2", "confirmed")
def test_train_short_test_long(ev, seed):
    """Trained on 8 tokens, Shaw (k=4) and XL copy the token 3 back at 8x the length; absolute sinusoids lose it. The
    causal Shaw model reads exactly the k+1 table rows its mask allows (offsets -k..0, the clip boundary -k included)
    at 8 and 64 tokens. Would be refuted if Shaw's or XL's accuracy fell with the length like the absolute arm's, or if
    the boundary row went unread."""
    acc = {kind: train_short_test_long(kind, seed) for kind in KINDS}
    for kind in KINDS:
        for n in TEST_LENS:
            ev.record(f"lag-3 copy at length {n}, {kind}", acc[kind][n], key=n in (8, 64),
                      expect="stays" if kind != "absolute" else "falls once positions are unseen")
    _plot_lengths(ev, acc)
    # thresholds from the spread over seeds 100-239 and 12345 (bench/seeds/relative/proof_rpr_vs_xl.json for 100-139):
    # accuracy at the training length Shaw 0.998 ± 0.009 (min 0.94), XL 1.0, absolute 0.982 ± 0.031 (min 0.79, seed
    # 12345); Shaw's loss from length 8 to its worst length 0.0005 ± 0.002 (max 0.016); absolute at 64 0.234 ± 0.024
    # (max 0.31), its loss from 8 to 64 0.75 ± 0.029 (min 0.62)
    assert min(acc[kind][TRAIN_LEN] for kind in KINDS) > 0.6  # every arm learned the task at the training length ...
    for kind in ("Shaw", "XL"):  # ... the relative arms keep what they learned at every length ...
        assert acc[kind][TRAIN_LEN] - min(acc[kind][n] for n in TEST_LENS) < 0.05
    assert acc["absolute"][64] < 0.5  # ... and absolute sinusoids lose it at 8x the length
    # which table rows the trained causal Shaw model reads (pairs with a nonzero attention weight), at 8 and at 64:
    # the mask hides every key after the query, so exactly the k+1 rows of offsets -k..0 are read, the boundary row -k
    # by every pair k or more back, and the k rows of offsets +1..+k never (they would serve a bidirectional model: the
    # RPR page's encoder reads all 2k+1). Exact counts of what the model computes, not statistics.
    shaw = short_model("Shaw", seed)
    for n in (TRAIN_LEN, 64):
        x, _ = lag_batch(torch.Generator().manual_seed(10_000 + seed), 64, n)
        pairs = row_usage(shaw, x)["pairs"]
        ev.record(f"Shaw k={SHORT_K}, length {n}: pairs reading table row of offset -{SHORT_K}..+{SHORT_K}",
                  pairs.tolist(), key=False, expect="offsets -k..0 only: the causal mask hides the rest")
        k, heads = SHORT_K, shaw.cfg.n_heads
        assert (pairs[: k + 1] > 0).all() and (pairs[k + 1:] == 0).all()
        assert pairs[0] == 64 * heads * (n - k) * (n - k + 1) // 2  # every key k or more back, through row -k


# --8<-- [start:test_boundary]
@pytest.mark.claim("C-XL-1", "confirmed")
def test_dependency_across_the_boundary(ev, seed):
    """Copy the token 12 back with segments of 8: with the memory, XL and Shaw (k=16) solve every position within
    reach; the same weights without the memory, or for answers beyond it, are at chance; a memory grown at evaluation
    brings those into reach. Would be refuted if Shaw with the memory failed where XL succeeds (then XL's encoding, not
    the memory, would carry the reach), or if either solved it with the memory switched off."""
    arms = ("XL + memory", "Shaw + memory, k=16")
    runs = {arm: cross_boundary(arm, seed) for arm in arms}
    inside, beyond = slice(DIST - MEM, SEG), slice(0, DIST - MEM)  # query positions 4..7 / 0..3
    part = lambda arm, key, where: runs[arm][key][where].mean().item()  # noqa: E731
    for arm in arms:
        ev.record(f"target in memory (p ≥ 4), {arm}", part(arm, "trained memory", inside))
        ev.record(f"same weights, memory off at evaluation (within one segment), {arm}", part(arm, "memory off", inside),
                  expect=f"chance {CHANCE:.3f}")
        ev.record(f"target beyond memory (p < 4), {arm}", part(arm, "trained memory", beyond), expect=f"chance {CHANCE:.3f}")
        ev.record(f"memory grown to {GROWN} at evaluation, all positions, {arm}", part(arm, "grown memory", slice(None)))
    # thresholds from the spread over seeds 100-219 (bench/seeds/relative/proof_rpr_vs_xl.json for 100-139): inside the
    # memory XL 0.999 ± 0.002, Shaw 0.995 ± 0.025 (its worst seeds 0.78, 0.94: a fit that stops short, still far above
    # chance 0.066); grown memory Shaw 0.99 ± 0.03 (min 0.79); memory off / beyond 0.066 ± 0.005 (max 0.084)
    for arm in arms:
        assert part(arm, "trained memory", inside) > 0.6  # the memory makes it solvable, for either encoding
        assert part(arm, "memory off", inside) < CHANCE + 0.05 and part(arm, "trained memory", beyond) < CHANCE + 0.05
        assert part(arm, "grown memory", slice(None)) > 0.6


@pytest.mark.claim("C-XL-1", "confirmed")
def test_what_the_memory_reaches_but_the_scores_cannot_single_out(ev, seed):
    """Same task and budget: absolute positions with the memory, and Shaw clipped below the distance (k=8 < 12), stay
    under the exact one-layer ceilings of guessing among keys that share a position signal; XL and Shaw (k=16) do not.
    Would be refuted if either capped arm beat its ceiling (then its scores could tell the keys apart after all)."""
    acc = {arm: cross_boundary(arm, seed)["trained memory"][DIST - MEM:SEG].mean().item() for arm in ARMS}
    two = mode_ceiling(2)  # absolute: the cached and the current token share one position row
    clipped = sum(mode_ceiling(p + 1) for p in range(DIST - MEM, SEG)) / (SEG - DIST + MEM)  # Shaw k=8: p+1 keys
    for arm in ("Shaw + memory, k=8", "absolute + memory"):
        ev.record(f"target in memory (p ≥ 4), {arm}", acc[arm])
    ev.record("ceiling, absolute + memory (two keys share a position row)", two)
    ev.record("ceiling, Shaw + memory k=8 (offsets 8 to p+8 share a row), mean over p ≥ 4", clipped)
    _plot_boundary(ev, {arm: cross_boundary(arm, seed) for arm in ARMS})
    # the ceilings are exact; the 0.05 covers the sampling noise of 512 test positions (seed spread recorded)
    assert acc["absolute + memory"] < two + 0.05 and acc["Shaw + memory, k=8"] < clipped + 0.05
    # the uncapped arms must beat the capped arms' ceilings, not just the capped arms: one of 20 random seeds
    # (rng 2027) fitted XL only to 0.67 (usually 0.999), still above the absolute arm's ceiling 0.533
    assert acc["XL + memory"] > two + 0.05
    assert acc["Shaw + memory, k=16"] > clipped + 0.05
# --8<-- [end:test_boundary]


def _plot_lengths(ev, acc):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for (kind, a), (style, color, ms) in zip(acc.items(), (("s--", "C1", 5), ("o-", "C0", 8), ("^-", "C2", 4))):
        ax.plot(TEST_LENS, [a[n] for n in TEST_LENS], style, color=color, alpha=0.8, ms=ms,
                label=f"{kind}" + (f" (k={SHORT_K})" if kind == "Shaw" else ""))
    ax.axvline(TRAIN_LEN, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set(xlabel="test length (trained on 8)", ylabel="lag-3 copy accuracy", ylim=(0, 1.05), xticks=TEST_LENS,
           xticklabels=[str(n) for n in TEST_LENS])
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "lengths", "Copy the token 3 back: one-layer causal LMs trained on 8 tokens, tested up to 64.")


def _plot_boundary(ev, runs):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    ax.axvspan(-0.5, DIST - MEM - 0.5, color="grey", alpha=0.12, lw=0)
    ax.text((DIST - MEM - 1) / 2, 0.55, "answer beyond\nthe memory", ha="center", fontsize=8, color="dimgrey")
    pos = torch.arange(SEG).float()
    for i, (arm, r) in enumerate(runs.items()):
        ax.plot(pos + (i - 2) * 0.07, r["trained memory"], ("o-", "s-", "s--", "^-")[i], color=f"C{i}", ms=4, lw=1.2,
                label=arm)
    grown = runs["XL + memory"]["grown memory"]
    ax.plot(pos, grown, "*", color="C0", ms=9, alpha=0.6, label=f"XL + memory, grown to {GROWN} at evaluation")
    within = range(DIST - MEM, SEG)
    ax.plot(within, [mode_ceiling(2)] * len(within), "_", color="C4", ms=14, mew=2, label="ceiling, absolute + memory")
    ax.plot(within, [mode_ceiling(p + 1) for p in within], "_", color="C3", ms=14, mew=2,
            label="ceiling, Shaw + memory, k=8")
    ax.axhline(CHANCE, color="grey", lw=0.8, ls=":")
    ax.set(xlabel=f"query position in its segment (segments of {SEG}; answer {DIST} back)", ylabel="accuracy",
           ylim=(0, 1.05), xticks=range(SEG))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    ev.figure(fig, "boundary", f"Copy the token {DIST} back across segments of {SEG}: accuracy per query position, "
                               "(dotted: chance; bars: the exact one-layer ceilings of "
                               "the two arms whose scores cannot single the answer out). In the shaded positions the "
                               "answer lies "
                               f"beyond a memory of {MEM}; stars: the XL model with its memory grown to {GROWN} at "
                               "evaluation.")

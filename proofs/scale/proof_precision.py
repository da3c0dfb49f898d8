# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # fp32, fp16, bf16: range, precision, loss scaling, master weights, autocast
#
# Proofs for `docs/scale/precision.md`. Everything here is exact: the formats come from `torch.finfo`,
# the rest are counts of rounding events on CPU tensors (the shared DecoderLM's real gradient and
# weights), and the autocast test records what this torch does. No training; the few thresholds on counts
# come with their spread over seeds 100-139 in a comment.
# Run: `pytest proofs/scale/proof_precision.py`.

# %%
from __future__ import annotations

import collections
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from proofs.train import token_loss
from proofs.transformer import DecoderLM, TransformerConfig

VOCAB, T, BATCH = 16, 8, 8


def tiny_cfg(**switches) -> TransformerConfig:
    base = dict(vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout_emb=0.0, dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})


# %% [markdown]
# ## 1. The three formats, read from torch.finfo

# %%
# --8<-- [start:formats]
def describe(dtype: torch.dtype) -> dict:
    """Largest finite value, smallest normal, machine epsilon (gap above 1.0), mantissa bits = -log2(eps),
    smallest subnormal (eps * smallest normal, where the format has subnormals)."""
    f = torch.finfo(dtype)
    return {"max": f.max, "smallest_normal": f.smallest_normal, "eps": f.eps,
            "mantissa_bits": round(-math.log2(f.eps)), "smallest_subnormal": f.eps * f.smallest_normal}
# --8<-- [end:formats]


@pytest.mark.claim("C-PREC-1", "confirmed")
def test_formats_range_and_precision(ev):
    """Exact, by the formats' definitions (read from torch.finfo). Shows fp16 tops out at 65504 with 10 mantissa
    bits while bf16 has fp32's exponent range (same smallest normal, max within 1%) with only 7 mantissa bits.
    Would be refuted if bf16's eps were smaller than fp16's (bf16 more precise) or its range fp16's."""
    d = {name: describe(dt) for name, dt in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16))}
    for name, row in d.items():
        for k, v in row.items():
            ev.record(f"{name} {k}", v)
    for name, dt in (("fp8 E4M3", torch.float8_e4m3fn), ("fp8 E5M2", torch.float8_e5m2)):
        row = describe(dt)
        ev.record(f"{name} max", row["max"])
        ev.record(f"{name} mantissa_bits", row["mantissa_bits"])
    assert d["fp16"]["max"] == 65504.0 and d["fp16"]["mantissa_bits"] == 10
    assert d["bf16"]["mantissa_bits"] == 7 and d["fp32"]["mantissa_bits"] == 23
    assert d["bf16"]["smallest_normal"] == d["fp32"]["smallest_normal"] == 2.0 ** -126
    assert abs(d["bf16"]["max"] / d["fp32"]["max"] - 1) < 0.01
    assert d["fp16"]["smallest_normal"] == 2.0 ** -14 and d["fp16"]["smallest_subnormal"] == 2.0 ** -24
    assert d["bf16"]["eps"] > d["fp16"]["eps"]  # bf16 is the LESS precise 16-bit format


# %% [markdown]
# ## 2. Small gradients underflow in fp16; static loss scaling keeps them
#
# The shared model's real gradient, multiplied by a small factor `SMALL` to stand for a small loss
# (a loss weighted down, or gradients late in training, where Micikevicius et al. found many values
# below fp16's range). Storing that gradient in fp16 is one cast; loss scaling multiplies by 2^k
# before the cast and divides in fp32 after. Because backpropagation is linear in the loss, scaling the
# loss by 2^k scales every gradient by exactly 2^k (a power of two: no rounding of its own).

# %%
SMALL = 2.0 ** -20          # stands for a small loss; named on the page
SCALE = 2.0 ** 16           # a static loss scale


@functools.cache
def model_gradient(seed: int) -> torch.Tensor:
    """All parameter gradients of the shared DecoderLM (fp32) on one random batch, flattened."""
    torch.manual_seed(seed)
    model = DecoderLM(tiny_cfg())
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (BATCH, T + 1), generator=g)
    token_loss(model(ids[:, :-1]), ids[:, 1:]).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


# --8<-- [start:scaling]
def fp16_backward(seed: int, scale: float, small: float = SMALL) -> torch.Tensor:
    """A real fp16 backward: the shared model in half precision, the loss times `small` (by default the same ×2^-20
    as the stored gradient above; small=1 is the model's own loss) times `scale`, and the gradients it leaves in
    fp16, unscaled in fp32, flattened in the same order as `model_gradient`."""
    torch.manual_seed(seed)
    model = DecoderLM(tiny_cfg()).half()
    ids = torch.randint(1, VOCAB, (BATCH, T + 1), generator=torch.Generator().manual_seed(seed))
    loss = token_loss(model(ids[:, :-1]).float(), ids[:, 1:]) * small
    (loss * scale).backward()
    return torch.cat([p.grad.flatten().float() / scale for p in model.parameters() if p.grad is not None])


def stored(g32: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """What survives of an fp32 gradient stored in `dtype`: multiply by the loss scale, cast, unscale in fp32."""
    return (g32 * scale).to(dtype).float() / scale


def flushed(g32: torch.Tensor, kept: torch.Tensor) -> float:
    """Fraction of the nonzero entries that became exactly 0."""
    nz = g32 != 0
    return ((kept == 0) & nz).sum().item() / nz.sum().item()
# --8<-- [end:scaling]


@pytest.mark.claim("C-PREC-1", "confirmed")
def test_fp16_gradient_underflow_and_loss_scaling(ev, seed):
    """Exact counts of rounding on the shared model's gradient (×2^-20, a small loss). Shows that storing it in
    fp16 flushes many entries to 0, that a static loss scale of 2^16 brings them back, that bf16 flushes none
    (fp32's range), and that too large a scale overflows to inf. Would be refuted if fp16 kept the small
    gradient without scaling, or if scaling left as many zeros. The real fp16 backward arm uses the same ×2^-20 loss,
    so its full flush without scaling is close to certain by construction (dL/dlogits ≈ 2^-20·(p − y)/(B·T) is already
    below fp16's smallest subnormal); the row at the model's own loss shows how few entries flush without the factor."""
    g = model_gradient(seed) * SMALL
    ev.record("gradient entries (nonzero)", int((g != 0).sum()))
    ev.record("median |gradient| (×2^-20)", g[g != 0].abs().median().item())
    f16 = flushed(g, stored(g, torch.float16))
    f16s = flushed(g, stored(g, torch.float16, SCALE))
    bf = flushed(g, stored(g, torch.bfloat16))
    sub = ((g.abs() < 2.0 ** -14) & (g != 0)).float().mean().item()
    ev.record("fraction flushed to 0, fp16, no scaling", f16, expect="a large share")
    ev.record("fraction below fp16's smallest normal 2^-14, no scaling", sub)
    ev.record("fraction flushed to 0, fp16, loss scale 2^16", f16s, expect="0 or near")
    ev.record("fraction flushed to 0, bf16, no scaling", bf, expect="0")
    normal = (g * SCALE).abs() >= 2.0 ** -14  # normal in fp16 after scaling: full 11-bit significand
    rel = ((stored(g, torch.float16, SCALE) - g).abs() / g.abs())[normal].max().item()
    ev.record("fraction still subnormal in fp16 after scale 2^16 (fewer significant bits)",
              ((~normal) & (g != 0)).float().mean().item())
    ev.record("largest relative error, entries normal after scale 2^16", rel, expect="≤ 2^-11 (half an ulp)")
    overflow = torch.isinf((g * 2.0 ** 40).half()).float().mean().item()
    ev.record("fraction overflowing to inf, fp16, loss scale 2^40", overflow, expect="> 0: the scale has a ceiling")
    one = torch.tensor(1e-8)
    ev.record("1e-8 stored in fp16", one.half().item(), expect="0")
    ev.record("1e-8 stored in fp16 with scale 2^16, unscaled", stored(one, torch.float16, SCALE).item())
    real, real_scaled = fp16_backward(seed, 1.0), fp16_backward(seed, SCALE)
    ev.record("real fp16 backward: fraction of the fp32 gradient's nonzero entries that are 0, no scaling",
              flushed(model_gradient(seed), real), expect="most: the small upstream gradients underflow first")
    ev.record("real fp16 backward: same, loss scale 2^16", flushed(model_gradient(seed), real_scaled), expect="near 0")
    own = flushed(model_gradient(seed), fp16_backward(seed, 1.0, small=1.0))
    ev.record("real fp16 backward at the model's own loss (no ×2^-20), no scaling: fraction flushed to 0", own,
              expect="near 0: at this scale the toy's gradients fit in fp16")
    # over seeds 100-139: no scaling 1.0 on every seed (sd 0); scale 2^16 0.00042 ± 0.00034 (max 0.0023)
    assert flushed(model_gradient(seed), real) > 0.5 and flushed(model_gradient(seed), real_scaled) < 0.02
    # the model's own loss, no scaling: 3.7e-5 ± 4.9e-5 over seeds 100-139 (min 0, max 1.7e-4); 0.01 is far outside,
    # and far below the 1.0 of the ×2^-20 arm, so the factor, not fp16 itself, makes that arm flush
    assert own < 0.01
    assert one.half().item() == 0.0 and abs(stored(one, torch.float16, SCALE).item() / 1e-8 - 1) < 2.0 ** -10
    assert f16 > 0.1 and f16s < f16 / 100 and bf == 0.0
    assert rel <= 2.0 ** -11 and overflow > 0


# %% [markdown]
# ## 3. Small updates vanish in a bf16 weight; an fp32 master copy keeps them

# %%
# --8<-- [start:master]
def accumulate(w0: float, update: float, steps: int, dtype: torch.dtype, master: bool) -> float:
    """Add `update` `steps` times to a weight kept in `dtype`; with master=True the sum is kept in fp32 and
    only the copy used by the forward pass is rounded to `dtype`."""
    w = torch.tensor(w0, dtype=torch.float32 if master else dtype)
    u = torch.tensor(update, dtype=w.dtype)
    for _ in range(steps):
        w = w + u
    return w.to(dtype).float().item() if master else w.float().item()
# --8<-- [end:master]


@pytest.mark.claim("C-PREC-1", "confirmed")
def test_small_updates_lost_in_bf16_kept_by_fp32_master(ev, seed):
    """Exact. w = 1 plus 1e-4 a thousand times: in bf16 every addition rounds back to 1 (eps/2 = 2^-8 ≈ 3.9e-3
    > 1e-4), in fp32, or with an fp32 master copy, w reaches 1.1. The other side of the threshold: an update of
    1e-2 (> eps/2) does move a bf16 weight. On the shared model, one SGD step (lr 1e-3) leaves most weights
    unchanged in bf16 and almost none in fp32. Would be refuted if the bf16 weight moved under 1e-4 updates."""
    bf_alone = accumulate(1.0, 1e-4, 1000, torch.bfloat16, master=False)
    f16_alone = accumulate(1.0, 1e-4, 1000, torch.float16, master=False)
    f32 = accumulate(1.0, 1e-4, 1000, torch.float32, master=False)
    bf_master = accumulate(1.0, 1e-4, 1000, torch.bfloat16, master=True)
    big = accumulate(1.0, 1e-2, 10, torch.bfloat16, master=False)
    ev.record("w after 1000 × 1e-4, kept in bf16", bf_alone, expect="1.0 exactly")
    ev.record("w after 1000 × 1e-4, kept in fp16", f16_alone, expect="1.0 exactly (eps/2 = 4.9e-4 > 1e-4)")
    ev.record("w after 1000 × 1e-4, kept in fp32", f32, expect="≈ 1.1")
    ev.record("w after 1000 × 1e-4, fp32 master, bf16 copy", bf_master, expect="bf16 nearest to 1.1")
    ev.record("w after 10 × 1e-2, kept in bf16", big, expect="moves (1e-2 > eps/2)")
    assert bf_alone == 1.0 and f16_alone == 1.0
    assert abs(f32 - 1.1) < 1e-3 and abs(bf_master - 1.1) <= 2.0 ** -7 * 1.1
    assert big > 1.05

    # One SGD step on the shared model's weights, learning rate 1e-3.
    torch.manual_seed(seed)
    model = DecoderLM(tiny_cfg())
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    g = model_gradient(seed)
    step = 1e-3 * g
    moved = step != 0
    unchanged_bf = ((w.bfloat16() - step.bfloat16()) == w.bfloat16())[moved].float().mean().item()
    unchanged_32 = ((w - step) == w)[moved].float().mean().item()
    ev.record("share of weights an SGD step (lr 1e-3) leaves unchanged, bf16 weights", unchanged_bf)
    ev.record("share of weights an SGD step (lr 1e-3) leaves unchanged, fp32 weights", unchanged_32)
    assert unchanged_bf > 0.5 and unchanged_32 < 0.05


# %% [markdown]
# ## 4. What CPU autocast runs in bf16 and what in fp32 (this torch's policy)
#
# Two probes. (a) Each op alone, called on an fp32 input and on a bf16 input inside
# `torch.autocast("cpu", dtype=torch.bfloat16)`: an op on the lower-precision list returns bf16 from
# fp32 input, one on the fp32 list returns fp32 from bf16 input, one on neither keeps its input's dtype.
# (b) The shared DecoderLM's forward and loss under autocast, every aten op's output dtype recorded
# with a TorchDispatchMode.

# %%
# --8<-- [start:autocast]
PROBES = {
    "linear": lambda x: F.linear(x, torch.ones(8, 8, dtype=x.dtype)),
    "matmul": lambda x: x @ x.T,
    "softmax": lambda x: F.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (8,)),
    "cross_entropy": lambda x: F.cross_entropy(x, torch.zeros(x.shape[0], dtype=torch.long)),
    "sum": lambda x: x.sum(-1),  # a plain reduction: on the CUDA fp32 list, on neither CPU list
}


def autocast_policy() -> dict:
    """op -> (output dtype from an fp32 input, output dtype from a bf16 input) under CPU bf16 autocast."""
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return {n: (str(f(x).dtype), str(f(x.bfloat16()).dtype)) for n, f in PROBES.items()}


class OutputDtypes(TorchDispatchMode):
    """Counts (aten op, output dtype) for every floating-point output."""
    def __init__(self):
        super().__init__()
        self.seen = collections.defaultdict(collections.Counter)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(first, torch.Tensor) and first.is_floating_point():
            self.seen[func.overloadpacket.__name__][str(first.dtype).replace("torch.", "")] += 1
        return out
# --8<-- [end:autocast]


@pytest.mark.claim("C-PREC-1", "confirmed")
def test_cpu_autocast_policy(ev, seed):
    """A count of this torch's CPU autocast policy (not a law: CUDA's lists differ). Shows linear/matmul are cast
    down to bf16 even from fp32 inputs, cross_entropy is cast up to fp32, and softmax/log_softmax/layer_norm and a
    plain sum are on neither CPU list, so they keep their input dtype: in the shared model the attention softmax runs
    in bf16, and "autocast keeps reductions in fp32" does not hold on CPU. Would read otherwise if a torch version
    put softmax/layer_norm/sum on the CPU fp32 list."""
    pol = autocast_policy()
    for op, (from32, from16) in pol.items():
        ev.record(f"{op}: output dtype from fp32 input / from bf16 input", f"{from32} / {from16}")
    torch.manual_seed(seed)
    model = DecoderLM(tiny_cfg(attn_impl="explicit"))
    ids = torch.randint(1, VOCAB, (BATCH, T + 1), generator=torch.Generator().manual_seed(seed))
    mode = OutputDtypes()
    with torch.autocast("cpu", dtype=torch.bfloat16), mode:
        logits = model(ids[:, :-1])
        loss = token_loss(logits, ids[:, 1:])
    for op in ("addmm", "bmm", "mm", "_softmax", "native_layer_norm", "_log_softmax", "nll_loss_forward"):
        ev.record(f"DecoderLM under autocast: {op}", ", ".join(f"{n} × {d}" for d, n in mode.seen.get(op, {}).items()))
    ev.record("DecoderLM under autocast: logits dtype / loss dtype", f"{logits.dtype} / {loss.dtype}")
    bf, f32 = "torch.bfloat16", "torch.float32"
    assert pol["linear"] == (bf, bf) and pol["matmul"] == (bf, bf) and pol["cross_entropy"] == (f32, f32)
    for op in ("softmax", "log_softmax", "layer_norm", "sum"):
        assert pol[op] == (f32, bf)  # on neither list: follows its input
    assert set(mode.seen["addmm"]) == {"bfloat16"} and set(mode.seen["_softmax"]) == {"bfloat16"}
    assert set(mode.seen["nll_loss_forward"]) == {"float32"} and loss.dtype == torch.float32

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why SwiGLU (or GELU) instead of ReLU?
#
# Proofs for `docs/blocks/swiglu.md`. The shared FFN has two switches: `cfg.activation` ("relu", "gelu",
# "gelu_tanh", "silu") and `cfg.ffn_gated` (the GLU family: act(x W1) ⊙ (x V), then W2; SwiGLU is gated +
# silu). `cfg.d_ff` is the hidden width of either form. Counts use FeedForward alone; training uses the
# section's toy language model from `proof_rmsnorm.py` (2-layer Pre-LN decoder, ReLU FFN of width 4d).
# Run: `pytest proofs/blocks/proof_swiglu.py`.

# %%
from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from proofs.block_lm import D, block_cfg, lm_run, loss_floor, markov2_task, paired
from proofs.train import token_loss
from proofs.transformer import DecoderLM, FeedForward
from proofs.transformer.feedforward import ACTIVATIONS

SWIGLU = dict(ffn_gated=True, activation="silu", d_ff=8 * D // 3)  # width 8/3·d: 128 at d = 48


# %% [markdown]
# ## 1. Parameters and FLOPs at width 8/3·d
#
# A ReLU FFN of width 4d has two d×4d matrices: 8d² weights. SwiGLU has three (W1, V, W2); at width
# 8/3·d that is 3·d·(8/3)d = 8d² again. The forward matrix products cost 2 FLOPs per weight per token in
# both. `FlopCounterMode` counts the matrix products; a small dispatch counter adds up the elements that
# every other operator writes (the activation, the gate's product), the part that is not a matmul. A
# saved-tensor hook counts what autograd keeps for the backward pass, a training cost the two others miss.

# %%
# --8<-- [start:count]
class ElementwiseCounter(TorchDispatchMode):
    """Elements written by every operator that is not a matrix product (activations, products, sums)."""

    MATMULS = ("mm", "addmm", "bmm", "matmul", "linear")

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in self.MATMULS and isinstance(out, torch.Tensor) and name not in ("view", "_unsafe_view",
                                                                                      "t", "detach"):
            self.elements += out.numel()
        return out


def ffn_cost(tokens: int = 256, d: int = D, bias: bool = False, **switches) -> dict:
    """Parameters of one FFN, forward matmul FLOPs and non-matmul elements written for `tokens` tokens."""
    ffn = FeedForward(block_cfg(d_model=d, bias=bias, **switches))
    x = torch.randn(tokens, d)
    with torch.no_grad(), FlopCounterMode(display=False) as flops, ElementwiseCounter() as other:
        ffn(x)
    return {"params": sum(p.numel() for p in ffn.parameters()), "flops": flops.get_total_flops(),
            "elementwise": other.elements}


def model_params(**switches) -> int:
    return sum(p.numel() for p in DecoderLM(block_cfg(**switches)).parameters())


def saved_for_backward(tokens: int = 256, d: int = D, **switches) -> int:
    """Elements of the activations that autograd keeps from one FFN forward pass for the backward pass (each
    storage counted once, the weights left out): the training-memory cost that parameters and FLOPs do not show."""
    ffn = FeedForward(block_cfg(d_model=d, **switches))
    weights = {p.untyped_storage().data_ptr() for p in ffn.parameters()}
    kept = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            kept[ptr] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ffn(torch.randn(tokens, d, requires_grad=True))
    return sum(kept.values())
# --8<-- [end:count]


# %% [markdown]
# ## 2. Smoothness, the tails of the slopes, and the tanh approximation of GELU
#
# GELU(x) = x·Φ(x) (Hendrycks & Gimpel 2016). Their approximation 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))
# is `nn.GELU(approximate="tanh")` (GPT-2 and BERT used it); a cruder one is x·σ(1.702x). Their largest
# error on a fine grid, in float64. The jump of the slope at 0: 1 for ReLU, 0 for the smooth ones.
#
# The tails: for z < 0 GELU's slope Φ(z) + z·φ(z) shrinks like |z|·e^{−z²/2} (a Gaussian tail), SiLU's
# σ(z)(1 + z(1 − σ(z))) like |z|·e^{−|z|} (an exponential one). We measure both slopes in float64, where
# neither is rounded away in this range, and the input below which each stays under 1e-6. Float32 can hold
# these values too: exp(−z²/2) underflows float32 only near |z| ≈ 14.4. What torch's CPU kernels return
# is another matter, so we record GELU's float32 slope at −6 and −7 computed on a one-element tensor (the
# scalar path) and on a tensor of 64 copies (the vectorised path).

# %%
# --8<-- [start:approx]
def gelu_errors() -> dict:
    x = torch.linspace(-10, 10, 200_001, dtype=torch.float64)
    exact = x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))  # x·Φ(x)
    tanh_form = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    sigmoid_form = x * torch.sigmoid(1.702 * x)
    x32 = x.float()
    torch_tanh = torch.nn.GELU(approximate="tanh")(x32).double()
    err = (tanh_form - exact).abs()
    return {"tanh": err.max().item(), "tanh_at": x[err.argmax()].item(),
            "sigmoid": (sigmoid_form - exact).abs().max().item(),
            "torch_tanh_vs_formula": (torch_tanh - tanh_form).abs().max().item()}


def slope64(activation: str, z: list[float]) -> list[float]:
    """The activation's slope at the inputs z, in float64."""
    x = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    ACTIVATIONS[activation]()(x).sum().backward()
    return x.grad.tolist()


def slope_negligible_below(activation: str, level: float = 1e-6) -> float:
    """The input z0 < 0 such that |slope| < level at every input below z0 (float64 grid of [−40, 0], step 1e-4).
    GELU's and SiLU's slopes also cross 0 once near their minimum (z ≈ −0.75, −1.28); that crossing is not a tail."""
    z = torch.linspace(-40, 0, 400_001, dtype=torch.float64, requires_grad=True)
    ACTIVATIONS[activation]()(z).sum().backward()
    small = (z.grad.abs() < level).int()
    n = int(small.cumprod(0).sum())  # how many grid points, from −40 up, are all below the level
    return z[n - 1].item() if n else float("-inf")


def float32_exp_underflow() -> float:
    """The smallest z > 0 at which float32 exp(−z²/2) is exactly 0 (grid of [0, 20], step 1e-4)."""
    z = torch.linspace(0, 20, 200_001)
    return z[torch.exp(-z * z / 2) == 0].min().item()


def gelu_slope_float32(z: float, copies: int) -> float:
    """torch's float32 GELU slope at z, computed on a tensor holding `copies` copies of z (1: the scalar path of
    the CPU kernel; 64: its vectorised path)."""
    x = torch.full((copies,), z, requires_grad=True)
    torch.nn.GELU()(x).sum().backward()
    return x.grad[0].item()


def slope_jump_at_zero(activation: str, eps: float = 1e-4) -> float:
    """|f'(+eps) − f'(−eps)|: 1 for ReLU's corner, about eps for a smooth function."""
    z = torch.tensor([eps, -eps], dtype=torch.float64, requires_grad=True)
    ACTIVATIONS[activation]()(z).sum().backward()
    return (z.grad[0] - z.grad[1]).abs().item()
# --8<-- [end:approx]


# %% [markdown]
# ## 3. Dead units after a high-learning-rate run
#
# A ReLU unit whose pre-activation x·w₁ is ≤ 0 for every input outputs 0 and gets gradient 0: nothing
# moves its weights back. We train the toy LM at the section's lr (5e-3) and at 20 times it (0.1, pushed
# there to make dying visible: at lr 5e-3 there is nothing to count), and probe every FFN unit of both
# layers on 4096 held-out tokens. How many units one run at lr 0.1 loses varies a lot from run to run, so at
# lr 0.1 we train three models per activation and pool their 1152 units; at lr 5e-3 one model (384 units) is
# enough, because no run of the seed sweep lost a unit there. For each unit we take the largest |slope| of
# its activation over those tokens. The same count serves all three activations: a unit is dead when that largest slope
# is below DEAD_SLOPE = 1e-6. Why 1e-6: a live unit's slope is of order 1 (ReLU's is 1, GELU's and SiLU's
# 0.5 at 0), so a dead unit passes at most a millionth of a live unit's gradient to its weights on any
# token. We check that on the trained model, from the gradient of the probe loss on each unit's row of
# W1, and we also record the counts at 1e-4 and 1e-8, so the reader sees how much the threshold matters.
# ReLU's dead units have a slope of exactly 0; that is recorded as its own fact. We also record how many
# units are never positive, the usual definition for ReLU.

# %%
# --8<-- [start:dead]
HIGH_LR = 0.1
DEAD_SLOPE = 1e-6  # a unit is dead when its largest |slope| on the probe tokens is below this (reason above)
INITS = (0, 1000, 2000)  # three trained models per arm: seed, seed + 1000, seed + 2000 (nearby seeds share none)


@torch.no_grad()
def pre_activations(model: DecoderLM, ids: torch.Tensor) -> torch.Tensor:
    """(tokens, units of all layers): x·W1 of every FFN unit on every token."""
    rows = []
    hooks = [layer.ffn.lin1.register_forward_hook(lambda m, i, out: rows.append(out.reshape(-1, out.shape[-1])))
             for layer in model.decoder.layers]
    model(ids)
    for h in hooks:
        h.remove()
    return torch.cat(rows, dim=1)


def w1_gradients(model: DecoderLM, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(units of all layers,): the norm of the probe loss's gradient on each unit's row of W1."""
    model.zero_grad()
    token_loss(model(ids), targets).backward()
    out = torch.cat([layer.ffn.lin1.weight.grad.norm(dim=1) for layer in model.decoder.layers])
    model.zero_grad(set_to_none=True)  # the trained model is cached and shared with other tests: leave no grads
    return out


def probe_units(seed: int, activation: str, lr: float) -> dict:
    """Every FFN unit of one trained model, probed on 4096 held-out tokens: its largest |slope|, whether it is never
    positive, and its W1-row gradient over the median of the live units' (so that runs can be pooled)."""
    switches = {} if activation == "relu" else {"activation": activation}  # ReLU is the baseline: reuse its run
    run = lm_run(seed, lr=lr, **switches)
    model = run["model"]
    ids, targets = markov2_task(torch.Generator().manual_seed(20_000 + seed), 256, 16)
    z = pre_activations(model, ids).requires_grad_(True)
    ACTIVATIONS[activation]()(z).sum().backward()  # z.grad = the activation's slope at every (token, unit)
    slope = z.grad.abs().max(0).values  # largest |slope| each unit ever has
    grad = w1_gradients(model, ids, targets)
    return {"slope": slope, "never_positive": (z <= 0).all(0),
            "grad": grad / grad[slope >= DEAD_SLOPE].median(), "held_out": run["held_out"]}


def dead_units(seed: int, activation: str, lr: float, inits: tuple[int, ...] = INITS) -> dict:
    """The units of the models trained from `seed` + inits, pooled (3 × 384 units by default): shares of units never
    positive, dead (largest |slope| < DEAD_SLOPE), dead at other thresholds, with a slope of exactly 0, and of the
    never-positive units that are dead; the largest W1-row gradient of a dead unit over the live median."""
    runs = [probe_units(seed + i, activation, lr) for i in inits]
    slope, never_positive, grad = (torch.cat([r[k] for r in runs]) for k in ("slope", "never_positive", "grad"))
    dead = slope < DEAD_SLOPE
    per_run = [r["slope"][r["never_positive"]] < DEAD_SLOPE for r in runs]
    return {"never_positive": never_positive.float().mean().item(),
            "dead": dead.float().mean().item(),
            "dead_at": {t: (slope < t).float().mean().item() for t in (1e-4, 1e-8)},
            "exact_zero": (slope == 0).float().mean().item(),
            "dead_among_never_positive": dead[never_positive].float().mean().item() if never_positive.any() else 0.0,
            "dead_among_never_positive_per_run": [d.float().mean().item() if len(d) else 0.0 for d in per_run],
            "dead_grad_vs_live": grad[dead].max().item() if dead.any() else 0.0,
            "held_out": sum(r["held_out"] for r in runs) / len(runs), "units": len(slope)}
# --8<-- [end:dead]


# %%
if __name__ == "__main__":
    print(ffn_cost(activation="relu"), ffn_cost(**SWIGLU))
    print(gelu_errors())
    print(paired([0], SWIGLU))
    print({a: dead_units(0, a, HIGH_LR) for a in ("relu", "gelu", "silu")})


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_count]
@pytest.mark.claim("C-FOLK-20", "refuted")
@pytest.mark.claim("C-GLU-1", "confirmed")
def test_swiglu_at_8_3_d_has_the_parameters_and_flops_of_relu_at_4d(ev, seed):
    """A count of our module: SwiGLU at width 8/3·d has exactly the weights and matmul FLOPs of the ReLU FFN at 4d
    (8d², 16d² per token); at the same width it has 1.5 times more. Would be refuted if the counts differed. Also
    counted: the activations autograd keeps for the backward pass, where SwiGLU at 8/3·d keeps more than ReLU at 4d."""
    relu, swiglu = ffn_cost(activation="relu"), ffn_cost(**SWIGLU)
    same_width = ffn_cost(ffn_gated=True, activation="silu")  # SwiGLU at 4d
    ev.record(f"weights, ReLU FFN d→4d→d (d = {D})", relu["params"], expect=f"8d² = {8 * D * D}")
    ev.record("weights, SwiGLU FFN at width 8/3·d", swiglu["params"], expect="8d², the same")
    ev.record("weights, SwiGLU at width 4d", same_width["params"], expect="12d²: 1.5× (where the folk answer comes from)")
    ev.record("forward matmul FLOPs for 256 tokens, ReLU 4d / SwiGLU 8/3·d", [relu["flops"], swiglu["flops"]],
              expect=f"16d² per token = {16 * D * D * 256}, both")
    ev.record("elements written by non-matmul operators, ReLU 4d / SwiGLU 8/3·d", [relu["elementwise"],
              swiglu["elementwise"]], expect="O(tokens·d_ff): tiny next to the FLOPs")
    with_bias = [ffn_cost(bias=True, activation="relu")["params"], ffn_cost(bias=True, **SWIGLU)["params"]]
    ev.record("parameters with biases, ReLU 4d / SwiGLU 8/3·d", with_bias, expect="differ by 4d/3 (bias vectors)")
    lm = [model_params(), model_params(**SWIGLU)]
    ev.record("parameters of the whole toy LM, ReLU 4d / SwiGLU 8/3·d", lm, expect="equal")
    ratio = [relu["flops"] / relu["elementwise"], swiglu["flops"] / swiglu["elementwise"]]
    ev.record("matmul FLOPs per non-matmul element, ReLU 4d / SwiGLU 8/3·d", ratio, key=False,
              expect="about 2d / (elementwise ops per hidden unit): grows with d")
    kept = [saved_for_backward(activation="relu"), saved_for_backward(**SWIGLU)]
    ev.record("activation elements kept for backward per token, ReLU 4d / SwiGLU 8/3·d (PyTorch autograd)",
              [k / 256 for k in kept], expect="ReLU d + 4d = 5d; SwiGLU d + 4·(8/3)d ≈ 11.7d")
    ev.record("same, in units of d", [k / 256 / D for k in kept], key=False)
    assert relu["params"] == swiglu["params"] == 8 * D * D and same_width["params"] == 12 * D * D
    assert relu["flops"] == swiglu["flops"] == 16 * D * D * 256
    assert with_bias[1] - with_bias[0] == 4 * D // 3 and lm[0] == lm[1]
    # what autograd keeps: ReLU keeps x (d) and its output (4d, shared with lin2's input); SwiGLU keeps x, x·W, SiLU's
    # output, the gate x·V and their product (4 × 8/3·d). Exact counts of this module, not statistics
    assert kept == [256 * 5 * D, 256 * (D + 4 * (8 * D // 3))]
# --8<-- [end:test_count]


# --8<-- [start:test_lm]
@pytest.mark.claim("C-GLU-1", "confirmed")
def test_swiglu_beats_relu_on_the_toy_lm_at_equal_parameters(ev, seed):
    """The toy LM with the ReLU FFN (4d) and with SwiGLU (8/3·d): same parameters, same batches, same steps, two
    seeds. SwiGLU's held-out loss is lower. Would be refuted if the mean paired difference were not below 0 with
    the margin below."""
    seeds = [seed, seed + 1]
    p = paired(seeds, SWIGLU)
    ev.record("held-out loss, ReLU 4d (2 seeds)", p["base"], expect=f"floor {loss_floor():.3f}")
    ev.record("held-out loss, SwiGLU 8/3·d (2 seeds)", p["arm"])
    ev.record("SwiGLU − ReLU, mean over the 2 seeds", p["mean_diff"], expect="< 0")
    # over seeds 100-139 the 2-seed mean difference was -0.182 ± 0.025 (min -0.244, max -0.127); the bound is the
    # mean + 4.4 SD, so a SwiGLU that only matched ReLU (or beat it by a third of that) would fail
    assert p["mean_diff"] < -0.07
    # what the trained SwiGLU arm computes (its loss alone would not notice the gate on the wrong branch): a hook on
    # every FFN compares its output with lin2(silu(lin1 x) ⊙ gate x), and with the swapped lin2(lin1 x ⊙ silu(gate x))
    model = lm_run(seed, **SWIGLU)["model"]
    seen = []
    hooks = [f.register_forward_hook(lambda m, i, o: seen.append((m, i[0], o))) for f in model.modules()
             if isinstance(f, FeedForward)]
    with torch.no_grad():
        model(markov2_task(torch.Generator().manual_seed(seed), 4, 16)[0])
        for h in hooks:
            h.remove()
        silu = torch.nn.functional.silu
        gaps = [(o - m.lin2(silu(m.lin1(x)) * m.gate(x))).abs().max().item() for m, x, o in seen]
        swapped = [(o - m.lin2(m.lin1(x) * silu(m.gate(x)))).abs().max().item() for m, x, o in seen]
    ev.record("trained SwiGLU FFNs: largest |out − lin2(silu(lin1 x) ⊙ gate x)|", max(gaps), key=False, expect="0")
    ev.record("same, against the gate on the other branch", min(swapped), key=False, expect="O(1e-2) or more")
    assert len(seen) == model.cfg.n_layers and max(gaps) < 1e-6 and min(swapped) > 1e-3
# --8<-- [end:test_lm]


@pytest.mark.claim("C-GLU-1", "confirmed")
def test_gelu_and_silu_without_the_gate_on_the_toy_lm(ev, seed):
    """The same toy LM with the ungated FFN at 4d and GELU or SiLU instead of ReLU: what the activation alone does,
    next to the gate. Not claimed better or worse: the assertions check that neither is far from ReLU, and that the
    larger of the two activation effects is below the gate's effect on the same seeds. Would be refuted if
    changing only the activation moved the loss about as much as adding the gate."""
    seeds = [seed, seed + 1]
    out = {}
    for act in ("gelu", "silu"):
        p = paired(seeds, dict(activation=act))
        ev.record(f"held-out loss, {act.upper()} 4d (2 seeds)", p["arm"])
        ev.record(f"{act.upper()} − ReLU, mean over the 2 seeds", p["mean_diff"])
        out[act] = p["mean_diff"]
    gated = paired(seeds, SWIGLU)["mean_diff"]
    ev.record("SwiGLU − ReLU, same seeds (for comparison)", gated, key=False)
    share = max(abs(v) for v in out.values()) / abs(gated)
    ev.record("largest |activation − ReLU| / |SwiGLU − ReLU|, same seeds", share,
              expect="well below 1: the gate does more")
    # over seeds 100-139: GELU − ReLU was -0.025 ± 0.013 (min -0.059), SiLU − ReLU +0.030 ± 0.015 (max 0.066),
    # SwiGLU − ReLU -0.182 ± 0.025 on the same seeds; |bound| 0.1 is beyond 4 SD of both activation effects. The
    # larger activation effect over the gate's is a ratio with a long right tail: 0.214 ± 0.070 (max 0.42) over seeds
    # 100-139, but 0.269 ± 0.112 (max 0.719, 5 of 100 above 0.5) over seeds 200-299, where the |bound| 0.1 above held
    # at all 100. The bound is the docstring's criterion, the gate's own effect: 1 is 6.5 SD above the mean and 0.28
    # above the largest of the 140 seeds.
    assert all(abs(v) < 0.1 for v in out.values())
    assert share < 1.0


# --8<-- [start:test_dead]
@pytest.mark.claim("C-ACT-1", "nuanced")
def test_units_switch_off_at_a_high_learning_rate(ev, seed):
    """At lr 0.1 three models per activation, units pooled (one model at lr 5e-3). At lr 0.1 a share of ReLU units is
    never positive on 4096 held-out tokens: dead, with a slope of exactly 0; at the section's lr 5e-3 almost none.
    GELU and SiLU units are pushed below 0 at least as often. Counted the same way for all three (largest |slope|
    over the tokens below 1e-6), GELU loses units too. Of the units pushed below zero, a larger share is dead for
    GELU than for SiLU: GELU's slope decays like e^(−z²/2), SiLU's like e^(−|z|), so a SiLU unit must be pushed much
    further down before its slope is negligible. Would be refuted if ReLU lost no units at lr 0.1 (or as many at
    5e-3), if GELU lost none at lr 0.1, or if the share of never-positive units that are dead were as large for
    SiLU as for GELU."""
    high = {a: dead_units(seed, a, HIGH_LR) for a in ("relu", "gelu", "silu")}
    low = {a: dead_units(seed, a, 5e-3, inits=(0,)) for a in ("relu", "gelu", "silu")}  # one model: see below
    ev.record("FFN units probed per activation, lr 0.1 / lr 5e-3 (2 layers × 192 per model)",
              [high["relu"]["units"], low["relu"]["units"]], key=False)
    for a in ("relu", "gelu", "silu"):
        ev.record(f"share of units never positive, {a.upper()}, lr 0.1 / lr 5e-3",
                  [high[a]["never_positive"], low[a]["never_positive"]])
        ev.record(f"share of units dead (largest |slope| < 1e-6), {a.upper()}, lr 0.1 / lr 5e-3",
                  [high[a]["dead"], low[a]["dead"]],
                  expect="ReLU: = never positive" if a == "relu" else "GELU: > 0" if a == "gelu" else "")
        ev.record(f"share dead at a threshold of 1e-4 / 1e-8, {a.upper()}, lr 0.1",
                  [high[a]["dead_at"][1e-4], high[a]["dead_at"][1e-8]], key=False)
        ev.record(f"largest W1-row gradient of a dead unit / median of the live units, {a.upper()}, lr 0.1",
                  high[a]["dead_grad_vs_live"], expect="≪ 1 (0 for ReLU)", key=False)
        ev.record(f"held-out loss, {a.upper()}, lr 0.1 (mean of {len(INITS)}) / lr 5e-3",
                  [high[a]["held_out"], low[a]["held_out"]], key=False)
        ev.record(f"share of units never positive at lr 0.1, {a.upper()}", high[a]["never_positive"], key=False)
        ev.record(f"share of units never positive at lr 5e-3, {a.upper()}", low[a]["never_positive"], key=False)
        ev.record(f"share of units dead at lr 0.1, {a.upper()}", high[a]["dead"], key=False)
    ev.record("share of units with slope exactly 0 on every token, ReLU, lr 0.1", high["relu"]["exact_zero"],
              expect="= never positive")
    ev.record("share of the never-positive units that are dead, GELU / SiLU, lr 0.1",
              [high["gelu"]["dead_among_never_positive"], high["silu"]["dead_among_never_positive"]],
              expect="GELU more than SiLU")
    margin = high["gelu"]["dead_among_never_positive"] - high["silu"]["dead_among_never_positive"]
    ev.record("share of the never-positive units that are dead, GELU − SiLU, lr 0.1", margin, key=False, expect="> 0")
    for a in ("gelu", "silu"):
        ev.record(f"share of the never-positive units that are dead, {a.upper()}, each of the {len(INITS)} models",
                  high[a]["dead_among_never_positive_per_run"], key=False)
    ev.record("share of units dead, GELU − SiLU, lr 0.1", high["gelu"]["dead"] - high["silu"]["dead"], key=False,
              expect="> 0 (recorded, not asserted)")
    # Over seeds 100-139 (three models per activation at lr 0.1, 1152 units pooled; one model, 384 units, at lr 5e-3):
    # never positive at lr 0.1 ReLU 0.208 ± 0.041 (min 0.143), GELU 0.285 ± 0.061 (min 0.153), SiLU 0.325 ± 0.068
    # (min 0.145), 5.0 / 4.7 / 4.8 SD above the lr-5e-3 shares, which were 0 on every seed (bound 0.02: one ReLU unit
    # of 384 on one seed of an earlier sweep). Dead (< 1e-6): ReLU = never positive = slope exactly 0; GELU 0.176 ±
    # 0.061 (min 0.030, 34 units); SiLU 0.030 ± 0.025 (max 0.095; 0 on seed 137 only). GELU's bound 0 is 2.9 SD
    # below its mean, under the 4 SD used elsewhere; what makes it safe is that it fails only if all three GELU models
    # lose no unit, and every one of the 200 GELU models of the earlier five-model sweep (same seeds 100-139; the 120
    # of this sweep are among them) lost some (the share of its never-positive units that are dead: min 0.024). From
    # 0 of 200 models, the 95 % upper bound on one model losing no unit is 3/200, about 1 in 67; all three on one
    # seed, (1/67)³, about one seed in 300,000, if the three models are independent (each trains from its own seed).
    # With five models pooled it was 0.171 ± 0.043 (min 0.076). The share of the never-positive units that are
    # dead, GELU − SiLU: 0.514 ± 0.111 (min 0.190), 4.6 SD above 0 (five models: 0.520 ± 0.079; one model: 0.52 ±
    # 0.18, min 0.072, 2.9 SD: pooling is what buys the margin). GELU lost more units than SiLU on all 40 seeds, but that difference,
    # 0.146 ± 0.061 (min 0.011), is 2.4 SD from 0, so it is recorded, not asserted. Largest W1-row gradient of a dead
    # unit / median live unit: GELU max 8.5e-7, SiLU max 2.6e-5, 38 times below the bound 1e-3.
    for a in ("relu", "gelu", "silu"):
        assert high[a]["never_positive"] > low[a]["never_positive"] and low[a]["never_positive"] < 0.02
        assert low[a]["dead"] < 0.02
    # ReLU's exact zero, its own fact: never positive = slope exactly 0 = dead
    assert high["relu"]["exact_zero"] == high["relu"]["never_positive"] == high["relu"]["dead"]
    assert high["gelu"]["dead"] > 0
    assert margin > 0
    assert all(high[a]["dead_grad_vs_live"] < 1e-3 for a in ("gelu", "silu"))
# --8<-- [end:test_dead]


# --8<-- [start:test_approx]
@pytest.mark.claim("C-ACT-1", "nuanced")
def test_gelu_tanh_approximation_error_and_smoothness(ev, seed):
    """Exact: the tanh form of GELU is within 5e-4 of x·Φ(x) everywhere (torch's approximate="tanh" is that
    formula), the sigmoid form x·σ(1.702x) within about 2e-2; ReLU's slope jumps by 1 at 0, GELU's and SiLU's do
    not. Their tails differ: GELU's slope (Gaussian tail) is below 1e-6 from a few units below 0, SiLU's
    (exponential tail) only from about −17. Would be refuted by a larger error, a jump in a smooth activation's
    slope, or tails that did not differ so."""
    e = gelu_errors()
    ev.record("max |tanh-GELU − GELU| on [−10, 10]", e["tanh"], expect="< 5e-4")
    ev.record("where the tanh form errs most (|x|)", abs(e["tanh_at"]), key=False)
    ev.record("max |x·σ(1.702x) − GELU|", e["sigmoid"], expect="about 2e-2")
    ev.record("max |torch GELU(approximate='tanh') − the tanh formula| (float32)", e["torch_tanh_vs_formula"],
              expect="float32 rounding")
    jumps = {a: slope_jump_at_zero(a) for a in ("relu", "gelu", "silu")}
    ev.record("jump of the slope across 0 (±1e-4), ReLU / GELU / SiLU", list(jumps.values()),
              expect="1 / about 1e-4 / about 1e-4")
    tails = {a: slope64(a, [-4.0, -8.0, -16.0]) for a in ("gelu", "silu")}
    for a in ("gelu", "silu"):
        ev.record(f"{a.upper()} slope at z = −4 / −8 / −16 (float64)", tails[a],
                  expect="∝ |z|e^(−z²/2)" if a == "gelu" else "∝ |z|e^(−|z|)")
    below = {a: slope_negligible_below(a) for a in ("gelu", "gelu_tanh", "silu")}
    ev.record("input below which |slope| < 1e-6 (float64): GELU / tanh-GELU / SiLU", list(below.values()),
              expect="about −5.4 / −5 / −17")
    ev.record("smallest |z| where float32 exp(−z²/2) underflows to 0", float32_exp_underflow(), expect="about 14.4")
    for z in (-6.0, -7.0):
        ev.record(f"GELU slope at z = {z:g}: float32 one-element / float32 64 copies (vectorised) / float64",
                  [gelu_slope_float32(z, 1), gelu_slope_float32(z, 64), slope64("gelu", [z])[0]],
                  expect="the float32 value exists; the vectorised CPU kernel may flush it")
    # deterministic (no random draws): the same values on every seed; the bounds bracket the values measured
    assert e["tanh"] < 5e-4 and 1e-2 < e["sigmoid"] < 3e-2 and e["torch_tanh_vs_formula"] < 1e-6
    assert jumps["relu"] == 1.0 and jumps["gelu"] < 1e-3 and jumps["silu"] < 1e-3
    assert -6 < below["gelu"] < -5 and -19 < below["silu"] < -15
    assert abs(tails["gelu"][1]) < 1e-12 < 1e-4 < abs(tails["silu"][1])  # at z = −8: Gaussian vs exponential tail
    assert 14 < float32_exp_underflow() < 15  # a float32 fact: the density itself survives far below −6
# --8<-- [end:test_approx]

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How much memory does training take?
#
# Proofs for `docs/scale/training-memory.md`. Everything here is counted, not timed or trained:
# bytes of the real tensors that a training step keeps (parameters, `.grad`, `optimizer.state`), bytes
# of the tensors autograd saves for backward (`torch.autograd.graph.saved_tensors_hooks`), FLOPs of
# forward and backward (`torch.utils.flop_counter.FlopCounterMode`) and calls of each layer's forward.
# The one-layer activation count and its paper setting come from `proofs/cost/proof_layer_cost.py`.
# Run: `pytest proofs/scale/proof_memory.py`.

# %%
from __future__ import annotations

import copy
import functools
from collections import Counter

import pytest
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from proofs.layer_activations import PAPER_LAYER, layer_config, saved_activations
from proofs.train import token_loss
from proofs.transformer import DecoderLM, EncoderLayer, TransformerConfig

VOCAB, T, BATCH = 16, 16, 4
GB, GiB = 1e9, 2.0**30


def tiny_cfg(**switches) -> TransformerConfig:
    """The shared decoder-only LM, small: d_model 32, 4 layers, dropout off unless a switch turns it on."""
    base = dict(vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=128, n_layers=4, dropout_emb=0.0,
                dropout_residual=0.0, attn_impl="explicit")
    return TransformerConfig(**{**base, **switches})


def batch(seed: int) -> tuple[Tensor, Tensor]:
    ids = torch.randint(1, VOCAB, (BATCH, T + 1), generator=torch.Generator().manual_seed(seed))
    return ids[:, :-1], ids[:, 1:]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() lists a tied matrix once


# %% [markdown]
# ## 1. Parameters, gradients and Adam state, counted after one real step
#
# fp32: the model, its gradients and `torch.optim.Adam`'s two moments, all fp32. Mixed precision as
# ZeRO counts it (Rajbhandari et al. 2020, §3.1): the forward and backward passes run on a 16-bit copy of
# the weights and produce 16-bit gradients; the optimizer keeps an fp32 master copy of the weights and
# Adam's fp32 momentum and variance, and after the step the 16-bit copy is refreshed from the master.
# The fp32 gradient the update reads is a temporary; the count is made with it freed and with it kept.

# %%
# --8<-- [start:states]
def state_bytes(working: list[Tensor], opt: torch.optim.Optimizer, master: list[Tensor] | None = None) -> dict:
    """Bytes of every tensor a training step keeps between steps, read from the tensors themselves."""
    out = Counter()
    out["weights (working copy)"] = sum(p.nbytes for p in working)
    out["gradients (working copy)"] = sum(p.grad.nbytes for p in working if p.grad is not None)
    for p in master or []:
        out["fp32 master weights"] += p.nbytes
        out["fp32 master gradients (kept)"] += p.grad.nbytes if p.grad is not None else 0
    for st in opt.state.values():  # Adam: exp_avg (momentum), exp_avg_sq (variance), step (one scalar per tensor)
        for name, t in st.items():
            out[f"Adam {name}"] += t.nbytes
    return dict(out)


def fp32_adam(seed: int) -> tuple[dict, int]:
    """One real Adam step on the fp32 model; the bytes it keeps and the parameter count."""
    torch.manual_seed(seed)
    model = DecoderLM(tiny_cfg())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = batch(seed)
    token_loss(model(x), y).backward()
    opt.step()
    return state_bytes(list(model.parameters()), opt), n_params(model)


def mixed_adam(seed: int, dtype=torch.bfloat16, keep_fp32_grads: bool = False) -> tuple[dict, int, bool]:
    """One real mixed-precision Adam step: 16-bit working weights and gradients, fp32 master weights and moments.
    Returns the bytes kept, the parameter count, and whether the refreshed 16-bit weights equal the master rounded."""
    torch.manual_seed(seed)
    model = DecoderLM(tiny_cfg()).to(dtype)  # the copy forward and backward run on
    working = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_() for p in working]  # fp32 master copy
    opt = torch.optim.Adam(master, lr=1e-3)  # its state is created in fp32, like the master
    x, y = batch(seed)
    token_loss(model(x).float(), y).backward()  # 16-bit gradients land in p.grad
    for p, w in zip(working, master):
        w.grad = p.grad.float()  # the update reads the gradient in fp32
    opt.step()
    with torch.no_grad():
        for p, w in zip(working, master):
            p.copy_(w)  # refresh the 16-bit copy (rounds to dtype)
    if not keep_fp32_grads:
        for w in master:
            w.grad = None
    refreshed = all(torch.equal(p, w.detach().to(dtype)) for p, w in zip(working, master))
    return state_bytes(working, opt, master), n_params(model), refreshed
# --8<-- [end:states]


# --8<-- [start:arithmetic]
def training_state_gb(n: float, bytes_per_param: float = 16) -> dict:
    """Model-state memory of n parameters in decimal GB and binary GiB (no activations, no buffers)."""
    b = n * bytes_per_param
    return {"bytes": b, "GB": b / GB, "GiB": b / GiB}


def korthikanti_activation_bytes(s: int, b: int, h: int, a: int, L: int, score_matrices: bool = True) -> float:
    """sbhL(34 + 5as/h): Korthikanti et al. (2022) §4.1, 16-bit activations with 1-byte dropout masks; without the
    score matrices (a fused attention kernel that recomputes them), 34sbhL."""
    return s * b * h * L * (34 + (5 * a * s / h if score_matrices else 0))
# --8<-- [end:arithmetic]


# %% [markdown]
# ## 2. What one layer saves for backward, tensor by tensor
#
# The same hook as the layer-cost proof, but each saved tensor is also sorted into the size classes of
# Korthikanti et al.'s count: per token × h (sbh elements), per token × 4h (the FFN's hidden layer),
# one s × s score matrix per head (as²b), and per token (b·s, LayerNorm's mean and 1/σ, which their count
# leaves out as small). Bytes are given in units of that class's element count (2 = 16-bit, 4 = fp32).

# %%
# --8<-- [start:saved]
class SavedTensors:
    """Records every distinct storage autograd saves for backward inside the block (weights excluded).

        with SavedTensors(model) as saved:
            loss = model(x)...
        saved.bytes, saved.items  # items: one (nbytes, shape, dtype, inside_layer) per storage
    """

    def __init__(self, model: nn.Module, layers: list[nn.Module] = ()):
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.kept: dict[int, tuple] = {}
        self.depth = 0  # > 0 while one of `layers` is running its forward
        for layer in layers:
            layer.register_forward_pre_hook(lambda *_: setattr(self, "depth", self.depth + 1))
            layer.register_forward_hook(lambda *_: setattr(self, "depth", self.depth - 1))
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t: Tensor) -> Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in self.weights and st.data_ptr() not in self.kept:
            self.kept[st.data_ptr()] = (st.nbytes(), tuple(t.shape), t.dtype, self.depth > 0)
        return t

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    @property
    def items(self) -> list[tuple]:
        return list(self.kept.values())

    @property
    def bytes(self) -> int:
        return sum(n for n, *_ in self.kept.values())


def saved_by_class(b: int, s: int, h: int, a: int, dtype=torch.float32, **switches) -> dict:
    """Bytes one training-mode EncoderLayer saves, per size class, in units of that class's element count."""
    torch.manual_seed(0)
    layer = EncoderLayer(layer_config(h, n_heads=a, attn_impl="explicit", **switches)).to(dtype).train()
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    with SavedTensors(layer) as saved:
        layer(x)
    units = {"sbh": s * b * h, "4sbh": 4 * s * b * h, "as²b": a * s * s * b, "sb": s * b}
    if len(set(units.values())) < 4:
        raise ValueError(f"b={b}, s={s}, h={h}, a={a} make two size classes equal; pick s ≠ h/a and s ≠ 4h/a.")
    by_size = {n: c for c, n in units.items()}
    out = Counter({c: 0.0 for c in units})
    for nbytes, shape, dt, _ in saved.items:
        cls = by_size[nbytes // dt.itemsize]  # KeyError: a tensor of a size the count does not expect
        out[cls] += nbytes / units[cls]
    return {"classes": dict(out), "bytes": saved.bytes}
# --8<-- [end:saved]


# Korthikanti et al. (2022) §4.1, per class, bytes per element of the class (16-bit activations, 1-byte masks):
# sbh: attention 2 (QKV input) + 4 (Q, K) + 2 (V) + 2 (projection input) + 1 (dropout mask), MLP 2 (first linear
# input) + 1 (dropout mask), LayerNorm inputs 2 + 2 = 18; 4sbh: GeLU input 2 + second linear input 2 = 4 (= 16 sbh);
# as²b: softmax output 2 + dropout mask 1 + dropout output 2 = 5; LayerNorm statistics: not counted.
PAPER_CLASSES = {"sbh": 18, "4sbh": 4, "as²b": 5, "sb": 0}


# %% [markdown]
# ## 3. Activation checkpointing: same gradients, fewer saved bytes, one more forward
#
# `Checkpointed` wraps one layer of the shared model in `torch.utils.checkpoint.checkpoint` (non-reentrant):
# during the forward pass the layer keeps only its input; during backward it runs its forward again to
# rebuild what it needs. `preserve_rng_state=True` (PyTorch's default) replays the same dropout masks in
# that second forward; switching it off is the control that shows why.

# %%
# --8<-- [start:checkpoint]
class Checkpointed(nn.Module):
    """One layer run under torch.utils.checkpoint: saves its input only, recomputes the rest in backward."""

    def __init__(self, layer: nn.Module, preserve_rng_state: bool = True):
        super().__init__()
        self.layer, self.preserve_rng_state = layer, preserve_rng_state

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        return checkpoint(lambda t: self.layer(t, *args, **kwargs), x, use_reentrant=False,
                          preserve_rng_state=self.preserve_rng_state)


def with_checkpointing(model: DecoderLM, preserve_rng_state: bool = True) -> DecoderLM:
    """A copy of the model (same weights) whose every decoder layer is checkpointed."""
    model = copy.deepcopy(model)
    for i, layer in enumerate(model.decoder.layers):
        model.decoder.layers[i] = Checkpointed(layer, preserve_rng_state)
    return model


def inner_layers(model: DecoderLM) -> list[nn.Module]:
    return [getattr(layer, "layer", layer) for layer in model.decoder.layers]


def training_step_counts(model: DecoderLM, seed: int) -> dict:
    """One forward and backward: gradients, saved bytes (all, and outside the layers), FLOPs of the forward and of
    forward + backward, FLOPs of the output layer, and how many times the layers' forward ran."""
    x, y = batch(seed)
    calls = Counter()
    for i, layer in enumerate(inner_layers(model)):
        layer.register_forward_pre_hook(lambda *_, i=i: calls.update([i]))  # a pre-hook: recomputation may stop early
    torch.manual_seed(seed + 1)  # the dropout masks, when dropout is on
    with FlopCounterMode(display=False) as fwd, SavedTensors(model, list(model.decoder.layers)) as saved:
        loss = token_loss(model(x), y)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    head = sum(fwd.get_flop_counts().get("DecoderLM.head", {}).values())
    return {"grads": [p.grad.clone() for p in model.parameters()], "saved bytes": saved.bytes,
            "saved outside layers": sum(n for n, *_, inside in saved.items if not inside),
            "forward FLOPs": fwd.get_total_flops(), "training FLOPs": fwd.get_total_flops() + bwd.get_total_flops(),
            "head forward FLOPs": head, "layer forward calls": sum(calls.values())}


@functools.lru_cache(maxsize=None)
def checkpoint_arms(seed: int, dropout: float = 0.0) -> dict:
    """The same model and batch, plain, checkpointed, and checkpointed without RNG replay."""
    torch.manual_seed(seed)
    plain = DecoderLM(tiny_cfg(dropout_residual=dropout, dropout_attn=dropout))
    arms = {"plain": plain, "checkpointed": with_checkpointing(plain),
            "checkpointed, no RNG replay": with_checkpointing(plain, preserve_rng_state=False)}
    return {name: training_step_counts(m.train(), seed) for name, m in arms.items()}
# --8<-- [end:checkpoint]


def max_grad_gap(a: dict, b: dict) -> float:
    return max((ga - gb).abs().max().item() for ga, gb in zip(a["grads"], b["grads"]))


# %%
if __name__ == "__main__":  # notebook / script: change a size and rerun
    print(fp32_adam(0)[0], mixed_adam(0)[0])
    print(training_state_gb(7e9))
    print(saved_by_class(2, 32, 64, 4, torch.bfloat16, **PAPER_LAYER))
    print({k: {m: v for m, v in arm.items() if m != "grads"} for k, arm in checkpoint_arms(0).items()})


# %% [markdown]
# ## Tests

# %%
# --8<-- [start:test_states]
@pytest.mark.claim("C-MEM-1", "nuanced")
def test_adam_state_is_16_bytes_per_parameter(ev, seed):
    """Exact counts of our module's real tensors after one Adam step. fp32: 4 (weights) + 4 (gradients) + 8 (two
    moments) = 16 bytes per parameter. Mixed precision arranged as ZeRO §3.1 counts it: 2 + 2 (16-bit weights and
    gradients) + 4 + 4 + 4 (fp32 master, momentum, variance) = 16; 20 if the fp32 gradient copy is kept. So 16 is
    exact for the arrangement, and mixed precision saves nothing on these states. Another verdict: a count other
    than 16 for either arrangement would refute the rule; a mixed count below fp32's would refute 'saves nothing'."""
    f32, n = fp32_adam(seed)
    steps = f32.pop("Adam step")  # one fp32 scalar per parameter tensor, not per parameter
    ev.record("parameters of the model", n)
    for k, v in f32.items():
        ev.record(f"fp32 Adam: {k}, bytes per parameter", v / n, key=False)
    ev.record("fp32 Adam: bytes per parameter (weights + gradients + moments)", sum(f32.values()) / n, expect="16")
    ev.record("Adam step counters, bytes in all (one scalar per tensor)", steps, key=False)
    assert f32 == {"weights (working copy)": 4 * n, "gradients (working copy)": 4 * n, "Adam exp_avg": 4 * n,
                   "Adam exp_avg_sq": 4 * n}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        mixed, n16, refreshed = mixed_adam(seed, dtype)
        mixed.pop("Adam step")
        mixed.pop("fp32 master gradients (kept)")
        ev.record(f"mixed precision ({name}): bytes per parameter, 16-bit weights / 16-bit gradients / fp32 master / "
                  "momentum / variance", [mixed[k] / n16 for k in ("weights (working copy)", "gradients (working copy)",
                  "fp32 master weights", "Adam exp_avg", "Adam exp_avg_sq")], expect="2 / 2 / 4 / 4 / 4",
                  key=name == "bf16")
        ev.record(f"mixed precision ({name}): bytes per parameter", sum(mixed.values()) / n16, expect="16")
        assert n16 == n and refreshed
        assert mixed == {"weights (working copy)": 2 * n, "gradients (working copy)": 2 * n,
                         "fp32 master weights": 4 * n, "Adam exp_avg": 4 * n, "Adam exp_avg_sq": 4 * n}
    kept, _, _ = mixed_adam(seed, keep_fp32_grads=True)
    kept.pop("Adam step")
    ev.record("mixed precision, fp32 gradient copy kept: bytes per parameter", sum(kept.values()) / n, expect="20")
    assert sum(kept.values()) == 20 * n
    # the arithmetic: 7e9 parameters at 16 bytes
    seven = training_state_gb(7e9)
    ev.record("7e9 parameters × 16 bytes (GB, decimal)", seven["GB"], expect="112")
    ev.record("7e9 parameters × 16 bytes (GiB, binary)", round(seven["GiB"], 1), expect="≈ 104.3")
    ev.record("of which bf16 weights / bf16 gradients / fp32 master + moments (GB)",
              [training_state_gb(7e9, 2)["GB"], training_state_gb(7e9, 2)["GB"], training_state_gb(7e9, 12)["GB"]],
              expect="14 / 14 / 84")
    assert seven["GB"] == pytest.approx(112) and seven["GiB"] == pytest.approx(104.31, abs=0.01)
# --8<-- [end:test_states]


# --8<-- [start:test_activations]
@pytest.mark.claim("C-MEM-1", "nuanced")
def test_activations_per_layer_beside_the_formula(ev, seed):
    """Exact counts of our module, class by class, beside Korthikanti et al.'s sbh(34 + 5as/h). Paper setting (bf16,
    GeLU, attention and residual dropout, Pre-LN): the same tensors as the paper, except that the CPU dropout masks
    take 2 bytes, not 1 (sbh 20 vs 18, as²b 6 vs 5), and LayerNorm's per-token statistics (sb 8) that the formula
    leaves out. Our default fp32 layer (ReLU, no attention dropout, Post-LN) differs as listed. Then the formula's
    arithmetic for a 7B-sized shape, which is what '112 GB before activations' leaves out. Would read otherwise if
    any class differed from the listed explanation (asserted exactly)."""
    b, s, h, a = 2, 32, 64, 4  # classes distinct: sbh 4096, 4sbh 16384, as²b 8192, sb 64 elements
    paper = saved_by_class(b, s, h, a, torch.bfloat16, **PAPER_LAYER)
    ours = saved_by_class(b, s, h, a, torch.float32, dropout_residual=0.1)
    for cls in PAPER_CLASSES:
        ev.record(f"bytes per element of class {cls}: paper formula / our layer in the paper setting (bf16) / "
                  "our default layer (fp32)", [PAPER_CLASSES[cls], paper["classes"][cls], ours["classes"][cls]])
    # same totals as the layer-cost proof's counter (one instrument checks the other)
    assert paper["bytes"] == saved_activations(b, s, h, a, dtype=torch.bfloat16, **PAPER_LAYER)["bytes"]
    assert ours["bytes"] == saved_activations(b, s, h, a, dropout_residual=0.1)["bytes"]
    # paper setting: + 1 byte for each of the 2 residual masks (sbh) and the attention mask (as²b); + LN statistics
    assert paper["classes"] == {"sbh": 20, "4sbh": 4, "as²b": 6, "sb": 8}
    # the same layer at s = 48: identical bytes per class element, so the sbh classes grew as s and as²b as s²
    longer = saved_by_class(b, 48, h, a, torch.bfloat16, **PAPER_LAYER)
    ev.record("paper setting, saved bytes at s = 48 / at s = 32", longer["bytes"] / paper["bytes"],
              expect="between 1.5 (all linear in s) and 2.25 (all quadratic)")
    assert longer["classes"] == paper["classes"]
    # fp32 default: 10 sbh-sized tensors × 4 B, ReLU keeps one 4h tensor (its output is the next input) × 4 B,
    # one score matrix (no attention dropout) × 4 B, LN statistics 4 × 4 B
    assert ours["classes"] == {"sbh": 40, "4sbh": 4, "as²b": 4, "sb": 16}
    # the formula's arithmetic for an assumed 7B-sized shape: h 4096, a 32, L 32, s 2048, b 1
    full = korthikanti_activation_bytes(2048, 1, 4096, 32, 32)
    fused = korthikanti_activation_bytes(2048, 1, 4096, 32, 32, score_matrices=False)
    ev.record("formula, h=4096 a=32 L=32 s=2048 b=1: activations with score matrices / without (GB)",
              [full / GB, fused / GB], expect="arithmetic of sbhL(34 + 5as/h), not a measurement")
    assert full / GB == pytest.approx(2048 * 4096 * 32 * (34 + 80) / 1e9)
# --8<-- [end:test_activations]


# --8<-- [start:test_checkpoint_grads]
@pytest.mark.claim("C-MEM-2", "confirmed")
def test_checkpointing_gives_identical_gradients(ev, seed):
    """Exact (torch.equal). With dropout off, every gradient of the checkpointed model equals the plain one bit for bit.
    With dropout on, they are still equal because checkpoint replays the RNG state; the control (preserve_rng_state
    off) draws new dropout masks in the recomputation and its gradients differ. Would be refuted if the default arm
    differed at all."""
    for dropout in (0.0, 0.1):
        arms = checkpoint_arms(seed, dropout)
        same = all(torch.equal(g, c) for g, c in zip(arms["plain"]["grads"], arms["checkpointed"]["grads"]))
        ev.record(f"dropout {dropout}: all gradients bitwise equal, plain vs checkpointed", same, expect="True")
        ev.record(f"dropout {dropout}: largest |gradient difference|, checkpointed", max_grad_gap(arms["plain"],
                  arms["checkpointed"]), expect="0")
        gap = max_grad_gap(arms["plain"], arms["checkpointed, no RNG replay"])
        ev.record(f"dropout {dropout}: largest |gradient difference|, checkpointed without RNG replay", gap,
                  expect="0 without dropout, > 0 with it")
        assert same
        # seeds 100-139, dropout 0.1: gap 0.117 ± 0.039 (min 0.066); it is 0 only if every redrawn mask matched
        assert (gap == 0) if dropout == 0 else (gap > 1e-3)
# --8<-- [end:test_checkpoint_grads]


# --8<-- [start:test_checkpoint_cost]
@pytest.mark.claim("C-MEM-2", "confirmed")
def test_checkpointing_saves_only_layer_inputs_for_one_extra_forward(ev, seed):
    """Exact counts of our module (4 layers). Without checkpointing autograd keeps every layer's intermediates;
    with it, only each layer's input (b·s·d fp32 numbers per layer) plus what lies outside the layers (the output
    layer and the loss, the same in both arms). Each layer's forward runs twice, and the training FLOPs grow by
    exactly the layers' forward FLOPs: from 3× the forward to 3× + the layers' share. Would be refuted by saved
    bytes that did not fall, or by a recomputation that cost more or less than one forward of the layers."""
    arms = checkpoint_arms(seed)
    plain, ck = arms["plain"], arms["checkpointed"]
    L, d = tiny_cfg().n_layers, tiny_cfg().d_model
    layer_inputs = L * BATCH * T * d * 4
    ev.record("saved for backward (bytes): plain / checkpointed", [plain["saved bytes"], ck["saved bytes"]])
    ev.record("saved for backward: plain / checkpointed", plain["saved bytes"] / ck["saved bytes"],
              expect="far fewer with checkpointing")
    ev.record("saved inside the layers (bytes): plain / checkpointed",
              [plain["saved bytes"] - plain["saved outside layers"], ck["saved bytes"] - ck["saved outside layers"]],
              expect=f"… / L·b·s·d·4 = {layer_inputs}")
    assert ck["saved outside layers"] == plain["saved outside layers"]
    assert ck["saved bytes"] - ck["saved outside layers"] == layer_inputs
    assert plain["saved bytes"] > 5 * ck["saved bytes"]
    ev.record("layer forward calls in one training step: plain / checkpointed",
              [plain["layer forward calls"], ck["layer forward calls"]], expect=f"{L} / {2 * L}")
    assert (plain["layer forward calls"], ck["layer forward calls"]) == (L, 2 * L)
    F = plain["forward FLOPs"]
    layers_fwd = F - plain["head forward FLOPs"]
    ev.record("training FLOPs / forward FLOPs: plain / checkpointed",
              [plain["training FLOPs"] / F, ck["training FLOPs"] / F], expect="3 / 3 + layers' share of the forward")
    ev.record("layers' share of the forward FLOPs (the rest is the output layer)", layers_fwd / F)
    ev.record("hardware / model FLOPs with checkpointing (HFU / MFU)", ck["training FLOPs"] / plain["training FLOPs"],
              expect="4/3 if everything were checkpointed")
    assert plain["training FLOPs"] == 3 * F
    assert ck["training FLOPs"] == plain["training FLOPs"] + layers_fwd
# --8<-- [end:test_checkpoint_cost]

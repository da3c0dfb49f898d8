# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # int8 / int4: per tensor, per channel, per group, and one outlier channel
#
# Proofs for `docs/scale/quantisation.md`. Four parts:
#
# 1. **Exact**: absmax rounding moves each element by at most scale/2 with scale = absmax / (2^(b-1) - 1),
#    so one large weight inflates the error of every element that shares its scale: the whole matrix per
#    tensor, only its row per channel (the other rows are bit-identical).
# 2. **Trained**: a tiny shared DecoderLM (previous-token task) quantised weight-only to int8/int4 per tensor,
#    per channel and per group of 32: relative logit error and accuracy. Thresholds from seeds 100-139.
# 3. **Injected outlier**: one feature dimension of every pre-norm output is multiplied by 64 and the columns of
#    the linear maps that read it are divided by 64 (the float model is bit-identical: checked). Then every linear
#    layer runs int8 x int8 (W8A8) with activations per tensor, per token, or LLM.int8's decomposition.
#    The toy has no emergent outliers of its own; this one is put there by hand. LLM.int8's decomposition is also
#    checked by counting the columns it keeps in float (at most the injected one).
# 4. **SmoothQuant** on the same outlier: per-channel factors folded into the norms and the readers, then per-tensor
#    W8A8 with nothing in float. With alpha = 0.5 it undoes the injection exactly (checked bit for bit).
# Run: `pytest proofs/scale/proof_quantisation.py`.

# %%
from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch
from torch import Tensor

from proofs.tasks import previous_token_task
from proofs.train import fixed_batches, train
from proofs.transformer import DecoderLM, TransformerConfig, quantise, dequantise, quantise_model
from proofs.transformer.quant import Int8Linear, absmax_scale, elementwise_scale, smoothing_factors

VOCAB, T = 32, 16
GROUP = 32          # per-group size: in_features is 64 or 128, so 2 or 4 groups per row
ALPHA = 64.0        # the injected outlier's factor (a power of two, so the float model stays bit-identical)
THRESHOLD = 6.0     # LLM.int8's outlier threshold (bitsandbytes' default)

# An optimizer's first construction in a process imports torch._dynamo (about 1 CPU-second, once): pay it at import
# so that --durations times each test for its own work. It draws no random numbers and touches no model.
torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])


# %% [markdown]
# ## 1. The rounding bound, and one large weight (exact)

# %%
# --8<-- [start:bound]
def one_large_weight(seed: int, factor: float = 50.0) -> tuple[Tensor, Tensor]:
    """A (64, 64) Gaussian weight, and the same weight with w[0, 0] set to `factor` × the matrix's absmax."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 64, generator=g, dtype=torch.float64) * 0.05
    w_big = w.clone()
    w_big[0, 0] = factor * w.abs().max()
    return w, w_big


def rounding_report(w: Tensor, bits: int, granularity: str, group_size=None) -> dict:
    """Largest |w - ŵ| / (scale/2) (≤ 1 is the bound), the error of rows 1.., and their share rounded to 0."""
    q = quantise(w, bits, granularity, group_size)
    err = (dequantise(q) - w).abs()
    return {"worst error / (scale/2)": (err / (elementwise_scale(q) / 2)).max().item(),
            "mean |error|, rows 1..": err[1:].mean().item(),
            "share of rows 1.. rounded to 0": (q.codes.reshape(w.shape)[1:] == 0).double().mean().item(),
            "rows 1.. dequantised": dequantise(q)[1:]}
# --8<-- [end:bound]


@pytest.mark.claim("C-QUANT-1", "confirmed")
def test_rounding_bound_and_one_large_weight(ev, seed):
    """Exact check of our quantiser and of the arithmetic behind granularity. Every element's error is at most
    scale/2 (int8 and int4, all three granularities). A weight 50x the matrix's absmax put in row 0 multiplies
    the per-tensor scale by 50, and the other rows' error with it; in int4 it exceeds 2·7 = 14x everything else,
    so every other weight rounds to 0. Per channel, rows 1.. are bit-identical with and without it. Would be
    refuted if per-channel rows 1.. changed, or the per-tensor error of rows 1.. did not grow."""
    w, w_big = one_large_weight(seed)
    worst = max(rounding_report(m, b, gr, gs)["worst error / (scale/2)"] for m in (w, w_big) for b in (8, 4)
                for gr, gs in (("per_tensor", None), ("per_channel", None), ("per_group", 16)))
    ev.record("worst |w - ŵ| / (scale/2), 12 cases", worst, expect="≤ 1 (round to nearest)")
    assert worst <= 1 + 1e-9
    for bits in (8, 4):
        for gran in ("per_tensor", "per_channel"):
            plain, big = rounding_report(w, bits, gran), rounding_report(w_big, bits, gran)
            ratio = big["mean |error|, rows 1.."] / plain["mean |error|, rows 1.."]
            ev.record(f"int{bits} {gran}: error of rows 1.., with / without the large weight", ratio)
            ev.record(f"int{bits} {gran}: share of rows 1.. rounded to 0, without the large weight",
                      plain["share of rows 1.. rounded to 0"])
            ev.record(f"int{bits} {gran}: share of rows 1.. rounded to 0, with the large weight",
                      big["share of rows 1.. rounded to 0"])
            if gran == "per_channel":
                assert torch.equal(plain["rows 1.. dequantised"], big["rows 1.. dequantised"])
            else:  # seeds 100-139: int8 50.1 ± 0.6 (min 48.9), int4 5.9 ± 0.55 (min 4.3; capped: all round to 0)
                assert ratio > (20 if bits == 8 else 3)
    assert rounding_report(w_big, 4, "per_tensor")["share of rows 1.. rounded to 0"] == 1.0


# %% [markdown]
# ## 2. A trained toy, quantised weight-only
#
# Pre-LN DecoderLM (d_model 64, 2 layers, d_ff 128, untied head so that it is an nn.Linear too), trained 150
# Adam steps on the previous-token task (position t must output the token at t-1: it needs attention).
# `quantise_model` replaces every nn.Linear weight by its dequantised copy; embeddings and norms stay float.

# %%
# --8<-- [start:trained]
def toy_cfg() -> TransformerConfig:
    return TransformerConfig(vocab_size=VOCAB, d_model=64, n_heads=4, d_ff=128, n_layers=2, norm_position="pre",
                             tie_embeddings="none", dropout_emb=0.0, dropout_residual=0.0)


@lru_cache(maxsize=None)
def trained(seed: int) -> tuple[DecoderLM, Tensor, Tensor]:
    """(model, held-out inputs, targets); cached: both trained tests read the same model."""
    torch.manual_seed(seed)
    model = DecoderLM(toy_cfg())
    train(model, fixed_batches(previous_token_task, seed, batch=32, length=T, vocab=VOCAB), steps=150, lr=3e-3)
    x, y = previous_token_task(torch.Generator().manual_seed(10_000 + seed), 256, T, VOCAB)
    return model.eval(), x, y


@torch.no_grad()
def compare(model, reference, x: Tensor, y: Tensor) -> tuple[float, float, float]:
    """(relative logit error ‖ℓ_q - ℓ‖ / ‖ℓ‖ against the float model, accuracy and cross-entropy of `model`)."""
    return scores(model(x), reference(x), y)


def scores(out: Tensor, ref: Tensor, y: Tensor) -> tuple[float, float, float]:
    """compare's three numbers from logits (B, T, vocab) already computed."""
    ce = torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()).item()
    return ((out - ref).norm() / ref.norm()).item(), (out.argmax(-1) == y).float().mean().item(), ce


SCHEMES = {"per tensor": ("per_tensor", None), "per channel": ("per_channel", None),
           f"per group of {GROUP}": ("per_group", GROUP)}
# --8<-- [end:trained]


@pytest.mark.claim("C-QUANT-1", "confirmed")
def test_trained_toy_weight_only(ev, seed):
    """Trained (thresholds from seeds 100-139). Weight-only int8 at any granularity leaves the toy's accuracy
    where it was and its logits within about 1%; int4 errs about 18x more (127/7). Per tensor errs more than per
    channel in logit error at both widths on every seed; per group of 32 is lower on average, not on every seed.
    The cross-entropy increase is recorded too: on this toy its granularity ordering is not stable across seeds
    (recorded, not asserted). Would be refuted if int8 per channel cost accuracy, or nuanced if per channel were
    no better than per tensor."""
    model, x, y = trained(seed)
    _, acc_float, ce_float = compare(model, model, x, y)
    ev.record("accuracy, float model", acc_float)
    ev.record("cross-entropy, float model", ce_float)
    err = {}
    for bits in (8, 4):
        for name, (gran, g) in SCHEMES.items():
            e, acc, ce = compare(quantise_model(model, bits, gran, g), model, x, y)
            err[bits, name] = e
            ev.record(f"int{bits} {name}: relative logit error", e)
            ev.record(f"int{bits} {name}: accuracy drop", acc_float - acc)
            ev.record(f"int{bits} {name}: cross-entropy increase", ce - ce_float)
            if bits == 8:
                assert acc_float - acc < 0.01
    pc8, pc4 = err[8, "per channel"], err[4, "per channel"]
    ev.record("int4 / int8 error, per channel", pc4 / pc8)
    for bits in (8, 4):
        ev.record(f"int{bits} per group / per channel error", err[bits, f"per group of {GROUP}"] / err[bits, "per channel"])
    # Seeds 100-139: int8 per channel 0.0079 ± 0.00038 (max 0.0089); int4/int8 per channel 18.2 ± 0.87 (min 16.7);
    # int8 accuracy drop at most 0.0007 at any granularity.
    assert pc8 < 0.03 and pc4 > 10 * pc8
    # Per tensor > per channel on all 40 seeds, ranges disjoint: int8 0.0099 ± 0.00035 (min 0.0093) vs 0.0079
    # ± 0.00038 (max 0.0089); int4 0.177 ± 0.008 (min 0.165) vs 0.144 ± 0.006 (max 0.162).
    assert err[8, "per tensor"] > pc8 and err[4, "per tensor"] > pc4
    # Per group of 32 is lower than per channel on average (int8 0.0073 ± 0.00026, int4 0.133 ± 0.0053) but not
    # on every seed: per group / per channel is 0.92 ± 0.042 (max 1.02) in int8 and 0.93 ± 0.039 (max 1.09) in
    # int4, so per seed we only assert it is not clearly worse (1.15: over 5 sd above the mean).
    assert err[8, f"per group of {GROUP}"] < 1.15 * pc8 and err[4, f"per group of {GROUP}"] < 1.15 * pc4
    # Cross-entropy increase, recorded only (seeds 100-139): int4 per tensor 0.0118 ± 0.0054, per channel 0.0087 ±
    # 0.0055, per group of 32 0.0078 ± 0.0048; int8 all within ± 0.0003 of 0. The means order like the logit error but
    # the seed-to-seed spread is as large as the gaps, so the order flips on single seeds: not asserted.


# %% [markdown]
# ## 3. One outlier feature dimension, injected
#
# `inject_outlier` multiplies channel 0 of every pre-norm's gain and bias (both attention and FFN norms of both
# layers, and the final norm) by ALPHA = 64 and divides column 0 of every linear map that reads those norms
# (W_Q, W_K, W_V, the FFN's first map, the output head) by 64. Scaling by a power of two is exact in floating
# point, so the float model's logits are bit-identical: that is checked, not assumed. The quantised models then
# see one feature dimension scaled 64-fold in every norm output, for every token (its peak is 40-70x the largest
# other feature's over seeds 100-139): a feature-dimension outlier, the kind LLM.int8's decomposition targets.

# %%
# --8<-- [start:inject]
def norm_readers(model: DecoderLM) -> list[tuple[torch.nn.Module, list[torch.nn.Linear]]]:
    """Every pre-norm with the linear maps that read its output: (attention norm, [W_Q, W_K, W_V]),
    (FFN norm, [lin1]) per layer, and (final norm, [head])."""
    pairs = [(model.decoder.final_norm, [model.head.proj])]
    for layer in model.decoder.layers:
        att = layer.self_attn
        pairs += [(layer.sub_self.norm, [att.w_q, att.w_k, att.w_v]), (layer.sub_ffn.norm, [layer.ffn.lin1])]
    return pairs


def inject_outlier(model: DecoderLM, alpha: float = ALPHA, ch: int = 0) -> DecoderLM:
    """A copy with feature `ch` of every pre-norm output scaled by alpha and compensated in the readers."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for norm, readers in norm_readers(m):
            norm.weight[ch] *= alpha
            norm.bias[ch] *= alpha
            for lin in readers:
                lin.weight[:, ch] /= alpha  # (out, in): column ch multiplies feature ch
    return m


ACTS = {"per tensor": ("per_tensor", None), "per token": ("per_token", None),
        "LLM.int8 (per token + outliers in float)": ("per_token", THRESHOLD)}
# --8<-- [end:inject]


def linear_inputs(model: torch.nn.Module, x: Tensor,
                  kinds=(torch.nn.Linear, Int8Linear)) -> tuple[Tensor, dict[str, Tensor]]:
    """(logits, the input of every linear layer of `model` on x flattened to (tokens, in_features), by name)."""
    seen: dict[str, Tensor] = {}
    hooks = [mod.register_forward_hook(lambda m, inputs, out, name=name: seen.__setitem__(
                 name, inputs[0].reshape(-1, inputs[0].shape[-1])))  # returns None: the output is left as it is
             for name, mod in model.named_modules() if isinstance(mod, kinds)]
    with torch.no_grad():
        out = model(x)
    for h in hooks:
        h.remove()
    return out, seen


def per_token_rounding(x: Tensor) -> tuple[float, float]:
    """Per-token int8 codes of x (tokens, d): (share of features 1.. that round to 0, median number of distinct
    levels among features 1.. per token). Feature 0 is the one the outlier is injected into."""
    q = torch.round(x / absmax_scale(x, 8, dim=1))          # (tokens, d), the codes int8_matmul would use
    levels = (q[:, 1:].sort(dim=1).values.diff(dim=1) != 0).sum(dim=1) + 1   # (tokens,) distinct codes per row
    return (q[:, 1:] == 0).double().mean().item(), levels.double().median().item()


@pytest.mark.claim("C-QUANT-1", "confirmed")
def test_outlier_channel_ruins_per_tensor_int8_not_llm_int8(ev, seed):
    """Exact equivalence and exact counts, then trained (thresholds from seeds 100-139). The injected model's float
    logits equal the original's bit for bit. W8A8 with per-tensor activations: the logit error grows many-fold and
    accuracy falls; per-token activations: the error still grows many-fold (the outlier sits in every token, so
    every row's scale is set by it); LLM.int8's decomposition: back to the error without the outlier, while keeping
    at most ONE column of any linear in float (the injected one), and none in the clean model, where it equals
    per-token W8A8 bit for bit. The recovery is near-true by construction once that column is out: the int8 part
    then sees exactly the original model's other 63 features. What the test can fail on is the count: a decomposition
    that kept many columns (or all: error 0) in float would pass an error test but not this one. Would be refuted
    if the decomposition's error stayed far above the no-outlier error, if it needed more than the injected column,
    or if per-tensor int8 were unaffected."""
    model, x, y = trained(seed)
    hurt = inject_outlier(model)
    with torch.no_grad():
        assert torch.equal(hurt(x), model(x))  # the float model is unchanged, exactly
    ev.record("float logits after injection equal the original's bit for bit", True)
    lin1_x = {label: linear_inputs(m, x)[1]["decoder.layers.0.ffn.lin1"] for label, m in (("no outlier", model),
                                                                                        ("outlier", hurt))}
    peaks = lin1_x["outlier"].abs().amax(0)
    ratio = (peaks[0] / peaks[1:].max()).item()
    ev.record("outlier feature's max |x| / the largest other feature's (layer 0 FFN input)", ratio)
    for label, xin in lin1_x.items():  # what per-token int8 does to the ordinary features of layer 0's FFN input
        zero, levels = per_token_rounding(xin)
        ev.record(f"per-token int8, {label}: share of features 1.. rounded to 0 (layer 0 FFN input)", zero)
        ev.record(f"per-token int8, {label}: median distinct levels of features 1.. per token", levels)
    with torch.no_grad():
        ref = model(x)
    _, acc_float, _ = scores(ref, ref, y)
    err, drop, logits, kept = {}, {}, {}, {}
    for label, m in (("no outlier", model), ("outlier", hurt)):
        for name, (act, thr) in ACTS.items():
            q = quantise_model(m, activations=act, threshold=thr)
            logits[label, name], inputs = linear_inputs(q, x)
            e, acc, _ = scores(logits[label, name], ref, y)
            err[label, name], drop[label, name] = e, acc_float - acc
            ev.record(f"W8A8 {name}, {label}: relative logit error", e)
            ev.record(f"W8A8 {name}, {label}: accuracy drop", acc_float - acc)
            if thr is not None:  # per linear: (columns int8_matmul takes out, counted as it selects them, d_in, d_out)
                mods = dict(q.named_modules())
                kept[label] = {n: (int((xi.abs().amax(0) >= thr).sum()), xi.shape[1], mods[n].weight.shape[0])
                               for n, xi in inputs.items()}
    llm = "LLM.int8 (per token + outliers in float)"
    assert torch.equal(logits["no outlier", llm], logits["no outlier", "per token"])
    ev.record("LLM.int8, no outlier: logits equal per-token W8A8's bit for bit", True)
    for label, cols in kept.items():
        ev.record(f"LLM.int8, {label}: most columns kept in float in one linear (of d_in)",
                  max(k for k, _, _ in cols.values()))
        ev.record(f"LLM.int8, {label}: linears with a column kept in float (of {len(cols)})",
                  sum(k > 0 for k, _, _ in cols.values()))
        share = sum(k * o for k, _, o in cols.values()) / sum(i * o for _, i, o in cols.values())
        ev.record(f"LLM.int8, {label}: share of multiply-adds done in float", share)
    assert max(k for k, _, _ in kept["outlier"].values()) == 1        # exact count: only the injected column
    assert max(k for k, _, _ in kept["no outlier"].values()) == 0     # threshold 6 catches nothing in the clean toy
    base = err["no outlier", "per token"]
    mixed = err["outlier", llm]
    # Seeds 100-139: ratio 50.9 ± 4.9 (min 40); per tensor with outlier 0.78 ± 0.043 (min 0.68) vs 0.0226 ± 0.0008
    # without, accuracy drop 0.28 ± 0.038 (min 0.19); per token 0.31 ± 0.027 (min 0.25) vs 0.0152 ± 0.0005;
    # LLM.int8 0.0151 ± 0.0005 (max 0.0162), accuracy drop at most 0.001.
    assert ratio > 20  # an outlier: tens of times the largest other feature
    assert err["outlier", "per tensor"] > 10 * err["no outlier", "per tensor"] and drop["outlier", "per tensor"] > 0.1
    assert err["outlier", "per token"] > 5 * base
    assert mixed < 1.2 * base and drop["outlier", llm] < 0.01
    # Seeds 100-139 (layer 0 FFN input, per-token int8): features 1.. rounded to 0: 0.172 ± 0.021 with the outlier vs
    # 0.0082 ± 0.0003 without; median distinct levels per token 12.6 ± 1.3 (10-15) vs 53.1 ± 0.3. Column counts are
    # exact and identical on all 40 seeds: at most 1 column per linear, in 9 of 13 linears (0.0099 of multiply-adds).


# %% [markdown]
# ## 4. SmoothQuant on the same outlier
#
# `smooth` measures each pre-norm output's per-feature max |x| on a calibration batch (other sequences than the
# evaluation's), takes the per-column max |W| over the linear maps that read it, and folds s_j (alpha = 0.5) into
# the norm (gain and bias divided by s_j) and the readers (column j times s_j). Then every linear runs per-tensor
# W8A8: no column is kept in float.

# %%
# --8<-- [start:smoothquant]
def smooth(model: DecoderLM, calib: Tensor, alpha: float = 0.5) -> DecoderLM:
    """A copy with SmoothQuant's factors folded into every pre-norm and the linear maps that read it."""
    m = copy.deepcopy(model)
    pairs = norm_readers(m)
    peaks: dict[int, Tensor] = {}
    hooks = [norm.register_forward_hook(lambda mod, inputs, out, k=k: peaks.__setitem__(k, out.abs().amax(dim=(0, 1))))
             for k, (norm, _) in enumerate(pairs)]  # (d_model,) max |x| per feature over the calibration tokens
    with torch.no_grad():
        m(calib)
        for h in hooks:
            h.remove()
        for k, (norm, readers) in enumerate(pairs):
            w_peak = torch.cat([lin.weight for lin in readers]).abs().amax(dim=0)   # (d_model,) max over readers' rows
            s = smoothing_factors(peaks[k], w_peak, alpha)
            norm.weight /= s
            norm.bias /= s
            for lin in readers:
                lin.weight *= s                                                    # (out, in) * (in,): column j × s_j
    return m
# --8<-- [end:smoothquant]


@pytest.mark.claim("C-QUANT-1", "confirmed")
def test_smoothquant_folds_the_outlier_into_the_weights(ev, seed):
    """Exact, then trained (thresholds from seeds 100-139). With alpha = 0.5 SmoothQuant undoes our injection
    exactly: feature 0's activation peak is 64x and its weight columns 1/64, so s_0 is 64x and the smoothed
    injected model equals the smoothed clean model parameter for parameter, bit for bit (sqrt and powers of two are
    exact). This is the easiest outlier there is for smoothing; a real one is not a pure rescaling. Then per-tensor
    W8A8 of the smoothed model errs no more than per-tensor W8A8 of the clean model, with every multiply in int8.
    Would be refuted if the smoothed model's per-tensor error stayed near the unsmoothed 0.78."""
    model, x, y = trained(seed)
    hurt = inject_outlier(model)
    calib, _ = previous_token_task(torch.Generator().manual_seed(20_000 + seed), 64, T, VOCAB)
    smoothed = smooth(hurt, calib)
    with torch.no_grad():
        rel = ((smoothed(x) - model(x)).norm() / model(x).norm()).item()
    ev.record("float logits, smoothed vs original: relative difference", rel)
    assert rel < 1e-5  # float rounding only: smoothing is an identity in real arithmetic
    same = all(torch.equal(a, b) for a, b in zip(smoothed.state_dict().values(), smooth(model, calib).state_dict().values()))
    ev.record("smoothed injected model equals the smoothed clean model bit for bit", same)
    assert same
    peaks = linear_inputs(smoothed, x)[1]["decoder.layers.0.ffn.lin1"].abs().amax(0)
    ev.record("after smoothing: feature 0's max |x| / the largest other feature's (layer 0 FFN input)",
              (peaks[0] / peaks[1:].max()).item())
    _, acc_float, _ = compare(model, model, x, y)
    err = {}
    for label, m in (("no outlier", model), ("outlier", hurt), ("outlier, smoothed", smoothed)):
        e, acc, _ = compare(quantise_model(m, activations="per_tensor"), model, x, y)
        err[label] = e
        ev.record(f"W8A8 per tensor, {label}: relative logit error", e)
        ev.record(f"W8A8 per tensor, {label}: accuracy drop", acc_float - acc)
    # Seeds 100-139: smoothed per tensor 0.0216 ± 0.0006 (max 0.0230) vs clean per tensor 0.0226 ± 0.0008 (min
    # 0.0209); unsmoothed with the outlier 0.78 ± 0.043 (min 0.68); bit-identity with the smoothed clean model 40/40.
    assert err["outlier, smoothed"] < 1.2 * err["no outlier"]
    assert err["outlier"] > 10 * err["outlier, smoothed"]

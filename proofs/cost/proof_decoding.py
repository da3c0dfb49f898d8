# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How does the decoder generate, and what does the key/value cache save?
#
# Proofs for the page `docs/cost/decoding.md`. Everything runs on the shared model
# (`proofs/transformer/`): `EncoderDecoder.generate` and `DecoderLM.generate` decode
# greedily, with the key/value cache (`use_cache=True`) or by recomputing the whole
# prefix at every step (`use_cache=False`): that flag is the switch. Calls are counted
# with forward hooks, FLOPs with `torch.utils.flop_counter.FlopCounterMode` on the
# explicit attention path (`attn_impl="explicit"`: the fused CPU kernel of
# `F.scaled_dot_product_attention` is not in its registry and would count as 0).
# Run it with `pytest proofs/cost/proof_decoding.py`, or open it as a notebook with
# `jupytext --to notebook proofs/cost/proof_decoding.py`.

# %%
from __future__ import annotations

import time
from functools import cache

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from proofs.tasks import copy_task
from proofs.train import fixed_batches, train
from proofs.transformer import ConfigError, DecoderLM, EncoderDecoder, TransformerConfig

BOS = 0  # token 0 never occurs in copy_task's sequences (tokens 1..V-1): it serves as begin-of-sequence
V = 16  # vocabulary of the small models
PREFIXES = [1, 2, 8, 32, 68, 128, 512, 1024]  # prefix lengths t at which one cached step is counted


def small_config(**switches) -> TransformerConfig:
    """A small model without dropout (generation is run in eval mode anyway)."""
    base = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=160,
                dropout_emb=0.0, dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})


def shift_right(y: Tensor, bos: int = BOS) -> Tensor:
    """(B, T) target -> (B, T) decoder input [bos, y_0, ..., y_{T-2}]: position t sees only y_<t."""
    return torch.cat([torch.full_like(y[:, :1], bos), y[:, :-1]], dim=1)


# %% [markdown]
# ## 1. Who runs how often
#
# Forward hooks count the calls of the encoder and the decoder during generation, and
# the shape of what each call received. For contrast, a loop that calls the model's
# `forward(src, tgt_in)` at every step, as a training step would, encodes the source again each time.

# %%
# --8<-- [start:count]
def count_calls(modules: dict[str, nn.Module], run) -> dict[str, list[tuple]]:
    """Run run() and return, per module, the input shape of each of its forward calls."""
    seen = {name: [] for name in modules}
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: seen[name].append(tuple(args[0].shape)))
             for name, m in modules.items()]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def generate_with_forward(model: EncoderDecoder, src: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Greedy decoding that calls model(src, tgt_in) at every step: correct, but it re-encodes src each time."""
    ids, picked = torch.full((src.shape[0], 1), BOS), []
    for _ in range(steps):
        last = model(src, ids)[:, -1]  # forward() = encode + decode
        ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)
        picked.append(last)
    return ids, torch.stack(picked, dim=1)
# --8<-- [end:count]


# %% [markdown]
# ## 2. Teacher forcing: one pass over the shifted target equals step-by-step decoding
#
# Training feeds the decoder the gold target shifted right by one, all positions at
# once. The causal mask makes position t depend on tgt_in[:, :t+1] only, so one pass
# gives the logits that T separate decoding steps fed the same gold prefix give.

# %%
# --8<-- [start:teacher_forcing]
@torch.no_grad()
def teacher_forcing_gaps(seed: int, T: int = 10) -> dict:
    torch.manual_seed(seed)
    model = EncoderDecoder(small_config()).eval()
    src, y = copy_task(torch.Generator().manual_seed(seed), 4, T, V)
    tgt_in = shift_right(y)
    parallel = model(src, tgt_in)  # (B, T, V): one pass, every position
    memory = model.encode(src)
    stepwise = torch.stack([model.decode(tgt_in[:, :t + 1], memory)[:, -1] for t in range(T)], dim=1)
    cache = model.decoder.new_cache()  # the same, one gold token at a time through the cache
    cached = torch.cat([model.head(model.decoder(model.tgt_embed(tgt_in[:, t:t + 1], t), memory, cache=cache))
                        for t in range(T)], dim=1)
    future = tgt_in.clone()
    future[:, T // 2:] = (future[:, T // 2:] % (V - 1)) + 1  # change every gold token from T/2 on
    changed = model(src, future)
    return {
        "one pass vs step-by-step": (parallel - stepwise).abs().max().item(),
        "one pass vs step-by-step through the cache": (parallel - cached).abs().max().item(),
        "positions < T/2 after changing tokens ≥ T/2": (changed - parallel)[:, :T // 2].abs().max().item(),
        "positions ≥ T/2 after changing tokens ≥ T/2": (changed - parallel)[:, T // 2:].abs().max().item(),
    }
# --8<-- [end:teacher_forcing]


# %% [markdown]
# ## 3. What the right shift is for
#
# The same model trained on the copy task twice, with the same batches: decoder input
# `shift_right(y)` (the paper's setting) or `y` itself (no shift, so position t reads its own
# answer). Then both generate greedily from BOS, where no answer is there to read.

# %%
# --8<-- [start:shift]
class TeacherForced(nn.Module):
    """Adapter for proofs/train.py, whose batches are (inputs, targets): inputs = (src, tgt_in)."""

    def __init__(self, model: EncoderDecoder):
        super().__init__()
        self.model = model

    def forward(self, pair: tuple[Tensor, Tensor]) -> Tensor:
        return self.model(*pair)


@cache
def train_copy(seed: int, shift: bool, steps: int = 120, T: int = 6) -> dict:
    """Train on copy (target = source) with tgt_in = shift_right(y) or y; then decode greedily."""
    torch.manual_seed(seed)
    model = EncoderDecoder(small_config(vocab_size=10, n_heads=2, n_layers=1, max_len=16))
    data = fixed_batches(copy_task, 1000 + seed, batch=32, length=T, vocab=10)

    def batches(step: int):
        src, y = data(step)
        return (src, shift_right(y) if shift else y), y

    log = train(TeacherForced(model), batches, steps, lr=5e-3)
    src, y = copy_task(torch.Generator().manual_seed(10_000 + seed), 256, T, 10)
    with torch.no_grad():
        forced = (model(src, shift_right(y) if shift else y).argmax(-1) == y).float().mean().item()
    ids, _ = model.generate(src, BOS, T)
    return {"train loss": log.final(), "teacher-forced accuracy": forced,
            "generation accuracy": (ids[:, 1:] == y).float().mean().item()}
# --8<-- [end:shift]


# %% [markdown]
# ## 4. Cost per generated token, with and without the cache
#
# A hook before the decoder reads the FLOP counter, a hook after the output layer reads
# it again: the difference is one generation step. Without the cache, step t reruns all
# t tokens of the prefix; with it, step t runs one token against t cached keys.

# %%
# --8<-- [start:flops]
def flops_per_step(model: DecoderLM, prompt: Tensor, steps: int, use_cache: bool) -> list[int]:
    """FLOPs of each generation step (decoder + output layer), counted by FlopCounterMode."""
    per_step, start = [], []
    with FlopCounterMode(display=False) as fc:
        h1 = model.decoder.register_forward_pre_hook(lambda m, args: start.append(fc.get_total_flops()))
        h2 = model.head.register_forward_hook(lambda m, args, out: per_step.append(fc.get_total_flops() - start[-1]))
        try:
            model.generate(prompt, steps, use_cache)
        finally:
            h1.remove()
            h2.remove()
    return per_step


def step_formula(t: int, cfg: TransformerConfig, use_cache: bool) -> int:
    """Matrix FLOPs of the step whose prefix holds t tokens (2 per multiply-add)."""
    L, d, d_ff, V = cfg.n_dec_layers or cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.vocab_size
    rows = 1 if use_cache else t  # positions pushed through the projections, the FFN and the output layer
    per_layer = rows * (8 * d * d + 4 * d * d_ff) + 4 * rows * t * d  # Q,K,V,O + FFN; QKᵀ and A·V over t keys
    return L * per_layer + 2 * rows * d * V
# --8<-- [end:flops]


def cost_model(seed: int, **switches) -> DecoderLM:
    """A deliberately narrow model (d_model 16, d_ff 32, V 16, 2 layers), so that the crossover where attention's
    t·d term overtakes the per-token d² work, t* = 2d + d_ff + V/(2L) = 68 tokens, is cheap to go past."""
    torch.manual_seed(seed)
    switches = {"attn_impl": "explicit", **switches}  # explicit path: every matrix product is counted
    return DecoderLM(small_config(d_model=16, d_ff=32, n_heads=2, vocab_size=16, max_len=1100, **switches)).eval()


@torch.no_grad()
def cached_step_flops(model: DecoderLM, t: int) -> int:
    """FLOPs of the cached step whose prefix holds t tokens: prefill t-1 tokens (not counted), then one new token."""
    ids = torch.ones(1, t, dtype=torch.long)
    cache = model.decoder.new_cache()
    if t > 1:
        model.decoder(model.embed(ids[:, : t - 1]), cache=cache)  # the keys and values of the first t-1 tokens
    with FlopCounterMode(display=False) as fc:
        model.head(model.decoder(model.embed(ids[:, t - 1:], t - 1), cache=cache))
    return fc.get_total_flops()


def wall_seconds(model: DecoderLM, n: int, use_cache: bool, repeats: int = 3) -> float:
    """Median wall time of generating n tokens (recorded only: it depends on the machine)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.generate(torch.ones(1, 1, dtype=torch.long), n, use_cache)
        times.append(time.perf_counter() - t0)
    return sorted(times)[repeats // 2]


# %% [markdown]
# ## 5. Cross-attention: queries from the decoder, keys and values from the encoder
#
# Hooks on every decoder layer's cross-attention record what it was called with, and
# the keys its W_K produced.

# %%
# --8<-- [start:cross]
@torch.no_grad()
def cross_attention_inputs(model: EncoderDecoder, src: Tensor, tgt_in: Tensor) -> dict:
    """Per decoder layer: the tensors its cross-attention got as queries' input and keys' input, and its keys."""
    got = {"memory": None, "query input": [], "key input": [], "keys": [], "queries": []}

    def inputs(module, args):  # cross_attn(h, memory, ...): returns None, so the call is left unchanged
        got["query input"].append(args[0])
        got["key input"].append(args[1])

    hooks = [model.encoder.register_forward_hook(lambda m, args, out: got.update(memory=out))]
    for layer in model.decoder.layers:
        attn = layer.cross_attn
        hooks.append(attn.register_forward_pre_hook(inputs))
        hooks.append(attn.w_k.register_forward_hook(lambda m, args, out: got["keys"].append(out)))
        hooks.append(attn.w_q.register_forward_hook(lambda m, args, out: got["queries"].append(out)))
    try:
        model(src, tgt_in)
    finally:
        for h in hooks:
            h.remove()
    return got
# --8<-- [end:cross]


# %%
if __name__ == "__main__":  # notebook / script: flip use_cache, change a length, rerun
    print(teacher_forcing_gaps(0))
    print("shifted", train_copy(0, True), "unshifted", train_copy(0, False))
    m = cost_model(0)
    print({t: cached_step_flops(m, t) for t in PREFIXES})


# %% [markdown]
# ## Tests: each asserts what the switch (or the claim) changes

# %%
import pytest  # noqa: E402


# --8<-- [start:test_calls]
@pytest.mark.claim("C-DEC-1", "confirmed")
def test_encoder_runs_once_decoder_once_per_token(ev, seed):
    """generate() encodes the source once and runs the decoder once per token; calling forward() per step re-encodes.
    Exact call counts of our module; it would be refuted if generate() called the encoder more than once."""
    torch.manual_seed(seed)
    model = EncoderDecoder(small_config()).eval()
    src = copy_task(torch.Generator().manual_seed(seed), 3, 9, V)[0]
    n = 12
    parts = {"encoder": model.encoder, "decoder": model.decoder}
    out = {}
    for name, run in (("generate, cache", lambda: out.update(a=model.generate(src, BOS, n))),
                      ("generate, no cache", lambda: out.update(b=model.generate(src, BOS, n, use_cache=False))),
                      ("forward() per step", lambda: out.update(c=generate_with_forward(model, src, n)))):
        seen = count_calls(parts, run)
        ev.record(f"{name}: encoder calls, decoder calls ({n} tokens)", [len(seen["encoder"]), len(seen["decoder"])])
        out[name] = seen
    ev.record("encoder input shape (B, S, C) of its one call", list(out["generate, cache"]["encoder"][0]),
              expect="all S source positions at once")
    ev.record("decoder input length per step, cache", sorted({s[1] for s in out["generate, cache"]["decoder"]}),
              expect="[1]: the new token only")
    ev.record("decoder input length per step, no cache", [s[1] for s in out["generate, no cache"]["decoder"]],
              expect="1, 2, …, n: the whole prefix", key=False)
    gap = (out["a"][1] - out["c"][1]).abs().max().item()
    ev.record("max |Δlogit|, encode once vs re-encode every step", gap, expect="< 1e-5: nothing is lost")
    assert len(out["generate, cache"]["encoder"]) == len(out["generate, no cache"]["encoder"]) == 1
    assert len(out["generate, cache"]["decoder"]) == len(out["generate, no cache"]["decoder"]) == n
    assert len(out["forward() per step"]["encoder"]) == n  # the contrast: n encodings of the same source
    assert out["generate, cache"]["encoder"][0][1] == src.shape[1]
    assert [s[1] for s in out["generate, cache"]["decoder"]] == [1] * n
    assert [s[1] for s in out["generate, no cache"]["decoder"]] == list(range(1, n + 1))
    assert torch.equal(out["a"][0], out["c"][0]) and gap < 1e-5
# --8<-- [end:test_calls]


@pytest.mark.claim("C-DEC-1", "confirmed")
def test_teacher_forcing_equals_stepwise_decoding(ev, seed):
    """One pass over the right-shifted gold target gives, position by position, the logits of step-by-step decoding.
    Exact up to float rounding (our module); it would be refuted by any position whose logits differ."""
    gaps = teacher_forcing_gaps(seed)
    for name, value in gaps.items():
        ev.record(f"max |Δlogit|, {name}", value,
                  expect="> 0.1: later positions see the change" if name.startswith("positions ≥") else "< 1e-5")
    assert gaps["one pass vs step-by-step"] < 1e-5
    assert gaps["one pass vs step-by-step through the cache"] < 1e-5
    assert gaps["positions < T/2 after changing tokens ≥ T/2"] < 1e-5  # the causal mask: no position sees ahead
    assert gaps["positions ≥ T/2 after changing tokens ≥ T/2"] > 0.1


# --8<-- [start:test_shift]
@pytest.mark.claim("C-DEC-1", "confirmed")
def test_right_shift_keeps_the_answer_out_of_the_input(ev, seed):
    """Trained without the shift, position t reads its own answer: perfect training loss, failed generation; with the
    shift, generation works. Would be refuted if the unshifted model generated as well as the shifted one."""
    shifted, unshifted = train_copy(seed, shift=True), train_copy(seed, shift=False)
    for name, expect_s, expect_u in (("train loss", "falls", "≈ 0: it copies its input"),
                                     ("teacher-forced accuracy", "high", "≈ 1: the answer is in the input"),
                                     ("generation accuracy", "high", "near chance (1/9)")):
        ev.record(f"{name}, shifted", shifted[name], expect=expect_s)
        ev.record(f"{name}, unshifted", unshifted[name], expect=expect_u)
    # thresholds from the spread over seeds 100-219 (bench/seeds/cost/proof_decoding.json for 100-139): train loss
    # unshifted 0.0011 ± 0.0002, shifted 0.21 ± 0.13 (min 0.07); generation accuracy unshifted 0.064 ± 0.054 (max 0.17),
    # shifted 0.92 ± 0.06 (min 0.67: a few seeds fit less well, none comes near the unshifted arm)
    assert unshifted["train loss"] < 0.01 < shifted["train loss"]
    assert unshifted["teacher-forced accuracy"] > 0.99
    assert unshifted["generation accuracy"] < 0.35
    assert shifted["generation accuracy"] > 0.5
# --8<-- [end:test_shift]


@pytest.mark.claim("C-DEC-2", "confirmed")
def test_cached_generation_equals_uncached(ev, seed):
    """With and without the cache, greedy decoding picks the same tokens from logits equal to 1e-5 (not bit for bit).
    Exact up to float rounding (eight variants of our module); it would be refuted by one differing token."""
    worst, bitwise = 0.0, True
    for kind in (DecoderLM, EncoderDecoder):
        for norm_position in ("post", "pre"):
            for positions in ("sinusoidal", "learned"):
                torch.manual_seed(seed)
                model = kind(small_config(norm_position=norm_position, positions=positions)).eval()
                x = copy_task(torch.Generator().manual_seed(seed), 4, 6, V)[0]
                args = (x, 24) if kind is DecoderLM else (x, BOS, 24)
                (ids_c, log_c), (ids_u, log_u) = model.generate(*args), model.generate(*args, use_cache=False)
                gap = (log_c - log_u).abs().max().item()
                ev.record(f"max |Δlogit|, {kind.__name__}, {norm_position}-LN, {positions}", gap, expect="< 1e-5",
                          key=False)
                assert torch.equal(ids_c, ids_u) and gap < 1e-5
                worst, bitwise = max(worst, gap), bitwise and torch.equal(log_c, log_u)
    ev.record("max |Δlogit| over the 8 models, 24 tokens each", worst, expect="< 1e-5")
    ev.record("bit-for-bit equal logits in every model", bitwise, expect="not required: sums run in another order")
    # the check can fail: a cache fed without the position offset (start=0 at every step) drifts
    torch.manual_seed(seed)
    lm = DecoderLM(small_config()).eval()
    ids = copy_task(torch.Generator().manual_seed(seed), 2, 8, V)[0]
    cache = lm.decoder.new_cache()
    with torch.no_grad():
        no_offset = torch.cat([lm.head(lm.decoder(lm.embed(ids[:, t:t + 1]), cache=cache)) for t in range(8)], 1)
        drift = (no_offset - lm(ids)).abs().max().item()
    ev.record("max |Δlogit|, cache fed without the position offset", drift, expect="large: every token at position 0")
    assert drift > 0.1


# --8<-- [start:test_flops]
@pytest.mark.claim("C-DEC-2", "confirmed")
def test_cache_makes_each_step_linear_in_t_but_the_total_stays_quadratic(ev, seed):
    """Per token, the cache costs A + B·t (A = L(8d² + 4d·d_ff) + 2dV, B = 4Ld): the d² work becomes constant but
    attention still reads all t keys. Recomputing costs t times that. So the cache turns O(n²d² + n³d) into
    O(nd² + n²d): linear-dominated while n is below the crossover t* = 2d + d_ff + V/(2L), quadratic above it.
    Exact FLOP counts of our module; "the cached total is linear" would be confirmed only if B were 0."""
    model, prompt = cost_model(seed), torch.ones(1, 1, dtype=torch.long)
    cfg = model.cfg
    L, d, d_ff, V = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.vocab_size
    n = 24  # every step of a short generation, both arms, against the formula
    steps = {c: flops_per_step(model, prompt, n, c) for c in (True, False)}
    for c in (True, False):  # step t has a prefix of t tokens
        assert steps[c] == [step_formula(t, cfg, c) for t in range(1, n + 1)]
    assert steps[False] == [t * st for t, st in enumerate(steps[True], 1)]  # without the cache: t times the work
    # one cached step at long prefixes (prefill, then count one step): still exactly A + B·t
    at = {t: cached_step_flops(model, t) for t in PREFIXES}
    A, B = L * (8 * d * d + 4 * d * d_ff) + 2 * d * V, 4 * L * d
    assert all(f == A + B * t for t, f in at.items())
    crossover = A / B
    ev.record("cached step: constant part A (FLOPs)", A, expect="L(8d² + 4d·d_ff) + 2dV", key=False)
    ev.record("cached step: FLOPs per cached key, B", B, expect="4Ld", key=False)
    ev.record("crossover t* = A/B where attention over the cache costs as much as everything else", crossover,
              expect=f"2d + d_ff + V/(2L) = {2 * d + d_ff + V / (2 * L):g}")
    assert crossover == 2 * d + d_ff + V / (2 * L)
    for t in (8, 1024):
        ev.record(f"share of the cached step spent on attention over the cache, t={t}", B * t / at[t],
                  expect="small below t*, most of the step above it")
    # totals over n generated tokens, from the counted per-step costs
    total = lambda k: sum(A + B * t for t in range(1, k + 1))  # noqa: E731  (exact: every step is A + B·t)
    growth = {k: total(2 * k) / total(k) for k in (8, 1024)}
    ev.record("cached total ×, n = 8 → 16 (below t*)", growth[8], expect="≈ 2: the linear term dominates")
    ev.record("cached total ×, n = 1024 → 2048 (far above t*)", growth[1024], expect="→ 4: the quadratic term dominates")
    ev.record("uncached total ×, n = 12 → 24", sum(steps[False][:24]) / sum(steps[False][:12]), expect="≥ 4")
    ev.record("FLOPs of step 24 (no cache / cache)", steps[False][-1] / steps[True][-1], expect="= 24: t×")
    assert growth[8] < 2.2 and growth[1024] > 3.5
    _plot_flops(ev, at, A, B)
    # the cache's size: keys and values of every layer and every position so far (a count of our module)
    cache = model.decoder.new_cache()
    with torch.no_grad():
        for t in range(n):
            model.decoder(model.embed(prompt, t), cache=cache)
    held = sum(e.numel() for c in cache for e in c["self"].entries)
    ev.record(f"floats in the cache after {n} tokens (2·L·n·d = {2 * L * n * d})", held)
    assert held == 2 * L * n * d
    fast = cost_model(seed, attn_impl="auto")  # the default path, for the clock
    for c, label in ((True, "cache"), (False, "no cache")):
        ev.record(f"wall time, {n} tokens, batch 1, {label} (s)", wall_seconds(fast, n, c),
                  expect="recorded, not asserted", key=False)
# --8<-- [end:test_flops]


def _plot_flops(ev, at, A, B):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    ts = sorted(at)
    axes[0].loglog(ts, [at[t] for t in ts], "o-", label="cached step (counted)")
    axes[0].loglog(ts, [A] * len(ts), ":", color="grey", label="constant part A")
    axes[0].loglog(ts, [B * t for t in ts], "--", color="grey", label="attention over t keys, B·t")
    axes[0].axvline(A / B, color="C3", lw=0.8, label="t* = A/B")
    axes[0].set(title="FLOPs of one cached step, prefix of t tokens", xlabel="t")
    ns = [2**i for i in range(2, 12)]
    lin = [A * k for k in ns]
    quad = [B * k * (k + 1) / 2 for k in ns]
    axes[1].loglog(ns, [a + b for a, b in zip(lin, quad)], "o-", label="cached total")
    axes[1].loglog(ns, lin, ":", color="grey", label="linear part n·A")
    axes[1].loglog(ns, quad, "--", color="grey", label="quadratic part B·n(n+1)/2")
    axes[1].set(title="total FLOPs to generate n tokens with the cache", xlabel="n")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    ev.figure(fig, "flops", "FlopCounterMode counts of one cached step against the prefix length (DecoderLM, 2 layers, "
                            "d_model=16, d_ff=32, V=16, explicit attention path), and the total they add up to.")


# --8<-- [start:test_cross]
@pytest.mark.claim("C-XATT-1", "nuanced")
def test_cross_attention_reads_the_encoder_output_in_every_layer(ev, seed):
    """Queries come from the decoder stream, keys/values from the one encoder output that every layer reads (exact, our
    module). "Which is why both share d_model" is the nuanced half: our module refuses a narrower encoder, but one
    Linear from its width makes it run, i.e. W_K and W_V can read any width; equal widths serve the residual stream.
    The first half would be refuted if any layer's keys came from elsewhere; the second confirmed if no map could
    bridge two widths."""
    torch.manual_seed(seed)
    model = EncoderDecoder(small_config(n_layers=3)).eval()
    g = torch.Generator().manual_seed(seed)
    src, y = copy_task(g, 2, 7, V)
    other_src, other_y = copy_task(g, 2, 7, V)
    base = cross_attention_inputs(model, src, shift_right(y))
    memory = base["memory"]
    same_object = all(t is memory for t in base["key input"])
    same_storage = len({t.data_ptr() for t in base["key input"]} | {memory.data_ptr()}) == 1
    query_is_memory = any(t.data_ptr() == memory.data_ptr() for t in base["query input"])
    ev.record("every layer's cross-attention key/value input is the encoder output object", same_object)
    ev.record("distinct data_ptr among the layers' key/value inputs and the encoder output",
              len({t.data_ptr() for t in base["key input"]} | {memory.data_ptr()}), expect="1")
    ev.record("distinct query inputs (one per layer, from the decoder stream)",
              len({t.data_ptr() for t in base["query input"]}), expect="= number of layers (3)")
    new_src = cross_attention_inputs(model, other_src, shift_right(y))  # other encoder output, same decoder input
    new_tgt = cross_attention_inputs(model, src, shift_right(other_y))  # same encoder output, other decoder input
    key_change_src = [(a - b).abs().max().item() for a, b in zip(base["keys"], new_src["keys"])]
    key_change_tgt = [(a - b).abs().max().item() for a, b in zip(base["keys"], new_tgt["keys"])]
    query_change_tgt = [(a - b).abs().max().item() for a, b in zip(base["queries"], new_tgt["queries"])]
    ev.record("max |Δ keys| per layer, other source", key_change_src, expect="> 0 in every layer")
    ev.record("max |Δ keys| per layer, other decoder input", key_change_tgt, expect="0: keys see no decoder state")
    ev.record("max |Δ queries| per layer, other decoder input", query_change_tgt, expect="> 0 in every layer")
    assert same_object and same_storage and not query_is_memory
    assert len({t.data_ptr() for t in base["query input"]}) == len(model.decoder.layers)
    assert min(key_change_src) > 0.1 and max(key_change_tgt) == 0.0 and min(query_change_tgt) > 0.1

    # a 32-wide encoder output fed to a 64-wide decoder
    narrow = EncoderDecoder(small_config(d_model=32)).eval()
    wide = EncoderDecoder(small_config(d_model=64)).eval()
    with torch.no_grad():
        memory32 = narrow.encode(src)
        with pytest.raises(ConfigError) as checked:
            wide.decode(shift_right(y), memory32)
        with pytest.raises(RuntimeError) as unchecked:
            wide.decoder.layers[0].cross_attn.w_k(memory32)  # what the check stands in front of
        adapter = nn.Linear(32, 64)  # a learned map from the encoder's width: the same as W_K, W_V of shape (64, 32)
        bridged = wide.decode(shift_right(y), adapter(memory32))
    ev.record("d_model 32 encoder → 64 decoder: the module says", f"ConfigError: {checked.value}", key=False)
    ev.record("the same without the check: W_K says", f"RuntimeError: {unchecked.value}", key=False)
    ev.record("with a Linear(32, 64) on the encoder output: logits shape", list(bridged.shape),
              expect="runs: equal widths are a choice", key=False)
    assert "d_model=64" in str(checked.value) and "cannot be multiplied" in str(unchecked.value)
    assert bridged.shape == (2, 7, V)
# --8<-- [end:test_cross]

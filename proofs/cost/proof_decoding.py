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

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from proofs.tasks import copy_task
from proofs.train import fixed_batches, train
from proofs.transformer import ConfigError, DecoderLM, EncoderDecoder, TransformerConfig

BOS = 0  # token 0 never occurs in copy_task's sequences (tokens 1..V-1): it serves as begin-of-sequence
V = 16  # vocabulary of the small models
N_TOKENS = [8, 16, 32, 64, 128]  # generation lengths of the cost measurement


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
    torch.manual_seed(seed)
    switches = {"attn_impl": "explicit", **switches}  # explicit path: every matrix product is counted
    return DecoderLM(small_config(d_model=64, d_ff=256, vocab_size=32, **switches)).eval()


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
    for cached in (True, False):
        print("cache" if cached else "no cache", sum(flops_per_step(m, torch.ones(1, 1, dtype=torch.long), 32, cached)))


# %% [markdown]
# ## Tests: each asserts what the switch (or the claim) changes

# %%
import pytest  # noqa: E402


# --8<-- [start:test_calls]
@pytest.mark.claim("C-DEC-1", "confirmed")
def test_encoder_runs_once_decoder_once_per_token(ev, seed):
    """generate() encodes the source once and runs the decoder once per token; calling forward() per step re-encodes."""
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
    """One pass over the right-shifted gold target gives, position by position, the logits of step-by-step decoding."""
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
    """Trained without the shift, position t reads its own answer: perfect training loss, failed generation."""
    seeds = [seed, seed + 1, seed + 2]
    shifted = [train_copy(s, shift=True) for s in seeds]
    unshifted = [train_copy(s, shift=False) for s in seeds]
    for name, expect_s, expect_u in (("train loss", "falls", "≈ 0: it copies its input"),
                                     ("teacher-forced accuracy", "high", "≈ 1: the answer is in the input"),
                                     ("generation accuracy", "high", "near chance (1/9)")):
        ev.record(f"{name}, shifted (3 seeds)", [r[name] for r in shifted], expect=expect_s)
        ev.record(f"{name}, unshifted (3 seeds)", [r[name] for r in unshifted], expect=expect_u)
    assert max(r["train loss"] for r in unshifted) < 0.01 < min(r["train loss"] for r in shifted)
    assert min(r["teacher-forced accuracy"] for r in unshifted) > 0.99
    assert max(r["generation accuracy"] for r in unshifted) < 0.25
    assert min(r["generation accuracy"] for r in shifted) > 0.8
# --8<-- [end:test_shift]


@pytest.mark.claim("C-DEC-2", "confirmed")
def test_cached_generation_equals_uncached(ev, seed):
    """With and without the cache, greedy decoding picks the same tokens from logits equal to 1e-5 (not bit for bit)."""
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
def test_cache_turns_quadratic_work_linear(ev, seed):
    """Per token, the cache costs a constant plus 4·t·d per layer; recomputing costs ∝ t (plus t²): totals linear vs quadratic."""
    n = N_TOKENS[-1]
    model, prompt = cost_model(seed), torch.ones(1, 1, dtype=torch.long)
    cfg = model.cfg
    steps = {c: flops_per_step(model, prompt, n, c) for c in (True, False)}
    for c in (True, False):  # every step, exactly the formula: step t has a prefix of t tokens
        assert steps[c] == [step_formula(t, cfg, c) for t in range(1, n + 1)]
    total = {c: [sum(steps[c][:k]) for k in N_TOKENS] for c in (True, False)}
    _plot_flops(ev, steps, total)
    for k, with_c, without in zip(N_TOKENS, total[True], total[False]):
        ev.record(f"total FLOPs for {k} tokens: cache / no cache", [with_c, without], key=k in (8, 128))
    growth = {c: total[c][-1] / total[c][-2] for c in (True, False)}
    ev.record("total FLOPs ×, n = 64 → 128, cache", growth[True], expect="≈ 2: linear, plus the 4·t·d term")
    ev.record("total FLOPs ×, n = 64 → 128, no cache", growth[False], expect="≥ 4: quadratic, plus t²")
    ev.record("FLOPs saved at n = 128 (no cache / cache)", total[False][-1] / total[True][-1])
    ev.record("FLOPs of token 128 (no cache / cache)", steps[False][-1] / steps[True][-1])
    assert growth[True] < 2.5 and growth[False] > 4.0
    # the cache's size: keys and values of every layer and every position so far
    cache = model.decoder.new_cache()
    with torch.no_grad():
        for t in range(n):
            model.decoder(model.embed(prompt, t), cache=cache)
    held = sum(e.numel() for c in cache for e in c["self"].entries)
    ev.record(f"floats in the cache after {n} tokens (2·L·n·d = {2 * cfg.n_layers * n * cfg.d_model})", held)
    assert held == 2 * cfg.n_layers * n * cfg.d_model
    fast = cost_model(seed, attn_impl="auto")  # the default path, for the clock
    for c, label in ((True, "cache"), (False, "no cache")):
        ev.record(f"wall time, {n} tokens, batch 1, {label} (s)", wall_seconds(fast, n, c),
                  expect="recorded, not asserted", key=False)
# --8<-- [end:test_flops]


def _plot_flops(ev, steps, total):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    t = range(1, len(steps[True]) + 1)
    for c, style, label in ((False, "s-", "no cache: rerun the prefix"), (True, "o-", "key/value cache")):
        axes[0].plot(t, steps[c], style, markersize=2, label=label)
        axes[1].loglog(N_TOKENS, total[c], style, label=label)
    axes[0].set(title="FLOPs of generation step t", xlabel="t (tokens in the prefix)", yscale="log")
    axes[1].set(title="total FLOPs to generate n tokens", xlabel="n")
    axes[0].legend()
    fig.tight_layout()
    ev.figure(fig, "flops", "FlopCounterMode counts of each greedy step and of whole generations, DecoderLM with "
                            "2 layers, d_model=64, d_ff=256, V=32, explicit attention path.")


# --8<-- [start:test_cross]
@pytest.mark.claim("C-XATT-1", "confirmed")
def test_cross_attention_reads_the_encoder_output_in_every_layer(ev, seed):
    """Queries come from the decoder stream, keys/values from the one encoder output that every layer reads."""
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

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Sliding-window attention, rolling caches and attention sinks
#
# Proofs for `docs/inference/sliding-window.md`. Everything runs on the shared model
# (`proofs/transformer/`). The switches: `cfg.window` (a causal query sees itself and the window − 1
# keys before it; 0 = every earlier key), `cfg.attn_sinks` (the first positions stay visible to every
# query), the cache kind (`KVCache`, or `RollingKVCache` keeping the last `window` positions plus the
# sinks), and, for the sink experiment, whether every training text starts with the same token (BOS).
# Masks are built from positions (attention.py, `hidden`). Run: `pytest proofs/inference/proof_sliding_window.py`.

# %%
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from proofs.train import train
from proofs.transformer import DecoderLM, TransformerConfig, record_attention

V = 16  # vocabulary; token 0 is BOS in the sink experiment and never occurs in the text itself


def config(**switches) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=256, dropout_emb=0.0,
                dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})


def built(seed: int, **switches) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(config(**switches)).eval()


def same_weights(model: DecoderLM, **switches) -> DecoderLM:
    """The same weights under other attention switches (window, sinks): a one-switch ablation at inference."""
    other = DecoderLM(model.cfg.replace(**switches)).eval()
    other.load_state_dict(model.state_dict())
    return other


# %% [markdown]
# ## 1. How far back does a stack of windows reach?
#
# Change one token j and see which outputs move, as on the masks page. With a window of w (a query
# sees w keys: itself and w − 1 before it) one layer lets token j reach positions j … j + w − 1; each
# further layer adds w − 1. Depths 1 to 4, window 4; and without a window for contrast.

# %%
# --8<-- [start:reach]
@torch.no_grad()
def moved_positions(model: DecoderLM, seed: int, j: int, T: int = 28) -> torch.Tensor:
    """(T,) the largest change of each position's logits when token j is replaced (4 random sequences)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (4, T), generator=g)
    other = ids.clone()
    other[:, j] = ids[:, j] % (V - 1) + 1  # another real token
    return (model(other) - model(ids)).abs().amax(dim=(0, 2))


def reach_table(seed: int, window: int = 4, depths=(1, 2, 3, 4), j: int = 4) -> dict:
    out = {}
    for w in (window, 0):
        for L in depths:
            d = moved_positions(built(seed, n_layers=L, window=w), seed, j)
            moved = (d > 0).nonzero()[:, 0]
            out[(w, L)] = {"delta": d, "first": int(moved.min()), "last": int(moved.max())}
    return out
# --8<-- [end:reach]


# %% [markdown]
# ## 2. A rolling buffer of w entries is enough
#
# Decode 40 tokens with a window of 6 (and once with 2 sinks): the whole sequence in one pass (the
# window mask does everything), the contiguous cache (every key kept, the mask hides the old ones), and
# the rolling cache (old keys dropped). Bytes of the cached tensors are read off the caches after each
# step. The off arm: the same rolling cache under a model whose attention has no window: the cache then
# changes what the model computes.

# %%
# --8<-- [start:rolling]
@torch.no_grad()
def decode(model: DecoderLM, ids: torch.Tensor, cache, prompt: int = 4) -> tuple[torch.Tensor, list[int]]:
    """Logits of ids (B, T): the prompt in one call, then one token per call; cache bytes after each call."""
    outs, sizes = [model(ids[:, :prompt], cache=cache)], []
    sizes.append(sum(layer["self"].nbytes for layer in cache))
    for t in range(prompt, ids.shape[1]):
        outs.append(model(ids[:, t:t + 1], cache=cache))
        sizes.append(sum(layer["self"].nbytes for layer in cache))
    return torch.cat(outs, 1), sizes


def rolling_vs_full(seed: int, window: int = 6, sinks: int = 0, T: int = 40) -> dict:
    model = built(seed, window=window, attn_sinks=sinks)
    ids = torch.randint(1, V, (2, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = model(ids)  # no cache: the window mask alone
    contiguous, bytes_contiguous = decode(model, ids, model.decoder.new_cache())
    rolling, bytes_rolling = decode(model, ids, model.decoder.new_cache("rolling"))
    unwindowed = same_weights(model, window=0, attn_sinks=0)  # off arm: no window in the attention
    with torch.no_grad():
        full_unwindowed = unwindowed(ids)
    rolled, _ = decode(unwindowed, ids, unwindowed.decoder.new_cache("rolling", window=window, sinks=sinks))
    cfg = model.cfg
    per_entry = 2 * cfg.n_layers * ids.shape[0] * cfg.kv_heads * cfg.d_head * 4  # K and V, fp32
    return {"rolling": (rolling - full).abs().max().item(), "contiguous": (contiguous - full).abs().max().item(),
            "off": (rolled - full_unwindowed).abs().max().item(), "bytes_rolling": bytes_rolling,
            "bytes_contiguous": bytes_contiguous, "per_entry": per_entry, "T": T}
# --8<-- [end:rolling]


# %% [markdown]
# ## 3. Attention sinks in a small trained LM
#
# A 2-layer LM (the shared defaults: Post-LN, sinusoidal positions) is trained for 150 Adam steps on
# text from a random Markov chain over tokens 1–15, 32 tokens per sequence. In one arm every sequence
# starts with the same token, BOS = 0 (as LLM training documents do); in the other the first token is
# an ordinary random one. Measured on fresh text:
#
# - the share of attention that queries at positions ≥ 8 put on position 0 (all layers and heads),
#   against 1/(i + 1), the share a uniform row would give it, and against the same model at init;
# - the loss at positions 8–31 with full attention, and with a window of 8 (position 0 drops out of
#   every window there), with and without keeping the first 1 or 4 positions (`attn_sinks`): the window
#   mask computes exactly what the rolling cache would (section 2), in one pass;
# - the same losses 4× past the training length (positions 32–127), where our cache, unlike
#   StreamingLLM, keeps each token's original position.

# %%
# --8<-- [start:sinks]
BOS, T_TRAIN, W = 0, 32, 8


def chain(seed: int, scale: float = 2.0) -> torch.Tensor:
    """(V, V) next-token probabilities over the text tokens 1..V-1 (row 0 unused)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    P = torch.softmax(scale * torch.randn(V, V, generator=g), dim=-1)
    P[:, BOS] = 0.0
    return P / P.sum(-1, keepdim=True)


def text(P: torch.Tensor, g: torch.Generator, rows: int, length: int, bos: bool) -> torch.Tensor:
    """(rows, length) chain text; with bos, the same text shifted right behind a BOS token."""
    x = torch.zeros(rows, length, dtype=torch.long)
    x[:, 0] = torch.randint(1, V, (rows,), generator=g)
    for t in range(1, length):
        x[:, t] = torch.multinomial(P[x[:, t - 1]], 1, generator=g)[:, 0]
    return torch.cat([torch.full((rows, 1), BOS), x[:, :-1]], 1) if bos else x


@functools.cache
def trained(seed: int, bos: bool, steps: int = 150, batch: int = 16) -> tuple[DecoderLM, torch.Tensor]:
    P, g = chain(seed), torch.Generator().manual_seed(seed)
    data = text(P, g, steps * batch, T_TRAIN + 1, bos).view(steps, batch, T_TRAIN + 1)
    model = built(seed)
    train(model, lambda s: (data[s][:, :-1], data[s][:, 1:]), steps, lr=3e-3)
    return model, text(P, g, 128, 4 * T_TRAIN + 1, bos)  # held-out text, 4x the training length


@torch.no_grad()
def share_on_first(model: DecoderLM, ids: torch.Tensor) -> dict:
    """Mean attention weight on key 0 of queries i >= W, per layer, and what uniform rows would give it."""
    with record_attention(model) as mods:
        model(ids)
    per_layer = [m.weights[:, :, W:, 0].mean().item() for m in mods]  # weights (B, nh, T, T)
    uniform = (1.0 / torch.arange(W + 1, ids.shape[1] + 1).double()).mean().item()
    return {"per_layer": per_layer, "mean": sum(per_layer) / len(per_layer), "uniform": uniform}


@torch.no_grad()
def losses(model: DecoderLM, held: torch.Tensor) -> dict:
    """Mean next-token loss at positions W..T_TRAIN-1 and past the training length, per attention setting."""
    x, y = held[:, :-1], held[:, 1:]
    out = {}
    for name, sw in (("full", {}), ("window", dict(window=W)), ("window + 1 sink", dict(window=W, attn_sinks=1)),
                     ("window + 4 sinks", dict(window=W, attn_sinks=4))):
        per_pos = F.cross_entropy(same_weights(model, **sw)(x).transpose(1, 2), y, reduction="none").mean(0)
        out[name] = (per_pos[W:T_TRAIN].mean().item(), per_pos[T_TRAIN:].mean().item())
    return out


@functools.cache
def sink_measurements(seed: int, bos: bool) -> dict:
    model, held = trained(seed, bos)
    return {"trained": share_on_first(model, held[:, :T_TRAIN]),
            "init": share_on_first(built(seed), held[:, :T_TRAIN]),  # the same initial weights, untrained
            "loss": losses(model, held)}
# --8<-- [end:sinks]


# %%
if __name__ == "__main__":
    r = reach_table(0)
    print({k: (v["first"], v["last"]) for k, v in r.items()})
    print({k: v for k, v in rolling_vs_full(0).items() if not k.startswith("bytes")})
    for bos in (True, False):
        m = sink_measurements(0, bos)
        print(bos, m["trained"], m["init"]["mean"], m["loss"])


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


def _plot_reach(ev, r: dict, window: int, depths, j: int):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8), sharey=True, constrained_layout=True)
    for ax, w in zip(axes, (window, 0)):
        m = torch.stack([r[(w, L)]["delta"] for L in depths]).clamp_min(1e-12).log10()
        im = ax.imshow(m.numpy(), aspect="auto", cmap="magma", vmin=-8, vmax=1)
        ax.set(title=f"window {w}" if w else "no window", xlabel="output position i",
               yticks=range(len(depths)), yticklabels=[f"{L} layer{'s' * (L > 1)}" for L in depths])
        ax.axvline(j, color="cyan", lw=0.8)
    fig.colorbar(im, ax=list(axes), shrink=0.9, label="log10 max |Δ logits| (−12 = unchanged)")
    ev.figure(fig, "reach", f"Which outputs move when token {j} (cyan line) is replaced: window {window} against no "
              "window, 1 to 4 layers.")


# --8<-- [start:test_reach]
@pytest.mark.claim("C-SWA-1", "confirmed")
def test_each_windowed_layer_reaches_w_minus_1_further_back(ev, seed):
    """Exact, a count of our module: with window w a change of token j moves exactly the outputs j … j + L(w − 1) of an
    L-layer stack (every other output is bit-identical); without a window it moves every later output at any depth.
    Would be refuted by any output moving outside that span, or one inside it not moving."""
    window, depths, j, T = 4, (1, 2, 3, 4), 4, 28
    r = reach_table(seed, window, depths, j)
    for L in depths:
        x, full = r[(window, L)], r[(0, L)]
        ev.record(f"reach (last moved − j), window {window}, {L} layer(s)", x["last"] - j, expect=f"L(w−1) = {L * (window - 1)}")
        assert x["first"] == j and x["last"] == j + L * (window - 1)
        inside = x["delta"][j:x["last"] + 1]
        assert bool((inside > 0).all())  # every output in the span moves; outside it, exactly 0 (above)
        ev.record(f"reach without a window, {L} layer(s)", full["last"] - j, expect=f"to the end: {T - 1 - j}", key=False)
        assert full["last"] == T - 1 and full["first"] == j
    sink = moved_positions(built(seed, n_layers=1, window=window, attn_sinks=1), seed, j=0)
    ev.record(f"outputs moved by token 0 with 1 sink, window {window}, 1 layer", int((sink > 0).sum()),
              expect=f"all {T}: a sink is seen by every query")
    assert bool((sink > 0).all())
    _plot_reach(ev, r, window, depths, j)
# --8<-- [end:test_reach]


def _plot_bytes(ev, r: dict, window: int):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3), constrained_layout=True)
    steps = range(4, 4 + len(r["bytes_contiguous"]))
    ax.plot(steps, [b / 1024 for b in r["bytes_contiguous"]], label="contiguous KVCache")
    ax.plot(steps, [b / 1024 for b in r["bytes_rolling"]], label=f"RollingKVCache (window {window})")
    ax.set(xlabel="tokens seen", ylabel="cached K/V (KiB)")
    ax.legend(fontsize=8)
    ev.figure(fig, "bytes", "Bytes held by the self-attention caches of both layers while decoding 40 tokens.")


# --8<-- [start:test_rolling]
@pytest.mark.claim("C-SWA-1", "confirmed")
def test_a_rolling_cache_of_w_entries_gives_the_full_caches_outputs(ev, seed):
    """Exact up to float rounding (an identity of our module): decoding with a rolling cache of the last w positions
    (plus sinks) gives the logits of the full pass with the window mask, while its bytes stop growing at w entries.
    Would be refuted by a difference beyond rounding. Off arm: without the window mask the same cache changes the
    outputs."""
    for sinks in (0, 2):
        r = rolling_vs_full(seed, window=6, sinks=sinks)
        tag = f"window 6, {sinks} sinks"
        ev.record(f"max |Δ logits| rolling cache vs full pass, {tag}", r["rolling"], expect="float rounding")
        ev.record(f"max |Δ logits| contiguous cache vs full pass, {tag}", r["contiguous"], expect="float rounding",
                  key=False)
        ev.record(f"cache bytes after 40 tokens, rolling / contiguous, {tag}",
                  f"{r['bytes_rolling'][-1]} / {r['bytes_contiguous'][-1]}",
                  expect=f"(6 + {sinks}) and 40 entries × {r['per_entry']} B")
        ev.record(f"max |Δ logits| rolling cache vs full pass, model WITHOUT the window mask, {tag}", r["off"],
                  expect="large: the cache dropped keys the model reads")
        assert r["rolling"] < 1e-4 and r["contiguous"] < 1e-4 and r["off"] > 1e-2
        assert r["bytes_rolling"][-1] == (6 + sinks) * r["per_entry"] and max(r["bytes_rolling"]) == r["bytes_rolling"][-1]
        assert r["bytes_contiguous"][-1] == r["T"] * r["per_entry"]
        if sinks == 0:
            _plot_bytes(ev, r, 6)
# --8<-- [end:test_rolling]


# --8<-- [start:test_sink_share]
@pytest.mark.claim("C-SINK-1", "nuanced")
def test_a_trained_lm_parks_attention_on_its_first_token(ev, seed):
    """When every training text starts with BOS, the trained toy LM puts more attention on position 0 than the same
    model trained on the same chain without a fixed first token, which stays near or below the uniform share: the
    sink comes from the fixed first token. Would be refuted by the BOS-trained share not exceeding the other arm's,
    or by the arm without BOS putting clearly more than uniform weight (30 %) on position 0. How large the sink is
    varies from model to model (the seed report gives the spread of the share / uniform ratio): hence "nuanced"."""
    m, without = sink_measurements(seed, bos=True), sink_measurements(seed, bos=False)
    tr, init, no = m["trained"], m["init"], without["trained"]
    ev.record("mean attention on position 0, queries 8..31, trained with BOS", tr["mean"])
    ev.record("same, per layer", tr["per_layer"], key=False)
    ev.record("uniform share 1/(i+1), averaged over the same queries", tr["uniform"])
    ev.record("share / uniform, trained with BOS", tr["mean"] / tr["uniform"], expect="above 1 in most models")
    ev.record("share / uniform, same weights at init", init["mean"] / init["uniform"], expect="about 1")
    ev.record("share / uniform, trained WITHOUT a fixed first token", no["mean"] / no["uniform"], expect="≤ 1")
    ev.record("log(share with BOS / share without)", math.log(tr["mean"] / no["mean"]), expect="> 0")
    # Over seeds 100-139 (one process, 40 models per arm): share / uniform with BOS 2.35 ± 0.57 (min 0.97: a sink
    # does not form in every model, so that is recorded, not asserted); without BOS 0.83 ± 0.063 (max 0.99), so
    # the bound 1.1 was 4.3 sd above the mean, yet one of 20 random seeds (rng 2027) reached 1.11: the bound is 1.3
    # (7.5 sd; BOS-trained 2.35 on average); log(share with BOS / without) 1.01 ± 0.25, so > 0 holds at 4 sd.
    assert no["mean"] < 1.3 * no["uniform"]
    assert tr["mean"] > no["mean"]
# --8<-- [end:test_sink_share]


def _plot_losses(ev, with_bos: dict, without: dict):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3), constrained_layout=True)
    names = list(with_bos)
    x = torch.arange(len(names)).float()
    for off, (label, d) in zip((-0.2, 0.2), (("texts start with BOS", with_bos), ("no fixed first token", without))):
        ax.bar(x + off, [d[n][0] - d["full"][0] for n in names], width=0.4, label=label)
    ax.set(xticks=x, xticklabels=names, ylabel="loss − full attention (nats)")
    ax.axhline(0, color="grey", lw=0.8)
    ax.legend(fontsize=8)
    ev.figure(fig, "losses", f"Loss at positions {W}..{T_TRAIN - 1} under a window of {W}, with and without keeping "
              "the first positions, minus the loss with full attention.")


# --8<-- [start:test_sink_window]
@pytest.mark.claim("C-SINK-1", "nuanced")
def test_evicting_the_first_token_costs_loss_and_sinks_take_it_back(ev, seed):
    """With a window of 8, evicting position 0 raises the loss of the BOS-trained LM, and keeping the first 4 positions
    as sinks (StreamingLLM's choice) takes back most of that rise. Would be refuted by no loss from evicting BOS, or by
    sinks that recover less than 40 % of it, pooled over two BOS-trained models (this seed's and the next: one
    model's ratio of two small losses is too skewed to bound alone). The model trained without a fixed first token is
    recorded beside it: its eviction cost is about five times smaller on average, but not on every seed, so that
    comparison is not asserted."""
    with_bos = sink_measurements(seed, bos=True)
    without = sink_measurements(seed, bos=False)
    lb, ln = with_bos["loss"], without["loss"]
    for name in lb:
        ev.record(f"loss at positions 8..31, {name}, BOS-trained", lb[name][0], key=name != "window + 4 sinks")
    cost, kept = lb["window"][0] - lb["full"][0], lb["window + 1 sink"][0] - lb["full"][0]
    ev.record("loss increase from evicting BOS (window 8, no sink)", cost, expect="> 0")
    ev.record("loss increase with BOS kept as 1 sink", kept, expect="≈ 0")
    ev.record("share / uniform on position 0, trained WITHOUT a fixed first token",
              without["trained"]["mean"] / without["trained"]["uniform"], expect="no sink: about 1 or below")
    cost_no = ln["window"][0] - ln["full"][0]
    ev.record("loss increase from evicting the first token, no fixed first token", cost_no)
    ev.record("eviction cost with BOS minus without", cost - cost_no, expect="> 0: the cost comes with the sink")
    for name in lb:
        ev.record(f"loss past the training length (positions 32..127), {name}, BOS-trained", lb[name][1], key=False)
    _plot_losses(ev, lb, ln)
    kept4 = lb["window + 4 sinks"][0] - lb["full"][0]
    ev.record("loss increase with 4 sinks kept, as a fraction of the eviction cost", kept4 / cost,
              expect="small; asserted pooled over two models")
    second = sink_measurements(seed + 1, bos=True)["loss"]  # the next seed's BOS-trained model
    cost2, kept4_2 = (second[n][0] - second["full"][0] for n in ("window", "window + 4 sinks"))
    pooled = (kept4 + kept4_2) / (cost + cost2)
    ev.record("loss increase with 4 sinks kept / eviction cost, pooled over two BOS-trained models (seed, seed + 1)",
              pooled, expect="< 0.6")
    # One model, seeds 100-139 (40 models): cost 0.039 ± 0.023 (min 0.007); kept4 / cost 0.10 ± 0.12 (max 0.57),
    # skewed: a small cost makes the ratio jump, so one model's ratio came within 0.03 of the bound 0.6. Pooled over
    # two models (seed, seed + 1), seeds 100-139: 0.086 ± 0.064, min −0.013, max 0.22, so 0.6 is 8 sd above the
    # mean and 0.38 above the largest seen. One sink alone (kept / cost 0.19 ± 0.20, max 1.17)
    # and the cost without BOS (0.0070 ± 0.0036) vary too much per model to assert: they are recorded.
    # Cost with BOS minus without: 0.032 ± 0.022, min −0.0013 (one seed of 40 below 0), so no per-seed "only if".
    assert cost > 0 and cost2 > 0 and pooled < 0.6
# --8<-- [end:test_sink_window]

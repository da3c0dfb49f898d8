# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How does a mixture of experts work, and what does it cost?
#
# Proofs for `docs/blocks/mixture-of-experts.md`. The shared model's switch is `cfg.moe_experts = E > 0`:
# every FFN becomes `MoEFeedForward`, a linear router and E FFNs of width `d_ff`; each token runs its top
# `moe_top_k = k` experts. `moe_capacity` caps the tokens an expert takes (Switch Transformer's capacity
# factor); after each call the module keeps `stats` (routing, tokens taken and dropped) and `aux_loss`, the
# Switch load-balancing loss E·Σ_e f_e·P_e.
# Run: `pytest proofs/blocks/proof_moe.py`.

# %%
from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import FlopCounterMode

from proofs.block_lm import D, block_cfg, lm_run, markov2_task
from proofs.transformer import DecoderLM, FeedForward, MoEFeedForward, TransformerConfig
from proofs.transformer.presets import llama_config


# %% [markdown]
# ## 1. One expert is the dense FFN
#
# With E = 1 and k = 1 the router's softmax over one expert is exactly 1, so the layer is its one expert.
# Copy a dense FFN's weights into it (and a dense model's into an MoE model) and compare outputs.

# %%
# --8<-- [start:dense]
@torch.no_grad()
def one_expert_gap(seed: int) -> dict:
    torch.manual_seed(seed)
    dense_lm = DecoderLM(block_cfg()).eval()
    moe_lm = DecoderLM(block_cfg(moe_experts=1, moe_top_k=1)).eval()
    state = {k.replace(".ffn.", ".ffn.experts.0."): v for k, v in dense_lm.state_dict().items()}
    missing, unexpected = moe_lm.load_state_dict(state, strict=False)  # only the router is not in the dense model
    ids = torch.randint(1, 16, (4, 16), generator=torch.Generator().manual_seed(seed))
    x = torch.randn(64, D)
    layer = moe_lm.decoder.layers[0]
    return {"ffn": (layer.ffn(x) - dense_lm.decoder.layers[0].ffn(x)).abs().max().item(),
            "model": (moe_lm(ids) - dense_lm(ids)).abs().max().item(),
            "not_copied": sorted(missing), "unexpected": list(unexpected)}
# --8<-- [end:dense]


# %% [markdown]
# ## 2. Parameters E times, compute k times
#
# `FlopCounterMode` counts the matrix products of one MoE layer on N tokens with no capacity limit: each
# token passes through k experts, so the experts cost k times one dense FFN, plus the router's N·d·E
# multiply-adds; the parameters are E FFNs plus the router.

# %%
# --8<-- [start:flops]
def moe_costs(E: int = 8, k: int = 2, tokens: int = 256, d_ff: int = 4 * D) -> dict:
    cfg = block_cfg(moe_experts=E, moe_top_k=k, d_ff=d_ff)
    torch.manual_seed(0)
    moe, dense = MoEFeedForward(cfg), FeedForward(cfg)
    x = torch.randn(tokens, D)
    out = {}
    for name, module in (("moe", moe), ("dense", dense)):
        with torch.no_grad(), FlopCounterMode(display=False) as flops:
            module(x)
        out[name] = {"params": sum(p.numel() for p in module.parameters()), "flops": flops.get_total_flops()}
    out["router_flops"] = 2 * tokens * D * E
    return out
# --8<-- [end:flops]


# %% [markdown]
# ## 3. Mixtral 8×7B, counted
#
# Mixtral's published configuration (Jiang et al. 2024, Table 1): d = 4096, 32 layers, 32 query heads and
# 8 key/value heads of 128 channels, SwiGLU experts of width 14336, 8 experts, top-2, vocabulary 32000,
# untied head, RMSNorm, no biases. Counted twice: by arithmetic, and by building that configuration of the
# shared model on the `meta` device (shapes without memory) and summing `numel`. "Active" parameters are
# those a token uses: everything but the E − k experts it skips.

# %%
# --8<-- [start:mixtral]
MIXTRAL = dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, moe_experts=8,
               moe_top_k=2)


def mixtral_arithmetic(d=4096, L=32, heads=32, kv=8, ff=14336, E=8, k=2, V=32000) -> dict:
    hs = d // heads
    attn = d * heads * hs + 2 * d * kv * hs + heads * hs * d  # W_Q, W_K, W_V (GQA), W_O
    expert = 3 * d * ff  # SwiGLU: W1, V, W2
    per_layer_shared = attn + d * E + 2 * d  # + router + two RMSNorm gains
    shared = L * per_layer_shared + 2 * V * d + d  # + embedding, untied head, final norm
    return {"total": shared + L * E * expert, "active": shared + L * k * expert, "expert": expert,
            "dense_equivalent": shared - L * d * E + L * expert}  # the same model with one FFN (Mistral 7B)


def meta_counts(cfg: TransformerConfig) -> dict:
    with torch.device("meta"):
        model = DecoderLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    E, k = cfg.moe_experts, cfg.moe_top_k
    return {"total": total, "active": total - experts * (E - k) // E if E else total}
# --8<-- [end:mixtral]


# %% [markdown]
# ## 4. Router collapse and the Switch balancing loss
#
# The section's toy LM with its FFN replaced by 8 experts of width 48 (= d), top-1 (Switch), trained as
# the other arms (80 Adam steps, lr 5e-3), once without and once with the Switch loss added at Switch's
# weight α = 0.01, and with ten times that weight. One layer instead of two: the expert loop makes a step
# about twice as slow, and one layer lets each arm run on five seeds within the time budget. No capacity
# limit while training. On 4096
# held-out tokens we read the load f_e (share of tokens routed to expert e) and its normalised entropy
# H(f)/ln E (1 = even, 0 = one expert), at initialisation and after training; then we switch the capacity
# on (factors 1, 1.25, 2) and count the dropped tokens.

# %%
# --8<-- [start:collapse]
E_TOY, ALPHA, CAPACITIES = 8, 0.01, (1.0, 1.25, 2.0)  # ALPHA: Switch Transformer's weight
MOE_TOY = dict(moe_experts=E_TOY, moe_top_k=1, d_ff=D, n_layers=1)


def moe_run(seed: int, alpha: float) -> dict:
    """The trained toy MoE LM (cached): alpha · (Switch loss) added to the training loss (alpha = 0: none)."""
    return lm_run(seed, aux_weight=alpha, **MOE_TOY)


@torch.no_grad()
def load(model: DecoderLM, seed: int, capacity: float = 0.0) -> list[dict]:
    """Per layer: load f, normalised entropy, largest share, aux loss and the share of assignments dropped."""
    ids, _ = markov2_task(torch.Generator().manual_seed(20_000 + seed), 256, 16)
    moes = [layer.ffn for layer in model.decoder.layers]
    for m in moes:
        m.capacity_factor = capacity
    model.eval()(ids)
    out = []
    for m in moes:
        f = torch.bincount(m.stats["experts"].flatten(), minlength=m.n_experts).float()
        f = f / f.sum()
        entropy = -(f * f.clamp_min(1e-12).log()).sum().item() / math.log(m.n_experts)
        out.append({"f": f.tolist(), "entropy": entropy, "max_share": f.max().item(), "aux": m.aux_loss.item(),
                    "dropped": m.stats["dropped"] / m.stats["experts"].numel()})
        m.capacity_factor = 0.0
    return out


def at_init(seed: int) -> list[dict]:
    torch.manual_seed(seed)
    return load(DecoderLM(block_cfg(**MOE_TOY)), seed)
# --8<-- [end:collapse]


@torch.no_grad()
def capacity_by_hand(seed: int, k: int = 2, c: float = 0.75, E: int = 4, tokens: int = 64) -> dict:
    """A top-k MoE layer (float64) against a token-by-token loop: each (token, slot) assignment in token order goes to
    its expert while that expert has room under ⌈c·N·k/E⌉, with its renormalised gate; later ones are dropped."""
    torch.manual_seed(seed)
    moe = MoEFeedForward(block_cfg(moe_experts=E, moe_top_k=k, moe_capacity=c, d_ff=D)).double()
    x = torch.randn(tokens, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    y = moe(x)
    capacity = math.ceil(c * tokens * k / E)
    p = torch.softmax(x @ moe.router.weight.T, -1)
    top_p, top_e = p.topk(k, -1)
    gates = top_p / top_p.sum(-1, keepdim=True)
    taken, out = [0] * E, torch.zeros_like(x)
    for t in range(tokens):  # first come, first served
        for slot in range(k):
            e = int(top_e[t, slot])
            if taken[e] < capacity:
                taken[e] += 1
                out[t] += gates[t, slot] * moe.experts[e](x[t:t + 1])[0]
    return {"capacity": moe.stats["capacity"], "capacity by hand": capacity, "taken": moe.stats["taken"].tolist(),
            "taken by hand": taken, "dropped": moe.stats["dropped"], "dropped by hand": tokens * k - sum(taken),
            "output vs loop": (y - out).abs().max().item(), "output scale": out.abs().max().item()}


# %% [markdown]
# ## 5. The balancing loss's bounds, exactly
#
# E·Σ f_e·P_e with f_e the share of tokens sent to e (a count: no gradient) and P_e the mean router
# probability of e (the gradient flows through it). Σ_e f_e·P_e ≤ max_e P_e ≤ 1, so the loss never
# exceeds E, and reaches E only when every token goes to one expert with probability 1. If either f or P is
# uniform the loss is exactly 1. A confident router has P ≈ f and the loss ≈ E·Σ f², which by
# Cauchy–Schwarz is ≥ 1 with equality at an even load. But the loss can dip below 1 when f and P disagree.
# Routers with chosen logits: the module's `aux_loss` next to the formula computed by hand.

# %%
# --8<-- [start:bounds]
@torch.no_grad()
def aux_for_logits(logits: torch.Tensor) -> tuple[float, float]:
    """(module's aux_loss, hand formula) for a top-1 router whose logits for N tokens are `logits` (N, E)."""
    N, E = logits.shape
    moe = MoEFeedForward(TransformerConfig(d_model=E, n_heads=1, d_ff=4, moe_experts=E, moe_top_k=1))
    moe.router.weight.copy_(torch.eye(E))  # router(x) = x: the token vectors are the logits
    moe(logits)
    p = torch.softmax(logits, -1)
    f = torch.bincount(p.argmax(-1), minlength=E).float() / N
    return moe.aux_loss.item(), E * (f * p.mean(0)).sum().item()


def bound_cases(E: int = 8) -> dict:
    confident = 30.0 * torch.eye(E)  # logits: token i is sure of expert i
    cases = {
        "even_confident": confident.repeat(4, 1),  # each expert gets 1/E of the tokens, probability ≈ 1
        "collapsed_confident": confident[[0]].repeat(32, 1),  # every token to expert 0, probability ≈ 1
        "uniform_router": torch.zeros(32, E),  # P uniform (ties: all tokens go to one expert)
        "below_one": torch.tensor([[0.04, 0.0], [0.04, 0.0], [0.0, 30.0]]),  # f = (2/3, 1/3), P ≈ (0.34, 0.66)
    }
    return {name: aux_for_logits(lg) for name, lg in cases.items()}
# --8<-- [end:bounds]


# %%
if __name__ == "__main__":
    print(one_expert_gap(0), moe_costs())
    print(mixtral_arithmetic(), meta_counts(llama_config(**MIXTRAL)))
    print(bound_cases())
    for alpha in (0.0, ALPHA, 10 * ALPHA):
        print(alpha, [round(layer["entropy"], 2) for layer in load(moe_run(0, alpha)["model"], 0)])


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_dense]
@pytest.mark.claim("C-MOE-1", "confirmed")
def test_one_expert_top_1_is_the_dense_ffn(ev, seed):
    """Exact, by construction: with E = 1, k = 1 and the dense weights copied, the MoE layer and the whole MoE model
    give bit-identical outputs; only the router is extra. Would be refuted by any difference."""
    r = one_expert_gap(seed)
    ev.record("max |MoE FFN − dense FFN|, E = 1, k = 1, weights copied", r["ffn"], expect="0 exactly")
    ev.record("max |MoE DecoderLM − dense DecoderLM| logits", r["model"], expect="0 exactly")
    ev.record("parameters not in the dense model", r["not_copied"], expect="the routers only", key=False)
    assert r["ffn"] == 0.0 and r["model"] == 0.0
    assert r["unexpected"] == [] and all(n.endswith("router.weight") for n in r["not_copied"])
# --8<-- [end:test_dense]


# --8<-- [start:test_flops]
@pytest.mark.claim("C-MOE-1", "confirmed")
def test_moe_has_e_times_the_parameters_and_k_times_the_compute(ev, seed):
    """A count of our module: E = 8, k = 2 holds 8 FFNs' parameters (plus the router) and, for 256 tokens, runs
    exactly 2 FFNs' matrix products per token plus the router's. Would be refuted if the FLOPs scaled with E."""
    c = moe_costs()
    ev.record("parameters, dense FFN / MoE (E = 8)", [c["dense"]["params"], c["moe"]["params"]],
              expect="MoE = 8 × dense + router (d·E)")
    ev.record("forward matmul FLOPs for 256 tokens, dense / MoE (k = 2)", [c["dense"]["flops"], c["moe"]["flops"]],
              expect="MoE = 2 × dense + router")
    ev.record("MoE FLOPs / dense FLOPs", c["moe"]["flops"] / c["dense"]["flops"], expect="≈ k = 2, not E = 8")
    assert c["moe"]["params"] == 8 * c["dense"]["params"] + D * 8
    assert c["moe"]["flops"] == 2 * c["dense"]["flops"] + c["router_flops"]
# --8<-- [end:test_flops]


# --8<-- [start:test_mixtral]
@pytest.mark.claim("C-MOE-1", "confirmed")
@pytest.mark.claim("C-FOLK-21", "refuted")
def test_mixtral_has_about_47b_parameters_and_13b_active(ev, seed):
    """Mixtral's published configuration, counted by arithmetic and on the meta device: about 46.7B parameters in
    all and 12.9B used per token, not 8 × 7B = 56B. Exact counts of a configuration; would be refuted if the two
    counts disagreed or the total were near 56B."""
    a, m = mixtral_arithmetic(), meta_counts(llama_config(**MIXTRAL))
    dense = meta_counts(llama_config(**{**MIXTRAL, "moe_experts": 0}))["total"]  # the same model with one FFN per layer
    ev.record("Mixtral 8×7B, total parameters (meta-device count)", m["total"], expect="≈ 46.7B (paper: 47B)")
    ev.record("Mixtral 8×7B, active parameters per token (meta-device count)", m["active"],
              expect="≈ 12.9B (paper: 13B)")
    ev.record("same, by arithmetic: total / active", [a["total"], a["active"]], expect="equal to the count")
    ev.record("the same model with one dense FFN per layer (Mistral 7B's shape)", dense, expect="≈ 7.24B")
    ev.record("8 × that (the folk reading of '8×7B')", 8 * dense, expect="≈ 58B: wrong")
    ev.record("parameters of one expert (one layer)", a["expert"], key=False)
    assert m["total"] == a["total"] and m["active"] == a["active"] and dense == a["dense_equivalent"]
    assert round(m["total"] / 1e9, 1) == 46.7 and round(m["active"] / 1e9, 1) == 12.9
# --8<-- [end:test_mixtral]


# --8<-- [start:test_bounds]
@pytest.mark.claim("C-MOE-2", "nuanced")
def test_switch_loss_is_1_at_even_load_and_e_at_collapse(ev, seed):
    """Exact: the module's aux_loss equals E·Σ f·P computed by hand; it is ≈ 1 for an even, confident routing and
    ≈ E when all tokens go to one expert, exactly 1 when the router is uniform (whatever f), and below 1 in a
    case where f and P disagree. Would be refuted by a mismatch with the formula or other limits."""
    b = bound_cases()
    for name, (module, hand) in b.items():
        ev.record(f"Switch loss, {name.replace('_', ' ')} (module / formula)", [module, hand])
        assert module == pytest.approx(hand, abs=1e-6)
    assert b["even_confident"][0] == pytest.approx(1.0, abs=1e-4)
    assert b["collapsed_confident"][0] == pytest.approx(8.0, abs=1e-4)
    assert b["uniform_router"][0] == pytest.approx(1.0, abs=1e-6)
    assert b["below_one"][0] < 0.95
# --8<-- [end:test_bounds]


def _plot_load(ev, loads: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(loads), figsize=(3.2 * len(loads), 2.8), constrained_layout=True, sharey=True)
    for ax, (title, layers) in zip(axes, loads.items()):
        ax.bar(range(E_TOY), layers[0]["f"], color="C0")
        ax.axhline(1 / E_TOY, color="grey", ls=":")
        ax.set(title=title, xlabel="expert", xticks=range(E_TOY))
    axes[0].set_ylabel("share of tokens")
    ev.figure(fig, "load", "Share of 4096 held-out tokens routed to each of 8 experts (top-1): at initialisation, "
              "and after 80 steps without the balancing loss, with it at α = 0.01 and at α = 0.1. Dotted: an even "
              "load.")


# --8<-- [start:test_collapse]
SEEDS = 5  # training runs per arm: the load without the loss varies a lot from run to run


def entropies(seeds: list[int], alpha: float) -> list[float]:
    return [load(moe_run(s, alpha)["model"], s)[0]["entropy"] for s in seeds]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.claim("C-MOE-2", "nuanced")
def test_router_collapses_without_the_balancing_loss(ev, seed):
    """The toy MoE LM, top-1 over 8 experts, 80 steps, no balancing loss, five seeds: the load ends far more
    concentrated than at initialisation, on some seeds on a single expert. Would be refuted if training left the
    load as even as it started."""
    seeds = list(range(seed, seed + SEEDS))
    init, trained = [at_init(s)[0] for s in seeds], [load(moe_run(s, 0.0)["model"], s)[0] for s in seeds]
    ev.record("normalised load entropy at initialisation (5 seeds)", [x["entropy"] for x in init],
              expect="below 1 already: a random router has preferences")
    ev.record("normalised load entropy after 80 steps, no balancing loss (5 seeds)", [x["entropy"] for x in trained],
              expect="lower: concentrated (0 = one expert)")
    ev.record("largest expert share at init / after training (5 seeds each)",
              [[x["max_share"] for x in init], [x["max_share"] for x in trained]], expect="even would be 0.125")
    drop = mean([x["entropy"] for x in init]) - mean([x["entropy"] for x in trained])
    ev.record("entropy at init − after training, mean over the 5 seeds", drop)
    ev.record("Switch loss value (unweighted) after training (5 seeds)", [x["aux"] for x in trained], expect="> 1",
              key=False)
    # over seeds 100-139 the 5-seed mean drop was 0.436 ± 0.068 (min 0.32): bound 0.1 at 4.9 SD. Per run the entropy
    # after training went as low as 0.006 (largest share 0.998): some runs put nearly every token on one expert
    assert drop > 0.1
# --8<-- [end:test_collapse]


@pytest.mark.claim("C-MOE-2", "nuanced")
def test_a_ten_times_larger_weight_evens_the_load(ev, seed):
    """α = 0.1, ten times Switch's weight, pushed to see whether a stronger pull makes the load even in this short
    run, two seeds, next to α = 0.01 on the same seeds. Would be refuted if the load stayed clearly uneven."""
    seeds = [seed, seed + 1]
    strong, switch = entropies(seeds, 10 * ALPHA), entropies(seeds, ALPHA)
    ev.record("normalised load entropy, α = 0.1 (2 seeds)", strong, expect="near 1")
    ev.record("entropy α = 0.1 − α = 0.01, mean over the 2 seeds", mean(strong) - mean(switch))
    ev.record("held-out loss, α = 0.1 / α = 0.01 (2 seeds each)",
              [[moe_run(s, a)["held_out"] for s in seeds] for a in (10 * ALPHA, ALPHA)])
    # over seeds 100-139: entropy at α = 0.1 was 0.987 ± 0.006 per run (min 0.975)
    assert mean(strong) > 0.95


# --8<-- [start:test_balanced]
@pytest.mark.claim("C-MOE-2", "nuanced")
def test_switch_loss_spreads_the_load(ev, seed):
    """The same five runs with α·(Switch loss) added, α = 0.01 (Switch's weight): the load is more even than without
    the loss on the same seeds, though not even. Would be refuted if the loss did not raise the load entropy."""
    seeds = list(range(seed, seed + SEEDS))
    without, with_loss = entropies(seeds, 0.0), entropies(seeds, ALPHA)
    ev.record("normalised load entropy, Switch loss α = 0.01 (5 seeds)", with_loss, expect="higher than without")
    ev.record("entropy with − without the loss, mean over the 5 seeds", mean(with_loss) - mean(without))
    ev.record("largest expert share with the loss (5 seeds)",
              [load(moe_run(s, ALPHA)["model"], s)[0]["max_share"] for s in seeds], expect="even would be 0.125")
    ev.record("held-out loss without / with the balancing loss (5 seeds each)",
              [[moe_run(s, a)["held_out"] for s in seeds] for a in (0.0, ALPHA)])
    # over seeds 100-139 (5 seeds per window): with − without 0.406 ± 0.099 (min 0.26), 4.1 SD above 0; entropy with
    # the loss 0.79 ± 0.085 per run, so the 5-run mean's SD is about 0.04 and 0.6 is about 5 SD below it
    assert mean(with_loss) > mean(without) and mean(with_loss) > 0.6
# --8<-- [end:test_balanced]


# --8<-- [start:test_capacity]
@pytest.mark.claim("C-MOE-2", "nuanced")
def test_tokens_over_capacity_are_dropped(ev, seed):
    """With a capacity of ⌈c·N·k/E⌉ tokens per expert, every assignment beyond it is dropped (its FFN output is 0;
    the residual carries the token). Exact: more capacity never drops more, and c = E drops nothing. Over the five
    runs of each arm the concentrated routers (no loss) drop more at c = 1 than the spread ones. Would be refuted
    if the balanced routers dropped as many tokens. A top-2 layer is also checked against a token-by-token loop: its
    capacity is ⌈c·N·k/E⌉ with the k, and each expert keeps exactly the first assignments in token order."""
    seeds = list(range(seed, seed + SEEDS))
    drops = {a: [[load(moe_run(s, a)["model"], s, c)[0]["dropped"] for c in CAPACITIES] for s in seeds]
             for a in (0.0, ALPHA)}
    for a, label in ((0.0, "without the balancing loss"), (ALPHA, "with it (α = 0.01)")):
        ev.record(f"share of assignments dropped at capacity factor {list(CAPACITIES)}, {label}, first seed",
                  drops[a][0])
        ev.record(f"same at c = 1, mean over the 5 seeds, {label}", mean([d[0] for d in drops[a]]))
        for s, d in zip(seeds, drops[a]):
            assert all(x >= y for x, y in zip(d, d[1:]))  # more capacity, never more drops
            assert load(moe_run(s, a)["model"], s, float(E_TOY))[0]["dropped"] == 0.0  # c = E: room for every token
    _plot_load(ev, {"at init": at_init(seed), "no balancing loss": load(moe_run(seed, 0.0)["model"], seed),
                    "Switch loss, α = 0.01": load(moe_run(seed, ALPHA)["model"], seed),
                    "α = 0.1": load(moe_run(seed, 10 * ALPHA)["model"], seed)})
    # over seeds 100-139, 5-seed means of the share dropped at c = 1: without the loss 0.662 ± 0.056 (min 0.58), with
    # it 0.370 ± 0.031 (max 0.44); the gap, about 0.29, is about 4.6 SD of the difference
    assert mean([d[0] for d in drops[0.0]]) > mean([d[0] for d in drops[ALPHA]])
    # which tokens are dropped, at k = 2 (the toy routes top-1, where a missing k would not show): a layer of E = 4
    # experts on 64 tokens at c = 0.75 against a token-by-token loop, first come first served (E·capacity = 96 < 128
    # assignments: at least 32 are dropped on any seed; seeds 100-139: output gap at most 4.4e-16)
    hand = capacity_by_hand(seed)
    ev.record("k = 2, E = 4, N = 64, c = 0.75: capacity, module and ⌈c·N·k/E⌉", [hand["capacity"], hand["capacity by hand"]],
              key=False)
    ev.record("k = 2: tokens taken per expert, module and loop", [hand["taken"], hand["taken by hand"]], key=False)
    ev.record("k = 2: max |module output − token-by-token loop| (fp64)", hand["output vs loop"], expect="≈ 1e-16")
    assert hand["capacity"] == hand["capacity by hand"] == 24
    assert hand["taken"] == hand["taken by hand"] and hand["dropped"] == hand["dropped by hand"] > 0
    assert hand["output vs loop"] < 1e-12
# --8<-- [end:test_capacity]

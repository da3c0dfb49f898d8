# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Prompt tuning, prefix tuning, adapters, LoRA
#
# Proofs for `docs/generation/peft-families.md`. `proofs/transformer/peft.py` applies prompt tuning (p input
# vectors), prefix tuning (p keys and values per layer, as a pre-filled KV cache read by the unchanged attention) and
# Houlsby adapters (a bottleneck after each sub-layer) to a built DecoderLM and removes them again; LoRA is
# `proofs/transformer/lora.py`. Sections 1-3 are exact, in float64: the trainable counts against the formulas (an
# identity of our modules), He et al.'s two-term form of prefix attention, and prompt tuning as a special case of
# prefix tuning. Section 4 trains: the LoRA page's toy (a DecoderLM that copies the previous token, adapted to copy
# the token two back; rebuilt in `proofs/peft_task.py`, because that set-up lives inside proof_lora.py) with every
# method at equal steps and near-equal trainable parameters, each at its own learning rate. Thresholds from
# seeds 100-139. Run: `pytest proofs/generation/proof_peft.py`.

# %%
from __future__ import annotations

import copy
import math
import re

import pytest
import torch

from proofs.peft_task import (VOCAB, T, accuracy, adaptation_batches, base_config, base_model,
                              two_back_task)
from proofs.train import train
from proofs.transformer import (ConfigError, DecoderLM, KVCache, LoRALinear, PrefixSelfAttention, TransformerConfig,
                                apply_adapters, apply_lora, apply_prefix_tuning, apply_prompt_tuning, peft_formula,
                                remove_peft, repeat_kv, trainable_parameters)

LORA_TARGETS, RANK, ALPHA = ("w_q", "w_k", "w_v", "w_o", "lin1", "lin2"), 4, 8.0  # the LoRA page's adapter
# One budget for all: LoRA r = 4 on the 12 matrices of the toy (d 32, 2 layers) trains 3584 numbers; prompt tuning
# p·d = 3584 needs p = 112 soft tokens, prefix tuning 2·L·p·d = 3584 needs p = 28, adapters 2·L·(2·d·r + d + r)
# come nearest at r = 13 (3508; r = 14 gives 3768).
BUDGET = {"prompt": 112, "prefix": 28, "adapters": 13}


def fresh_model(cfg: TransformerConfig, seed: int = 0, dtype=torch.float64) -> DecoderLM:
    """An untrained DecoderLM: the exact checks need weights, not training."""
    torch.manual_seed(seed)
    return DecoderLM(cfg).to(dtype).eval()


def apply_method(model: DecoderLM, method: str, k: int) -> None:
    """k: prompt/prefix length p, adapter bottleneck r or LoRA rank r."""
    if method == "lora":
        apply_lora(model, LORA_TARGETS, r=k, alpha=ALPHA)
    else:
        {"prompt": apply_prompt_tuning, "prefix": apply_prefix_tuning, "adapters": apply_adapters}[method](model, k)


# %% [markdown]
# ## 1. What each method trains: counts against the formulas, starts, removal

# %%
# --8<-- [start:test_counts]
@pytest.mark.claim("C-PEFT-1", "confirmed")
def test_each_method_trains_what_its_formula_says(ev, seed):
    """An identity of our modules, not evidence about the world. On two configs (the toy; 3 layers of width 48
    with 2 key/value heads, GQA) the trainable count of each method equals its formula: prompt p·d, prefix
    2·L·p·d_kv (d_kv = n_kv_heads·d_head: GQA shrinks the prefix), adapters 2·L·(2·d·r + d + r), LoRA
    Σ r·(d_in + d_out); after one backward pass only those numbers hold a gradient. Adapters start at the base
    model's logits bit for bit (zero up-projection); a prompt or a prefix changes them at step 0 by design; removing
    any of them gives the base model's logits bit for bit and its requires_grad flags back. Would fail if a base
    weight trained, if a count missed a term, or if removal left anything behind."""
    configs = {
        "toy (d 32, L 2, 4 heads)": base_config(),
        "d 48, L 3, 4 heads, 2 KV heads (GQA)": base_config(48).replace(n_layers=3, n_kv_heads=2),
    }
    x = torch.randint(1, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))
    for cname, cfg in configs.items():
        base = fresh_model(cfg, seed)
        with torch.no_grad():
            ref = base(x)
        counts = {}
        for method, k in (("prompt", 5), ("prefix", 3), ("adapters", 4), ("lora", 2)):
            m = copy.deepcopy(base)
            torch.manual_seed(seed)
            apply_method(m, method, k)
            formula = (sum(k * (w.base.in_features + w.base.out_features) for w in m.modules()
                           if isinstance(w, LoRALinear)) if method == "lora" else peft_formula(method, cfg, k))
            with torch.no_grad():
                start = (m(x) - ref).abs().max().item()
            m(x).logsumexp(-1).mean().backward()
            with_grad = sum(p.numel() for p in m.parameters() if p.grad is not None)
            counts[method] = (trainable_parameters(m), formula)
            ev.record(f"{cname}: {method} (k={k}) trainable / formula / holding a gradient",
                      [trainable_parameters(m), formula, with_grad], key=False)
            assert trainable_parameters(m) == formula == with_grad
            if method == "lora":
                continue  # its start and merge are proved on the LoRA page
            ev.record(f"{cname}: max |logit − base| at step 0, {method}", start,
                      expect="0 (zero up-projection)" if method == "adapters" else "> 0 by design", key=False)
            assert (start == 0.0) if method == "adapters" else (start > 1e-3)
            remove_peft(m)
            with torch.no_grad():
                assert torch.equal(m(x), ref)
            assert all(p.requires_grad for p in m.parameters())
            assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in base.parameters())
    toy = base_config()
    ev.record("toy, one budget: prompt p=112, prefix p=28, adapters r=13, LoRA r=4 (trainable)",
              [peft_formula("prompt", toy, 112), peft_formula("prefix", toy, 28), peft_formula("adapters", toy, 13),
               2 * (4 * RANK * 64 + 2 * RANK * 96)], expect="3584, 3584, 3508, 3584")
    ev.record("removal restores the base model's logits bit for bit (every config, every method)", True)
# --8<-- [end:test_counts]


# %% [markdown]
# ## 2. Prefix tuning is attention over extra keys and values: He et al.'s two-term form

# %%
# --8<-- [start:test_gate]
def two_term_form(wrapper: PrefixSelfAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """He et al. 2022, §3.1, written out per head: (1 − λ)·Attn(q, K_x, V_x) + λ·Attn(q, P_k, P_v), with λ the
    prefix's share of the softmax mass, λ = Σ_j e^{s_pj} / (Σ_j e^{s_pj} + Σ_{i ≤ t} e^{s_xi}); then W_O.
    Returns the output (B, T, C) and λ (B, nh, T)."""
    attn = wrapper.attn
    B, T_, _ = x.shape
    q, k, v = attn.project(x, x)  # (B, nh, T, hs) each
    rep = attn.n_heads // attn.n_kv
    pk, pv = repeat_kv(wrapper.keys, rep), repeat_kv(wrapper.values, rep)  # (1, nh, p, hs)
    s_x = (q @ k.transpose(-2, -1)) * attn.scale  # (B, nh, T, T)
    s_x = s_x.masked_fill(torch.ones(T_, T_, dtype=torch.bool).triu(1), float("-inf"))  # causal among tokens
    s_p = (q @ pk.transpose(-2, -1)) * attn.scale  # (B, nh, T, p): every query sees the whole prefix
    mass_x, mass_p = s_x.logsumexp(-1), s_p.logsumexp(-1)  # (B, nh, T) log Σ e^s of each part
    lam = torch.sigmoid(mass_p - mass_x)  # = e^{mass_p} / (e^{mass_p} + e^{mass_x})
    mixed = (1 - lam)[..., None] * (s_x.softmax(-1) @ v) + lam[..., None] * (s_p.softmax(-1) @ pv)
    return attn.w_o(mixed.transpose(1, 2).reshape(B, T_, -1)), lam


@pytest.mark.claim("C-PEFT-1", "confirmed")
def test_prefix_attention_is_a_gated_mix(ev, seed):
    """Exact (float64): our prefix-tuned self-attention (the unchanged MultiHeadAttention reading a cache pre-filled
    with p trainable keys and values) equals He et al.'s (1 − λ)·Attn(x) + λ·Attn(prefix), with λ computed from the
    queries, on MHA and on GQA. λ is a gate that depends on the input (it varies across queries); the two switches
    that break the identity, a constant gate (the mean λ) and an ungated sum Attn(x) + Attn(prefix), are far off.
    Also exact: greedy decoding with the cache (prefix filled once, tokens appended) gives the cache-free tokens.
    Would fail if a pre-filled cache shifted the tokens' positions or hid the prefix from some queries."""
    g = torch.Generator().manual_seed(seed)
    for name, cfg in (("MHA", base_config()), ("GQA, 2 KV heads", base_config().replace(n_kv_heads=2))):
        model = fresh_model(cfg, seed)
        torch.manual_seed(seed)
        wrappers = apply_prefix_tuning(model, 6)
        with torch.no_grad():
            for w in wrappers:  # as after training: free vectors, not the base model's own keys
                w.keys.normal_(generator=g), w.values.normal_(generator=g)
            x = torch.randn(3, T, cfg.d_model, generator=g, dtype=torch.float64)
            module = wrappers[0](x, causal=True)
            form, lam = two_term_form(wrappers[0], x)
            constant = two_term_form_with(wrappers[0], x, lam.mean())
            ungated = wrappers[0].attn(x, causal=True) + prefix_only(wrappers[0], x)
        gap = (module - form).abs().max().item()
        ev.record(f"{name}: max |prefix-tuned attention − (1−λ)·Attn(x) − λ·Attn(P)|", gap, expect="< 1e-12 (float64)")
        ev.record(f"{name}: λ over queries: min / max", [lam.min().item(), lam.max().item()],
                  expect="spread: the gate depends on the input")
        ev.record(f"{name}: max |output − same form with a constant λ| / with no gate (plain sum)",
                  [(module - constant).abs().max().item(), (module - ungated).abs().max().item()], expect="≫ 0")
        assert gap < 1e-12
        assert lam.max() - lam.min() > 0.05
        assert (module - constant).abs().max() > 1e-3 and (module - ungated).abs().max() > 1e-3
    ids = torch.randint(1, VOCAB, (2, 4), generator=g)
    with torch.no_grad():
        cached, _ = model.generate(ids, 8, use_cache=True)
        uncached, _ = model.generate(ids, 8, use_cache=False)
    ev.record("greedy tokens with the pre-filled cache = without a cache (8 steps, GQA model)",
              torch.equal(cached, uncached), expect="True")
    assert torch.equal(cached, uncached)


def two_term_form_with(wrapper, x, lam_value):
    """The same two-term form with the gate replaced by one constant (the switch)."""
    attn = wrapper.attn
    B, T_, _ = x.shape
    out_x = attn(x, causal=True)  # W_O·Attn(x) (W_O is affine and the two weights sum to 1)
    return (1 - lam_value) * out_x + lam_value * prefix_only(wrapper, x)


def prefix_only(wrapper, x):
    """W_O·Attn(q, P_k, P_v): attention over the prefix alone."""
    attn = wrapper.attn
    B, T_, _ = x.shape
    q = attn.project_q(x)
    rep = attn.n_heads // attn.n_kv
    pk, pv = repeat_kv(wrapper.keys, rep), repeat_kv(wrapper.values, rep)
    y = ((q @ pk.transpose(-2, -1)) * attn.scale).softmax(-1) @ pv  # (B, nh, T, hs)
    return attn.w_o(y.transpose(1, 2).reshape(B, T_, -1))
# --8<-- [end:test_gate]


# %% [markdown]
# ## 3. Any soft prompt is a prefix; not every prefix is a soft prompt

# %%
# --8<-- [start:test_reach]
@torch.no_grad()
def prompt_as_prefix(prompted: DecoderLM) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run the soft prompt alone through the stack (causal: the prompt never sees the tokens after it) and keep
    each layer's keys and values of the prompt positions: ((1, n_kv, p, hs), (1, n_kv, p, hs)) per layer."""
    h = prompted.embed.prompt[None]  # (1, p, C)
    out = []
    for layer in prompted.decoder.layers:
        cache = {"self": KVCache(), "cross": KVCache()}
        h = layer(h, cache=cache, positions=torch.arange(h.shape[1])[None])
        out.append(cache["self"].entries)
    return out


@pytest.mark.claim("C-PEFT-1", "confirmed")
def test_prompt_tuning_is_reachable_by_prefix_tuning(ev, seed):
    """Exact (float64). Reachable: a soft prompt of p vectors acts on the tokens only through each layer's keys and
    values of the prompt positions, so a prefix set to those (every layer) gives the prompt-tuned model's logits, and
    at layer 1 its hidden states. Not conversely: prompt tuning reaches a set of prefixes of dimension at most p·d
    inside prefix tuning's 2·L·p·d (the Jacobian of prompt -> all layers' keys and values has rank ≤ p·d: a dimension
    count, true of any map from p·d numbers, recorded not as evidence), and at
    layer 1 its keys and values are tied: K₁ = LN(P)·W_Kᵀ + b_K and V₁ = LN(P)·W_Vᵀ + b_V come from one vector per
    slot, so the least-squares residual of a prefix on [W_Kᵀ | W_Vᵀ] is zero for a prompt-made prefix and large for
    free keys and values. Would fail if the prefix made from the prompt gave other logits, or if a random prefix fit
    the tied form."""
    cfg = base_config()
    base = fresh_model(cfg, seed)
    x = torch.randint(1, VOCAB, (4, T), generator=torch.Generator().manual_seed(seed))
    prompted, prefixed = copy.deepcopy(base), copy.deepcopy(base)
    torch.manual_seed(seed)
    prompt = apply_prompt_tuning(prompted, 5)
    with torch.no_grad():
        prompt.prompt.normal_(std=3.0)  # as after training: free vectors
    wrappers = apply_prefix_tuning(prefixed, 5)
    with torch.no_grad():
        for w, (k, v) in zip(wrappers, prompt_as_prefix(prompted)):
            w.keys.copy_(k), w.values.copy_(v)
        layer1 = {}
        hooks = [m.decoder.layers[0].register_forward_hook(lambda mod, i, o, n=n: layer1.__setitem__(n, o))
                 for n, m in (("prompt", prompted), ("prefix", prefixed))]
        gap = (prompted(x) - prefixed(x)).abs().max().item()
        gap1 = (layer1["prompt"][:, 5:] - layer1["prefix"]).abs().max().item()
        for h in hooks:
            h.remove()
        moved = (prompted(x) - base(x)).abs().max().item()
    # layer 1: the tied form. Pre-LN: K₁ = u·W_Kᵀ + b_K, V₁ = u·W_Vᵀ + b_V with u = LN(p) (d numbers per slot)
    a = prefixed.decoder.layers[0].self_attn.attn
    W = torch.cat([a.w_k.weight.T, a.w_v.weight.T], dim=1)  # (d, 2·d_kv)

    def tied_residual(k, v):
        """Relative residual of the best u on [K − b_K | V − b_V] ≈ u·W (a lower bound on the distance to any prompt)."""
        target = torch.cat([_flat(k) - _b(a.w_k), _flat(v) - _b(a.w_v)], dim=1)  # (p, 2·d_kv)
        u = torch.linalg.lstsq(W.T, target.T).solution.T  # (p, d)
        return ((u @ W - target).norm() / target.norm()).item()

    w0 = wrappers[0]
    g = torch.Generator().manual_seed(seed + 1)
    free_k, free_v = (torch.randn(w0.keys.shape, generator=g, dtype=torch.float64) for _ in range(2))
    res_prompt, res_free = tied_residual(w0.keys, w0.values), tied_residual(free_k, free_v)
    # dimension: the map from one soft token (d numbers) to every layer's key and value (2·L·d numbers)
    p1 = copy.deepcopy(base)
    torch.manual_seed(seed)
    one = apply_prompt_tuning(p1, 1)

    jac = torch.autograd.functional.jacobian(lambda vec: _kv_graph(p1, vec), one.prompt.detach().flatten().clone())
    rank = torch.linalg.matrix_rank(jac).item()
    ev.record("max |logit, prompt-tuned − logit, prefix made from its keys/values| (all layers)", gap,
              expect="< 1e-12 (float64)")
    ev.record("max |layer-1 hidden state, prompt − prefix| (token positions)", gap1, expect="< 1e-12")
    ev.record("max |logit, prompt-tuned − base| (the prompt does something)", moved, expect="> 0")
    ev.record("layer 1, relative residual of the tied form: prompt-made prefix / free random prefix",
              [res_prompt, res_free], expect="≈ 0 / ≫ 0")
    ev.record("rank of d(all layers' K, V)/d(one soft token) / its columns (d) / prefix tuning's numbers (2·L·d)",
              [rank, jac.shape[1], jac.shape[0]], expect="≤ d < 2·L·d")
    assert gap < 1e-12 and gap1 < 1e-12 and moved > 1e-3
    assert res_prompt < 1e-10 and res_free > 0.3
    assert rank <= jac.shape[1] < jac.shape[0]


def _flat(t):  # (1, n_kv, p, hs) -> (p, n_kv·hs): the slot's key (or value) as one row, heads side by side
    return t[0].transpose(0, 1).reshape(t.shape[2], -1)


def _b(lin):
    return lin.bias if lin.bias is not None else torch.zeros(lin.out_features, dtype=lin.weight.dtype)


def _kv_graph(prompted: DecoderLM, vec: torch.Tensor) -> torch.Tensor:
    """Differentiable prompt -> every layer's keys and values of the prompt positions, flattened (2·L·p·d_kv,)."""
    h = vec.reshape(1, 1, -1)
    out = []
    for layer in prompted.decoder.layers:
        cache = {"self": KVCache(), "cross": KVCache()}
        h = layer(h, cache=cache, positions=torch.zeros(1, 1, dtype=torch.long))
        out += [e.flatten() for e in cache["self"].entries]
    return torch.cat(out)
# --8<-- [end:test_reach]


# %% [markdown]
# ## 4. Equal budgets on the LoRA page's toy, each method at its own learning rate

# %%
# --8<-- [start:test_adapt]
# Each arm's rate, chosen from a grid on seeds 200-203 (outside the test seeds and the sweep's 100-139), as the
# accuracy on the new task after the STEPS = 50 steps, seed 200 / 201 / 202 / 203 (- = not run; seeds 200-201 ran
# the first grid at 100 steps, read at step 50; 202-203 the second grid):
#   full      1e-3: .18/.10/ - / -    3e-3: .87/.45/.50/.88   1e-2: 1.0/.91/.94/1.0   3e-2:  - / - /1.0/.99   <- 1e-2
#   LoRA r=4  3e-3: .29/.11/ - / -    1e-2: .79/.61/.86/.80   3e-2: .95/.86/.98/.95   1e-1:  - / - /.10/.05   <- 3e-2
#   adapters  3e-3: .09/.04/ - / -    1e-2: .35/.04/.03/.29   3e-2: .62/.03/.04/.68   1e-1: .17/.03/.03/.38   <- 3e-2
#   prefix    1e-2: .04/.03/ - / -    3e-2: .04/.03/.03/.04   1e-1: .03/.03/.04/.03   3e-1: .03/.03/.03/.03   <- 1e-1
#   prompt    3e-2: .04/.03/ - / -    1e-1: .04/ - /.04/.03   3e-1: .09/ - /.03/.03   1:    .09/ - /.03/.03   <- 3e-1
# (zero-shot .034/.033/.029/.030, chance 1/32). Prefix and prompt tuning stay at chance at every rate (at 100 steps
# too: best .07 and .10 on seed 200); prompt's 3e-1 is Lester et al.'s rate. Adapters learn on some seeds and stay
# at chance on others whatever the rate; 1e-1 breaks LoRA.
LR = {"full": 1e-2, "lora": 3e-2, "adapters": 3e-2, "prefix": 1e-1, "prompt": 3e-1}


STEPS = 50  # half the LoRA page's 100 (peft_task.ADAPT_STEPS): the proof's 8 s budget; ranking as at 100 (grid)


def adapted(seed: int, method: str, k: int = 0) -> tuple[DecoderLM, float]:
    """The base model of peft_task, adapted for STEPS batches of the two-back task (the same for every arm).
    Returns the model and its mean training loss over the last 5 steps."""
    model = copy.deepcopy(base_model(seed))
    torch.manual_seed(10_000 + seed)  # the adapter's random init: the same whichever tests ran before
    if method != "full":
        apply_method(model, method, k)
    log = train(model, adaptation_batches(seed), STEPS, lr=LR[method])
    return model.eval(), sum(log.loss[-5:]) / 5


@pytest.mark.claim("C-PEFT-2", "nuanced")
def test_equal_budgets_do_not_adapt_equally(ev, seed):
    """The base copies the previous token; the new task copies the token two back. Every arm gets the same 50
    batches at its own rate (chosen on seeds 200-203, above): full fine-tuning and, at ~3.5k trainable numbers
    each, LoRA r=4, adapters r=13, prefix p=28, prompt p=112. Asserted: the weight edits (full, LoRA) learn the
    task; prefix and prompt tuning stay far below LoRA at these steps. Adapters are recorded, not asserted: over
    seeds they either learn the task or stay at chance (bimodal), which no honest threshold covers. 'About as well
    at equal parameters' would have been confirmed if prefix and prompt tuning had come within 0.25 of LoRA.
    Not asserted and not claimed: that context cannot reach the task; a side run (seed 200, 800 steps at lr 3e-2,
    16x the steps here, outside the proof's budget) took prefix tuning from chance to most of the way; on seed
    203, 8x the steps at lr 0.1 did not move it."""
    zero_shot = accuracy(base_model(seed), two_back_task, seed)
    acc, end_loss = {}, {}
    for method, k in (("full", 0), ("lora", RANK), *BUDGET.items()):
        model, end_loss[method] = adapted(seed, method, k)
        acc[method] = accuracy(model, two_back_task, seed)
    ev.record("accuracy on the new task, base model (zero-shot)", zero_shot, expect=f"≈ chance 1/{VOCAB}")
    for name, label in (("full", "full fine-tuning"), ("lora", "LoRA r=4"), ("adapters", "adapters r=13"),
                        ("prefix", "prefix tuning p=28"), ("prompt", "prompt tuning p=112")):
        ev.record(f"accuracy on the new task, {label} (lr {LR[name]:g})", acc[name])
    # An arm at chance is not a broken module: its loss falls from the base model's confident wrong answer (about 8)
    # towards the uniform output's ln V. Adapters at chance sit on that plateau (probe, seeds 201-202: 8.0-8.4 ->
    # 3.47 by step 25; Houlsby's near-identity init, N(0, 1e-2) for both projections, or trained layer norms change
    # little; at 200 steps seed 201 leaves it, 0.22); prefix and prompt are still above it at step 50 (seed 0: 4.2).
    # Recorded, not asserted.
    ev.record("training loss, mean of the last 5 steps: full / LoRA / adapters / prefix / prompt (ln V = uniform)",
              [end_loss[m] for m in ("full", "lora", "adapters", "prefix", "prompt")],
              expect=f"ln {VOCAB} = {math.log(VOCAB):.2f} is the uniform output; arms at chance at or above it", key=False)
    gap = acc["lora"] - max(acc["prefix"], acc["prompt"])
    ev.record("LoRA − the better of prefix and prompt tuning", gap, expect="> 0.3 (asserted)")
    # Thresholds from seeds 100-139 (40 seeds, all passing; bench/seeds/generation/proof_peft.json), mean ± sd [min, max]:
    # zero-shot 0.032 ± 0.003 [0.026, 0.040]; full 0.899 ± 0.075 [0.766, 1.000]; LoRA 0.854 ± 0.099 [0.624, 0.989];
    # adapters 0.137 ± 0.187 [0.027, 0.681] (bimodal: not asserted); prefix 0.036 ± 0.013 [0.016, 0.088];
    # prompt 0.034 ± 0.003 [0.027, 0.041]; LoRA − better context arm 0.815 ± 0.103 [0.587, 0.955].
    # full − zero-shot > 0.45 (~5.5 sd below its mean, under the min); LoRA − zero-shot > 0.35 (~4.8 sd, under the
    # min); each context arm − zero-shot < 0.12 (~9 sd above prefix's mean, over its max); gap > 0.3 (5 sd, under min)
    assert acc["full"] - zero_shot > 0.45 and acc["lora"] - zero_shot > 0.35
    assert acc["prefix"] - zero_shot < 0.12 and acc["prompt"] - zero_shot < 0.12
    assert gap > 0.3
# --8<-- [end:test_adapt]


# %% [markdown]
# ## 5. Bad settings

# %%
def test_bad_settings_raise_config_errors(ev):
    """p < 1, r < 1, prefix tuning on position-biased or windowed attention, prompt tuning with a KV cache, two
    methods at once and removing from a plain model each raise ConfigError naming the fix (recorded, so that the
    site's evidence covers every test of this file)."""
    model = fresh_model(base_config())
    for call, says in ((lambda m: apply_prompt_tuning(m, 0), "p >= 1 soft tokens"),
                       (lambda m: apply_prefix_tuning(m, 0), "p >= 1 virtual tokens"),
                       (lambda m: apply_adapters(m, 0), "must be >= 1"),
                       (remove_peft, "no prompt, prefix or adapters to remove")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            call(copy.deepcopy(model))
    for cfg in (base_config().replace(positions="alibi"), base_config().replace(window=4)):
        with pytest.raises(ConfigError, match="prefix tuning"):
            apply_prefix_tuning(fresh_model(cfg), 2)
    m = copy.deepcopy(model)
    apply_prompt_tuning(m, 2)
    with pytest.raises(ConfigError, match="use_cache=False"):
        m.generate(torch.ones(1, 3, dtype=torch.long), 2)
    with pytest.raises(ConfigError, match="remove_peft") as err:
        apply_adapters(m, 2)
    ev.record("two methods at once", str(err.value), key=False)

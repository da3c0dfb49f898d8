# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Speculative decoding: lossless, and fewer target calls
#
# Proofs for `docs/inference/speculative-decoding.md`. Both models are the shared `DecoderLM`
# (`proofs/transformer/`): a target and a smaller draft with the same vocabulary.
# `speculative_generate` (speculative.py) drafts k tokens, scores them with one target call, keeps a
# prefix by a rule, and rolls both key/value caches back with `KVCache.truncate`. The switches:
# the rule (`"exact"`: accept with min(1, p/q), else resample from (p − q)+; `"argmax"`: the folk rule,
# accept when the target's argmax agrees), the draft (trained or not), and the rollback (on, or a cache
# whose truncate does nothing). Run: `pytest proofs/inference/proof_speculative_decoding.py`.

# %%
from __future__ import annotations

import functools
import itertools
import math

import torch

from proofs.train import train
from proofs.transformer import DecoderLM, KVCache, TransformerConfig
from proofs.transformer.speculative import speculative_generate, target_generate

V = 16  # vocabulary of the trained pair
T_TRAIN, STEPS, BATCH = 24, 100, 16  # training: sequence length, Adam steps, batch


def config(**switches) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=128, dropout_emb=0.0,
                dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})


TARGET = dict()  # 2 layers, d_model 32
DRAFT = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1)  # 1 layer, d_model 16: about a tenth of the parameters


# %% [markdown]
# ## 1. A target and a draft trained on the same text
#
# The text is a random Markov chain over 16 tokens (each token drawn from a fixed distribution given
# the one before it, peaked but not deterministic). Both models see the same batches for the same
# number of steps (100 Adam steps); the draft is much smaller, so it agrees with the target often but
# not always.

# %%
# --8<-- [start:models]
def chain(seed: int, scale: float = 2.5) -> torch.Tensor:
    """(V, V) next-token probabilities given the previous token: softmax of scaled Gaussian logits."""
    g = torch.Generator().manual_seed(20_000 + seed)
    return torch.softmax(scale * torch.randn(V, V, generator=g), dim=-1)


def chain_text(P: torch.Tensor, g: torch.Generator, rows: int, length: int) -> torch.Tensor:
    x = torch.zeros(rows, length, dtype=torch.long)
    x[:, 0] = torch.randint(0, V, (rows,), generator=g)
    for t in range(1, length):
        x[:, t] = torch.multinomial(P[x[:, t - 1]], 1, generator=g)[:, 0]
    return x


@functools.cache
def trained_pair(seed: int) -> dict:
    """Target and draft trained on the same batches, plus an untrained draft of the same size."""
    P, g = chain(seed), torch.Generator().manual_seed(seed)
    data = chain_text(P, g, STEPS * BATCH, T_TRAIN + 1).view(STEPS, BATCH, T_TRAIN + 1)
    batches = lambda s: (data[s][:, :-1], data[s][:, 1:])  # noqa: E731
    models = {}
    for name, sw in (("target", TARGET), ("draft", DRAFT)):
        torch.manual_seed(seed)
        models[name] = DecoderLM(config(**sw))
        train(models[name], batches, STEPS, lr=3e-3)
    torch.manual_seed(seed + 1)
    models["untrained draft"] = DecoderLM(config(**DRAFT)).eval()
    models["prompts"] = chain_text(P, g, 8, 6)
    return models
# --8<-- [end:models]


# %% [markdown]
# ## 2. Greedy: the target's own tokens, from fewer target calls
#
# The reference is the target alone (`target_generate`, one call per token). Speculative decoding with
# k = 2 and k = 4 must return the very same tokens. Counted: target passes per generated token (each row
# needs one target pass per round; the batch of 8 prompts runs the rounds together), the draft's calls,
# and the acceptance rate. Two off arms: an untrained draft (the tokens must still be right; only the
# savings go), and a cache whose `truncate` does nothing (the rejected drafts stay visible to later tokens).

# %%
# --8<-- [start:greedy]
class NoRollback(KVCache):
    """A cache that ignores truncate: rejected draft tokens stay in it."""

    def truncate(self, length) -> None:
        pass


def greedy_run(seed: int, steps: int = 32) -> dict:
    m = trained_pair(seed)
    target, prompts = m["target"], m["prompts"]
    ref, calls = target_generate(target, prompts, steps)
    out = {"ref": ref, "target alone calls": calls, "distinct": sum(len(set(r.tolist())) for r in ref[:, 6:])}
    for name, draft, k in (("trained draft, k=2", m["draft"], 2), ("trained draft, k=4", m["draft"], 4),
                           ("untrained draft, k=4", m["untrained draft"], 4)):
        ids, st = speculative_generate(target, draft, prompts, steps, k)
        out[name] = {"same": int((ids == ref).all(1).sum()), "passes_per_token": st.row_rounds / (len(ref) * steps),
                     "calls": st.target_calls, "draft_calls": st.draft_calls, "acceptance": st.acceptance_rate,
                     "alpha": st.alpha, "k": k, "tokens_per_pass": (st.accepted + st.row_rounds) / st.row_rounds}
    caches = tuple([{"self": NoRollback(), "cross": KVCache()} for _ in mm.decoder.layers] for mm in (target, m["draft"]))
    ids, _ = speculative_generate(target, m["draft"], prompts, steps, 4, caches=caches)
    out["no rollback"] = {"same": int((ids == ref).all(1).sum()), "wrong tokens": int((ids != ref).sum())}
    return out
# --8<-- [end:greedy]


# %% [markdown]
# ## 3. Sampling: the target's distribution, exactly
#
# On a vocabulary of 4 tokens everything is small enough to compute exactly: the target's distribution
# over the 4³ = 64 three-token continuations of a fixed prompt (the product of its conditionals), and the
# distribution each acceptance rule produces with this very draft. Each round starts afresh from the
# tokens emitted so far, so the rule's distribution follows from a short dynamic programme over emitted
# prefixes: per prefix, every draft path of k = 2 tokens with its probability under q, then the rule's
# accept/reject/resample branches with the target's p (an independent re-statement of the rule, not a
# call of `verify`). Then the module itself samples N continuations (N rows of one batch) with each rule,
# and the target alone does too: the total variation distance between empirical and exact distribution
# is pure sampling noise (about ∝ 1/√N) for a correct sampler, and levels off at the bias for a biased one.
# The models are untrained (random weights): the theorem holds for any pair of distributions, and a draft
# far from the target makes the rules disagree more.

# %%
# --8<-- [start:sampling]
V_TINY, PROMPT, NEW, K_TINY = 4, (1, 2), 3, 2
DRAWS = (125, 500, 2000, 8000)
OUTCOMES = list(itertools.product(range(V_TINY), repeat=NEW))  # the 64 continuations, in this order


def tiny_pair(seed: int) -> tuple[DecoderLM, DecoderLM]:
    torch.manual_seed(seed)
    target = DecoderLM(config(vocab_size=V_TINY, d_model=16, n_heads=2, d_ff=32)).eval()
    torch.manual_seed(seed + 7)
    draft = DecoderLM(config(vocab_size=V_TINY, d_model=8, n_heads=2, d_ff=16, n_layers=1)).eval()
    return target, draft


@torch.no_grad()
def next_token_tables(model: DecoderLM, longest: int) -> dict[tuple, list[float]]:
    """softmax of the next-token logits after PROMPT + s, for every continuation s of up to `longest` tokens."""
    table = {}
    for n in range(longest + 1):
        conts = list(itertools.product(range(V_TINY), repeat=n))
        ids = torch.tensor([PROMPT + c for c in conts])
        probs = torch.softmax(model(ids)[:, -1].double(), -1)
        table.update({c: row.tolist() for c, row in zip(conts, probs)})
    return table


def target_distribution(p: dict) -> torch.Tensor:
    """(64,) exact probability of each continuation: the product of the target's conditionals."""
    return torch.tensor([math.prod(p[o[:i]][o[i]] for i in range(NEW)) for o in OUTCOMES], dtype=torch.float64)


def rule_distribution(p: dict, q: dict, rule: str) -> torch.Tensor:
    """(64,) exact probability of each continuation emitted by speculative sampling with k = K_TINY and `rule`."""
    at, out = {(): 1.0}, torch.zeros(len(OUTCOMES), dtype=torch.float64)
    for length in range(NEW):  # emitted prefixes, shortest first: a round only ever makes them longer
        for e in [e for e in at if len(e) == length]:
            mass = at.pop(e)
            for d in itertools.product(range(V_TINY), repeat=K_TINY):  # every draft path and its probability
                branch = mass * math.prod(q[e + d[:i]][d[i]] for i in range(K_TINY))
                for i in range(K_TINY + 1):
                    p_i = p[e + d[:i]]
                    if i == K_TINY:  # all k kept: one more token from the target
                        ends = [(e + d + (y,), branch * p_i[y]) for y in range(V_TINY)]
                    else:
                        q_i = q[e + d[:i]]
                        if rule == "exact":
                            keep = min(1.0, p_i[d[i]] / q_i[d[i]])
                            resid = [max(0.0, a - b) for a, b in zip(p_i, q_i)]
                            redraw = [r / sum(resid) for r in resid] if sum(resid) > 0 else p_i
                        else:  # folk: kept iff it is the target's argmax; otherwise a fresh draw from p
                            keep, redraw = float(d[i] == max(range(V_TINY), key=p_i.__getitem__)), p_i
                        ends = [(e + d[:i] + (y,), branch * (1 - keep) * redraw[y]) for y in range(V_TINY)]
                        branch *= keep
                    for seq, m in ends:
                        if len(seq) >= NEW:
                            out[OUTCOMES.index(seq[:NEW])] += m
                        else:
                            at[seq] = at.get(seq, 0.0) + m
                    if i < K_TINY and branch == 0:
                        break
    return out


def tv_curve(samples: torch.Tensor, exact: torch.Tensor) -> list[float]:
    """TV distance between the empirical distribution of the first N samples and `exact`, per N in DRAWS."""
    code = (samples * V_TINY ** torch.arange(NEW - 1, -1, -1)).sum(1)  # continuation -> its index in OUTCOMES
    return [0.5 * (torch.bincount(code[:n], minlength=len(exact)).double() / n - exact).abs().sum().item()
            for n in DRAWS]


@functools.cache
def sampling_run(seed: int) -> dict:
    target, draft = tiny_pair(seed)
    p = next_token_tables(target, NEW + K_TINY - 1)
    q = next_token_tables(draft, NEW + K_TINY - 1)
    exact = {"target": target_distribution(p), "exact": rule_distribution(p, q, "exact"),
             "argmax": rule_distribution(p, q, "argmax")}
    prompt = torch.tensor(PROMPT).expand(DRAWS[-1], -1)
    curves, stats = {}, {}
    for rule in ("exact", "argmax"):
        g = torch.Generator().manual_seed(seed)
        ids, st = speculative_generate(target, draft, prompt, NEW, K_TINY, sample=True, generator=g, rule=rule)
        curves[rule], stats[rule] = tv_curve(ids[:, len(PROMPT):], exact["target"]), st
        curves[rule + " vs its own"] = tv_curve(ids[:, len(PROMPT):], exact[rule])
    ids, _ = target_generate(target, prompt, NEW, sample=True, generator=torch.Generator().manual_seed(seed))
    curves["target alone"] = tv_curve(ids[:, len(PROMPT):], exact["target"])
    tv = {rule: 0.5 * (exact[rule] - exact["target"]).abs().sum().item() for rule in ("exact", "argmax")}
    p0, q0 = torch.tensor(p[()]), torch.tensor(q[()])  # the first token: folk = q(a)·δ_a + (1 − q(a))·p
    a = int(p0.argmax())
    # another folk rule: on rejection draw from p itself, not from (p − q)+. Its first token is distributed as
    # min(p, q) (accepted) + (1 − Σ min(p, q))·p (rejected, then drawn from p): closed form, no sampling.
    resample_p = torch.minimum(p0, q0) + (1 - torch.minimum(p0, q0).sum()) * p0
    return {"curves": curves, "stats": stats, "tv_exact": tv, "first_token_bias": (q0[a] * (1 - p0[a])).item(),
            "resample_p_bias": 0.5 * (resample_p - p0).abs().sum().item(),
            "tv_p_q": 0.5 * (p0 - q0).abs().sum().item(), "total": {r: exact[r].sum().item() for r in exact}}
# --8<-- [end:sampling]


# %%
if __name__ == "__main__":
    g = greedy_run(0)
    print({k: v for k, v in g.items() if k != "ref"})
    s = sampling_run(0)
    print(s["curves"], s["first_token_bias"], {k: v.acceptance_rate for k, v in s["stats"].items()})


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_greedy]
@pytest.mark.claim("C-SPEC-1", "confirmed")
def test_greedy_speculative_decoding_returns_the_targets_tokens_with_fewer_calls(ev, seed):
    """With greedy decoding every prompt gets exactly the target's own tokens, whatever the draft; a trained draft
    needs well under one target pass per token (the target alone needs one). Would be refuted by any differing token,
    or by no saving with a trained draft. Recorded beside it: an untrained draft (same tokens, smaller saving) and no
    cache rollback (wrong tokens)."""
    r = greedy_run(seed)
    n = len(r["ref"])
    ev.record("target calls, target alone (32 tokens, 8 prompts in one batch)", r["target alone calls"], key=False)
    ev.record("distinct tokens per generated row (summed over 8 rows)", r["distinct"], key=False)
    for name in ("trained draft, k=2", "trained draft, k=4", "untrained draft, k=4"):
        x = r[name]
        ev.record(f"prompts with the target's exact tokens, {name}", f"{x['same']} / {n}", expect="all")
        ev.record(f"target passes per generated token, {name}", x["passes_per_token"], expect="< 1 (1 = target alone)")
        ev.record(f"acceptance rate (kept / drafted), {name}", x["acceptance"], key=False)
        ev.record(f"α, Leviathan's per-proposal acceptance (kept / judged), {name}", x["alpha"],
                  expect="≥ kept / drafted: proposals after a rejection are never judged")
        ev.record(f"tokens per target pass, {name}", x["tokens_per_pass"], key=False)
        ev.record(f"Leviathan Eq. 1 at the measured alpha, (1 − α^(k+1))/(1 − α), {name}",
                  (1 - x["alpha"] ** (x["k"] + 1)) / (1 - x["alpha"]) if x["alpha"] < 1 else x["k"] + 1, key=False)
        ev.record(f"target calls / draft calls, {name}", f"{x['calls']} / {x['draft_calls']}", key=False)
        assert x["same"] == n
    ev.record("prompts with the target's exact tokens, NO cache rollback", f"{r['no rollback']['same']} / {n}",
              expect="fewer: rejected drafts stay visible")
    ev.record("wrong tokens, NO cache rollback", r["no rollback"]["wrong tokens"])
    # over seeds 100-139 the trained draft with k=4 needed 0.28 ± 0.07 target passes per token (max 0.49); the
    # untrained draft 0.84 ± 0.21 (it does well only where the target repeats a token it happens to propose), and the
    # missing rollback changed 23 ± 35 tokens (0 on some seeds: a stale entry need not flip a greedy argmax), so
    # those two arms are recorded, not asserted; tests/test_speculative.py checks the rollback on a fixed case.
    # 20 random seeds (rng 2027): 0.29 ± 0.09, but one seed at 0.625 (a draft that trained poorly): the bound 0.8
    # (5.6 sd) still says "well under the target alone's 1"
    assert r["trained draft, k=4"]["passes_per_token"] < 0.8
# --8<-- [end:test_greedy]


def _plot_tv(ev, r: dict):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4), constrained_layout=True)
    style = {"exact": ("min(1, p/q) rule", "o-"), "argmax": ("argmax-agrees rule", "s-"),
             "target alone": ("target alone", "^--")}
    for name, (label, fmt) in style.items():
        ax.loglog(DRAWS, r["curves"][name], fmt, label=label)
    ax.loglog(DRAWS, [r["curves"]["target alone"][0] * math.sqrt(DRAWS[0] / n) for n in DRAWS], ":", color="grey",
              label="∝ 1/√N")
    ax.axhline(r["tv_exact"]["argmax"], color="C1", lw=0.8, ls="--", label="argmax rule's exact bias")
    ax.set(xlabel="draws N", ylabel="TV(empirical, exact target)")
    ax.legend(fontsize=8)
    ev.figure(fig, "tv", "Total variation between the empirical distribution of N sampled 3-token continuations "
              "and the target's exact distribution (64 outcomes).")


# --8<-- [start:test_sampling]
@pytest.mark.claim("C-SPEC-1", "confirmed")
def test_speculative_sampling_draws_from_the_target_distribution(ev, seed):
    """Exact, on these models: the distribution the min(1, p/q) rule produces, computed by enumeration, equals the
    target's to float precision. Sampled by the module, its empirical distribution approaches the target's as fast
    as sampling from the target alone (TV ∝ 1/√N). Would be refuted by an enumerated TV above float error, or a
    sampled TV that stops shrinking or stays clearly above the target-alone sampler's."""
    r = sampling_run(seed)
    ex, alone = r["curves"]["exact"], r["curves"]["target alone"]
    ev.record("TV(exact-rule distribution, target distribution), both computed exactly", r["tv_exact"]["exact"],
              expect="0 (float error)")
    ev.record("total probability of the enumerated distributions (target, exact rule, argmax rule)",
              list(r["total"].values()), expect="1 each", key=False)
    ev.record("TV at N = 125, 500, 2000, 8000, min(1, p/q) rule", ex, expect="shrinking like 1/√N")
    ev.record("TV at the same N, target alone", alone, expect="the same noise level")
    ev.record("TV at N = 8000, min(1, p/q) rule / target alone", ex[-1] / alone[-1], expect="about 1")
    ev.record("TV shrink from N = 125 to 8000, min(1, p/q) rule", ex[0] / ex[-1], expect="about √64 = 8")
    ev.record("acceptance rate, min(1, p/q) rule", r["stats"]["exact"].acceptance_rate)
    ev.record("TV(p, q) of the first token: what a rejection has to correct", r["tv_p_q"], key=False)
    _plot_tv(ev, r)
    assert r["tv_exact"]["exact"] < 1e-9
    # THRESHOLDS: see the seed report
    assert ex[0] / ex[-1] > 3 and ex[-1] / alone[-1] < 2
# --8<-- [end:test_sampling]


# --8<-- [start:test_folk]
@pytest.mark.claim("C-FOLK-17", "refuted")
def test_accepting_when_the_argmax_agrees_biases_sampling(ev, seed):
    """The folk rule (keep a drafted token when it is the target's argmax, else draw from the target): its exact
    distribution, enumerated like the correct rule's, differs from the target's; sampled, its TV to the target
    levels off at that bias while its TV to its own enumerated distribution keeps shrinking. Would be refuted by an
    enumerated bias at the level of float error, as the correct rule's is."""
    r = sampling_run(seed)
    folk = r["curves"]["argmax"]
    ev.record("TV(argmax-rule distribution, target distribution), both computed exactly", r["tv_exact"]["argmax"],
              expect="> 0: the bias")
    ev.record("bias of the first token alone, closed form q(a)(1 − p(a))", r["first_token_bias"],
              expect="≤ the 3-token bias")
    ev.record("TV at N = 125, 500, 2000, 8000, argmax-agrees rule", folk, expect="levels off at the bias")
    ev.record("TV at N = 125, 500, 2000, 8000, argmax-agrees rule vs its own enumerated distribution",
              r["curves"]["argmax vs its own"], expect="shrinking: the sampler does what was enumerated", key=False)
    ev.record("acceptance rate, argmax-agrees rule", r["stats"]["argmax"].acceptance_rate, key=False)
    ev.record("TV to p of the first token when a rejection redraws from p, closed form", r["resample_p_bias"],
              expect="> 0: accepted mass min(p, q) is counted twice")
    # exact identity: min(p,q) + (1 − β)p − p = min(p,q) − βp, zero only when q = p on p's support, i.e. TV(p,q) = 0
    assert (r["resample_p_bias"] > 1e-6) == (r["tv_p_q"] > 1e-6)
    # a marginal's TV never exceeds the joint's (both computed in float32: equal to rounding when the later tokens
    # add no bias, as on one of 20 random seeds)
    assert r["tv_exact"]["argmax"] >= r["first_token_bias"] - 1e-6
    # THRESHOLDS: see the seed report
    assert r["tv_exact"]["argmax"] > 1e-4 > 1e5 * r["tv_exact"]["exact"]
# --8<-- [end:test_folk]

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Multi-token prediction: a t+2 module as the draft of self-speculative decoding
#
# Proofs for `docs/inference/multi-token-prediction.md`. The model is the shared `DecoderLM`; the extra module is
# `proofs/transformer/mtp.py` (DeepSeek-V3's sequential MTP module at depth 1, its Transformer block replaced by a
# feed-forward block). It is trained with the LM (loss = next-token CE + 0.3 · MTP CE) on a first-order Markov
# chain (`proofs.tasks.markov_task`), where the token after next is partly predictable. The draft is `MTPDraft`,
# handed unchanged to `speculative_generate` from `proofs/transformer/speculative.py` (proved lossless on
# [its own page](speculative-decoding.md)). The switches: the draft (MTP module, an independent t+2 head without
# the next token's embedding, a unigram draft, a random draft) and the MTP loss (on or off at equal steps).
# Run: `pytest proofs/inference/proof_mtp.py`.

# %%
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from proofs.tasks import markov_table, markov_task
from proofs.train import fixed_batches, train
from proofs.transformer import DecoderLM, TransformerConfig
from proofs.transformer.config import ConfigError
from proofs.transformer.mtp import MTPDraft, MTPLM, MTPModule, mtp_extra_loss
from proofs.transformer.speculative import speculative_generate, target_generate

V, T_TRAIN, BATCH, STEPS, LR = 16, 24, 16, 120, 3e-3  # vocabulary, training length, batch, Adam steps, peak rate
WEIGHT = 0.3  # the MTP loss weight λ (our choice; DeepSeek-V3 §2.2 multiplies the MTP loss by a weight λ)
PROMPTS, PROMPT_LEN, NEW = 8, 6, 32  # decoding: rows, prompt length, new tokens


def config() -> TransformerConfig:
    return TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=128, dropout_emb=0.0,
                             dropout_residual=0.0)


# %% [markdown]
# ## 1. Three arms trained on the same batches from the same initial LM
#
# `none` is the LM alone; `mtp` adds the DeepSeek-style module (it sees the trunk state at t and the embedding of
# x_{t+1}); `independent` adds the same module without the embedding input: a head on the trunk alone, Gloeckle
# et al.'s design, which must guess x_{t+2} without knowing x_{t+1}. Equal steps, equal batches, the LM's
# initial weights identical in all three (the module is built after the LM, from another seed).

# %%
# --8<-- [start:arms]
@functools.cache
def arms(seed: int) -> dict:
    batches = fixed_batches(markov_task, seed, BATCH, T_TRAIN, V)
    out = {}
    for name in ("none", "mtp", "independent"):
        torch.manual_seed(seed)
        lm = DecoderLM(config())
        if name == "none":
            train(lm, batches, STEPS, lr=LR)
            out[name] = (lm, None)
            continue
        torch.manual_seed(seed + 10_000)
        model = MTPLM(lm, MTPModule(lm, use_next_embedding=(name == "mtp")))
        train(model, batches, STEPS, lr=LR, extra_loss=mtp_extra_loss(WEIGHT))
        out[name] = (lm, model.mtp)
    g = torch.Generator().manual_seed(seed + 20_000)
    out["held-out"] = markov_task(g, 64, T_TRAIN, V)  # (x, y) the chain's text, never trained on
    out["prompts"] = markov_task(g, PROMPTS, PROMPT_LEN, V)[0]
    counts = torch.bincount(torch.cat([batches(s)[1].reshape(-1) for s in range(STEPS)]), minlength=V)
    out["unigram"] = int(counts.argmax())  # the most frequent training token
    return out
# --8<-- [end:arms]


# %% [markdown]
# ## 2. Control drafts, and the decode
#
# Two drafts that ignore the model: the most frequent training token every time (unigram), and a uniformly random
# token. Everything is cast to float64 for decoding so that the identity with the target's greedy tokens is not
# blurred by rounding. Counted per arm: rows with exactly the target's tokens, target passes per generated token
# (each row needs one per round; 1 = the target alone), and the acceptance rate (kept / drafted, k = 1).
# The teacher-forced agreement is the same acceptance test on held-out chain text instead of the model's own
# greedy output: is the draft's argmax at j the target's argmax at j?

# %%
# --8<-- [start:decode]
class FixedDraft:
    """A draft that ignores the text: proposes `token` every time (unigram), or a uniform random token."""

    def __init__(self, cfg, token: int | None = None, seed: int = 0):
        self.cfg, self.token, self.g = cfg, token, torch.Generator().manual_seed(seed)
        self.decoder = SimpleNamespace(new_cache=lambda: [{"self": _NoCut(), "cross": None}])  # nothing to roll back

    def __call__(self, ids, cache=None, positions=None):
        B, P = ids.shape
        if self.token is None:
            return torch.rand(B, P, self.cfg.vocab_size, generator=self.g, dtype=torch.float64)
        return torch.nn.functional.one_hot(torch.full((B, P), self.token), self.cfg.vocab_size).double()


class _NoCut:
    def truncate(self, lengths):
        pass


@torch.no_grad()
def teacher_forced_agreement(lm, mtp, x) -> float:
    """Share of held-out positions j >= 1 where the module's argmax (from h_{j-1}, x_j) equals the LM's (from h_j)."""
    from proofs.transformer.mtp import shift_states

    h = lm.decoder(lm.embed(x))
    main = lm.head(h).argmax(-1)  # (B, T) the target's choice of x_{j+1}
    draft = lm.head(mtp(shift_states(h), lm.embed.tok(x))).argmax(-1)  # (B, T) the module's guess of x_{j+1}
    return (main[:, 1:] == draft[:, 1:]).double().mean().item()


@functools.cache
def decode_run(seed: int) -> dict:
    a = arms(seed)
    prompts, out = a["prompts"], {}
    for name in ("mtp", "independent"):
        lm, mtp = a[name]
        lm, mtp = lm.double().eval(), mtp.double().eval()
        ref, _ = target_generate(lm, prompts, NEW)
        drafts = {name: None, "unigram": FixedDraft(lm.cfg, a["unigram"]), "random": FixedDraft(lm.cfg, None, seed)}
        for dname, draft in drafts.items():
            d = MTPDraft(lm, mtp) if draft is None else draft
            try:
                ids, st = speculative_generate(lm, d, prompts, NEW, k=1)
            finally:
                if draft is None:
                    d.close()
            out[(name, dname)] = {"same": int((ids == ref).all(1).sum()), "acceptance": st.acceptance_rate,
                                  "passes_per_token": st.row_rounds / (PROMPTS * NEW),
                                  "draft_trunk_passes": getattr(d, "trunk_passes", 0)}
        x = a["held-out"][0]
        out[(name, "teacher-forced")] = teacher_forced_agreement(lm, mtp, x.clone())
        uni = lm.head(lm.decoder(lm.embed(x))).argmax(-1)[:, 1:]
        out[(name, "teacher-forced unigram")] = (uni == a["unigram"]).double().mean().item()
        lm.float(), mtp.float()
    return out
# --8<-- [end:decode]


# %% [markdown]
# ## 3. Next-token loss with and without the MTP loss
#
# Held-out next-token cross-entropy of the three LMs after the same 120 steps on the same batches, beside the true
# chain's cross-entropy on the same text (`markov_table`): the best any model can do in expectation.

# %%
# --8<-- [start:loss]
def heldout_losses(seed: int) -> dict:
    a = arms(seed)  # outside no_grad: the first call trains the arms
    x, y = a["held-out"]
    out = {}
    with torch.no_grad():
        for name in ("none", "mtp", "independent"):
            lm = a[name][0].eval()
            out[name] = torch.nn.functional.cross_entropy(lm(x).reshape(-1, V), y.reshape(-1)).item()
        out["floor"] = -markov_table(V)[x, y].log().mean().item()  # the true chain's own cross-entropy on this text
    return out
# --8<-- [end:loss]


# %%
if __name__ == "__main__":
    print(decode_run(0))
    print(heldout_losses(0))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_lossless]
@pytest.mark.claim("C-MTP-1", "confirmed")
def test_mtp_self_speculation_returns_the_targets_greedy_tokens(ev, seed):
    """An identity of the decoder, not evidence about MTP: the verifier keeps a drafted token only if it is the
    target's argmax, so any draft (the MTP module, an independent head, a unigram or random guess) gives the
    target's own greedy tokens. Checked in float64 on 8 prompts x 32 tokens for both trained modules and both
    control drafts. A single differing token would refute the 'lossless' half of the claim."""
    r = decode_run(seed)
    for name in ("mtp", "independent"):
        for dname in (name, "unigram", "random"):
            ev.record(f"rows with the target's exact greedy tokens, {name} LM, draft = {dname}",
                      f"{r[(name, dname)]['same']} / {PROMPTS}", expect="all")
            assert r[(name, dname)]["same"] == PROMPTS
    ev.record("trunk passes the MTP draft ran itself (the prompt's prefill, once)", r[("mtp", "mtp")]["draft_trunk_passes"],
              expect="1: every later draft reads the target's own hidden states")
    assert r[("mtp", "mtp")]["draft_trunk_passes"] == 1
# --8<-- [end:test_lossless]


# --8<-- [start:test_acceptance]
@pytest.mark.claim("C-MTP-1", "confirmed")
def test_mtp_draft_is_accepted_often_and_saves_target_passes(ev, seed):
    """The speed-up mechanism, measured: the MTP module's guess of the token after next is kept far more often than a
    random guess, so fewer target passes are needed per token (k = 1: between 1/2 and 1); on held-out text it agrees
    with the model's own choice far more often than a unigram guess, and more often than the same module without
    the next token's embedding (an independent head). Would be refuted if the module's acceptance were not clearly
    above the controls', or if the passes per token stayed near 1."""
    r = decode_run(seed)
    for dname in ("mtp", "independent", "unigram", "random"):
        lm = "mtp" if dname in ("mtp", "unigram", "random") else "independent"
        x = r[(lm, dname)]
        ev.record(f"acceptance rate of the drafted token, draft = {dname}", x["acceptance"],
                  key=dname in ("mtp", "unigram"))
        ev.record(f"target passes per generated token, draft = {dname}", x["passes_per_token"],
                  expect="1 / (1 + acceptance); 1 = the target alone")
    tf = {d: r[("mtp", "teacher-forced")] if d == "mtp" else r[("independent", "teacher-forced")] if d == "independent"
          else r[("mtp", "teacher-forced unigram")] for d in ("mtp", "independent", "unigram")}
    ev.record("teacher-forced agreement with the target's argmax on held-out text, MTP module", tf["mtp"])
    ev.record("teacher-forced agreement, independent head (no x_{t+1} embedding)", tf["independent"])
    ev.record("teacher-forced agreement, unigram draft", tf["unigram"])
    m, u, z = r[("mtp", "mtp")], r[("mtp", "unigram")], r[("mtp", "random")]
    ev.record("greedy acceptance: MTP module minus random draft", m["acceptance"] - z["acceptance"], key=False)
    ev.record("greedy acceptance: MTP module minus unigram draft", m["acceptance"] - u["acceptance"], key=False,
              expect="> 0 on most seeds; not asserted: greedy cycles of the chain can run through the commonest token")
    ev.record("teacher-forced agreement: MTP module minus unigram", tf["mtp"] - tf["unigram"], key=False)
    ev.record("teacher-forced agreement: MTP module minus independent head", tf["mtp"] - tf["independent"], key=False)
    # THRESHOLDS, seeds 100-139 (40 seeds, recorded in bench/seeds): greedy acceptance MTP 0.995 ± 0.008 (min 0.970),
    # random 0.059 ± 0.014 (max 0.099), unigram 0.55 ± 0.18 (0.22 to 0.92: the greedy decode of a Markov chain falls
    # into short cycles, and on some seeds the commonest token is on them, so MTP minus unigram, 0.44 ± 0.19, min
    # 0.07, is recorded, not asserted); target passes per token with the MTP draft 0.502 ± 0.003 (max 0.512).
    # Differences per seed: greedy MTP - random 0.936 ± 0.017 (min 0.901; bound 0.5, 26 sd); teacher-forced MTP -
    # unigram 0.747 ± 0.021 (min 0.700; bound 0.4, 16 sd); teacher-forced MTP - independent head 0.307 ± 0.024
    # (min 0.255; bound 0.1, 8.8 sd). Passes per token: bound 0.6, 30 sd above the mean.
    assert m["acceptance"] - z["acceptance"] > 0.5
    assert m["passes_per_token"] < 0.6
    assert tf["mtp"] - tf["unigram"] > 0.4
    assert tf["mtp"] - tf["independent"] > 0.1
# --8<-- [end:test_acceptance]


# --8<-- [start:test_loss]
@pytest.mark.claim("C-MTP-1", "confirmed")
def test_next_token_loss_with_and_without_the_mtp_loss(ev, seed):
    """Gloeckle et al. and DeepSeek-V3 report that the MTP loss helps the next-token model at scale; on this toy we
    only measure it, at equal steps: held-out next-token loss of the LM trained with and without it. A two-sided
    guard: a gap beyond it (a clear gain or a clear cost on this toy) would change what the page says."""
    L = heldout_losses(seed)
    ev.record("held-out next-token loss, LM alone (nats)", L["none"])
    ev.record("held-out next-token loss, LM + MTP module loss", L["mtp"])
    ev.record("held-out next-token loss, LM + independent t+2 head loss", L["independent"])
    ev.record("the true chain's cross-entropy on the same text", L["floor"])
    ev.record("MTP minus alone", L["mtp"] - L["none"], key=True)
    ev.record("independent head minus alone", L["independent"] - L["none"])
    # seeds 100-139 (40): MTP minus alone -0.0004 ± 0.0042 nats (min -0.017, max +0.008); independent head minus
    # alone +0.002 ± 0.003 (max +0.010). The guard, 0.05 nats, is 12 sd and three times the largest observed gap:
    # the extra loss neither helps nor hurts this toy measurably, which is what the page reports.
    assert abs(L["mtp"] - L["none"]) < 0.05
# --8<-- [end:test_loss]


def test_bad_mtp_settings_raise_config_error(ev, seed):
    """A negative loss weight, a model without a trunk, and asking one module for two drafted tokens per round each
    raise ConfigError naming the fix (recorded, so that the site's evidence covers every test of this file)."""
    lm = DecoderLM(config()).eval()
    mtp = MTPModule(lm).eval()
    prompts = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(seed))

    def two_drafts():
        with MTPDraft(lm, mtp) as d:
            speculative_generate(lm, d, prompts, 4, k=2)

    cases = {"loss weight -1": (lambda: mtp_extra_loss(-1.0), "weight"),
             "a module on an nn.Linear": (lambda: MTPModule(torch.nn.Linear(2, 2)), "DecoderLM"),
             "speculative_generate with k = 2": (two_drafts, "k=1")}
    for name, (call, match) in cases.items():
        with pytest.raises(ConfigError, match=match) as err:
            call()
        ev.record(name, str(err.value), key=False)
    assert not lm.decoder._forward_hooks  # the draft removed its hook on the way out

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why LayerNorm and not BatchNorm?
#
# Proofs for `docs/normalisation/layernorm-vs-batchnorm.md`. One switch of the shared model:
# `norm` = "layer" (each token over its d_model features) or "batch" (each feature over every
# token of the batch, padding included), and `norm="none"` for the scale measurements.
# Run: `pytest proofs/normalisation/proof_layernorm_vs_batchnorm.py`.

# %%
from __future__ import annotations

import torch

from proofs.tasks import padded_batch, reverse_task
from proofs.train import accuracy, fixed_batches, token_loss, train
from proofs.transformer import EncoderTagger, TransformerConfig

VOCAB, T = 16, 12


def model(norm: str, seed: int, n_layers: int = 2) -> EncoderTagger:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=64, n_heads=4, d_ff=128, n_layers=n_layers, norm=norm,
                            dropout_emb=0.0, dropout_residual=0.0)
    return EncoderTagger(cfg)


# %% [markdown]
# ## 1. One sentence, three different batches
#
# Sentence A (8 real tokens) is run in three batches: alone, with three full-length batch-mates,
# and with three batch-mates that are mostly padding. Its outputs at its own 8 positions are
# compared. The padding mask is passed, so attention ignores padding in every case; only the
# normalisation can let the batch-mates in.

# %%
# --8<-- [start:batchmates]
def batchmate_drift(norm: str, seed: int) -> dict:
    """Largest change of A's outputs (its real positions) across the three batches, in train and eval mode."""
    m = model(norm, seed)
    g = torch.Generator().manual_seed(seed)
    a, a_pad = padded_batch(g, [8], T, VOCAB)
    full, full_pad = padded_batch(g, [T, T, T], T, VOCAB)
    short, short_pad = padded_batch(g, [2, 3, 2], T, VOCAB)
    batches = [(a, a_pad), (torch.cat([a, full]), torch.cat([a_pad, full_pad])),
               (torch.cat([a, short]), torch.cat([a_pad, short_pad]))]
    out = {}
    for mode in ("train", "eval"):
        m.train(mode == "train")
        with torch.no_grad():
            ys = [m(ids, pad)[0, :8] for ids, pad in batches]  # A's logits at its real tokens
        out[mode] = max((y - ys[0]).abs().max().item() for y in ys[1:])
    return out
# --8<-- [end:batchmates]


def running_stats_drift(seed: int) -> float:
    """Eval-mode BatchNorm uses running statistics: fit them on padded vs unpadded batches, compare A's outputs."""
    outs = []
    for lengths in ([T] * 8, [3] * 8):  # the same model, its running stats updated on two kinds of batch
        m = model("batch", seed)
        g = torch.Generator().manual_seed(seed + 1)
        m.train()
        with torch.no_grad():
            for _ in range(20):
                ids, pad = padded_batch(g, lengths, T, VOCAB)
                m(ids, pad)
        m.eval()
        a, a_pad = padded_batch(torch.Generator().manual_seed(seed + 2), [8], T, VOCAB)
        with torch.no_grad():
            outs.append(m(a, a_pad)[0, :8])
    return (outs[0] - outs[1]).abs().max().item()


# %% [markdown]
# ## 2. Which axis does LayerNorm normalise?

# %%
# --8<-- [start:axis]
def layernorm_axis(seed: int) -> dict:
    """Statistics of the shared model's LayerNorm output, and what changing another token does to it."""
    torch.manual_seed(seed)
    ln = model("layer", seed).encoder.layers[0].sub_attn.norm  # nn.LayerNorm(d_model), weight 1, bias 0
    x = torch.randn(4, T, 64) * 3 + 1
    y = ln(x)
    x2 = x.clone()
    x2[:, 5] = torch.randn(4, 64) * 10  # change token 5 of every sentence
    y2 = ln(x2)
    sentence = torch.nn.functional.layer_norm(x, (T, 64))  # the folk version: over the whole sentence
    sentence2 = torch.nn.functional.layer_norm(x2, (T, 64))
    others = [t for t in range(T) if t != 5]
    return {
        "token_mean": y.mean(-1).abs().max().item(),  # per token, over features
        "token_var_err": (y.var(-1, unbiased=False) - 1).abs().max().item(),
        "feature_mean_over_sentence": y.mean(1).abs().max().item(),  # per feature, over the sentence: not 0
        "other_tokens_change": (y2[:, others] - y[:, others]).abs().max().item(),
        "sentence_norm_other_tokens_change": (sentence2[:, others] - sentence[:, others]).abs().max().item(),
    }
# --8<-- [end:axis]


# %% [markdown]
# ## 3. Scale through depth, learning rate, and BatchNorm's noise

# %%
# --8<-- [start:scale]
def scale_through_depth(norm: str, n_layers: int, seed: int) -> dict:
    """Activation std after the last layer and gradient norm of the first layer's FFN, at initialisation."""
    m = model(norm, seed, n_layers=n_layers)
    x, y = reverse_task(torch.Generator().manual_seed(seed), 32, 10, VOCAB)
    h = m.encoder(m.embed(x))  # (B, T, C) after the last layer (Post-LN: no final norm)
    token_loss(m.head(h), y).backward()
    return {"act_std": h.std().item(), "grad_first": m.encoder.layers[0].ffn.lin1.weight.grad.norm().item()}
# --8<-- [end:scale]


def trained_reverse(norm: str, seed: int, lr: float, batch: int = 32, steps: int = 200) -> EncoderTagger:
    m = model(norm, seed)
    train(m, fixed_batches(reverse_task, 100 + seed, batch, 10, VOCAB), steps, lr=lr)
    return m


def eval_accuracies(m: EncoderTagger, seed: int) -> dict:
    """Accuracy with running statistics (eval); and how far the logits move when the same sentences are
    normalised with the batch statistics of one sentence at a time (train mode: BatchNorm's noise)."""
    x, y = reverse_task(torch.Generator().manual_seed(10_000 + seed), 256, 10, VOCAB)
    eval_acc = accuracy(m, x, y)
    with torch.no_grad():
        eval_logits = m(x[:64])
        m.train()  # batch statistics; dropout is 0 in this model, so only the norm differs
        one = torch.cat([m(x[i : i + 1]) for i in range(64)])
        m.eval()
    return {
        "eval": eval_acc,
        "batch_of_1_acc": (one.argmax(-1) == y[:64]).float().mean().item(),
        "batch_of_1_logit_shift": (one - eval_logits).abs().mean().item(),
    }


# %%
if __name__ == "__main__":
    for norm in ("layer", "batch"):
        print(norm, batchmate_drift(norm, 0))
    print(layernorm_axis(0))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_batchmates]
@pytest.mark.claim("C-LN-1", "confirmed")
def test_batchnorm_output_depends_on_batchmates_and_padding(ev, seed):
    """Under BatchNorm a sentence's outputs move with its batch-mates and their padding; under LayerNorm they do not."""
    ln, bn = batchmate_drift("layer", seed), batchmate_drift("batch", seed)
    ev.record("LayerNorm: max change of A's logits across batches (train)", ln["train"], expect="0 (float noise)")
    ev.record("BatchNorm: max change of A's logits across batches (train)", bn["train"], expect="clearly > 0")
    ev.record("BatchNorm: same, in eval mode", bn["eval"], expect="0: running statistics are fixed")
    drift = running_stats_drift(seed)
    ev.record("BatchNorm eval: change of A's logits, running stats from padded vs full batches", drift,
              expect="> 0: padding leaks in through the running statistics")
    assert ln["train"] < 1e-4 and bn["eval"] < 1e-4
    assert bn["train"] > 0.1
    assert drift > 0.1
# --8<-- [end:test_batchmates]


@pytest.mark.claim("C-FOLK-9", "refuted")
def test_layernorm_normalises_each_token_over_features(ev, seed):
    """LayerNorm in the Transformer normalises each token over d_model, not the sentence."""
    r = layernorm_axis(seed)
    ev.record("max |mean| of a token's features after LN", r["token_mean"], expect="0")
    ev.record("max |var − 1| of a token's features after LN", r["token_var_err"], expect="0")
    ev.record("max |mean| of a feature over the sentence after LN", r["feature_mean_over_sentence"], expect="not 0")
    ev.record("change of other tokens when token 5 changes (LN)", r["other_tokens_change"], expect="0")
    ev.record("same, normalising over the whole sentence", r["sentence_norm_other_tokens_change"], expect="> 0")
    assert r["token_mean"] < 1e-5 and r["token_var_err"] < 1e-3
    assert r["feature_mean_over_sentence"] > 0.1
    assert r["other_tokens_change"] == 0.0
    assert r["sentence_norm_other_tokens_change"] > 0.1


@pytest.mark.claim("C-LN-2", "nuanced")
def test_layernorm_keeps_scale_through_depth(ev, seed):
    """Without a norm, activations and gradients grow with depth; with LayerNorm they stay of order 1."""
    import matplotlib.pyplot as plt

    depths = [2, 4, 8, 12]
    rows = {norm: [scale_through_depth(norm, L, seed) for L in depths] for norm in ("layer", "none")}
    fig, ax = plt.subplots(1, 2, figsize=(8, 3))
    for norm, style in (("layer", "o-"), ("none", "s--")):
        ax[0].semilogy(depths, [r["act_std"] for r in rows[norm]], style, label=f"norm={norm}")
        ax[1].semilogy(depths, [r["grad_first"] for r in rows[norm]], style, label=f"norm={norm}")
    ax[0].set(title="activation std after the last layer", xlabel="layers")
    ax[1].set(title="gradient norm, first layer's FFN", xlabel="layers")
    ax[0].legend()
    fig.tight_layout()
    ev.figure(fig, "depth", "Post-LN stack at initialisation, with and without LayerNorm.")
    for norm in ("layer", "none"):
        ev.record(f"activation std at 12 layers, norm={norm}", rows[norm][-1]["act_std"])
        ev.record(f"first-layer gradient norm at 12 layers, norm={norm}", rows[norm][-1]["grad_first"])
    assert all(0.5 < r["act_std"] < 2 for r in rows["layer"])
    assert rows["none"][-1]["act_std"] > 20 * rows["layer"][-1]["act_std"]
    assert rows["none"][-1]["grad_first"] > 100 * rows["layer"][-1]["grad_first"]


# --8<-- [start:test_lr]
@pytest.mark.claim("C-LN-4", "nuanced")
def test_batchnorm_learning_rate_and_its_noise(ev, seed):
    """At lr 1e-2 the BatchNorm model trains where the Post-LN LayerNorm model stalls. BatchNorm's noise is real
    (the logits move when one sentence supplies the statistics); LayerNorm has none."""
    seeds = [seed, seed + 1, seed + 2]
    runs = {norm: [trained_reverse(norm, s, lr=1e-2) for s in seeds] for norm in ("layer", "batch")}
    acc = {norm: [eval_accuracies(m, s) for m, s in zip(runs[norm], seeds)] for norm in runs}
    ev.record("reverse accuracy at lr 1e-2, LayerNorm (3 seeds)", [a["eval"] for a in acc["layer"]])
    ev.record("reverse accuracy at lr 1e-2, BatchNorm (3 seeds)", [a["eval"] for a in acc["batch"]])
    ev.record("BatchNorm: mean logit shift, one-sentence batch statistics vs running (3 seeds)",
              [a["batch_of_1_logit_shift"] for a in acc["batch"]], expect="> 0: the batch noise")
    ev.record("LayerNorm: same (3 seeds)", [a["batch_of_1_logit_shift"] for a in acc["layer"]], expect="0: no batch noise")
    ev.record("BatchNorm accuracy with one-sentence statistics (3 seeds)", [a["batch_of_1_acc"] for a in acc["batch"]],
              expect="compare with its eval accuracy")
    assert min(a["eval"] for a in acc["batch"]) - max(a["eval"] for a in acc["layer"]) > 0.5
    assert all(a["batch_of_1_logit_shift"] > 0.05 for a in acc["batch"])
    assert all(a["batch_of_1_logit_shift"] < 1e-5 for a in acc["layer"])
# --8<-- [end:test_lr]

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why attention instead of recurrence? Do RNN gradients vanish?
#
# Proofs for the page `docs/training/rnn-vs-attention.md`. The same measurement for every
# sequence model: the gradient that a readout of the LAST output sends back to the input
# at each earlier position, as a function of the distance between them. The models are
# `torch.nn` recurrences (tanh RNN, LSTM, GRU) and the causal stack of the shared
# `DecoderLM` (`proofs/transformer/`). Then a task whose answer is the first token of the
# sequence, asked for at the last position.
# Run it with `pytest proofs/training/proof_rnn_vs_attention.py`, or open it as a notebook
# with `jupytext --to notebook proofs/training/proof_rnn_vs_attention.py`.

# %%
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from proofs.tasks import random_tokens
from proofs.train import accuracy, fixed_batches, train
from proofs.transformer import DecoderLM, TransformerConfig

D, T = 64, 64  # width of every model and sequence length of the gradient measurements
FORGET_BIAS = 3.0  # the "remembering" LSTM: sigmoid(3) ≈ 0.95 keeps 95 % of its cell per step at initialisation
GAINS = (0.5, 1.0, 2.0, 4.0)  # scales of the tanh RNN's recurrent matrix, W_hh ~ N(0, gain²/d)


# %% [markdown]
# ## 1. Every model as a map from input vectors to output vectors
#
# Each model takes (B, T, d) input vectors and returns (B, T, d) outputs, causally: output t sees
# inputs 0..t. The recurrences start from PyTorch's own initialisation, except where a variant
# changes one thing (the LSTM's forget-gate bias, the RNN's recurrent scale). The attention model
# is the decoder stack of the shared `DecoderLM` (Post-LN, 2 layers, 4 heads, its own initialisation)
# with the sinusoidal positions added to the inputs, as its embedding layer would.

# %%
# --8<-- [start:models]
def recurrence(kind: str, d: int = D, forget_bias: float | None = None, gain: float | None = None) -> nn.Module:
    """nn.RNN (tanh), nn.LSTM or nn.GRU, one layer, hidden size d, PyTorch's initialisation unless told."""
    rnn = {"tanh RNN": nn.RNN, "LSTM": nn.LSTM, "GRU": nn.GRU}[kind](d, d, batch_first=True)
    with torch.no_grad():
        if forget_bias is not None:  # LSTM gates are stacked (input, forget, cell, output): rows d..2d are forget
            rnn.bias_ih_l0[d:2 * d] = forget_bias
            rnn.bias_hh_l0[d:2 * d] = 0.0
        if gain is not None:
            rnn.weight_hh_l0.normal_(0.0, gain / math.sqrt(d))
    return rnn


class Attention(nn.Module):
    """The causal decoder stack of the shared DecoderLM, fed input vectors plus sinusoidal positions."""

    def __init__(self, d: int = D, n_layers: int = 2, max_len: int = 256):
        super().__init__()
        cfg = TransformerConfig(vocab_size=8, d_model=d, n_heads=4, d_ff=2 * d, n_layers=n_layers, max_len=max_len,
                                dropout_emb=0.0, dropout_residual=0.0)
        lm = DecoderLM(cfg)
        self.embed, self.decoder = lm.embed, lm.decoder  # the token table is not used: inputs are vectors

    def forward(self, x: Tensor) -> tuple[Tensor, None]:  # returns a pair, like the torch.nn recurrences
        return self.decoder(x + self.embed.positions(x.shape[1]).to(x.dtype)), None


def models(seed: int, d: int = D) -> dict[str, nn.Module]:
    torch.manual_seed(seed)
    return {
        "tanh RNN": recurrence("tanh RNN", d),
        "LSTM": recurrence("LSTM", d),
        "GRU": recurrence("GRU", d),
        f"LSTM, forget bias {FORGET_BIAS:g}": recurrence("LSTM", d, forget_bias=FORGET_BIAS),
        "attention (shared DecoderLM)": Attention(d),
    }
# --8<-- [end:models]


# %% [markdown]
# ## 2. The gradient against distance
#
# A random linear readout u·y_{T−1} of the last output; its gradient with respect to the input at
# position t, averaged over a batch, indexed by the distance T−1−t. Float64, so that a vanishing
# gradient shows as a tiny number instead of an underflow to 0.

# %%
# --8<-- [start:gradient]
def gradient_by_distance(model: nn.Module, seed: int, length: int = T, batch: int = 32, d: int = D) -> Tensor:
    """g[k] = mean over the batch of ‖∂(u·y_{T-1}) / ∂x_{T-1-k}‖, k = 0 … T-1 (model at initialisation)."""
    model = model.double().eval()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, d, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(batch, d, generator=g, dtype=torch.float64)
    y, _ = model(x)  # (B, T, d)
    (y[:, -1] * u).sum().backward()
    return x.grad.norm(dim=-1).mean(0).flip(0)  # index = distance from the last position


def per_step_factor(g: Tensor, start: int = 1, stop: int = 24) -> float:
    """exp of the slope of log g over distances start … stop: the factor the gradient keeps per step back."""
    k = torch.arange(start, stop + 1, dtype=torch.float64)
    logs = g[start:stop + 1].log()
    slope = ((k - k.mean()) * (logs - logs.mean())).sum() / ((k - k.mean()) ** 2).sum()
    return slope.exp().item()
# --8<-- [end:gradient]


# %% [markdown]
# ## 3. A task whose answer is far away
#
# Input: `length` random tokens; target, at the last position only: the token `distance` positions
# back (`distance = length − 1` is the first token). Each model embeds the tokens, runs, and predicts
# from its last output. Same batches, same optimiser, same budget for every model.

# %%
# --8<-- [start:task]
def token_back(distance: int):
    """A task in the style of proofs/tasks.py: target (B, 1) = the input `distance` positions before the last."""

    def task(g: torch.Generator, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
        x = random_tokens(g, batch, length, vocab)
        return x, x[:, length - 1 - distance:length - distance]

    return task


class LastPositionClassifier(nn.Module):
    """Embedding, sequence model, linear readout of the last position: (B, T) ids -> (B, 1, V) logits."""

    def __init__(self, body: nn.Module, vocab: int, d: int):
        super().__init__()
        self.embed, self.body, self.out = nn.Embedding(vocab, d), body, nn.Linear(d, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        y, _ = self.body(self.embed(ids))
        return self.out(y[:, -1:])


def far_token_accuracy(kind: str, seed: int, distance: int | None = None, length: int = 32, vocab: int = 8,
                       d: int = 32, steps: int = 150, lr: float = 5e-3) -> float:
    """Held-out accuracy after a fixed budget; chance is 1/(vocab-1) (tokens are drawn from 1..vocab-1)."""
    distance = length - 1 if distance is None else distance
    torch.manual_seed(seed)
    body = {
        "tanh RNN": lambda: recurrence("tanh RNN", d),
        "LSTM": lambda: recurrence("LSTM", d),
        "LSTM, forget bias": lambda: recurrence("LSTM", d, forget_bias=FORGET_BIAS),
        "attention": lambda: Attention(d, n_layers=1, max_len=length),
    }[kind]()
    model = LastPositionClassifier(body, vocab, d)
    train(model, fixed_batches(token_back(distance), 100 + seed, batch=32, length=length, vocab=vocab), steps, lr=lr)
    x, y = token_back(distance)(torch.Generator().manual_seed(10_000 + seed), 1000, length, vocab)
    return accuracy(model, x, y)
# --8<-- [end:task]


# %%
if __name__ == "__main__":  # notebook / script: change a model, a length or a budget and rerun
    for name, m in models(seed=0).items():
        g = gradient_by_distance(m, seed=0)
        print(f"{name:32s} g[1]={g[1]:.2e} g[63]={g[63]:.2e} per step {per_step_factor(g):.3f}")
    for kind in ("tanh RNN", "LSTM", "LSTM, forget bias", "attention"):
        print(kind, far_token_accuracy(kind, seed=0))


# %% [markdown]
# ## Tests: each asserts a difference between the models, on every seed

# %%
import pytest  # noqa: E402

SEED_OFFSETS = (0, 1, 2)


def _plot(ev, curves: dict, gain_curves: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    k = list(range(T))
    for (name, g), style in zip(curves.items(), ("o-", "s-", "^-", "v--", "D-")):
        axes[0].semilogy(k, (g / g[0]).tolist(), style, markersize=3, label=name)
    axes[0].set(title="gradient at initialisation, relative to distance 0", xlabel="distance T−1−t",
                ylabel="gradient norm / its value at distance 0", ylim=(1e-25, 10))
    axes[0].legend(fontsize=7, loc="lower left")
    for gain, g in gain_curves.items():
        axes[1].semilogy(k, (g / g[1]).tolist(), "-", label=f"W_hh ~ N(0, {gain:g}²/d)")
    axes[1].set(title="tanh RNN: the recurrent scale decides", xlabel="distance T−1−t", ylabel="relative to distance 1")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    ev.figure(fig, "gradient_by_distance",
              f"Mean gradient norm reaching the input at each distance from the last position (T={T}, d={D}, "
              "float64, mean of 3 seeds, batch 32). Left: the five models at initialisation. Right: a tanh RNN "
              "whose recurrent matrix is drawn at four scales.")


# --8<-- [start:test_gradient]
@pytest.mark.claim("C-RNN-1", "nuanced")
def test_gradient_vanishes_with_distance_in_recurrences_not_in_attention(ev, seed):
    """At initialisation the gradient from the last output decays geometrically with distance in a tanh RNN, an LSTM
    and a GRU; a forget-gate bias keeps it, and attention's does not depend on distance."""
    seeds = [seed + i for i in SEED_OFFSETS]
    runs = {}  # name -> list of g over seeds
    for s in seeds:
        torch.manual_seed(s)
        for name, m in models(seed=0).items():
            runs.setdefault(name, []).append(gradient_by_distance(m, s))
    far = {name: [(g[T - 1] / g[1]).item() for g in gs] for name, gs in runs.items()}  # decay from distance 1 to 63
    factor = {name: [per_step_factor(g) for g in gs] for name, gs in runs.items()}
    for name in runs:
        ev.record(f"g(63)/g(1), {name} (3 seeds)", far[name], expect="tiny: vanishes" if "bias" not in name
                  and "attention" not in name else "≈ 1: no decay")
        ev.record(f"per-step factor, {name} (3 seeds)", factor[name], key=False,
                  expect="< 1/√3 ≈ 0.577 (linear RNN at this init)" if name == "tanh RNN" else "")
    attn = runs["attention (shared DecoderLM)"]
    spread = [(g[1:].max() / g[1:].min()).item() for g in attn]
    ev.record("attention: largest / smallest gradient over distances 1…63 (3 seeds)", spread, expect="small: flat")
    # attention's path is direct but shared: at near-uniform weights each of T positions gets about 1/T of it
    short = [gradient_by_distance(models(s)["attention (shared DecoderLM)"], s, length=16)[1:].mean().item()
             for s in seeds]
    long = [g[1:].mean().item() for g in attn]
    dilution = [a / b for a, b in zip(short, long)]
    ev.record("attention: mean gradient to an earlier position, T=16 / T=64 (3 seeds)", dilution,
              expect="≈ 4 = 64/16: shared out, not decayed")

    def scaled_rnn(gain: float, s: int) -> nn.Module:
        torch.manual_seed(s)
        return recurrence("tanh RNN", gain=gain)

    gain_runs = {gain: [gradient_by_distance(scaled_rnn(gain, s), s) for s in seeds] for gain in GAINS}
    gain_far = {gain: [(g[T - 1] / g[1]).item() for g in gs] for gain, gs in gain_runs.items()}
    for gain in GAINS:
        ev.record(f"tanh RNN, W_hh ~ N(0, {gain:g}²/d): g(63)/g(1) (3 seeds)", gain_far[gain],
                  expect="vanishes" if gain <= 1 else "explodes")
    _plot(ev, {n: torch.stack(gs).mean(0) for n, gs in runs.items()},
          {gain: torch.stack(gs).mean(0) for gain, gs in gain_runs.items()})

    for name in ("tanh RNN", "LSTM", "GRU"):
        assert max(far[name]) < 1e-8, name  # 62 steps at a factor ≤ 0.7 each
    assert max(factor["tanh RNN"]) < 1 / math.sqrt(3)
    assert min(far[f"LSTM, forget bias {FORGET_BIAS:g}"]) > 0.1
    assert min(far["attention (shared DecoderLM)"]) > 0.3 and max(spread) < 10
    assert min(dilution) > 2
    assert max(gain_far[0.5] + gain_far[1.0]) < 1e-4 and min(gain_far[4.0]) > 1e4  # vanish below, explode above
    assert all(max(gain_far[a]) < min(gain_far[b]) for a, b in zip(GAINS, GAINS[1:]))
# --8<-- [end:test_gradient]


# --8<-- [start:test_task]
@pytest.mark.claim("C-RNN-1", "nuanced")
def test_first_token_task_rnn_vs_attention(ev, seed):
    """Predict the first of 32 tokens at the last position: after the same 150 steps a tanh RNN and a default LSTM
    stay at chance, one attention layer solves it and an LSTM with a forget-gate bias is on its way; the tanh RNN
    solves the same task in 100 steps when the token is 2 positions back. Would refute "recurrences fail at long
    range where attention does not" if the RNN or the default LSTM learned the far token, or attention did not."""
    two = [seed, seed + 1]  # the arms whose result varies between seeds are averaged over two
    acc = {"tanh RNN": [far_token_accuracy("tanh RNN", seed)], "LSTM": [far_token_accuracy("LSTM", seed)],
           "LSTM, forget bias": [far_token_accuracy("LSTM, forget bias", s) for s in two],
           "attention": [far_token_accuracy("attention", s) for s in two]}
    near = far_token_accuracy("tanh RNN", seed, distance=2, steps=100)  # control, smaller budget
    chance = 1 / 7
    for kind, a in acc.items():
        ev.record(f"accuracy, first of 32 tokens, {kind} ({len(a)} seed{'s' if len(a) > 1 else ''})", a,
                  expect="≈ chance (1/7)" if kind in ("tanh RNN", "LSTM") else "well above chance")
    ev.record("accuracy, token 2 positions back, tanh RNN, 100 steps", near, expect="solved: the task is not the problem")
    # over seeds 100-139: tanh RNN 0.147 ± 0.013 and LSTM 0.144 ± 0.014 (max 0.17; chance + 0.1 is > 7 sd above);
    # near control 0.997 ± 0.003 (min 0.986); attention 0.987 ± 0.053 per run but skewed (min 0.67 over 80 runs),
    # so the mean of two (sd ≈ 0.037) is asserted > 0.8, 5 sd below; forget-bias LSTM 0.79 ± 0.15 per run
    # (0.45 to 1.0), mean of two (sd ≈ 0.11) > chance + 0.1 is 5 sd below its average
    assert acc["tanh RNN"][0] < chance + 0.1 and acc["LSTM"][0] < chance + 0.1
    assert near > 0.9
    assert sum(acc["attention"]) / 2 > 0.8
    assert sum(acc["LSTM, forget bias"]) / 2 > chance + 0.1
# --8<-- [end:test_task]

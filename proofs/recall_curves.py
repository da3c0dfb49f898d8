"""Set-up of the trained recall curves (docs/beyond/linear-attention.md, docs/beyond/delta-rule.md): one mixer layer
trained on fused MQAR with a mixture of pair counts, then its recall measured at each pair count.

Every arm is the shared DecoderLM (`mixer_lm`) with ONE layer, one head and d_model = d_head = WIDTH; only
MixerConfig's mixer switch (and, for the additive arm, delta_erase) differs. Same embeddings, FFN, steps, learning
rate and batches (one seed gives every arm the same data stream). The recurrent arms' state is one WIDTH × WIDTH
matrix (plus a WIDTH-vector normaliser for linear attention); softmax attention keeps a key and a value per token.

Training cycles through the pair counts PAIRS, one count per step (step s stores PAIRS[s mod len(PAIRS)] pairs), so
one run learns the task at every count and one training gives the whole curve; recall is then the share of queries
answered exactly on a held-out batch at each count. Zoology (Arora et al. 2023, §3) also sweeps the number of
key-value pairs against the model's dimension; its format has two tokens a pair, ours one (proofs/mqar.py, fused),
so that one layer can retrieve.

rewrite_batch is the same task with some keys written twice: REWRITE_PAIRS distinct pairs, then REWRITTEN of their
keys again with a different value; queries ask for any of the keys, and the answer is the value written last. An
additive state holds the sum of both values under a rewritten key; the delta rule can replace the first; a decay
gate (Gated DeltaNet's α_t, the arm "gated additive") can make the later write the larger one, but decays the pairs
that were not rewritten too. Recall is scored on rewritten and on kept keys separately. It trains well inside the
state, so that it tests overwriting, not capacity. No arm has positions, so an arm that cannot tell which write
came last can at best guess between the two values of a rewritten key (1/2). The gated arm's decay starts near 1
(GATE_BIAS): at σ(0) = 1/2 it would halve the state every token from the first step, a handicap (a first version
started there and its recall spread from chance to near the delta arm's over seeds). written_beta reads the learned
writing strength β of a DeltaRule layer, since the erase term's effect grows with β.

The recipe (searched on one CPU thread, seeds 100-101, 2026-11-27): 32 keys, 4 values (128 pair tokens), 16 queries,
WIDTH 16, pairs 2…32, Adam lr 1e-2, batch 64, 200 steps: about 2 s per arm on one thread. At 300 steps and lr 3e-3
or 6e-3 the curves have the same shape (softmax flat near 0.9, linear falling with the pairs); at lr 3e-3 every arm
is less trained. Softmax is not converged at 200 steps either (about 0.93 at every count): the curves compare equal
budgets, and what the comparison rests on is the SHAPE, flat for the cache and falling for a fixed state.
"""

from __future__ import annotations

import time

import torch

from .mqar import IGNORE, mqar, mqar_vocab, recall
from .train import train
from .transformer.mixers import DeltaRule, MixerConfig, mixer_lm

KEYS, VALUES, QUERIES = 32, 4, 16  # keys to draw pairs from, values, queries per sequence
WIDTH = 16  # d_model = d_head (one head): the recurrent state is WIDTH × WIDTH
PAIRS = (2, 4, 8, 16, 24, 32)  # pair counts trained on (cycled, one per step) and measured
REWRITE_PAIRS, REWRITTEN = 8, 4  # rewrite task: 8 distinct pairs, then 4 of their keys written again
GATE_BIAS = 3.0  # the decay gate's initial bias: α = σ(3) ≈ 0.95 at the start (σ(0) = 1/2 would halve the state)
STEPS, LR, BATCH, TEST_BATCH = 200, 1e-2, 64, 256
ARMS = {  # arm -> the MixerConfig switches that make it; everything else is the same
    "softmax": dict(mixer="softmax"),
    "linear": dict(mixer="linear"),  # elu+1 features, normalised (Katharopoulos et al. 2020)
    "additive": dict(mixer="delta", delta_erase=False),  # the delta layer without its erase term: S += β v kᵀ
    "delta": dict(mixer="delta"),  # S ← S (I − β k kᵀ) + β v kᵀ (DeltaNet)
    "gated additive": dict(mixer="delta", delta_erase=False, delta_gate=True),  # S ← α S + β v kᵀ: decay, no erase
}


def config(arm: str, **kw) -> MixerConfig:
    """The arm's MixerConfig; kw overrides any field (e.g. d_model=32 for a wider state)."""
    base = dict(vocab_size=mqar_vocab(KEYS, VALUES, fused=True), d_model=WIDTH, n_heads=1, d_ff=2 * WIDTH,
                n_layers=1, max_len=max(PAIRS) + QUERIES, positions="none", norm_position="pre",
                dropout_emb=0.0, dropout_residual=0.0, tie_embeddings="none", scale_embeddings=False,
                attn_impl="explicit")
    return MixerConfig(**{**base, **ARMS[arm], **kw})


def build(arm: str, **overrides) -> torch.nn.Module:
    """mixer_lm for one arm; a decay gate, where the arm has one, starts near 1 (GATE_BIAS)."""
    model = mixer_lm(config(arm, **overrides))
    for m in model.modules():
        if isinstance(m, DeltaRule) and m.w_alpha is not None:
            torch.nn.init.constant_(m.w_alpha.bias, GATE_BIAS)
    return model


@torch.no_grad()
def written_beta(model: torch.nn.Module, x: torch.Tensor, writes: int) -> float | None:
    """Mean learned writing strength β = σ(w_β x) of the DeltaRule layers over the first `writes` positions of x
    (the pair tokens), in eval mode; None for a model without a DeltaRule layer."""
    seen = []
    hooks = [m.w_beta.register_forward_hook(lambda _m, _i, out: seen.append(torch.sigmoid(out[:, :writes])))
             for m in model.modules() if isinstance(m, DeltaRule)]
    model.eval()
    model(x)
    for h in hooks:
        h.remove()
    return torch.cat([b.flatten() for b in seen]).mean().item() if seen else None


# --8<-- [start:curve]
def mixture_batches(seed: int, batch: int = BATCH):
    """batches(step) -> a fused MQAR batch with PAIRS[step mod len(PAIRS)] pairs, the same stream for every arm."""
    g = torch.Generator().manual_seed(seed)
    cache: list = []

    def get(step: int):
        while len(cache) <= step:
            cache.append(mqar(g, batch, PAIRS[len(cache) % len(PAIRS)], QUERIES, KEYS, VALUES, fused=True))
        return cache[step]

    return get


def recall_curve(arm: str, seed: int, steps: int = STEPS, lr: float = LR, **overrides) -> dict:
    """Train one arm on the mixture; recall at each pair count on held-out batches (the same for every arm)."""
    torch.manual_seed(seed)
    model = build(arm, **overrides)
    t0 = time.perf_counter()
    log = train(model, mixture_batches(seed), steps, lr=lr)
    seconds = time.perf_counter() - t0
    curve = {}
    for n in PAIRS:
        x, y = mqar(torch.Generator().manual_seed(seed + 10_000 + n), TEST_BATCH, n, QUERIES, KEYS, VALUES, fused=True)
        curve[n] = recall(model, x, y)
    return {"recall": curve, "loss": log.final(), "seconds": seconds, "beta": written_beta(model, x, max(PAIRS)),
            "params": sum(p.numel() for p in model.parameters())}
# --8<-- [end:curve]


# --8<-- [start:rewrite]
def rewrite_batch(g: torch.Generator, batch: int) -> tuple:
    """Fused MQAR with rewrites: REWRITE_PAIRS distinct pairs, then REWRITTEN of their keys again (shuffled), each
    with a DIFFERENT value; queries ask for any of the keys, the answer is the value written LAST.

        x:  p(k_1,v_1) … p(k_n,v_n)  p(k_π1,v'_π1) … p(k_πr,v'_πr)  q_1 … q_m        (B, n + r + m)

    Returns x, y and `rewritten` (B, m): whether each query asks for a rewritten key."""
    n, r = REWRITE_PAIRS, REWRITTEN
    x, _ = mqar(g, batch, n, QUERIES, KEYS, VALUES, fused=True)
    first = x[:, :n]  # (B, n) pair tokens 1 + KEYS + (key − 1)·VALUES + value
    key, value = (first - 1 - KEYS) // VALUES + 1, (first - 1 - KEYS) % VALUES  # (B, n) each, value in [0, VALUES)
    which_pairs = torch.rand(batch, n, generator=g).argsort(dim=1)[:, :r]  # (B, r) the pairs rewritten, in order
    new = (value.gather(1, which_pairs) + torch.randint(1, VALUES, (batch, r), generator=g)) % VALUES  # (B, r) ≠ old
    second = 1 + KEYS + (key.gather(1, which_pairs) - 1) * VALUES + new  # (B, r)
    latest = value.scatter(1, which_pairs, new)  # (B, n) the value each key holds last
    asked = torch.randint(0, n, (batch, QUERIES), generator=g)  # (B, m) which pair each query asks for
    rewritten = torch.zeros(batch, n, dtype=torch.bool).scatter(1, which_pairs, True).gather(1, asked)  # (B, m)
    x = torch.cat([first, second, key.gather(1, asked)], dim=1)  # (B, n + r + m)
    y = torch.full_like(x, IGNORE)
    y[:, n + r:] = latest.gather(1, asked) + 1 + KEYS + KEYS * VALUES  # answer ids after the pair tokens
    return x, y, rewritten


def rewrite_recall(arm: str, seed: int, steps: int = STEPS, lr: float = LR) -> dict:
    """Train one arm on rewrite_batch; recall of the latest value on a held-out batch: over all queries, over
    queries for rewritten keys, and over queries for keys written once."""
    torch.manual_seed(seed)
    model = build(arm)
    g, cache = torch.Generator().manual_seed(seed), []

    def batches(step: int):
        while len(cache) <= step:
            cache.append(rewrite_batch(g, BATCH)[:2])
        return cache[step]

    t0 = time.perf_counter()
    log = train(model, batches, steps, lr=lr)
    seconds = time.perf_counter() - t0
    x, y, rewritten = rewrite_batch(torch.Generator().manual_seed(seed + 10_000), TEST_BATCH)
    model.eval()
    with torch.no_grad():
        right = model(x)[:, -QUERIES:].argmax(-1) == y[:, -QUERIES:]  # (B, m)
    return {"recall": right.float().mean().item(), "rewritten": right[rewritten].float().mean().item(),
            "kept": right[~rewritten].float().mean().item(), "loss": log.final(), "seconds": seconds,
            "beta": written_beta(model, x, REWRITE_PAIRS + REWRITTEN)}
# --8<-- [end:rewrite]


if __name__ == "__main__":
    import sys

    torch.set_num_threads(1)
    for s in [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [100]:
        for arm in ("softmax", "linear", "additive", "delta"):
            r = recall_curve(arm, s)
            print(s, arm, {n: round(v, 3) for n, v in r["recall"].items()}, f"{r['seconds']:.1f} s", flush=True)
        for arm in ("additive", "delta", "gated additive"):
            r = rewrite_recall(arm, s)
            print(s, arm, "rewrites", {k: round(r[k], 3) for k in ("recall", "rewritten", "kept")},
                  f"{r['seconds']:.1f} s", flush=True)

# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How much does data-parallel training communicate?
#
# Proofs for the page `docs/cost/data-parallel-communication.md`. N workers live in one
# process: each holds the gradient of the shared `DecoderLM` (`proofs/transformer/`) on its
# own shard of a batch, as one flat vector of S elements. A `Network` object carries every
# message between them and counts the elements each worker sends and receives, round by round.
# Three all-reduce schemes run over it: the ring (reduce-scatter then all-gather), "send
# everything to worker 0 and broadcast", and a binary tree. No sockets, no torch.distributed.
# Run it with `pytest proofs/cost/proof_allreduce.py`, or open it as a notebook with
# `jupytext --to notebook proofs/cost/proof_allreduce.py`.

# %%
from __future__ import annotations

import torch
from torch import Tensor

from proofs.tasks import copy_task
from proofs.train import token_loss
from proofs.transformer import DecoderLM, TransformerConfig

WORKERS = (2, 4, 8, 16)  # N, the data-parallel degree


# %% [markdown]
# ## 1. A network that counts
#
# A round is a set of messages sent at the same time. A worker's link is full duplex with
# bandwidth B each way, so a round lasts as long as the busiest worker needs to push out (or take
# in) its elements: max over workers of max(sent, received) / B. Summed over rounds, that is
# the time of the scheme in units of 1/B; `rounds` is what a per-message latency multiplies.

# %%
# --8<-- [start:network]
class Network:
    def __init__(self, n: int):
        self.n = n
        self.rounds: list[tuple[str, list[tuple[int, int, int]]]] = []  # (phase, [(src, dst, elements)]) per round

    def new_round(self, phase: str) -> None:
        self.rounds.append((phase, []))

    def send(self, src: int, dst: int, data: Tensor) -> Tensor:
        assert src != dst
        self.rounds[-1][1].append((src, dst, data.numel()))
        return data.clone()  # what arrives is a copy: the receiver cannot touch the sender's buffer

    def sent(self, phase: str | None = None) -> list[int]:
        out = [0] * self.n
        for ph, msgs in self.rounds:
            for src, _, k in msgs:
                out[src] += k if phase in (None, ph) else 0
        return out

    def received(self, phase: str | None = None) -> list[int]:
        out = [0] * self.n
        for ph, msgs in self.rounds:
            for _, dst, k in msgs:
                out[dst] += k if phase in (None, ph) else 0
        return out

    def time(self) -> float:
        """Σ over rounds of the busiest worker's max(sent, received) in that round: seconds × B."""
        total = 0
        for _, msgs in self.rounds:
            out, inc = [0] * self.n, [0] * self.n
            for src, dst, k in msgs:
                out[src] += k
                inc[dst] += k
            total += max(max(o, i) for o, i in zip(out, inc))
        return total
# --8<-- [end:network]


# %% [markdown]
# ## 2. Ring all-reduce, step by step
#
# The vector is cut into N chunks. Reduce-scatter: in step s (0 … N−2) worker i sends its running
# sum of chunk (i − s) mod N to worker i+1, which adds it to its own. After N−1 steps chunk c has
# passed through every worker and its complete sum sits on worker c − 1. All-gather: in step s
# worker i forwards the complete chunk (i + 1 − s) mod N to worker i+1, which overwrites its copy.

# %%
# --8<-- [start:ring]
def ring_allreduce(vectors: list[Tensor], net: Network) -> list[Tensor]:
    n = len(vectors)
    buf = [v.clone() for v in vectors]
    chunk = lambda worker, c: buf[worker].tensor_split(n)[c]  # noqa: E731  (a view into the worker's buffer)
    for step in range(n - 1):
        net.new_round("reduce-scatter")
        msgs = [(i, (i + 1) % n, (i - step) % n) for i in range(n)]
        arriving = [net.send(i, j, chunk(i, c)) for i, j, c in msgs]  # all sends of a round happen at once
        for (_, j, c), data in zip(msgs, arriving):
            chunk(j, c).add_(data)
    for step in range(n - 1):
        net.new_round("all-gather")
        msgs = [(i, (i + 1) % n, (i + 1 - step) % n) for i in range(n)]
        arriving = [net.send(i, j, chunk(i, c)) for i, j, c in msgs]
        for (_, j, c), data in zip(msgs, arriving):
            chunk(j, c).copy_(data)
    return buf
# --8<-- [end:ring]


# --8<-- [start:others]
def gather_broadcast(vectors: list[Tensor], net: Network) -> list[Tensor]:
    """Everyone sends the whole vector to worker 0, which adds them up and sends the sum back to everyone."""
    n = len(vectors)
    net.new_round("gather")
    total = vectors[0].clone()
    for i in range(1, n):
        total += net.send(i, 0, vectors[i])
    net.new_round("broadcast")
    return [total] + [net.send(0, i, total) for i in range(1, n)]


def tree_allreduce(vectors: list[Tensor], net: Network) -> list[Tensor]:
    """Binary tree on workers 0 … N−1 (children of i: 2i+1, 2i+2), whole vectors, no pipelining:
    sums go up level by level to worker 0, the total comes back down the same way."""
    n = len(vectors)
    buf = [v.clone() for v in vectors]
    level = lambda i: (i + 1).bit_length() - 1  # noqa: E731
    deepest = level(n - 1)
    for lv in range(deepest, 0, -1):  # reduce: one round per level, children send to parents
        net.new_round("reduce")
        for i in range(n):
            if level(i) == lv:
                buf[(i - 1) // 2] += net.send(i, (i - 1) // 2, buf[i])
    for lv in range(1, deepest + 1):  # broadcast: parents send the total down
        net.new_round("broadcast")
        for i in range(n):
            if level(i) == lv:
                buf[i] = net.send((i - 1) // 2, i, buf[(i - 1) // 2])
    return buf
# --8<-- [end:others]


# %% [markdown]
# ## 3. The gradients: the shared model on N shards of one batch
#
# A 2-layer `DecoderLM` without dropout, one batch of 32 copy-task sequences split into N equal
# shards. Each worker computes the mean token loss of its shard and its gradient; the vector a
# worker all-reduces is every parameter's gradient, flattened.

# %%
# --8<-- [start:gradients]
def model_and_batch(seed: int, batch: int = 32, length: int = 16, **switches):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=32, d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout_emb=0.0,
                            dropout_residual=0.0, **switches)
    model = DecoderLM(cfg).double()
    x, y = copy_task(torch.Generator().manual_seed(seed), batch, length, 32)
    return model, x, y


def flat_gradient(model, x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    """Gradient of the mean (or the sum) of the token losses over the real tokens (targets of -100 are padding)."""
    model.zero_grad(set_to_none=True)
    loss = token_loss(model(x), y)  # cross-entropy ignores targets of -100: a mean over real tokens
    (loss * (int((y != IGNORE).sum()) if reduction == "sum" else 1)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


IGNORE = -100  # the target of a padding position: cross_entropy's ignore_index


def ragged_batch(seed: int, lengths: list[int], width: int = 16) -> tuple[Tensor, Tensor]:
    """Copy-task sequences of the given lengths, right-padded to `width`; padded targets are IGNORE."""
    x, y = copy_task(torch.Generator().manual_seed(seed), len(lengths), width, 32)
    for i, n in enumerate(lengths):
        x[i, n:] = 0
        y[i, n:] = IGNORE
    return x, y


def shard_gradients(model, x: Tensor, y: Tensor, n: int) -> list[Tensor]:
    """One gradient vector per worker: worker i sees the i-th of n equal shards of the batch."""
    return [flat_gradient(model, xs, ys) for xs, ys in zip(x.chunk(n), y.chunk(n))]
# --8<-- [end:gradients]


# %%
if __name__ == "__main__":  # notebook / script: change N or the scheme and rerun
    model, x, y = model_and_batch(0)
    for n in WORKERS:
        grads = shard_gradients(model, x, y, n)
        for scheme in (ring_allreduce, gather_broadcast, tree_allreduce):
            net = Network(n)
            scheme(grads, net)
            S = grads[0].numel()
            print(n, scheme.__name__, "max sent / S", max(net.sent()) / S, "time × B / S", net.time() / S)


# %% [markdown]
# ## Tests: exact counts, exact sums

# %%
import pytest  # noqa: E402


def _plot(ev, rows: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for scheme, style in (("ring", "o-"), ("tree", "^-"), ("gather + broadcast", "s--")):
        axes[0].plot(WORKERS, [rows[n][scheme]["max per worker"] for n in WORKERS], style, label=scheme)
        axes[1].plot(WORKERS, [rows[n][scheme]["time"] for n in WORKERS], style, label=scheme)
    axes[0].plot(WORKERS, [2 * (n - 1) / n for n in WORKERS], "k:", label="2(N−1)/N")
    axes[0].set(title="busiest worker: max(sent, received) / S", xlabel="workers N", yscale="log")
    axes[1].set(title="time × B / S (one full-duplex link per worker)", xlabel="workers N", yscale="log")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(WORKERS, [str(n) for n in WORKERS])
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "traffic", "Counted elements and the round-by-round time model for three all-reduce schemes, "
                              "S = the shared DecoderLM's gradient, N = 2 … 16 workers.")


# --8<-- [start:test_ring]
@pytest.mark.claim("C-COMM-1", "confirmed")
def test_ring_allreduce_sends_2_n_minus_1_over_n_per_worker(ev, seed):
    """The ring gives every worker the exact sum, and every worker sends and receives exactly 2(N−1)/N · S elements:
    (N−1)/N · S in reduce-scatter and (N−1)/N · S in all-gather, in 2(N−1) rounds. Exact counts of our simulated
    network; the formula would be refuted by one worker's count off it."""
    model, x, y = model_and_batch(seed)
    for n in WORKERS:
        grads = shard_gradients(model, x, y, n)  # float64
        S = grads[0].numel()
        assert S % n == 0  # 12H²+13H per layer and V·H: all multiples of 16 at H=64
        net = Network(n)
        out = ring_allreduce(grads, net)
        exact = torch.stack(grads).sum(0)
        assert all(torch.equal(o, out[0]) for o in out)  # every worker holds the same bits
        err = (out[0] - exact).abs().max().item() / exact.abs().max().item()
        assert err < 1e-14  # float64: only the order of the additions differs
        for phase in ("reduce-scatter", "all-gather"):
            assert net.sent(phase) == net.received(phase) == [(n - 1) * S // n] * n
        assert net.sent() == net.received() == [2 * (n - 1) * S // n] * n
        assert len(net.rounds) == 2 * (n - 1)
        assert net.time() == 2 * (n - 1) * S // n  # NCCL-tests: t = (S/B) · 2(n−1)/n
        ev.record(f"elements sent per worker / S, N={n}", net.sent()[0] / S, expect=f"2(N−1)/N = {2 * (n - 1) / n:g}",
                  key=n in (2, 16))
        ev.record(f"max relative error vs float64 sum, N={n}", err, key=False)
    ev.record("S, gradient elements of the 2-layer DecoderLM (d=64, V=32)", S)

    # float32: the ring adds in another order than torch.sum, so it matches to rounding, not bit for bit
    g32 = [g.float() for g in shard_gradients(model, x, y, 8)]
    r32 = ring_allreduce(g32, Network(8))[0]
    ref = torch.stack(g32).double().sum(0)
    err32 = ((r32.double() - ref).abs().max() / ref.abs().max()).item()
    ev.record("float32 ring vs float64 sum, max relative error, N=8", err32, expect="rounding only")
    assert torch.allclose(r32.double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
    # integer-valued inputs: every partial sum is exact, so the ring must match the sum bit for bit
    ints = [torch.randint(-1000, 1000, (1000,)).double() for _ in range(8)]
    assert torch.equal(ring_allreduce(ints, Network(8))[0], torch.stack(ints).sum(0))
    # S not divisible by N: chunks differ by one element; each worker skips one chunk per phase, so counts differ by 1
    net, sizes = Network(8), [len(c) for c in torch.arange(1001).tensor_split(8)]
    ring_allreduce([torch.randn(1001, dtype=torch.float64) for _ in range(8)], net)
    ev.record("S=1001, N=8: elements each worker sends in reduce-scatter", net.sent("reduce-scatter"),
              expect="S minus the one chunk it never sends", key=False)
    assert net.sent("reduce-scatter") == [1001 - sizes[(i + 1) % 8] for i in range(8)]
# --8<-- [end:test_ring]


# --8<-- [start:test_compare]
@pytest.mark.claim("C-COMM-1", "confirmed")
def test_ring_spreads_the_same_total_evenly(ev, seed):
    """All three schemes move 2(N−1)·S elements in total; gather-and-broadcast puts (N−1)·S on worker 0, a tree 3S on
    its inner nodes, the ring 2(N−1)/N · S on everyone: the lowest maximum, and the only one that does not grow with N.
    Exact counts; "the ring sends less in total" would be confirmed if its total were below the others'."""
    model, x, y = model_and_batch(seed)
    rows = {}
    for n in WORKERS:
        grads = shard_gradients(model, x, y, n)
        S = grads[0].numel()
        exact = torch.stack(grads).sum(0)
        rows[n] = {}
        for name, scheme in (("ring", ring_allreduce), ("tree", tree_allreduce), ("gather + broadcast", gather_broadcast)):
            net = Network(n)
            out = scheme(grads, net)
            assert all(torch.allclose(o, exact, rtol=1e-12, atol=1e-15) for o in out)
            busiest = max(max(s, r) for s, r in zip(net.sent(), net.received()))
            rows[n][name] = {"total": sum(net.sent()), "max per worker": busiest, "time": net.time(),
                             "rounds": len(net.rounds)}
            assert sum(net.sent()) == sum(net.received()) == 2 * (n - 1) * S  # same total for every scheme
        r = rows[n]
        tree_degree = max(len([c for c in (2 * i + 1, 2 * i + 2) if c < n]) + (i > 0) for i in range(n))
        assert r["gather + broadcast"]["max per worker"] == (n - 1) * S  # worker 0 takes in (N−1)·S
        assert r["tree"]["max per worker"] == tree_degree * S  # S per tree edge, each way
        assert r["ring"]["max per worker"] == 2 * (n - 1) * S // n
        assert r["ring"]["time"] <= r["tree"]["time"] <= r["gather + broadcast"]["time"]
        for name in r:
            ev.record(f"{name}, N={n}: max(sent, received) on the busiest worker / S", r[name]["max per worker"] / S,
                      key=n == 16)
            ev.record(f"{name}, N={n}: time × B / S", r[name]["time"] / S, key=n == 16)
            ev.record(f"{name}, N={n}: rounds", r[name]["rounds"], key=False)
        rows[n] = {name: {k: v / S if k != "rounds" else v for k, v in row.items()} for name, row in r.items()}
    _plot(ev, rows)
    # growth from N=2 to N=16: the ring's per-worker load stays below 2, the others' grow
    assert rows[16]["ring"]["max per worker"] < 2 < rows[16]["tree"]["max per worker"]
    assert rows[16]["gather + broadcast"]["time"] / rows[2]["gather + broadcast"]["time"] == 15
    assert rows[16]["ring"]["time"] / rows[2]["ring"]["time"] == 1.875  # (2·15/16) / (2·1/2)
    assert rows[16]["ring"]["rounds"] == 30 > rows[16]["tree"]["rounds"] == 8  # the price: latency per round
# --8<-- [end:test_compare]


# --8<-- [start:test_dp]
def test_averaged_shard_gradients_equal_the_full_batch_gradient(ev, seed):
    """With equal shards, a mean loss and no batch statistics, the all-reduced mean of the workers' gradients is the
    full-batch gradient; unequal shards and BatchNorm break the equality. Exact in float64 (our model); it would be
    refuted if equal shards differed beyond rounding."""
    model, x, y = model_and_batch(seed)
    full = flat_gradient(model, x, y)
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
    gaps = {}
    for n in WORKERS:
        avg = ring_allreduce(shard_gradients(model, x, y, n), Network(n))[0] / n
        gaps[n] = rel(avg, full)
        ev.record(f"equal shards, N={n}: max relative difference to the full-batch gradient", gaps[n],
                  expect="float64 rounding", key=n == 16)
        assert gaps[n] < 1e-12
    # unequal shards (8 and 24 sequences): the mean of the two shard means weights the small shard 3× too much
    sizes = [8, 24]
    parts = list(zip(x.split(sizes), y.split(sizes)))
    naive = ring_allreduce([flat_gradient(model, xs, ys) for xs, ys in parts], Network(2))[0] / 2
    summed = ring_allreduce([flat_gradient(model, xs, ys, reduction="sum") for xs, ys in parts], Network(2))[0] / y.numel()
    ev.record("unequal shards 8 + 24, mean of shard means", rel(naive, full), expect="wrong")
    ev.record("unequal shards, sum of shard sums / all tokens", rel(summed, full), expect="float64 rounding")
    assert rel(naive, full) > 1e-3 and rel(summed, full) < 1e-12
    # BatchNorm: each worker normalises with its own shard's statistics
    bn, xb, yb = model_and_batch(seed, norm="batch")
    bn_full = flat_gradient(bn, xb, yb)
    bn_avg = ring_allreduce(shard_gradients(bn, xb, yb, 4), Network(4))[0] / 4
    ev.record("norm='batch', N=4: max relative difference to the full-batch gradient", rel(bn_avg, bn_full),
              expect="not rounding: per-shard statistics")
    assert rel(bn_avg, bn_full) > 1e-3
# --8<-- [end:test_dp]


# --8<-- [start:test_tokens]
def test_equal_tokens_not_equal_sequences_make_the_mean_of_means_right(ev, seed):
    """A token-level mean loss makes each worker's gradient a mean over ITS tokens, so the mean of the workers' means is
    the full-batch gradient only when every worker holds the same number of (non-padding) tokens, whatever the number
    of sequences. Equal sequences with ragged lengths: wrong; unequal sequences with equal tokens: exact; fix: sum the
    token losses and divide by the all-reduced token count. The same holds for micro-batches under gradient
    accumulation. Exact (float64, our model); it would be refuted if the ragged, equal-sequence shards gave the
    full-batch gradient."""
    model, _, _ = model_and_batch(seed)
    g = torch.Generator().manual_seed(seed)
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731

    def run(shards: list[list[int]], reduction: str) -> tuple[float, list[int]]:
        """Shards given as lists of sequence lengths; returns the error against the full batch and the token counts."""
        lengths = [n for shard in shards for n in shard]
        x, y = ragged_batch(seed, lengths)
        full = flat_gradient(model, x, y)
        parts = list(zip(x.split([len(sh) for sh in shards]), y.split([len(sh) for sh in shards])))
        grads = [flat_gradient(model, xs, ys, reduction) for xs, ys in parts]
        tokens = [int((ys != IGNORE).sum()) for _, ys in parts]
        total = ring_allreduce(grads, Network(len(shards)))[0]
        avg = total / len(shards) if reduction == "mean" else total / sum(tokens)  # the count is all-reduced too
        return rel(avg, full), tokens

    ragged = [torch.randint(2, 17, (8,), generator=g).tolist() for _ in range(4)]  # 4 workers, 8 sequences each
    while len({sum(sh) for sh in ragged}) < 4:  # make sure the token counts differ between workers
        ragged = [torch.randint(2, 17, (8,), generator=g).tolist() for _ in range(4)]
    equal_tokens = [[16] * 4, [8] * 8, [16, 16, 8, 8, 4, 4, 4, 4], [12] * 4 + [4] * 4]  # 64 tokens, 4 to 8 sequences
    wrong, tok_ragged = run(ragged, "mean")
    right, tok_equal = run(equal_tokens, "mean")
    fixed, _ = run(ragged, "sum")
    ev.record("8 sequences per worker, ragged lengths: tokens per worker", tok_ragged, key=False)
    ev.record("8 sequences per worker, ragged lengths: mean of the workers' means, relative error", wrong,
              expect="not rounding: short shards count too much")
    ev.record("4 to 8 sequences per worker, 64 tokens each: mean of means, relative error", right, expect="rounding")
    ev.record("ragged lengths, sum of token losses / all-reduced token count, relative error", fixed, expect="rounding")
    assert tok_equal == [64] * 4 and len(set(tok_ragged)) == 4
    assert right < 1e-12 and fixed < 1e-12
    assert wrong > 1e-4  # the size of the error depends on the draw (seed spread recorded); its existence does not
# --8<-- [end:test_tokens]

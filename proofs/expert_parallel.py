"""Expert parallelism for the shared mixture-of-experts layer, over real torch.distributed processes.

    moe = MoEFeedForward(cfg)                                # built the same way on every rank (same seed)
    layer = ExpertParallelMoE(moe, rank, world)              # keeps only this rank's E/P experts
    y = layer(x, a2a)                                        # x: (N, C) this rank's tokens -> (N, C)

Rank r owns the contiguous block of experts [r·E/P, (r+1)·E/P). A forward is GShard's (Lepikhin et al. 2020, §2-3)
exchange, without capacity padding (variable-size "all-to-all-v" messages):

1. route: the shared layer's own router and top-k choose each token's experts (`route_rows`);
2. dispatch: every rank sends each chosen (token, expert) row to the expert's owner (one all-to-all, after a tiny
   all-to-all of row counts so the receiver knows the message sizes);
3. the owner runs each of its experts once on all the rows it received, from every rank;
4. combine: the outputs go back to the ranks that sent the rows (a second all-to-all);
5. the shared layer weights them by its gates and sums them per token (`combine_rows`).

Nothing of the layer is copied here: steps 1 and 5 run `MoEFeedForward.forward` itself with its experts swapped for
stand-ins that record the rows each expert is handed (step 1) or hand back the outputs received for them (step 5),
so routing, gates and the weighted sum are the shared code's, and a difference from the single-process layer can
only come from the exchange. With moe_capacity > 0 the capacity is applied by each rank to its own tokens (GShard's
per-group capacity), so the result equals the layer run rank by rank, not on all tokens at once; the proof uses no
capacity limit.

`AllToAll` wraps `dist.all_to_all_single` and counts, per phase, the bytes this rank hands to other ranks and
receives from them (element_size · rows · C; the share a rank keeps for itself is counted apart, as `kept`), and what
the process really wrote to its sockets (/proc/self/io wchar, via proofs.distributed.sent_bytes).
Under even routing each rank sends tokens·k·C·bytes·(P−1)/P in each phase (`even_bytes`).
"""

from __future__ import annotations

import collections
import contextlib
import math

import torch
import torch.distributed as dist
from torch import Tensor, nn

from proofs.distributed import sent_bytes
from proofs.transformer import ConfigError, MoEFeedForward


# --8<-- [start:stand_ins]
class _Record(nn.Module):
    """Stands in for one expert: keeps the rows it is handed, returns zeros of their shape."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:  # x: (n_e, C)
        self.rows = x
        return torch.zeros_like(x)


class _Replay(nn.Module):
    """Stands in for one expert: returns the outputs computed elsewhere for exactly the rows it is handed."""

    def __init__(self, out: Tensor) -> None:
        super().__init__()
        self.out = out

    def forward(self, x: Tensor) -> Tensor:
        if x.shape != self.out.shape:
            raise RuntimeError(f"expert outputs {tuple(self.out.shape)} do not match its rows {tuple(x.shape)}")
        return self.out


@contextlib.contextmanager
def swapped_experts(moe: MoEFeedForward, stand_ins: list[nn.Module]):
    """moe.experts replaced by `stand_ins` (one per expert) for the duration of the block."""
    if len(stand_ins) != moe.n_experts:
        raise ValueError(f"{len(stand_ins)} stand-ins for {moe.n_experts} experts")
    kept = moe.experts
    moe.experts = nn.ModuleList(stand_ins)
    try:
        yield
    finally:
        moe.experts = kept


def route_rows(moe: MoEFeedForward, x: Tensor) -> list[Tensor]:
    """The rows (n_e, C) the shared layer hands to each expert e for tokens x (N, C), in the layer's own order
    (its router, top-k and capacity). An expert with no rows gets an empty (0, C) tensor."""
    rec = [_Record() for _ in range(moe.n_experts)]
    with swapped_experts(moe, rec):
        moe(x)
    return [r.rows if r.rows is not None else x.new_zeros(0, x.shape[-1]) for r in rec]


def combine_rows(moe: MoEFeedForward, x: Tensor, outs: list[Tensor]) -> Tensor:
    """The shared layer's output for tokens x (N, C) when expert e's outputs for its rows are outs[e] (n_e, C):
    the layer's gates and weighted sum, applied to outputs computed elsewhere."""
    with swapped_experts(moe, [_Replay(o) for o in outs]):
        return moe(x)
# --8<-- [end:stand_ins]


# --8<-- [start:a2a]
class AllToAll:
    """dist.all_to_all_single on dim 0, counting per phase (a name) the bytes handed to the other ranks (`sent`),
    received from them (`received`), kept on this rank (`kept`), and written to sockets (`written`, wchar)."""

    def __init__(self) -> None:
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.sent: collections.Counter[str] = collections.Counter()
        self.received: collections.Counter[str] = collections.Counter()
        self.kept: collections.Counter[str] = collections.Counter()
        self.written: collections.Counter[str] = collections.Counter()

    def __call__(self, phase: str, send: Tensor, send_rows: list[int], recv_rows: list[int]) -> Tensor:
        """send (sum(send_rows), ...) : send_rows[q] rows go to rank q; returns (sum(recv_rows), ...), recv_rows[q]
        rows from rank q, in rank order."""
        row = send[0].numel() * send.element_size() if send.shape[0] else math.prod(send.shape[1:]) * send.element_size()
        recv = send.new_empty((sum(recv_rows), *send.shape[1:]))
        w0 = sent_bytes()
        dist.all_to_all_single(recv, send.contiguous(), recv_rows, send_rows)
        self.written[phase] += sent_bytes() - w0
        me = self.rank
        self.sent[phase] += row * (sum(send_rows) - send_rows[me])
        self.received[phase] += row * (sum(recv_rows) - recv_rows[me])
        self.kept[phase] += row * send_rows[me]
        return recv


def even_bytes(tokens: int, k: int, d: int, bytes_per: int, P: int) -> float:
    """Bytes one rank sends to the others in one phase (dispatch or combine) when its tokens·k (token, expert) rows
    spread evenly over the P ranks: (P−1)/P of them leave, each d·bytes_per."""
    return tokens * k * d * bytes_per * (P - 1) / P
# --8<-- [end:a2a]


# --8<-- [start:layer]
class ExpertParallelMoE:
    """The shared MoE layer spread over P ranks: every rank routes its own tokens with the full router, and holds
    only its E/P experts (the others are dropped from memory)."""

    def __init__(self, moe: MoEFeedForward, rank: int, world: int) -> None:
        E = moe.n_experts
        if E % world:
            raise ConfigError(f"moe_experts={E} cannot be split evenly over {world} ranks: use a number of experts "
                              f"divisible by the world size (or a world size dividing {E}).")
        self.per, self.rank, self.world, self.E = E // world, rank, world, E
        self.mine = range(rank * self.per, (rank + 1) * self.per)
        self.local = nn.ModuleList(moe.experts[e] for e in self.mine)   # this rank's experts ...
        moe.experts = nn.ModuleList(nn.Identity() for _ in range(E))    # ... and no others (router, gates stay)
        self.moe = moe

    def owner(self, e: int) -> int:
        return e // self.per

    def __call__(self, x: Tensor, a2a: AllToAll, exchange: bool = True) -> Tensor:
        """x (N, C) -> (N, C). exchange=False is the switch: each rank runs only the experts it holds on its own
        tokens' rows and treats the rest as zero (no all-to-all), which must differ from the single-process layer."""
        P, per = self.world, self.per
        rows = route_rows(self.moe, x)                                  # E tensors (n_e, C), grouped by expert
        if not exchange:
            outs = [self.local[e - self.mine.start](r) if e in self.mine else torch.zeros_like(r)
                    for e, r in enumerate(rows)]
            return combine_rows(self.moe, x, outs)
        n = torch.tensor([r.shape[0] for r in rows])                    # (E,) rows per expert from this rank
        # counts: n_in[q, j] = rows rank q sends to my j-th expert (E/P int64 to each rank)
        n_in = a2a("counts", n.view(P, per), [1] * P, [1] * P).view(P, per)
        send_rows, recv_rows = n.view(P, per).sum(1).tolist(), n_in.sum(1).tolist()
        recv = a2a("dispatch", torch.cat(rows), send_rows, recv_rows)   # (Σ n_in, C): by source rank, then expert
        blocks = list(recv.split(n_in.flatten().tolist()))              # P·per blocks, index q·per + j
        outs = [None] * len(blocks)
        for j, expert in enumerate(self.local):                         # each local expert runs once on all its rows
            idx = [q * per + j for q in range(P)]
            y = expert(torch.cat([blocks[i] for i in idx]))
            for i, part in zip(idx, y.split([blocks[i].shape[0] for i in idx])):
                outs[i] = part
        back = a2a("combine", torch.cat(outs), recv_rows, send_rows)    # (Σ n, C): by owner rank, then expert
        return combine_rows(self.moe, x, list(back.split(n.tolist())))
# --8<-- [end:layer]


def expert_bytes(layer: ExpertParallelMoE) -> int:
    """Bytes of expert parameters this rank holds."""
    return sum(p.numel() * p.element_size() for p in layer.local.parameters())

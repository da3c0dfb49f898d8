"""Key/value caches for incremental decoding, one object per attention module.

An attention module hands its cache the entries it projected for the new tokens (keys and values,
(B, heads, T_new, width) each, or MLA's latents) with their positions (B|1, T_new), and gets back
every entry the new queries may read with their positions; position -1 marks an empty slot, which the
attention masks. Three layouts, the same outputs:

    KVCache          contiguous: everything so far, in order (the plain cache)
    RollingKVCache   the last `window` positions (plus `sinks` first ones): sliding-window attention
    PagedKVCache     fixed-size blocks from a shared pool through a block table per sequence (vLLM's PagedAttention)
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .config import ConfigError

Entries = tuple[Tensor, ...]


# --8<-- [start:kvcache]
class KVCache:
    """Contiguous cache: the entries of every position seen so far, time on dim 2."""

    def __init__(self):
        self.entries: Optional[Entries] = None  # each (B, heads, T, width)
        self.pos: Optional[Tensor] = None  # (B|1, T) positions of the cached entries

    @property
    def filled(self) -> bool:
        return self.entries is not None

    def __len__(self) -> int:
        return 0 if self.pos is None else self.pos.shape[1]

    def next_positions(self, batch: int, t_new: int, device=None) -> Tensor:
        """(B|1, T_new): the positions that follow the cached ones."""
        start = 0 if self.pos is None else self.pos.max(dim=1, keepdim=True).values + 1  # (B|1, 1)
        return start + torch.arange(t_new, device=device)[None]

    def update(self, entries: Entries, pos: Tensor) -> tuple[Entries, Tensor]:
        """Append the new tokens' entries; return everything cached (B, heads, T, width) and its positions."""
        if self.entries is not None and self.entries[0].shape[0] != entries[0].shape[0]:
            raise ConfigError("this cache was filled by steps of another batch; it must hold this same batch: start "
                              "each generation with a fresh one (Decoder.new_cache()).")
        if self.entries is None:
            self.entries, self.pos = tuple(entries), pos
        else:
            self.entries = tuple(torch.cat([old, new], dim=2) for old, new in zip(self.entries, entries))
            rows = max(self.pos.shape[0], pos.shape[0])
            self.pos = torch.cat([self.pos.expand(rows, -1), pos.expand(rows, -1)], dim=1)
        return self.entries, self.pos

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (speculative decoding rolls back rejected tokens)."""
        if self.entries is not None:
            self.entries = tuple(e[:, :, :length] for e in self.entries)
            self.pos = self.pos[:, :length]

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows `rows` (B',) in that order (beam search: each beam continues some earlier beam)."""
        if self.entries is not None:
            self.entries = tuple(e.index_select(0, rows) for e in self.entries)
            self.pos = self.pos if self.pos.shape[0] == 1 else self.pos.index_select(0, rows)

    @property
    def nbytes(self) -> int:
        """Bytes the cached tensors occupy."""
        return sum(e.nbytes for e in self.entries) if self.entries is not None else 0
# --8<-- [end:kvcache]


# --8<-- [start:rolling]
class RollingKVCache(KVCache):
    """Sliding-window cache: after each step only the last `window` positions (and the first `sinks`) are kept.
    The attention's window mask hides the rest anyway, so the outputs equal a full cache's."""

    def __init__(self, window: int, sinks: int = 0):
        super().__init__()
        if window < 1 or sinks < 0:
            raise ConfigError(f"a rolling cache needs window >= 1 and sinks >= 0, got window={window}, sinks={sinks}.")
        self.window, self.sinks = window, sinks

    def update(self, entries: Entries, pos: Tensor) -> tuple[Entries, Tensor]:
        seen_entries, seen_pos = super().update(entries, pos)  # this step reads old + new
        newest = self.pos.max()
        keep = (self.pos[0] > newest - self.window) | (self.pos[0] < self.sinks)  # (T,) same for every row
        self.entries = tuple(e[:, :, keep] for e in self.entries)
        self.pos = self.pos[:, keep]
        return seen_entries, seen_pos
# --8<-- [end:rolling]


# --8<-- [start:paged]
class BlockPool:
    """Physical cache memory: n_blocks blocks of block_size token slots, handed out and taken back by id."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ConfigError(f"a block pool needs n_blocks >= 1 and block_size >= 1, got {n_blocks}, {block_size}.")
        self.n_blocks, self.block_size = n_blocks, block_size
        self.free = list(range(n_blocks))[::-1]
        self.storage: Optional[list[Tensor]] = None  # per entry: (n_blocks, heads, block_size, width)

    def allocate(self) -> int:
        if not self.free:
            raise ConfigError(f"the block pool is full ({self.n_blocks} blocks): give it more blocks or finish a sequence.")
        return self.free.pop()

    def release(self, blocks: list[int]) -> None:
        self.free.extend(reversed(blocks))


class PagedKVCache:
    """A cache whose rows (sequences) own lists of blocks in a shared BlockPool: a block table per row.

    Rows may hold different numbers of tokens (continuous batching). `update` writes each new token into
    its row's last block (taking a fresh block when that one is full) and gathers every row's blocks into
    a (B, heads, T_max, width) view, empty slots at position -1. A sequence wastes less than one block.
    """

    has_gaps = True  # rows of different lengths: the gathered view has empty slots (position -1)

    def __init__(self, pool: BlockPool, batch: int):
        self.pool, self.tables = pool, [[] for _ in range(batch)]
        self.lengths = [0] * batch  # tokens stored per row

    @property
    def filled(self) -> bool:
        return any(self.lengths)

    def next_positions(self, batch: int, t_new: int, device=None) -> Tensor:
        if batch != len(self.tables):
            raise ConfigError(f"this paged cache has {len(self.tables)} rows, the input has {batch}.")
        return torch.tensor(self.lengths, device=device)[:, None] + torch.arange(t_new, device=device)[None]

    def update(self, entries: Entries, pos: Tensor) -> tuple[Entries, Tensor]:
        pool, bs = self.pool, self.pool.block_size
        if pool.storage is None:
            pool.storage = [e.new_zeros(pool.n_blocks, e.shape[1], bs, e.shape[3]) for e in entries]
        B, t_new = entries[0].shape[0], entries[0].shape[2]
        for b in range(B):
            for t in range(t_new):
                n = self.lengths[b]
                if n % bs == 0:
                    self.tables[b].append(pool.allocate())
                block, slot = self.tables[b][n // bs], n % bs
                for store, e in zip(pool.storage, entries):
                    store[block, :, slot] = e[b, :, t]
                self.lengths[b] += 1
        return self.gather()

    def gather(self) -> tuple[Entries, Tensor]:
        """Every row's tokens read through its block table: (B, heads, T_max, width) per entry, (B, T_max) positions."""
        bs, n_max = self.pool.block_size, max(self.lengths)
        blocks = -(-n_max // bs)  # blocks of the longest row
        table = torch.tensor([t + [0] * (blocks - len(t)) for t in self.tables])  # (B, blocks), padded with block 0
        out = []
        for store in self.pool.storage:
            g = store[table]  # (B, blocks, heads, bs, width)
            B, nb, h, _, w = g.shape
            out.append(g.permute(0, 2, 1, 3, 4).reshape(B, h, nb * bs, w)[:, :, :n_max])  # (B, heads, T_max, width)
        slots = torch.arange(n_max)[None]
        pos = torch.where(slots < torch.tensor(self.lengths)[:, None], slots, -1)  # (B, T_max): -1 = empty
        return tuple(out), pos

    def free_row(self, row: int) -> None:
        """A finished sequence gives its blocks back; the row can take a new request."""
        self.pool.release(self.tables[row])
        self.tables[row], self.lengths[row] = [], 0

    @property
    def wasted_slots(self) -> int:
        """Allocated token slots that hold no token (less than one block per sequence)."""
        return sum(len(t) * self.pool.block_size - n for t, n in zip(self.tables, self.lengths))
# --8<-- [end:paged]

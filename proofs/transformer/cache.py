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

    @property
    def has_gaps(self) -> bool:
        """True when some slot is empty (position -1): rows truncated to different lengths."""
        return self.pos is not None and bool((self.pos < 0).any())

    def truncate(self, length) -> None:
        """Forget every position from `length` on (speculative decoding rolls back rejected tokens).

        length: an int (every row) or a (B,) tensor, one length per row. Rows cut shorter than the longest
        keep their slots as empty ones (position -1, masked by the attention); columns empty in every row go.
        """
        if self.entries is None:
            return
        if isinstance(length, int):
            keep = self.pos < length  # (B|1, T)
        else:
            length = torch.as_tensor(length, device=self.pos.device)
            if length.dim() != 1 or length.shape[0] != self.entries[0].shape[0]:
                raise ConfigError(f"truncate takes an int or one length per row ({self.entries[0].shape[0]}), "
                                  f"got shape {tuple(length.shape)}.")
            keep = self.pos < length[:, None]  # (B, T)
        pos = torch.where(keep, self.pos, -1)
        used = (pos >= 0).any(dim=0)  # (T,) columns that some row still needs
        if not bool(used.any()):
            self.entries, self.pos = None, None
            return
        last = int(used.nonzero().max()) + 1
        self.entries = tuple(e[:, :, :last] for e in self.entries)
        self.pos = pos[:, :last]

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
        if self.pos.shape[0] > 1 and not bool((self.pos == self.pos[:1]).all()):
            raise ConfigError("a rolling cache evicts the same slots in every row, so its rows must sit at the same "
                              "positions; for rows at different lengths use a paged cache (new_cache('paged')).")
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
            raise ConfigError(f"a block pool needs n_blocks >= 1 and block_size >= 1 (tokens per block; vLLM uses 16), "
                              f"got n_blocks={n_blocks}, block_size={block_size}.")
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
    `use_rows(rows)` makes the next calls serve only those rows (slots), in that order: a batch of the
    active requests, while idle slots hold nothing.
    """

    has_gaps = True  # rows of different lengths: the gathered view has empty slots (position -1)

    def __init__(self, pool: BlockPool, batch: int):
        if batch < 1:
            raise ConfigError(f"a paged cache needs batch >= 1 rows (slots), got {batch}.")
        self.pool, self.tables = pool, [[] for _ in range(batch)]
        self.lengths = [0] * batch  # tokens stored per row
        self.rows = list(range(batch))  # the rows the next calls serve (input row b -> cache row rows[b])

    def use_rows(self, rows) -> None:
        """Serve only these cache rows (slot ids), in this order, until called again."""
        rows = [int(r) for r in rows]
        if not rows or len(set(rows)) != len(rows) or not all(0 <= r < len(self.tables) for r in rows):
            raise ConfigError(f"use_rows needs distinct slot ids in [0, {len(self.tables)}), got {rows}.")
        self.rows = rows

    @property
    def filled(self) -> bool:
        return any(self.lengths[r] for r in self.rows)

    def next_positions(self, batch: int, t_new: int, device=None) -> Tensor:
        if batch != len(self.rows):
            raise ConfigError(f"this paged cache serves {len(self.rows)} rows, the input has {batch}: "
                              f"call use_rows() with the slots of this batch.")
        start = torch.tensor([self.lengths[r] for r in self.rows], device=device)[:, None]  # (B, 1)
        return start + torch.arange(t_new, device=device)[None]

    def append_slots(self, row: int, t_new: int) -> tuple[Tensor, Tensor]:
        """Room for t_new more tokens of a row: a fresh block from the pool whenever its last one is full (the
        block manager's step). Returns each new token's (block, slot) and counts the tokens as stored."""
        bs, n, table = self.pool.block_size, self.lengths[row], self.tables[row]
        while len(table) * bs < n + t_new:
            table.append(self.pool.allocate())
        logical = torch.arange(n, n + t_new)  # this row's new token slots, in order
        self.lengths[row] = n + t_new
        return torch.tensor(table)[logical // bs], logical % bs  # (t_new,) physical block, (t_new,) slot in it

    def update(self, entries: Entries, pos: Tensor) -> tuple[Entries, Tensor]:
        pool, bs = self.pool, self.pool.block_size
        B, t_new = entries[0].shape[0], entries[0].shape[2]
        if B != len(self.rows):
            raise ConfigError(f"this paged cache serves {len(self.rows)} rows, the input has {B}: call use_rows().")
        if pool.storage is None:
            pool.storage = [e.new_zeros(pool.n_blocks, e.shape[1], bs, e.shape[3]) for e in entries]
        for b, row in enumerate(self.rows):
            blocks, slots = self.append_slots(row, t_new)
            for store, e in zip(pool.storage, entries):
                store[blocks, :, slots] = e[b].transpose(0, 1)  # (t_new, heads, width)
        return self.gather()

    def gather(self) -> tuple[Entries, Tensor]:
        """The served rows' tokens read through their block tables: (B, heads, T_max, width) per entry and
        (B, T_max) positions, -1 at the empty slots of shorter rows."""
        bs = self.pool.block_size
        lengths = torch.tensor([self.lengths[r] for r in self.rows])  # (B,)
        n_max = int(lengths.max())
        blocks = -(-n_max // bs)  # blocks of the longest row
        tables = [self.tables[r] for r in self.rows]
        table = torch.tensor([t + [0] * (blocks - len(t)) for t in tables])  # (B, blocks), padded with block 0
        out = []
        for store in self.pool.storage:
            g = store[table]  # (B, blocks, heads, bs, width)
            B, nb, h, _, w = g.shape
            out.append(g.permute(0, 2, 1, 3, 4).reshape(B, h, nb * bs, w)[:, :, :n_max])  # (B, heads, T_max, width)
        slots = torch.arange(n_max)[None]
        pos = torch.where(slots < lengths[:, None], slots, -1)  # (B, T_max): -1 = empty
        return tuple(out), pos

    def free_row(self, row: int) -> None:
        """A finished sequence gives its blocks back; the row can take a new request."""
        self.pool.release(self.tables[row])
        self.tables[row], self.lengths[row] = [], 0

    @property
    def allocated_slots(self) -> int:
        """Token slots in the blocks the rows hold."""
        return sum(len(t) for t in self.tables) * self.pool.block_size

    @property
    def wasted_slots(self) -> int:
        """Allocated token slots that hold no token (less than one block per sequence)."""
        return self.allocated_slots - sum(self.lengths)
# --8<-- [end:paged]

"""Token eviction: keep a fixed budget of cached tokens, chosen by recency, H2O, SnapKV or at random.

Works over the existing caches of cache.py without changing them (every proof that reaches cache.py keeps its
evidence): `evict` cuts a contiguous KVCache down to chosen tokens; `EvictablePagedKVCache` is a PagedKVCache
whose rows can lose scattered tokens, giving a block back to the pool only when every token in it is gone,
and `compact` copies the survivors together so the emptied blocks can go.

The policies pick, per row, which of the T cached tokens stay (`budget` of them):

    recency  the last budget − sinks tokens, plus the first `sinks` (StreamingLLM's attention sinks)
    h2o      heavy hitters: the largest attention accumulated over the queries so far, plus the `recent` latest
             tokens (Zhang et al. 2023, §4, Alg. 1); `h2o_prefill` runs Alg. 1 token by token, evicting one
             token per step once the cache is over budget
    snapkv   the tokens the last `window` prompt queries (the observation window) attend to most, summed over
             those queries and heads and max-pooled over `pool` neighbours, plus the window itself (Li et al.
             2024, §4); one selection after the prompt
    random   `budget` tokens drawn uniformly (the control)

One set of tokens per layer, shared by that layer's heads (our cache keeps one position row per sequence); H2O
and SnapKV select per head. Scores come from `record_attention` (the explicit path's softmax weights).
Evicted entries are dropped for good: nothing here recomputes them.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import record_attention
from .cache import KVCache, PagedKVCache
from .config import ConfigError

POLICIES = ("recency", "h2o", "snapkv", "random")


def check_budget(policy: str, budget: int, *, sinks: int = 0, recent: Optional[int] = None, window: int = 1,
                 pool: int = 1) -> None:
    """Raise ConfigError naming the fix for a setting the policies cannot honour."""
    if policy not in POLICIES:
        raise ConfigError(f"eviction policy {policy!r} is not one of {POLICIES}.")
    if budget < 1:
        raise ConfigError(f"an eviction budget keeps >= 1 token per sequence, got {budget}.")
    if sinks < 0 or (policy == "recency" and budget <= sinks):
        raise ConfigError(f"a budget of {budget} must exceed the {sinks} attention sinks it always keeps (StreamingLLM):"
                          f" raise the budget or keep fewer sinks.")
    if recent is not None and not 0 <= recent <= budget:
        raise ConfigError(f"H2O keeps `recent` latest tokens inside the budget: need 0 <= recent <= budget={budget}, "
                          f"got {recent}.")
    if policy == "snapkv" and not 1 <= window <= budget:
        raise ConfigError(f"SnapKV keeps its observation window: need 1 <= window <= budget={budget}, got {window}.")
    if pool < 1 or pool % 2 == 0:
        raise ConfigError(f"SnapKV's pooling kernel must be odd and >= 1 (it is centred on each token), got {pool}.")


# --8<-- [start:select]
def select(policy: str, budget: int, T: int, *, weights: Optional[Tensor] = None, batch: int = 1, sinks: int = 0,
           recent: Optional[int] = None, window: int = 1, pool: int = 1,
           generator: Optional[torch.Generator] = None) -> Tensor:
    """(batch, min(budget, T)) indices (ascending) of the cached tokens that stay.

    weights: (B, nh, Tq, T) softmax weights of the last Tq queries over the T cached tokens (h2o, snapkv).
    """
    check_budget(policy, budget, sinks=sinks, recent=recent, window=window, pool=pool)
    if budget >= T:  # nothing to evict: the full cache
        return torch.arange(T).expand(batch, T)
    if policy == "recency":
        idx = torch.cat([torch.arange(sinks), torch.arange(T - (budget - sinks), T)])
        return idx.expand(batch, budget)
    if policy == "random":
        return torch.stack([torch.randperm(T, generator=generator)[:budget].sort().values for _ in range(batch)])
    if weights is None or weights.shape[-1] != T:
        raise ConfigError(f"{policy} scores tokens by attention: pass the (B, heads, queries, {T}) weights recorded "
                          f"with record_attention.")
    if policy == "h2o":
        r = budget // 2 if recent is None else recent  # H2O's experiments split the budget evenly
        score = weights.double().sum(dim=(1, 2))  # (B, T) attention accumulated over heads and queries
        fixed = T - r  # the last r tokens stay whatever their score
    else:  # snapkv: votes of the observation window (the last `window` queries) for the tokens before it
        score = weights[:, :, -window:].double().sum(dim=(1, 2))  # (B, T)
        if pool > 1:
            score = F.max_pool1d(score[:, None], pool, stride=1, padding=pool // 2)[:, 0]  # keep neighbours together
        r, fixed = window, T - window
    heavy = score[:, :fixed].topk(budget - r, dim=-1).indices  # (B, budget - r)
    tail = torch.arange(fixed, T).expand(score.shape[0], r)
    return torch.cat([heavy, tail], 1).sort(dim=-1).values
# --8<-- [end:select]


# --8<-- [start:evict]
def evict(cache: KVCache, keep: Tensor) -> int:
    """Keep only the tokens at indices keep (B, k) of a contiguous cache; returns how many slots were dropped.
    The survivors keep their positions, so the causal mask is unchanged; a KVCache places the next token after the
    largest kept position, so if the last token may be evicted, pass the next positions to the model explicitly."""
    B, T = cache.entries[0].shape[0], len(cache)
    if keep.shape[0] != B or int(keep.max()) >= T:
        raise ConfigError(f"keep must be (batch={B}, k) indices below the cached length {T}, got {tuple(keep.shape)}.")
    k = keep.shape[1]
    cache.entries = tuple(e.gather(2, keep[:, None, :, None].expand(-1, e.shape[1], -1, e.shape[3]))
                          for e in cache.entries)  # (B, heads, k, width)
    cache.pos = cache.pos.expand(B, -1).gather(1, keep)  # (B, k)
    return T - k
# --8<-- [end:evict]


def layer_caches(cache: list) -> list:
    return [layer["self"] for layer in cache]


# --8<-- [start:prefill]
@torch.no_grad()
def prefill_and_evict(model, prompt: Tensor, policy: str, budget: int, stepwise: bool = False, **kw) -> list:
    """Read prompt (B, T) into a fresh cache and cut every layer's self-attention cache to `budget` tokens.

    By default the prompt is read in one call and each layer selects once, from the attention of every prompt
    query (as the H2O and SnapKV code do at the end of the prefill). stepwise=True (h2o only) runs Alg. 1 of
    Zhang et al. over the prompt: one token per call, each layer accumulating every query's attention on its
    cached tokens and, once over budget, dropping the token with the least accumulated attention outside the
    `recent` latest; the prompt's own queries then already read the evicted cache.
    """
    cache = model.decoder.new_cache()
    B, T = prompt.shape
    if stepwise and policy != "h2o":
        raise ConfigError(f"stepwise eviction is H2O's Alg. 1; policy {policy!r} selects once after the prompt.")
    if not stepwise:
        with record_attention(model) as mods:
            model(prompt, cache=cache)
        for mod, c in zip(mods, layer_caches(cache)):
            evict(c, select(policy, budget, T, weights=mod.weights, batch=B, **kw))
        return cache
    kw = {k: v for k, v in kw.items() if k in ("recent", "sinks")}
    acc = [None] * len(cache)  # per layer (B, cached) accumulated attention
    with record_attention(model) as mods:
        for t in range(T):
            model(prompt[:, t:t + 1], cache=cache)
            for i, (mod, c) in enumerate(zip(mods, layer_caches(cache))):
                row = mod.weights.double().sum(dim=(1, 2))  # (B, cached): this query's attention, heads summed
                acc[i] = row if acc[i] is None else torch.cat([acc[i], torch.zeros(B, 1, dtype=row.dtype)], 1) + row
                n = len(c)
                if n > budget:
                    keep = select("h2o", budget, n, weights=acc[i][:, None, None], batch=B, **kw)
                    evict(c, keep)
                    acc[i] = acc[i].gather(1, keep)
    return cache
# --8<-- [end:prefill]


# --8<-- [start:paged]
class EvictablePagedKVCache(PagedKVCache):
    """A paged cache whose rows can lose scattered tokens.

    Each row keeps the position of every logical slot (-1 once evicted). `evict_slots` marks tokens gone and gives
    back a block only when all of its tokens are gone; the others stay allocated, holes and all. `compact`
    copies a row's surviving tokens into its first blocks, in order, and gives back the rest, counting the bytes
    it copied. The gathered view shows evicted slots as empty (position -1), which the attention masks.
    """

    def __init__(self, pool, batch: int):
        super().__init__(pool, batch)
        self.slot_pos: list[list[int]] = [[] for _ in range(batch)]  # per row: position of each logical slot, -1 = gone
        self.next_pos = [0] * batch  # per row: position of the next token

    def next_positions(self, batch: int, t_new: int, device=None) -> Tensor:
        super().next_positions(batch, t_new, device)  # the row-count check
        start = torch.tensor([self.next_pos[r] for r in self.rows], device=device)[:, None]  # (B, 1)
        return start + torch.arange(t_new, device=device)[None]

    def append_slots(self, row: int, t_new: int) -> tuple[Tensor, Tensor]:
        bs, n, table = self.pool.block_size, self.lengths[row], self.tables[row]
        while len(table) * bs < n + t_new:
            table.append(self.pool.allocate())
        logical = torch.arange(n, n + t_new)
        for j in set((logical // bs).tolist()):  # a block freed by eviction is taken again for new tokens
            if table[j] is None:
                table[j] = self.pool.allocate()
        self.lengths[row] = n + t_new
        return torch.tensor([-1 if b is None else b for b in table])[logical // bs], logical % bs

    def update(self, entries, pos: Tensor):
        for b, row in enumerate(self.rows):
            p = pos[b if pos.shape[0] > 1 else 0].tolist()
            self.slot_pos[row] += p
            self.next_pos[row] = max(p) + 1
        return super().update(entries, pos)

    def gather(self):
        bs = self.pool.block_size
        n_max = max(self.lengths[r] for r in self.rows)
        blocks = -(-n_max // bs)
        table = torch.tensor([[0 if b is None else b for b in self.tables[r]] + [0] * (blocks - len(self.tables[r]))
                              for r in self.rows])  # (B, blocks); freed blocks read block 0 and are masked below
        out = []
        for store in self.pool.storage:
            g = store[table]  # (B, blocks, heads, bs, width)
            B, nb, h, _, w = g.shape
            out.append(g.permute(0, 2, 1, 3, 4).reshape(B, h, nb * bs, w)[:, :, :n_max])
        pos = torch.tensor([self.slot_pos[r] + [-1] * (n_max - len(self.slot_pos[r])) for r in self.rows])  # (B, T_max)
        return tuple(out), pos

    def evict_slots(self, row: int, keep) -> int:
        """Keep only logical slots `keep` (indices) of a row; give back every block left without a token.
        Returns the number of blocks given back."""
        keep = set(int(i) for i in keep)
        bs, sp, table = self.pool.block_size, self.slot_pos[row], self.tables[row]
        for i in range(len(sp)):
            if i not in keep:
                sp[i] = -1
        freed = []
        for j, blk in enumerate(table):
            if blk is not None and all(p < 0 for p in sp[j * bs:(j + 1) * bs]):
                freed.append(blk)
                table[j] = None
        self.pool.release(freed)
        return len(freed)

    def compact(self, row: int) -> dict:
        """Copy a row's surviving tokens into its first blocks, in order, and give back the blocks left over.
        Returns blocks given back and tokens / bytes copied (a token that stays in its slot is not copied)."""
        bs, sp = self.pool.block_size, self.slot_pos[row]
        held = [b for b in self.tables[row] if b is not None]
        live = [i for i, p in enumerate(sp) if p >= 0]  # logical slots that hold a token, in order
        need = -(-len(live) // bs)
        src_blk = torch.tensor([self.tables[row][i // bs] for i in live], dtype=torch.long)
        src_slot = torch.tensor([i % bs for i in live], dtype=torch.long)
        dst_blk = torch.tensor([held[k // bs] for k in range(len(live))], dtype=torch.long)
        dst_slot = torch.tensor([k % bs for k in range(len(live))], dtype=torch.long)
        moved = (src_blk != dst_blk) | (src_slot != dst_slot)  # (live,)
        per_token = 0
        for store in self.pool.storage or []:
            vals = store[src_blk, :, src_slot].clone()  # (live, heads, width): read all before writing any
            store[dst_blk, :, dst_slot] = vals
            per_token += store.shape[1] * store.shape[3] * store.element_size()
        self.pool.release(held[need:])
        self.tables[row] = held[:need]
        self.slot_pos[row] = [sp[i] for i in live]
        self.lengths[row] = len(live)
        return {"blocks_freed": len(held) - need, "tokens_copied": int(moved.sum()),
                "bytes_copied": int(moved.sum()) * per_token}

    def free_row(self, row: int) -> None:
        self.pool.release([b for b in self.tables[row] if b is not None])
        self.tables[row], self.lengths[row], self.slot_pos[row], self.next_pos[row] = [], 0, [], 0

    @property
    def blocks_held(self) -> int:
        return sum(b is not None for t in self.tables for b in t)
# --8<-- [end:paged]


# --8<-- [start:expected]
def expected_free_blocks(n: int, evicted: int, block: int) -> float:
    """Expected number of blocks left empty when `evicted` of n tokens (n a multiple of block) are evicted
    uniformly at random without replacement: (n / block) · C(n − block, evicted − block) / C(n, evicted),
    which tends to (n / block) · f^block with f = evicted / n."""
    if n % block:
        raise ConfigError(f"n={n} must be a multiple of the block size {block} for this count.")
    if evicted < block:
        return 0.0
    p = 1.0
    for i in range(block):  # C(n-B, e-B)/C(n, e) = prod_{i<B} (e - i)/(n - i)
        p *= (evicted - i) / (n - i)
    return n // block * p
# --8<-- [end:expected]

"""Sparse attention: each query attends to a selected few of the keys it may see (MixerConfig.mixer "topk", "block").

Both classes are MultiHeadAttention with one new `score`: the usual logits q·k/√d_k, with every visible key that the
query did not select set to -inf, so the softmax renormalises over the kept keys only. Everything else (projections,
masks, softmax, the KV cache, decoding) is the shared attention's. Visibility is recomputed from the positions
(attention.hidden, causal and window as the forward applies them), so a query selects among the keys it may see and
the selection of a query depends on nothing after it: decoding through the cache gives the full forward's outputs.

    "topk"   token-level: each query keeps its sparse_keys highest-scoring visible keys. Selection by the head's own
             logits is the "oracle" DeepSeek Sparse Attention approximates with its lightning indexer (a few cheap
             ReLU heads trained to match the attention distribution; DeepSeek-V3.2-Exp report, §2.1).
    "block"  block-level: keys in blocks of sparse_block consecutive positions (position // sparse_block); each query
             keeps the sparse_keys // sparse_block blocks with the highest block score. Block score here: the mean of
             the query's logits over the block's visible keys, i.e. q·mean(k)/√d_k, mean-pooled keys. NSA's selected
             branch scores blocks by the attention weights of its compressed branch (learned MLP compression of each
             block's keys, Yuan et al. 2025, §3.3, eqs. 8-10), shares the choice across the heads of a GQA group and
             always keeps the first and the local blocks; we keep none of those: one head, mean pooling, no forced blocks.

sparse_keys = 0 keeps every visible key (dense attention). The selection is a hard top-k: it passes no gradient to the
choice itself (NSA trains the compression branch through its own output, DSA the indexer with a KL loss).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .attention import MultiHeadAttention, Pos, end_aligned, hidden
from .config import ConfigError

PAIRWISE = ("shaw", "xl", "rope", "alibi", "t5")  # variants that live in other attention classes


def check_sparse(cfg, block: bool) -> None:
    """Settings the sparse mixers cannot honour raise ConfigError naming the fix."""
    if cfg.positions in PAIRWISE or cfg.kv_latent or cfg.score_fn != "dot":
        raise ConfigError(f"sparse attention selects on the plain dot-product logits of MultiHeadAttention: use "
                          f"positions='learned', 'sinusoidal' or 'none', kv_latent=0 and score_fn='dot' "
                          f"(got positions={cfg.positions!r}, kv_latent={cfg.kv_latent}, score_fn={cfg.score_fn!r}).")
    if cfg.attn_impl == "tiled":
        raise ConfigError("attn_impl='tiled' never calls score(), so the selection would be skipped: use 'explicit' "
                          "or 'auto' (sparse attention always takes the explicit path).")
    if block:
        if cfg.sparse_block < 2:
            raise ConfigError(f"block-sparse attention needs sparse_block >= 2 keys per block (got {cfg.sparse_block}); "
                              f"sparse_block=1 is token-level selection: use mixer='topk'.")
        if cfg.sparse_keys % cfg.sparse_block:
            raise ConfigError(f"sparse_keys={cfg.sparse_keys} is not a whole number of blocks of {cfg.sparse_block}: "
                              f"set sparse_keys to a multiple of sparse_block (kept blocks = sparse_keys // sparse_block).")


class SparseAttention(MultiHeadAttention):
    """Shared part: the visible-key mask from positions, the guard on masks, the masked logits."""

    block = False

    def __init__(self, cfg):
        super().__init__(cfg)
        check_sparse(cfg, self.block)

    def forward(self, x: Tensor, kv: Optional[Tensor] = None, *, key_padding_mask=None, attn_mask=None,
                prefix: int = 0, **kw) -> Tensor:
        """The shared forward, after refusing what score() cannot see (masks given as tensors, a prefix, kv)."""
        if kv is not None or key_padding_mask is not None or attn_mask is not None or prefix:
            raise ConfigError("sparse attention selects among the keys its positions make visible (causal, window): "
                              "it takes no cross-attention kv, key_padding_mask, attn_mask or prefix; batch sequences "
                              "of one length.")
        return super().forward(x, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask, prefix=prefix, **kw)

    def visible(self, q: Tensor, k: Tensor, pos: Optional[Pos]) -> tuple[Tensor, Tensor]:
        """(B|1, 1, Tq, Tk) bool, True where the query may see the key (as the forward will mask it), and k_pos."""
        q_pos, k_pos = pos if pos is not None else end_aligned(q.shape[-2], k.shape[-2], q.device)
        window = self.cfg.window if self.causal else 0
        return ~hidden(q_pos, k_pos, self.causal, window, self.cfg.attn_sinks), k_pos

    def keep(self, s: Tensor, vis: Tensor, k_pos: Tensor) -> Tensor:
        raise NotImplementedError

    def score(self, q: Tensor, k: Tensor, pos: Optional[Pos] = None) -> Tensor:
        s = super().score(q, k, pos)  # (B, nh, Tq, Tk)
        if not self.cfg.sparse_keys:
            return s
        vis, k_pos = self.visible(q, k, pos)
        kept = self.keep(s, vis, k_pos) & vis  # (B, nh, Tq, Tk)
        return s.masked_fill(vis & ~kept, float("-inf"))  # hidden keys are masked by the forward as usual


# --8<-- [start:topk]
class TopKAttention(SparseAttention):
    """Token-level selection: each query keeps its sparse_keys highest-logit visible keys (all of them if fewer)."""

    name = "topk"

    def keep(self, s: Tensor, vis: Tensor, k_pos: Tensor) -> Tensor:
        n = min(self.cfg.sparse_keys, s.shape[-1])
        top = s.masked_fill(~vis, float("-inf")).topk(n, dim=-1).indices  # (B, nh, Tq, n): hidden ones sort last
        return torch.zeros_like(s, dtype=torch.bool).scatter_(-1, top, True)
# --8<-- [end:topk]


# --8<-- [start:block]
class BlockSparseAttention(SparseAttention):
    """Block-level selection: keys grouped by position // sparse_block; each query keeps the sparse_keys //
    sparse_block blocks whose visible keys have the highest mean logit (q · mean-pooled key)."""

    name = "block"
    block = True

    def block_scores(self, s: Tensor, vis: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """(B, nh, Tq, nb) mean logit over each block's visible keys (-inf for a block with none); (B|1, Tk, nb)."""
        ids = k_pos.clamp(min=0) // self.cfg.sparse_block  # (B|1, Tk) block of each key (empty slots are hidden)
        member = torch.nn.functional.one_hot(ids, int(ids.max()) + 1).to(s.dtype)  # (B|1, Tk, nb)
        v = vis.to(s.dtype)  # (B|1, 1, Tq, Tk)
        total = (s.masked_fill(~vis, 0.0)) @ member[:, None]  # (B, nh, Tq, nb): sum of visible logits per block
        count = v @ member[:, None]  # (B|1, 1, Tq, nb): visible keys per block
        return (total / count.clamp(min=1)).masked_fill(count == 0, float("-inf")), member

    def keep(self, s: Tensor, vis: Tensor, k_pos: Tensor) -> Tensor:
        score, member = self.block_scores(s, vis, k_pos)
        n = min(self.cfg.sparse_keys // self.cfg.sparse_block, score.shape[-1])
        top = score.topk(n, dim=-1).indices  # (B, nh, Tq, n) chosen blocks
        chosen = torch.zeros_like(score).scatter_(-1, top, 1.0)  # (B, nh, Tq, nb)
        return (chosen @ member[:, None].transpose(-2, -1)) > 0  # (B, nh, Tq, Tk): keys of the chosen blocks
# --8<-- [end:block]

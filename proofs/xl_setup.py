"""The small Transformer-XL decoder and how far back its last position can see through the segment memory: the
set-up shared by the Transformer-XL and RPR-vs-Transformer-XL proofs.

`influence` changes one input token at a time and measures the last position's logits (float64, so an untouched
output is bitwise unchanged); `gradient_reach` measures the gradient, which the detached memory stops at the current
segment; `predicted_reach` is the L x segment bound.
"""

from __future__ import annotations

import torch

from proofs.transformer import DecoderLM, TransformerConfig

V = 16  # vocabulary of every experiment here (token 0 unused)
BASE = TransformerConfig(vocab_size=V, d_model=32, n_heads=2, d_ff=64, n_layers=2, positions="xl", mem_len=8,
                         dropout_emb=0.0, dropout_residual=0.0)


def lm(seed: int, **switches) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(BASE.replace(**switches)).eval()


# --8<-- [start:reach]
def run_segments(model: DecoderLM, ids: torch.Tensor, seg_len: int, mem_len: int | None = None) -> torch.Tensor:
    """Logits of a stream processed segment by segment, each segment reading the previous ones' memory."""
    mems, out = None, []
    for seg in ids.split(seg_len, dim=1):
        logits, mems = model.forward_with_memory(seg, mems, mem_len)
        out.append(logits)
    return torch.cat(out, dim=1)  # (B, n_segments * seg_len, V)


def influence(model: DecoderLM, seg_len: int, n_segments: int, mem_len: int, seed: int) -> torch.Tensor:
    """(n,) how much changing input token t changes the logits of the stream's last position."""
    n = seg_len * n_segments
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (1, n), generator=g).repeat(n + 1, 1)  # row 0 as drawn, row t+1: token t changed
    t = torch.arange(n)
    ids[t + 1, t] = ids[t + 1, t] % (V - 1) + 1  # another token in [1, V)
    with torch.no_grad():
        last = run_segments(model.double(), ids, seg_len, mem_len)[:, -1]  # (n+1, V)
    return (last[1:] - last[0]).abs().amax(-1)  # (n,)


def predicted_reach(n_layers: int, seg_len: int, mem_len: int, n_segments: int) -> int:
    """How far back the last position can see: each layer reaches mem_len before its own segment's start."""
    last = seg_len * n_segments - 1
    earliest = last
    for _ in range(n_layers):
        earliest = max(earliest // seg_len * seg_len - mem_len, 0)
    return last - earliest


def gradient_reach(model: DecoderLM, seg_len: int, n_segments: int, seed: int) -> torch.Tensor:
    """(n,) gradient norm of the last position's logits with respect to each input embedding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (1, seg_len * n_segments), generator=g)
    model = model.double()
    mems, leaves = None, []
    for seg in ids.split(seg_len, dim=1):
        h = model.embed(seg).detach().requires_grad_()  # (1, L, C) a leaf per segment
        out, mems = model.decoder.forward_with_memory(h, mems)
        leaves.append(h)
    model.head(out)[0, -1].sum().backward()
    return torch.cat([h.grad[0].norm(dim=-1) if h.grad is not None else torch.zeros(seg_len) for h in leaves])
# --8<-- [end:reach]

"""The small Shaw-RPR encoder and two probes of what its relative tables do: the set-up shared by the Shaw RPR and
RPR-vs-Transformer-XL proofs.

`shift_change` moves a sentence inside a padded context and measures how much a real token's logits change (zero for
purely relative scores); `row_usage` counts, while a model runs, which rows of its (2k+1)-row relative tables the
forward pass reads with a nonzero attention weight.
"""

from __future__ import annotations

import torch

from proofs.tasks import PAD, random_tokens
from proofs.transformer import EncoderTagger, ShawAttention, TransformerConfig, record_attention

K = 4  # clipping distance of the trained models: below the training length, so every table row gets trained
TRAIN_LEN = 8  # length of every training sequence
TEST_LENS = (8, 16, 24, 32)  # 1x to 4x the training length


def tiny(positions: str, **switches) -> TransformerConfig:
    """The small encoder every measurement uses; only `positions` and the given switches change."""
    base = TransformerConfig(vocab_size=16, d_model=32, n_heads=2, d_ff=64, n_layers=1, rel_clip=K,
                             dropout_emb=0.0, dropout_residual=0.0)
    return base.replace(positions=positions, **switches)


# --8<-- [start:shift]
def shift_change(positions: str, seed: int, n: int = 10, context: int = 16, shift: int = 6) -> float:
    """Largest change of a real token's logits when the sentence moves `shift` slots right (fp64, 2 layers)."""
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(positions, n_layers=2)).double().eval()
    tokens = random_tokens(torch.Generator().manual_seed(seed), 1, n, 16)  # (1, n), never PAD
    out = []
    for start in (0, shift):
        ids = torch.full((1, context), PAD)
        ids[:, start:start + n] = tokens
        with torch.no_grad():
            out.append(model(ids, key_padding_mask=ids == PAD)[:, start:start + n])  # (1, n, V)
    return (out[0] - out[1]).abs().max().item()
# --8<-- [end:shift]


def row_usage(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a model's Shaw layers index while they run on ids: per row r of the (2k+1)-row tables (offset r − k), the
    number of (query, key) pairs that read it with a nonzero attention weight, and the attention weight summed over
    them (all layers, heads, queries, sequences). The index is the one the forward pass itself computes (each layer's
    `rel_index` is wrapped and its output kept); a pair the mask hides has weight 0 and does not count."""
    shaw = [m for m in model.modules() if isinstance(m, ShawAttention)]
    seen: dict[ShawAttention, torch.Tensor] = {}
    for m in shaw:
        def spy(*args, _m=m, _orig=m.rel_index, **kwargs):
            seen[_m] = _orig(*args, **kwargs)  # (B|1, 1, Tq, Tk) table rows of this call
            return seen[_m]
        m.rel_index = spy  # instance attribute: shadows the method for this call only
    try:
        with torch.no_grad(), record_attention(model):
            model(ids)
            rows = 2 * shaw[0].cfg.rel_clip + 1
            pairs, weight = torch.zeros(rows), torch.zeros(rows)
            for m in shaw:
                w = m.weights  # (B, nh, Tq, Tk)
                idx = seen[m].expand_as(w)
                pairs += torch.bincount(idx[w > 0].flatten(), minlength=rows).float()
                weight += torch.zeros(rows, dtype=w.dtype).scatter_add(0, idx.flatten(), w.flatten()).float()
    finally:
        for m in shaw:
            del m.rel_index
    return {"pairs": pairs, "weight": weight}

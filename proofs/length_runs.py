"""Small decoders trained at one length and evaluated at longer ones: the set-up of the extrapolation, ALiBi/T5,
RoPE-layout and long-context proofs, which reuse the same cached trained arms.

The task: tokens are uniform over 1..15; tokens 1..4 are keys. At every position the target is the most recent key at
or before it (no target before the first key). The rule is the same at every length, so extrapolation is well
defined, and it needs order. Train: 70 Adam steps of 32 sequences of length 32, learning rate 0.01; every arm sees the
same batches (they depend on the seed only).
"""

from __future__ import annotations

from functools import cache

import torch

from proofs.train import train
from proofs.transformer import DecoderLM, TransformerConfig

TRAIN_LEN = 32  # every training sequence has 32 tokens
FACTORS = (1, 2, 4)  # tested at 1x, 2x and 4x the training length
VOCAB = 16  # tokens 1..15 (0 is never drawn)
KEYS = 4  # tokens 1..4 are the "keys"; 5..15 are filler
IGNORE = -100  # F.cross_entropy's default ignore_index: no target before the first key
STEPS, BATCH, LR = 70, 32, 1e-2  # the same budget for every arm (Adam, as in proofs/train.py)
EVAL_BATCH = 128

# --8<-- [start:config]
# One model for every arm: 2 Pre-LN layers, d_model 32, 4 heads (d_head 8), dropout off.
# A learned table has exactly TRAIN_LEN rows. Shaw clips offsets at 8 and T5 puts every offset
# of 15 or more into its last bucket: both below the training length, as in the papers
# (Shaw et al. clip at k = 16; T5 has 32 buckets up to offset 128 and trains on 512 tokens).
BASE = TransformerConfig(vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=TRAIN_LEN,
                         norm_position="pre", dropout_emb=0.0, dropout_residual=0.0,
                         rel_clip=8, t5_buckets=16, t5_max_distance=16)
# --8<-- [end:config]


# --8<-- [start:task]
def last_key_task(g: torch.Generator, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, targets), both (batch, length): target t = the latest key (token <= KEYS) among ids[:t+1]."""
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    t = torch.arange(length).expand(batch, length)
    where_key = torch.where(ids <= KEYS, t, torch.full_like(t, -1))  # position of each key, -1 elsewhere
    latest = where_key.cummax(dim=1).values  # (B, T) position of the latest key so far (-1: none yet)
    target = ids.gather(1, latest.clamp(min=0))
    return ids, torch.where(latest >= 0, target, torch.full_like(target, IGNORE))


@cache
def trained(positions: str, seed: int) -> DecoderLM:
    """One arm, trained on length-32 sequences; the batches depend on the seed only, never on the arm."""
    torch.manual_seed(seed)
    model = DecoderLM(BASE.replace(positions=positions))
    g = torch.Generator().manual_seed(1000 + seed)
    data = [last_key_task(g, BATCH, TRAIN_LEN) for _ in range(STEPS)]
    train(model, lambda step: data[step], STEPS, lr=LR)
    return model


def eval_batch(seed: int, length: int = 4 * TRAIN_LEN) -> tuple[torch.Tensor, torch.Tensor]:
    return last_key_task(torch.Generator().manual_seed(10_000 + seed), EVAL_BATCH, length)
# --8<-- [end:task]

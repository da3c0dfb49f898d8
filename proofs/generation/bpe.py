"""Byte pair encoding from scratch: the merge loop of Sennrich et al. (2016), in a dozen lines.

Checked against the `tokenizers` library's BpeTrainer in proofs/generation/proof_tokenisers.py: same merges,
same order. Ties (two pairs with the same count) are broken as the library breaks them: the pair whose
tokens entered the vocabulary first wins (special tokens, then single characters in code-point order,
then merged tokens in the order they were made).
"""

from __future__ import annotations

from collections import Counter


# --8<-- [start:bpe]
def train_bpe(word_counts: dict[str, int], n_merges: int, specials: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """word -> count (after pre-tokenisation) in, the merges out, most frequent adjacent pair first."""
    rank = {t: i for i, t in enumerate([*specials, *sorted({c for w in word_counts for c in w})])}
    words = Counter({tuple(w): n for w, n in word_counts.items()})  # each word as a tuple of its current tokens
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, n in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += n  # a pair counts once per occurrence, weighted by the word's count
        if not pairs:
            break
        a, b = min(pairs, key=lambda p: (-pairs[p], rank[p[0]], rank[p[1]]))  # most frequent; ties: older tokens
        merges.append((a, b))
        rank[a + b] = len(rank)
        words = Counter({merge_word(w, a, b): n for w, n in words.items()})
    return merges


def merge_word(w: tuple[str, ...], a: str, b: str) -> tuple[str, ...]:
    """Replace every adjacent (a, b) in w, left to right, by the single token a+b."""
    out, i = [], 0
    while i < len(w):
        if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(w[i])
            i += 1
    return tuple(out)
# --8<-- [end:bpe]

"""Coding drill: the BPE merge loop.

Write `train_bpe(word_counts, n_merges)` (no tokenizer library), then run `pytest proofs/drills/drill_bpe.py`.
"""

from collections import Counter  # noqa: F401  (you will want it)

PAGE = "generation/tokenisers.md"


def train_bpe(word_counts: dict[str, int], n_merges: int) -> list[tuple[str, str]]:
    """Start from single characters; n_merges times, merge the most frequent adjacent pair (counted over every
    occurrence in every word, weighted by the word's count) and record it. Ties: the pair whose left token entered the
    vocabulary first wins, then its right token (characters in code-point order, then merged tokens in the order they
    were made). Stop early when no pair is left. Returns the merges in order, e.g. [("l", "o"), ("lo", "w"), ...]."""
    raise NotImplementedError("write the BPE merge loop here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import json  # noqa: E402

import pytest  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from proofs.drills import pick  # noqa: E402


def reference(word_counts: dict[str, int], n_merges: int) -> list[tuple[str, str]]:
    """The `tokenizers` library's BpeTrainer on the same word counts (an independent implementation)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    alphabet = {c for w in word_counts for c in w}
    words = [w for w, n in word_counts.items() for _ in range(n)]
    tok.train_from_iterator(words, trainers.BpeTrainer(vocab_size=len(alphabet) + n_merges, show_progress=False))
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in json.loads(tok.to_str())["model"]["merges"]]


SENNRICH = {"low": 5, "lower": 2, "newest": 6, "widest": 3}  # the toy vocabulary of Sennrich et al. (2016), Fig. 1


def test_sennrich_example():
    f = pick(train_bpe, reference)
    assert f(SENNRICH, 4) == reference(SENNRICH, 4)
    assert f(SENNRICH, 4)[:2] == [("e", "s"), ("es", "t")]  # "es" occurs 9 times, then "est" 9 times


@pytest.mark.parametrize("seed", [1, 2])
def test_random_words_match_the_library(seed):
    f = pick(train_bpe, reference)
    g = __import__("random").Random(seed)
    words = {"".join(g.choice("abcde") for _ in range(g.randint(2, 7))): g.randint(1, 9) for _ in range(40)}
    assert f(words, 25) == reference(words, 25)


def test_stops_when_nothing_is_left_to_merge():
    f = pick(train_bpe, reference)
    assert f({"ab": 3}, 5) == [("a", "b")]

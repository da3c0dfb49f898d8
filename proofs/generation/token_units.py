"""Four ways to cut the same text into tokens: words, characters, bytes, byte-level BPE (and character-level BPE).

One concern: build each unit's tokeniser with the Hugging Face `tokenizers` library on the training part of a
deterministic split of `proofs/generation/corpus.txt`, and count what it does to the held-out part. Used by
`proofs/generation/proof_token_units.py` (docs/generation/word-subword-byte.md).

| function | what it builds | unknowns possible? |
|---|---|---|
| `split_lines(lines, every)` | train / held-out by whole lines: line i is held out when i % every == every - 1 | |
| `word_level(train, k)` | the k most frequent words (Whitespace pre-tokeniser: runs of letters/digits, or of punctuation) + [UNK] | yes |
| `char_level(train)` | every character of the training text (a space is "▁") + [UNK]: BPE with no merge | yes |
| `char_bpe(train, v)` | BPE over characters, v entries in all (Sennrich et al. 2016, §3.2) + [UNK] | yes |
| `byte_bpe(train, v)` | BPE over the 256 UTF-8 byte symbols after GPT-2's pre-tokenisation split, v entries in all (Radford et al. 2019, §2.2) | no |

Shapes: every tokeniser maps a str to a list of int ids (`tok.encode(s).ids`, length n_tokens); the embedding table
of a model on top is (vocab_size, d_model). Bad settings raise `ConfigError` naming the fix.
Training is deterministic (no seed enters); `proof_token_units.py` checks that against shuffled line orders.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from proofs.transformer.config import ConfigError

UNK = "[UNK]"
BYTES = 256  # the byte-level alphabet: every UTF-8 string is a sequence of these


# --8<-- [start:split]
def split_lines(lines: list[str], every: int = 5) -> tuple[list[str], list[str]]:
    """Whole lines, deterministic: line i goes to the held-out part when i % every == every - 1, else to training."""
    if every < 2:
        raise ConfigError(f"every must be >= 2 (got {every}): every = 1 would hold out all lines and train on none")
    train = [s for i, s in enumerate(lines) if i % every != every - 1]
    held = [s for i, s in enumerate(lines) if i % every == every - 1]
    return train, held
# --8<-- [end:split]


# --8<-- [start:units]
def word_level(train: list[str], k: int) -> Tokenizer:
    """The k most frequent training words, anything else -> [UNK] (a word-level model's vocabulary)."""
    if k < 1:
        raise ConfigError(f"k must be >= 1 (got {k}): a word vocabulary keeps the k most frequent words")
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+ or [^\w\s]+: a Chinese clause without spaces is one "word"
    tok.train_from_iterator(train, trainers.WordLevelTrainer(vocab_size=k + 1, special_tokens=[UNK],
                                                             show_progress=False))
    return tok


def char_bpe(train: list[str], v: int) -> Tokenizer:
    """BPE over characters (Sennrich et al. 2016): the training text's characters, then merges up to v entries.
    The space is kept as the character "▁" (Metaspace, nothing prepended), so decoding gives the text back."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Metaspace(prepend_scheme="never")
    tok.train_from_iterator(train, trainers.BpeTrainer(vocab_size=v, special_tokens=[UNK], show_progress=False))
    return tok


def char_level(train: list[str]) -> Tokenizer:
    """One token per character: character BPE with no merge (the alphabet the training text has, + [UNK])."""
    return char_bpe(train, 1)  # a size below the alphabet keeps the whole alphabet and learns no merge


def byte_bpe(train: list[str], v: int) -> Tokenizer:
    """Byte-level BPE (GPT-2's kind): the 256 byte symbols, then merges up to v entries; no [UNK] exists.
    v = 256 is plain bytes: one token per UTF-8 byte."""
    if v < BYTES:
        raise ConfigError(f"byte-level BPE needs v >= {BYTES} (got {v}): the 256 byte symbols come first, merges after")
    tok = Tokenizer(models.BPE())
    # text -> UTF-8 bytes, one symbol each; use_regex (the library's default) first splits the text with GPT-2's
    # pattern (letters, digits, punctuation, spaces apart), so no merge crosses those categories (Radford et al. §2.2)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train, trainers.BpeTrainer(vocab_size=v, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return tok
# --8<-- [end:units]


def unknowns(tok: Tokenizer, lines: list[str]) -> tuple[int, int]:
    """(number of [UNK] ids, number of ids) over lines; a tokeniser without [UNK] has none by construction."""
    unk = tok.token_to_id(UNK)
    ids = [i for s in lines for i in tok.encode(s).ids]
    return sum(i == unk for i in ids) if unk is not None else 0, len(ids)

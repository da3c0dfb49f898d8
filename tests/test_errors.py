"""Bad configuration or input raises a ConfigError that names the problem and the fix."""

import pytest
import torch

from proofs.transformer import ConfigError, EncoderDecoder, EncoderTagger, MultiHeadAttention, TransformerConfig


def raises(match):
    return pytest.raises(ConfigError, match=match)


def test_heads_must_divide_d_model():
    with raises(r"d_model=30 is not divisible by n_heads=4.*Pick n_heads from \[1, 2, 3, 5, 6"):
        TransformerConfig(d_model=30, n_heads=4)


@pytest.mark.parametrize("field,value", [("norm", "rmsnorm"), ("positions", "rotary"), ("attn_scale", "sqrt_d")])
def test_unknown_option_lists_the_options(field, value):
    with raises(rf"TransformerConfig.{field}='{value}' is not an option; use one of"):
        TransformerConfig(**{field: value})


def test_unknown_field_in_replace():
    with raises(r"no field\(s\) \['heads'\]"):
        TransformerConfig().replace(heads=8)


def test_bad_dropout_probability():
    with raises(r"dropout_attn=1.5 must be a probability"):
        TransformerConfig(dropout_attn=1.5)


def test_tie_all_needs_one_vocabulary():
    with raises(r"Use tie_embeddings='decoder'"):
        TransformerConfig(src_vocab_size=50, vocab_size=40)
    EncoderDecoder(TransformerConfig(src_vocab_size=50, vocab_size=40, tie_embeddings="decoder"))


def test_sequence_longer_than_learned_table():
    m = EncoderTagger(TransformerConfig(positions="learned", max_len=8))
    with raises(r"sequence length 9 exceeds the learned position table \(max_len=8\).*Raise max_len"):
        m(torch.ones(1, 9, dtype=torch.long))


def test_sinusoidal_has_no_length_limit():
    m = EncoderTagger(TransformerConfig(positions="sinusoidal", max_len=8)).eval()
    assert m(torch.ones(1, 20, dtype=torch.long)).shape == (1, 20, 32)


@pytest.mark.parametrize("bad,match", [
    (torch.ones(2, 5), "bool tensor"),
    (torch.zeros(2, 5, dtype=torch.bool), r"shape \(2, 5\); expected \(2, 6\)"),
    (torch.zeros(6, dtype=torch.bool), r"shape \(6,\)"),
])
def test_bad_padding_mask(bad, match):
    attn = MultiHeadAttention(TransformerConfig(d_model=16, n_heads=2))
    with raises(match):
        attn(torch.randn(2, 6, 16), key_padding_mask=bad)


def test_bad_attn_mask_shape():
    attn = MultiHeadAttention(TransformerConfig(d_model=16, n_heads=2))
    with raises(r"attn_mask has shape \(5, 5\); expected \(6, 6\) or \(2, 6, 6\)"):
        attn(torch.randn(2, 6, 16), attn_mask=torch.zeros(5, 5, dtype=torch.bool))


def test_wrong_width_input():
    attn = MultiHeadAttention(TransformerConfig(d_model=16, n_heads=2))
    with raises(r"expects \(batch, time, d_model=16\)"):
        attn(torch.randn(2, 6, 12))


def test_token_ids_checked():
    m = EncoderTagger(TransformerConfig(vocab_size=10))
    with raises(r"token ids must lie in \[0, 10\)"):
        m(torch.tensor([[1, 2, 10]]))
    with raises(r"integer tensor of shape \(batch, time\)"):
        m(torch.randn(1, 3))

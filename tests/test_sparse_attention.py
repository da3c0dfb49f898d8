"""Sparse attention (proofs/transformer/sparse_attention.py) against a reference written here: the kept mask is built
query by query with Python loops, then a plain masked softmax over q·k/√d_k, independent of the module's code."""

import math

import pytest
import torch

from proofs.transformer import ConfigError, MixerConfig, MultiHeadAttention, mixer_lm
from proofs.transformer.sparse_attention import BlockSparseAttention, TopKAttention


def cfg(**kw) -> MixerConfig:
    base = dict(vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=64, dropout_emb=0.0,
                dropout_residual=0.0, positions="learned", attn_impl="explicit")
    return MixerConfig(**{**base, **kw})


def reference(att: MultiHeadAttention, x: torch.Tensor, keys: int, block: int, window: int = 0) -> torch.Tensor:
    """Causal attention where query i keeps, among keys j <= i (and i - j < window if window), the `keys` best by
    logit (block == 1) or the keys // block blocks (j // block) with the best mean logit over their visible keys."""
    q, k, v = att.project(x, x)  # (B, nh, T, hs)
    B, nh, T, hs = q.shape
    s = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
    keep = torch.zeros(B, nh, T, T, dtype=torch.bool)
    for b in range(B):
        for h in range(nh):
            for i in range(T):
                vis = [j for j in range(i + 1) if not window or i - j < window]
                if block == 1:
                    chosen = sorted(vis, key=lambda j: -s[b, h, i, j].item())[:keys]
                else:
                    groups = {}
                    for j in vis:
                        groups.setdefault(j // block, []).append(j)
                    mean = {g: sum(s[b, h, i, j].item() for j in js) / len(js) for g, js in groups.items()}
                    best = sorted(mean, key=lambda g: -mean[g])[:keys // block]
                    chosen = [j for g in best for j in groups[g]]
                for j in chosen:
                    keep[b, h, i, j] = True
    a = s.masked_fill(~keep, float("-inf")).softmax(-1)
    y = (a @ v).transpose(1, 2).reshape(B, T, nh * hs)
    return att.w_o(y)


@pytest.mark.parametrize("mixer,keys,block,window", [("topk", 1, 1, 0), ("topk", 3, 1, 0), ("topk", 2, 1, 4),
                                                     ("block", 4, 2, 0), ("block", 6, 3, 0), ("block", 4, 4, 0)])
def test_sparse_matches_reference_mask(mixer, keys, block, window):
    torch.manual_seed(0)
    c = cfg(mixer=mixer, sparse_keys=keys, sparse_block=block, window=window)
    att = mixer_lm(c).double().decoder.layers[0].self_attn
    assert isinstance(att, TopKAttention if mixer == "topk" else BlockSparseAttention)
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(att(x, causal=True), reference(att, x, keys, block, window), atol=1e-12)


@pytest.mark.parametrize("mixer,keys,block", [("topk", 11, 1), ("topk", 40, 1), ("block", 12, 2), ("topk", 0, 1)])
def test_equal_to_dense_when_every_key_is_kept(mixer, keys, block):
    torch.manual_seed(1)
    att = mixer_lm(cfg(mixer=mixer, sparse_keys=keys, sparse_block=block)).double().decoder.layers[0].self_attn
    dense = MultiHeadAttention(cfg()).double()
    dense.load_state_dict(att.state_dict())
    x = torch.randn(3, 11, 16, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(att(x, causal=True), dense(x, causal=True))  # same explicit path, same numbers


@pytest.mark.parametrize("mixer,block", [("topk", 1), ("block", 2)])
def test_decoding_through_the_cache_equals_the_full_forward(mixer, block):
    torch.manual_seed(2)
    model = mixer_lm(cfg(mixer=mixer, sparse_keys=4, sparse_block=block, n_layers=2)).double().eval()
    x = torch.randint(0, 30, (2, 13))
    with torch.no_grad():
        full = model(x)
        cache = model.decoder.new_cache()
        steps = [model(x[:, :5], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(5, 13)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(mixer="block", sparse_keys=4, sparse_block=1),
                                dict(mixer="block", sparse_keys=5, sparse_block=2),
                                dict(mixer="topk", sparse_keys=4, positions="alibi"),
                                dict(mixer="topk", sparse_keys=4, attn_impl="tiled"),
                                dict(mixer="topk", sparse_keys=-2)])
def test_bad_settings_raise_config_error(kw):
    with pytest.raises(ConfigError):
        mixer_lm(cfg(**kw))


def test_masks_and_cross_attention_are_refused():
    att = TopKAttention(cfg(mixer="topk", sparse_keys=2))
    x = torch.randn(1, 4, 16)
    with pytest.raises(ConfigError):
        att(x, causal=True, attn_mask=torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(ConfigError):
        att(x, causal=True, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(ConfigError):
        att(x, x)
    with pytest.raises(ConfigError):
        att(x, causal=True, prefix=2)

"""Hybrid stacks (one mixer per layer, MixerConfig.mixer as a tuple) and the hybrids page's set-up (proofs/hybrid_runs.py)
against references written here: decoding memory against a count of the numbers each layer must keep, token-by-token
decoding against one full forward for mixed stacks, the fused MQAR layout the set-up trains on, and the errors.
"""

from __future__ import annotations

import pytest
import torch

from proofs import hybrid_runs as H
from proofs.mqar import IGNORE, mqar
from proofs.transformer import ConfigError, MixerConfig, mixer_lm
from proofs.transformer.mixers import RecurrentState, state_bytes


def expected_bytes(stack, d, T, N, bytes_per=8):
    """Written out per layer: softmax caches K and V (2·d a token), linear keeps S (d×d) and z (d), the SSM d×N."""
    numbers = 0
    for m in stack:
        numbers += {"softmax": 2 * d * T, "linear": d * d + d, "ssm": d * N}[m]
    return numbers * bytes_per


@pytest.mark.parametrize("stack", [("softmax", "linear"), ("linear", "linear", "linear", "softmax"), ("ssm", "softmax"),
                                   ("ssm", "ssm")])
def test_decode_bytes_match_a_count_per_layer(stack):
    r = H.decode_bytes(stack, (5, 12))
    for T, b in r["bytes"].items():
        assert b == expected_bytes(stack, H.WIDTH, T, H.WIDTH)
    assert r["decode vs full forward"] < 1e-9


@pytest.mark.parametrize("stack", [("linear", "softmax", "ssm"), ("softmax", "delta")])
def test_mixed_stack_decodes_in_chunks_like_one_forward(stack):
    torch.manual_seed(0)
    model = mixer_lm(H.config(stack, 32)).double().eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    cache = model.decoder.new_cache()
    with torch.no_grad():
        parts = torch.cat([model(chunk, cache=cache) for chunk in ids.split([7, 1, 12], dim=1)], dim=1)
        full = model(ids)
    assert (parts - full).abs().max().item() < 1e-9
    kinds = [type(c["self"]).__name__ for c in cache]
    assert [k == "RecurrentState" for k in kinds] == [m != "softmax" for m in stack]
    assert state_bytes(cache) > 0


def test_setup_config_and_fused_layout():
    cfg = H.config(("softmax", "linear"), 16)
    assert cfg.layer_mixers() == ("softmax", "linear") and cfg.n_heads == 1 and cfg.positions == "none"
    x, y = mqar(torch.Generator().manual_seed(0), 4, 16, H.QUERIES, H.KEYS, H.VALUES, fused=True)
    assert x.shape == (4, 16 + H.QUERIES)
    assert (y[:, :16] == IGNORE).all() and (y[:, 16:] != IGNORE).all()
    assert int(x.max()) < cfg.vocab_size


def test_bad_stacks_raise():
    base = dict(vocab_size=16, d_model=8, n_heads=1, d_ff=16, positions="none")
    with pytest.raises(ConfigError):
        MixerConfig(**base, n_layers=3, mixer=("softmax", "linear"))  # two names for three layers
    with pytest.raises(ConfigError):
        MixerConfig(**base, n_layers=2, mixer=("softmax", "mamba"))  # not a registered mixer
    with pytest.raises(ConfigError):
        MixerConfig(**{**base, "positions": "rope"}, n_layers=2, mixer=("softmax", "linear"))  # RoPE needs scores
    assert RecurrentState().nbytes() == 0

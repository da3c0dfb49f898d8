"""Causal linear attention (proofs/transformer/mixers.py: LinearAttention) against references written here: a plain
token loop in fp64, the decoding state's size, decoding through mixer_lm's caches against the full forward, and the
settings MixerConfig and mixer_lm refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import ConfigError, KVCache, TransformerConfig
from proofs.transformer.mixers import LinearAttention, MixerConfig, RecurrentState, mixer_lm, state_bytes


def cfg(**kw) -> MixerConfig:
    base = dict(vocab_size=12, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout_emb=0.0, dropout_residual=0.0,
                norm_position="pre", positions="sinusoidal", mixer="linear")
    return MixerConfig(**{**base, **kw})


def loop_reference(q, k, v, normalise=True):
    """y_t = Σ_{j≤t} φ(q_t)·φ(k_j) v_j / Σ_{j≤t} φ(q_t)·φ(k_j), one (b, h, t) at a time, φ(x) = elu(x) + 1."""
    B, H, T, D = q.shape
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))  # elu(x) + 1 written out
    y = torch.zeros_like(v)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                w = torch.stack([(phi(q[b, h, t]) * phi(k[b, h, j])).sum() for j in range(t + 1)])  # (t+1,)
                num = (w[:, None] * v[b, h, :t + 1]).sum(0)
                y[b, h, t] = num / w.sum() if normalise else num
    return y


@pytest.mark.parametrize("normalise", [True, False])
def test_parallel_and_recurrent_forms_match_a_token_loop(normalise):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mixer = LinearAttention(cfg(linear_normalise=normalise)).double()
    ref = loop_reference(q, k, v, normalise)
    torch.testing.assert_close(mixer.parallel(q, k, v, None), ref, rtol=0, atol=1e-12)
    y, (S, z) = mixer.recurrent(q, k, v, None, None)
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-12)
    phi_k = F.elu(k) + 1
    torch.testing.assert_close(S, phi_k.transpose(-2, -1) @ v, rtol=0, atol=1e-12)  # S_T = Σ φ(k_j) v_jᵀ
    torch.testing.assert_close(z, phi_k.sum(2), rtol=0, atol=1e-12)


def test_recurrent_state_continues_where_it_stopped():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mixer = LinearAttention(cfg()).double()
    whole, _ = mixer.recurrent(q, k, v, None, None)
    first, state = mixer.recurrent(q[:, :, :5], k[:, :, :5], v[:, :, :5], None, None)
    second, _ = mixer.recurrent(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], None, state)
    torch.testing.assert_close(torch.cat([first, second], 2), whole, rtol=0, atol=1e-12)


def test_recurrent_state_bytes_do_not_grow_with_tokens():
    torch.manual_seed(2)
    mixer = LinearAttention(cfg()).double()
    state, sizes = RecurrentState(), []
    assert state.nbytes() == 0 and not state.filled
    for _ in range(20):
        mixer(torch.randn(3, 1, 16, dtype=torch.float64), cache=state)
        sizes.append(state.nbytes())
    B, nh, hs = 3, 2, 8
    assert set(sizes) == {B * nh * (hs * hs + hs) * 8}  # S (hs × hs) and z (hs) per head, fp64
    assert len(state) == 20 and state.seen == 20


@pytest.mark.parametrize("mixer", ["linear", ("linear", "softmax")])
def test_mixer_lm_decoding_equals_the_full_forward(mixer):
    torch.manual_seed(3)
    model = mixer_lm(cfg(mixer=mixer)).double().eval()
    ids = torch.randint(0, 12, (2, 14), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(ids)
        cache = model.decoder.new_cache()
        steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(4, 14)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)
        greedy_cached, _ = model.generate(ids[:, :3], 6, use_cache=True)
        greedy_full, _ = model.generate(ids[:, :3], 6, use_cache=False)
    assert torch.equal(greedy_cached, greedy_full)
    kinds = [type(c["self"]) for c in cache]
    assert kinds[0] is RecurrentState
    if isinstance(mixer, tuple):  # the softmax layer keeps a KV cache that grew with the tokens
        assert issubclass(kinds[1], KVCache) and state_bytes(cache) > state_bytes(cache[:1])


def test_mixer_lm_puts_linear_attention_in_every_layer():
    model = mixer_lm(cfg(n_layers=3))
    assert all(isinstance(layer.self_attn, LinearAttention) for layer in model.decoder.layers)


@pytest.mark.parametrize("bad", [
    dict(mixer="linearr"),  # unknown name
    dict(mixer=("linear", "softmax", "linear")),  # three names for two layers
    dict(positions="rope"),  # positions that live in attention scores
    dict(positions="alibi"),
    dict(window=4),  # an attention-cache shape on a recurrent mixer
    dict(ssm_state=0),
])
def test_bad_mixer_configs_raise_config_error(bad):
    with pytest.raises(ConfigError):
        cfg(**bad)


def test_bad_uses_raise_config_error():
    with pytest.raises(ConfigError):
        mixer_lm(TransformerConfig(vocab_size=12, d_model=16, n_heads=2))  # not a MixerConfig
    with pytest.raises(ConfigError):
        cfg().replace(no_such_field=1)
    mixer = LinearAttention(cfg())
    x = torch.randn(1, 3, 16)
    for kw in (dict(causal=False), dict(kv=x), dict(cache=KVCache()), dict(key_padding_mask=torch.ones(1, 3).bool()),
               dict(prefix=1)):
        with pytest.raises(ConfigError):
            mixer(x, **kw)
    with pytest.raises(ConfigError):
        mixer(torch.randn(1, 3, 8))  # wrong width
    state = RecurrentState()
    mixer(x, cache=state)
    with pytest.raises(ConfigError):
        state.truncate(1)  # a sum cannot forget its last tokens


def test_every_registered_mixer_builds_and_its_file_is_in_the_fingerprint():
    """mixer_class imports each mixer's file by name, so a proof that builds its model with mixer_lm has every mixer
    file in its fingerprint (proofs/evidence.py reads import statements)."""
    from proofs import evidence as E
    from proofs.transformer.mixers import MIXERS, mixer_class

    reached = {p.name for p in E.imported_modules(E.ROOT / "proofs" / "beyond" / "proof_linear_attention.py")}
    for name, where in MIXERS.items():
        if where is None:
            continue
        cls = mixer_class(name)
        assert cls.__name__ == where[1]
        assert f"{where[0].lstrip('.')}.py" in reached, f"{where[0]} is outside the fingerprint of mixer_lm's users"
    with pytest.raises(ConfigError):
        mixer_class("softmax")

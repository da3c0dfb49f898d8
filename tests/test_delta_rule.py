"""The delta rule mixer (proofs/transformer/mixers.py: DeltaRule) against references written here.

The reference is a plain loop over tokens of the update written out term by term,
    S ← α_t S;  S ← S − β_t (S k_t − v_t) k_tᵀ   (or S ← S + β_t v_t k_tᵀ without the erase);  y_t = S q_t,
in fp64, independent of the module's own `scan` and `chunkwise`. Decoding through mixer_lm's caches must give the
full forward's logits, for the plain, the gated and the additive variant and for a delta + softmax hybrid.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import ConfigError, DeltaRule, KVCache, MixerConfig, RecurrentState, mixer_lm

f64 = torch.float64


def loop_reference(q, k, v, beta, alpha=None, S0=None, erase=True):
    """Token by token, one (batch, head) at a time, with explicit vectors: y (B, nh, T, dv), S (B, nh, dv, dk)."""
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    y = torch.zeros(B, nh, T, dv, dtype=q.dtype)
    S_out = torch.zeros(B, nh, dv, dk, dtype=q.dtype)
    for b in range(B):
        for h in range(nh):
            S = torch.zeros(dv, dk, dtype=q.dtype) if S0 is None else S0[b, h].clone()
            for t in range(T):
                kt, vt, qt = k[b, h, t], v[b, h, t], q[b, h, t]
                if alpha is not None:
                    S = alpha[b, h, t] * S
                if erase:
                    S = S - beta[b, h, t] * torch.outer(S @ kt - vt, kt)
                else:
                    S = S + beta[b, h, t] * torch.outer(vt, kt)
                y[b, h, t] = S @ qt
            S_out[b, h] = S
    return y, S_out


def inputs(seed, B=2, nh=2, T=37, d=5):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, nh, T, d, generator=g, dtype=f64), dim=-1)
    k = F.normalize(torch.randn(B, nh, T, d, generator=g, dtype=f64), dim=-1)
    v = torch.randn(B, nh, T, d, generator=g, dtype=f64)
    beta = torch.rand(B, nh, T, generator=g, dtype=f64)
    alpha = torch.rand(B, nh, T, generator=g, dtype=f64) * 0.5 + 0.5
    S0 = torch.randn(B, nh, d, d, generator=g, dtype=f64)
    return q, k, v, beta, alpha, S0


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("erase", [True, False])
@pytest.mark.parametrize("start", [False, True])
def test_scan_and_chunkwise_match_the_loop(gated, erase, start):
    q, k, v, beta, alpha, S0 = inputs(0)
    a = alpha if gated else None
    s0 = S0 if start else None
    want_y, want_S = loop_reference(q, k, v, beta, a, s0, erase)
    la = None if a is None else a.log()
    got = [DeltaRule.scan(q, k, v, beta, la, s0, erase)]
    got += [DeltaRule.chunkwise(q, k, v, beta, la, s0, erase, chunk=c) for c in (1, 8, 16, 64)]  # 37 = 2·16 + 5
    for y, S in got:
        assert (y - want_y).abs().max().item() < 1e-12
        assert (S - want_S).abs().max().item() < 1e-12


def test_beta_one_replaces_and_beta_zero_keeps():
    q, k, v, beta, _, S0 = inputs(1, T=1)
    k1 = k[:, :, 0]  # (B, nh, d) unit keys
    _, S = DeltaRule.scan(q, k, v, torch.ones_like(beta), None, S0)
    assert torch.allclose((S @ k1[..., None])[..., 0], v[:, :, 0], atol=1e-12)  # S k = v: the old value is gone
    _, S = DeltaRule.scan(q, k, v, torch.zeros_like(beta), None, S0)
    assert torch.equal(S, S0)


def test_chunkwise_gradients_match_the_scan():
    q, k, v, beta, alpha, S0 = inputs(2, T=20)
    grads = []
    for form in (DeltaRule.scan, DeltaRule.chunkwise):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, beta, alpha, S0)]
        y, S = form(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4].log(), leaves[5])
        (y.pow(2).sum() + S.sum()).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert (a - b).abs().max().item() < 1e-10


def config(**kw) -> MixerConfig:
    base = dict(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=64, dropout_emb=0.0,
                dropout_residual=0.0, norm_position="pre", positions="learned", mixer="delta")
    return MixerConfig(**{**base, **kw})


def test_module_forward_matches_the_loop():
    """The layer's parallel path (chunkwise) against the loop fed the layer's own projections and gates."""
    torch.manual_seed(0)
    cfg = config(delta_gate=True)
    layer = DeltaRule(cfg).double()
    x = torch.randn(3, 11, cfg.d_model, dtype=f64)
    q = F.normalize(layer.project_q(x), dim=-1)
    k, v = layer.keys_values(layer.project_kv(x))
    k = F.normalize(k, dim=-1)
    beta = torch.sigmoid(layer.w_beta(x)).transpose(1, 2)
    alpha = torch.sigmoid(layer.w_alpha(x)).transpose(1, 2)
    y, _ = loop_reference(q, k, v, beta, alpha)
    want = layer.w_o(y.transpose(1, 2).reshape(3, 11, cfg.d_model))
    assert (layer(x) - want).abs().max().item() < 1e-12
    state = RecurrentState()
    assert (layer(x, cache=state) - want).abs().max().item() < 1e-12  # the recurrent path
    assert state.seen == 11 and state.nbytes() == 3 * cfg.n_heads * (cfg.d_model // cfg.n_heads) ** 2 * 8


@pytest.mark.parametrize("kw", [dict(), dict(delta_gate=True), dict(delta_erase=False),
                                dict(mixer=("delta", "softmax"), delta_gate=True)])
def test_decoding_through_caches_equals_full_forward(kw):
    torch.manual_seed(1)
    model = mixer_lm(config(**kw)).double().eval()
    ids = torch.randint(0, 20, (2, 15))
    with torch.no_grad():
        full = model(ids)
        cache = model.decoder.new_cache()
        parts = [model(ids[:, :6], cache=cache)]  # a prefill of 6 tokens, then one token at a time
        parts += [model(ids[:, t:t + 1], cache=cache) for t in range(6, 15)]
    assert (torch.cat(parts, 1) - full).abs().max().item() < 1e-12
    delta_state = cache[0]["self"]
    assert isinstance(delta_state, RecurrentState) and delta_state.seen == 15


def test_erase_switch_changes_the_output():
    torch.manual_seed(2)
    a = mixer_lm(config()).double().eval()
    b = mixer_lm(config(delta_erase=False)).double().eval()
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, 20, (2, 12))
    with torch.no_grad():
        assert (a(ids) - b(ids)).abs().max().item() > 1e-6


def test_bad_settings_raise_config_error():
    with pytest.raises(ConfigError):
        DeltaRule.chunkwise(*(torch.zeros(1, 1, 4, 2),) * 3, torch.ones(1, 1, 4), chunk=0)
    with pytest.raises(ConfigError):
        config(positions="rope")  # positions that live in attention scores
    layer = DeltaRule(config())
    x = torch.randn(1, 4, 16)
    with pytest.raises(ConfigError):
        layer(x, cache=KVCache())  # a recurrent mixer keeps a RecurrentState
    with pytest.raises(ConfigError):
        layer(x, kv=x)  # no cross-attention
    with pytest.raises(ConfigError):
        layer(x, causal=False)

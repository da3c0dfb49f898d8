"""Coding drill: causal linear attention in its recurrent form.

Write `causal_linear_attention(q, k, v, state)` as an RNN over the tokens (no T×T matrix, no
proofs.transformer.mixers), then run `pytest proofs/drills/drill_causal_linear_attention.py`.
"""

from typing import Optional

import torch
from torch import Tensor

PAGE = "beyond/linear-attention.md"


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor,
                            state: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Katharopoulos et al. 2020, §3.4 (eqs. 16-20), with the feature map φ(x) = elu(x) + 1:

        S_t = S_{t-1} + φ(k_t) v_tᵀ      (hs × hs per head)
        z_t = z_{t-1} + φ(k_t)           (hs per head)
        y_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t

    q, k, v are (B, nh, T, hs). `state` is (S, z) of shapes (B, nh, hs, hs) and (B, nh, hs) left by an earlier call
    on the tokens before these (None: start from zeros). Return y (B, nh, T, hs) and the new state (S, z), so
    that two calls on the halves of a sequence give the outputs of one call on the whole. Walk the tokens in a
    loop: the memory you carry must not grow with T."""
    raise NotImplementedError("write the recurrent form of causal linear attention here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.transformer.mixers import LinearAttention, MixerConfig  # noqa: E402


def _mixer(hs: int, nh: int) -> LinearAttention:
    return LinearAttention(MixerConfig(d_model=hs * nh, n_heads=nh, positions="none", mixer="linear")).double()


def reference(q, k, v, state=None):
    return _mixer(q.shape[-1], q.shape[1]).recurrent(q, k, v, None, state)  # the shared module's own recurrence


def _qkv(B=2, nh=3, T=10, hs=4, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(B, nh, T, hs, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("shape", [(1, 1, 1, 4), (2, 3, 10, 4), (1, 2, 33, 8)])
def test_matches_the_shared_parallel_form(shape):
    f = pick(causal_linear_attention, reference)
    q, k, v = _qkv(*shape)
    y, _ = f(q, k, v)
    expected = _mixer(shape[3], shape[1]).parallel(q, k, v, None)  # the T×T form: (φ(Q)φ(K)ᵀ ⊙ causal) V, normalised
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-10)


def test_state_is_the_sum_of_outer_products():
    f = pick(causal_linear_attention, reference)
    q, k, v = _qkv(seed=1)
    _, (S, z) = f(q, k, v)
    phi_k = torch.nn.functional.elu(k) + 1
    assert S.shape == (2, 3, 4, 4) and z.shape == (2, 3, 4), "S is hs × hs and z is hs, per sequence and head"
    torch.testing.assert_close(S, phi_k.transpose(-2, -1) @ v, rtol=0, atol=1e-10)
    torch.testing.assert_close(z, phi_k.sum(2), rtol=0, atol=1e-10)


def test_two_calls_equal_one():
    f = pick(causal_linear_attention, reference)
    q, k, v = _qkv(T=12, seed=2)
    whole, (S, z) = f(q, k, v)
    first, state = f(q[:, :, :7], k[:, :, :7], v[:, :, :7])
    second, (S2, z2) = f(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], state)
    torch.testing.assert_close(torch.cat([first, second], 2), whole, rtol=0, atol=1e-10)
    torch.testing.assert_close(S2, S, rtol=0, atol=1e-10)


def test_causal_the_future_does_not_leak():
    f = pick(causal_linear_attention, reference)
    q, k, v = _qkv(T=8, seed=3)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5:] += 3.0
    v2[:, :, 5:] -= 2.0
    torch.testing.assert_close(f(q, k2, v2)[0][:, :, :5], f(q, k, v)[0][:, :, :5], rtol=0, atol=1e-12)


def test_normalised_constant_values_come_back_unchanged():
    f = pick(causal_linear_attention, reference)
    q, k, _ = _qkv(seed=4, scale=3.0)
    v = torch.full_like(q, 0.7)
    y, _ = f(q, k, v)
    assert torch.allclose(y, v, rtol=0, atol=1e-10), "the weights φ(q)·φ(k_j) / Σ must sum to 1: divide by φ(q)ᵀz"

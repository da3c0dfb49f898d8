"""Coding drill: prefix tuning's attention.

Write `prefix_attention(q, k, v, prefix_k, prefix_v)` (no peft, no proofs.transformer), then run
`pytest proofs/drills/drill_prefix_attention.py`.
"""

import torch
from torch import Tensor

PAGE = "generation/peft-families.md"


def prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor) -> Tensor:
    """Causal scaled dot-product attention of the tokens' queries over p trainable prefix keys/values followed by
    the tokens' own keys/values (Li & Liang 2021). q, k, v: (B, h, T, d); prefix_k, prefix_v: (h, p, d), the same for
    every row of the batch. Every query sees the whole prefix; among the tokens, query t sees keys 0..t only.
    Returns (B, h, T, d). Scale the scores by 1/sqrt(d)."""
    raise NotImplementedError("write prefix tuning's attention here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.transformer import KVCache, MultiHeadAttention, TransformerConfig  # noqa: E402


def reference(q, k, v, prefix_k, prefix_v):
    """The shared model's own attention reading a KVCache pre-filled with the prefix at position 0 (what
    proofs/transformer/peft.py does), with identity projections so that q, k, v enter as given."""
    B, h, T, d = q.shape
    cfg = TransformerConfig(d_model=h * d, n_heads=h, dropout_attn=0.0)
    attn = MultiHeadAttention(cfg).to(q.dtype).eval()
    attn.project_q = lambda x: q                                       # (B, h, T, d) as given
    attn.project_kv = lambda x: (k, v)
    attn.w_o = torch.nn.Identity()
    cache = KVCache()
    cache.update((prefix_k.expand(B, -1, -1, -1), prefix_v.expand(B, -1, -1, -1)),
                 torch.zeros(1, prefix_k.shape[1], dtype=torch.long))   # prefix at position 0: seen by every query
    y = attn(torch.zeros(B, T, h * d, dtype=q.dtype), causal=True, cache=cache,
             positions=torch.arange(T)[None])                          # (B, T, h·d)
    return y.view(B, T, h, d).transpose(1, 2)


def _inputs(B=2, h=3, T=5, p=4, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return r(B, h, T, d), r(B, h, T, d), r(B, h, T, d), r(h, p, d), r(h, p, d)


@pytest.mark.parametrize("p", [1, 4, 9])
def test_matches_the_shared_module(p):
    f = pick(prefix_attention, reference)
    args = _inputs(p=p)
    torch.testing.assert_close(f(*args), reference(*args))


def test_the_first_token_reads_the_prefix():
    f = pick(prefix_attention, reference)
    q, k, v, pk, pv = _inputs()
    plain = torch.softmax((q @ k.transpose(-2, -1)) / 8 ** 0.5 + torch.full((5, 5), float("-inf")).triu(1), -1) @ v
    out = f(q, k, v, pk, pv)
    assert not torch.allclose(out[:, :, 0], v[:, :, 0]), "without the prefix token 0 would copy its own value"
    assert not torch.allclose(out, plain), "the prefix must enter every query's softmax"


def test_is_causal_among_the_tokens():
    f = pick(prefix_attention, reference)
    q, k, v, pk, pv = _inputs()
    v2 = v.clone()
    v2[:, :, -1] += 10.0  # change the last token's value: no earlier query may move
    torch.testing.assert_close(f(q, k, v, pk, pv)[:, :, :-1], f(q, k, v2, pk, pv)[:, :, :-1])


def test_is_he_et_al_gated_mix():
    f = pick(prefix_attention, reference)
    q, k, v, pk, pv = _inputs()
    s_x = (q @ k.transpose(-2, -1)) / 8 ** 0.5 + torch.full((5, 5), float("-inf"), dtype=q.dtype).triu(1)
    s_p = (q @ pk.transpose(-2, -1)) / 8 ** 0.5
    lam = torch.sigmoid(s_p.logsumexp(-1) - s_x.logsumexp(-1))[..., None]  # the prefix's share of the softmax mass
    mixed = (1 - lam) * (s_x.softmax(-1) @ v) + lam * (s_p.softmax(-1) @ pv)
    torch.testing.assert_close(f(q, k, v, pk, pv), mixed)

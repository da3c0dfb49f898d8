"""Speculative decoding against the target alone and against exact distributions.

- greedy: the tokens equal the target's own greedy tokens, for several k, batch rows advancing by different
  amounts, a poor and a perfect draft; with the cache rollback switched off they do not;
- the acceptance rule on one position, many rows at once: the exact rule's output frequencies approach p,
  the folk argmax rule's approach q(a)·δ_a + (1 − q(a))·p (a = argmax p), computed in closed form;
- sampled sequences: each row's tokens follow the target's conditional distributions (chi-square-free check
  on the first token against p computed by the target itself);
- bad settings raise ConfigError naming the fix.
"""

import pytest
import torch

from proofs.transformer import ConfigError, DecoderLM, KVCache, TransformerConfig
from proofs.transformer.speculative import check_pair, speculative_generate, target_generate, verify

V = 12
CFG = TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, max_len=128, dropout_emb=0.0,
                        dropout_residual=0.0, scale_embeddings=False)  # positions weigh more: outputs vary more
SMALL = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pair():
    torch.manual_seed(6)  # a target whose greedy rows do not all repeat one token (checked below)
    target = DecoderLM(CFG).eval()
    torch.manual_seed(2)
    draft = DecoderLM(CFG.replace(**SMALL)).eval()
    return target, draft


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_target_greedy(k):
    target, draft = pair()
    prompt = torch.randint(1, V, (4, 5))
    ref, _ = target_generate(target, prompt, 16)
    assert torch.equal(ref, target.generate(prompt, 16)[0])  # the reference is the model's own generate
    assert sum(len(set(r.tolist())) for r in ref[:, 5:]) >= 6  # not one repeated token per row
    ids, stats = speculative_generate(target, draft, prompt, 16, k)  # a poor draft
    assert torch.equal(ids, ref) and stats.draft_calls == (k + 1) * stats.rounds
    ids, stats = speculative_generate(target, target, prompt, 16, k)  # a perfect draft: k+1 tokens per call
    assert torch.equal(ids, ref)
    assert stats.acceptance_rate == 1.0 and stats.rounds == -(-16 // (k + 1))


def test_without_rollback_the_tokens_change():
    """The equality above can fail: a cache whose truncate does nothing keeps the rejected drafts visible."""

    class NoRollback(KVCache):
        def truncate(self, length):
            pass

    target, draft = pair()
    prompt = torch.randint(1, V, (4, 5))
    ref, _ = target_generate(target, prompt, 24)
    caches = tuple([{"self": NoRollback(), "cross": KVCache()} for _ in m.decoder.layers] for m in (target, draft))
    ids, stats = speculative_generate(target, draft, prompt, 24, 4, caches=caches)
    assert stats.accepted < stats.proposed  # there were rejections to roll back
    assert not torch.equal(ids, ref)


def test_exact_rule_reproduces_p_and_argmax_rule_is_biased():
    """One drafted position (k = 1), 400 000 rows drawn at once: output frequencies against closed forms."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    N = 400_000
    drafted = torch.multinomial(q, N, replacement=True, generator=g)[:, None]  # (N, 1)
    P = torch.stack([p, torch.full_like(p, 0.25)])[None].expand(N, 2, 4)  # position after: uniform (unused here)
    Q = q[None, None].expand(N, 1, 4)
    freqs = {}
    for rule in ("exact", "argmax"):
        n, nxt = verify(P, Q, drafted, g, rule)
        first = torch.where(n == 1, drafted[:, 0], nxt)  # the token emitted at the drafted position
        freqs[rule] = torch.bincount(first, minlength=4).float() / N
    folk = q[0] * torch.nn.functional.one_hot(torch.tensor(0), 4) + (1 - q[0]) * p  # argmax p is token 0
    assert (freqs["exact"] - p).abs().max() < 0.004
    assert (freqs["argmax"] - folk).abs().max() < 0.004
    assert 0.5 * (freqs["argmax"] - p).abs().sum() > 0.04  # its bias: q(a)(1 - p(a)) = 0.05


def test_sampled_first_token_follows_the_target():
    target, draft = pair()
    prompt = torch.randint(1, V, (1, 4)).expand(20_000, 4)
    g = torch.Generator().manual_seed(5)
    ids, _ = speculative_generate(target, draft, prompt, 2, 3, sample=True, generator=g)
    with torch.no_grad():
        p = torch.softmax(target(prompt[:1])[0, -1], -1)
    freq = torch.bincount(ids[:, 4], minlength=V).float() / ids.shape[0]
    assert 0.5 * (freq - p).abs().sum() < 0.03  # sampling noise at 20 000 draws is about 0.01


def test_bad_settings():
    target, draft = pair()
    other = DecoderLM(CFG.replace(vocab_size=V + 4, **SMALL)).eval()
    with pytest.raises(ConfigError, match=f"Build the draft with vocab_size={V}"):
        check_pair(target, other)
    with pytest.raises(ConfigError, match="vocabulary"):
        speculative_generate(target, other, torch.ones(1, 2, dtype=torch.long), 4)
    prompt = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ConfigError, match="k=0 must be a positive integer"):
        speculative_generate(target, draft, prompt, 4, k=0)
    with pytest.raises(ConfigError, match="steps=0 must be a positive integer"):
        speculative_generate(target, draft, prompt, 0)
    with pytest.raises(ConfigError, match="rule='greedy' is not one of"):
        speculative_generate(target, draft, prompt, 4, rule="greedy")
    with pytest.raises(ConfigError, match="temperature=0"):
        speculative_generate(target, draft, prompt, 4, sample=True, temperature=0)
    with pytest.raises(ConfigError, match="prompt must be"):
        speculative_generate(target, draft, torch.ones(3, dtype=torch.long), 4)

"""The shared training loop's auxiliary terms: z-loss, exactly."""

from __future__ import annotations

import torch

from proofs.tasks import markov_entropy, markov_table, markov_task
from proofs.train import token_loss, train
from proofs.transformer import DecoderLM, TransformerConfig


def _model(seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout_emb=0.0,
                            dropout_residual=0.0)
    return DecoderLM(cfg).double()


def test_z_loss_adds_c_log_z_squared_to_the_gradient_only():
    """One step with z_loss=c equals one step on token loss + c·mean(logsumexp²) by hand; log.loss keeps the
    cross-entropy alone."""
    x, y = markov_task(torch.Generator().manual_seed(1), 4, 8, 16)
    a, b = _model(), _model()
    log = train(a, lambda step: (x, y), 1, lr=1e-2, z_loss=0.1)
    opt = torch.optim.Adam(b.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    b.train()
    logits = b(x)
    ce = token_loss(logits, y)
    (ce + 0.1 * logits.logsumexp(-1).pow(2).mean()).backward()
    opt.step()
    assert abs(log.loss[0] - ce.item()) < 1e-12
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-12, rtol=0)


def test_z_loss_zero_is_the_plain_loop():
    x, y = markov_task(torch.Generator().manual_seed(2), 4, 8, 16)
    a, b = _model(), _model()
    train(a, lambda step: (x, y), 2, lr=1e-2, z_loss=0.0)
    train(b, lambda step: (x, y), 2, lr=1e-2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_markov_task_follows_its_table():
    """Targets are the next inputs, rows of the table sum to 1, and the entropy floor is that of the rows."""
    x, y = markov_task(torch.Generator().manual_seed(3), 8, 12, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    p = markov_table(16)
    assert torch.allclose(p.sum(-1), torch.ones(16))
    assert abs(markov_entropy(16) - float(-(p * p.log()).sum(-1).mean())) < 1e-6


def test_the_loop_matches_plain_single_tensor_adam_bit_for_bit():
    """The loop's Adam runs as foreach (one multi-tensor update per step) for speed; 30 steps in float32 must give
    exactly the weights of a hand-written loop with torch's single-tensor Adam, so the speed-up changed no result."""
    x, y = markov_task(torch.Generator().manual_seed(2), 8, 12, 16)
    a, b = _model(3).float(), _model(3).float()
    train(a, lambda step: (x, y), 30, lr=3e-3)
    opt = torch.optim.Adam(b.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9, foreach=False)
    b.train()
    for _ in range(30):
        opt.zero_grad(set_to_none=True)
        token_loss(b(x), y).backward()
        opt.step()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), f"{name} differs after 30 steps"

"""Mixture of experts against a brute-force loop over tokens (routing, gates, capacity and drops, the Switch
loss), the dense FFN it reduces to, and train()'s extra_loss hook."""

from __future__ import annotations

import math

import pytest
import torch

from proofs.train import train
from proofs.transformer import ConfigError, DecoderLM, FeedForward, MoEFeedForward, TransformerConfig


def cfg(**switches) -> TransformerConfig:
    base = dict(vocab_size=20, d_model=16, n_heads=2, d_ff=24, n_layers=2, dropout_emb=0.0, dropout_residual=0.0,
                moe_experts=4, moe_top_k=2)
    return TransformerConfig(**{**base, **switches})


def brute_force(moe: MoEFeedForward, x: torch.Tensor, capacity_factor: float = 0.0):
    """Token by token, in order: softmax router, top-k, gates (renormalised if k > 1), experts that are full skip."""
    flat = x.reshape(-1, x.shape[-1])
    N, E, k = flat.shape[0], moe.n_experts, moe.top_k
    cap = math.ceil(capacity_factor * N * k / E) if capacity_factor else N * k
    taken = [0] * E
    out, counts, p_sum = torch.zeros_like(flat), [0] * E, torch.zeros(E)
    for i in range(N):
        p = torch.softmax(flat[i] @ moe.router.weight.T, -1)
        p_sum += p
        chosen = sorted(range(E), key=lambda e: -p[e].item())[:k]
        norm = sum(p[e] for e in chosen) if k > 1 else 1.0
        for e in chosen:
            counts[e] += 1
            if taken[e] < cap:
                taken[e] += 1
                out[i] += p[e] / norm * moe.experts[e](flat[i])
    f = torch.tensor(counts, dtype=torch.float) / (N * k)
    aux = E * (f * p_sum / N).sum()
    return out.view(x.shape), taken, N * k - sum(taken), aux


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("capacity", [0.0, 0.5, 1.0, 1.25])
def test_moe_matches_a_token_by_token_loop(k, capacity):
    torch.manual_seed(k)
    moe = MoEFeedForward(cfg(moe_top_k=k, moe_capacity=capacity)).eval()
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        y = moe(x)
        ref, taken, dropped, aux = brute_force(moe, x, capacity)
    torch.testing.assert_close(y, ref)
    assert moe.stats["taken"].tolist() == taken and moe.stats["dropped"] == dropped
    assert moe.aux_loss.item() == pytest.approx(aux.item(), rel=1e-5)
    if capacity == 0.5:
        assert dropped > 0  # half the even share per expert: some tokens must be dropped


def test_dropped_tokens_get_no_expert_output():
    torch.manual_seed(0)
    moe = MoEFeedForward(cfg(moe_top_k=1, moe_capacity=0.25)).eval()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 1.0  # every token with x_0 > 0 prefers expert 0 ...
    x = torch.randn(40, 16).abs()  # ... and all of them have x_0 > 0: expert 0 is oversubscribed
    with torch.no_grad():
        y = moe(x)
    capacity = math.ceil(0.25 * 40 / 4)
    assert moe.stats["taken"][0].item() == capacity and moe.stats["dropped"] == 40 - capacity
    assert (y[capacity:] == 0).all() and (y[:capacity] != 0).any()  # first come, first served


def test_one_expert_is_the_dense_ffn_exactly():
    torch.manual_seed(1)
    dense = FeedForward(cfg())
    moe = MoEFeedForward(cfg(moe_experts=1, moe_top_k=1))
    moe.experts[0].load_state_dict(dense.state_dict())
    x = torch.randn(5, 16)
    assert torch.equal(moe(x), dense(x))


@pytest.mark.parametrize("k", [1, 2])
def test_the_task_loss_reaches_the_router(k):
    """Top-1 uses the raw probability as the gate (Switch): renormalising it would give 1 and no router gradient."""
    torch.manual_seed(2)
    moe = MoEFeedForward(cfg(moe_top_k=k))
    moe(torch.randn(10, 16)).pow(2).sum().backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_top_k_gates_are_renormalised_and_top_1_is_not():
    torch.manual_seed(3)
    x = torch.randn(6, 16)
    for k in (1, 2):
        moe = MoEFeedForward(cfg(moe_top_k=k))
        for e in moe.experts:  # every expert is the identity map on its input, so output = (sum of gates) · x
            for lin in (e.lin1, e.lin2):
                torch.nn.init.zeros_(lin.weight), torch.nn.init.zeros_(lin.bias)
            e.lin2.bias.data.fill_(1.0)
        with torch.no_grad():
            gate_sum = moe(x)[:, 0]
            top = torch.softmax(x @ moe.router.weight.T, -1).max(-1).values
        torch.testing.assert_close(gate_sum, torch.ones(6) if k > 1 else top)


def test_decoder_aux_loss_sums_the_layers():
    torch.manual_seed(4)
    lm = DecoderLM(cfg(norm_position="pre"))
    lm(torch.randint(1, 20, (2, 5)))
    layers = [layer.ffn.aux_loss for layer in lm.decoder.layers]
    torch.testing.assert_close(lm.aux_loss(), sum(layers))
    assert all(1.0 - 1e-4 <= v <= 4 + 1e-4 or v < 1 for v in layers)  # never above E


def test_train_extra_loss_hook():
    def run(extra):
        torch.manual_seed(5)
        lm = DecoderLM(cfg(norm_position="pre"))
        x = torch.randint(1, 20, (4, 6))
        log = train(lm, lambda s: (x, x), 3, extra_loss=extra)
        return lm.decoder.layers[0].ffn.router.weight.detach().clone(), log

    plain, log_plain = run(None)
    zero, log_zero = run(lambda m: 0.0 * m.aux_loss())
    pushed, log_pushed = run(lambda m: 10.0 * m.aux_loss())
    assert torch.equal(plain, zero) and log_plain.loss == log_zero.loss  # default behaviour unchanged
    assert not torch.allclose(plain, pushed)  # the extra loss is minimised too
    assert log_pushed.loss[0] == log_plain.loss[0]  # the log keeps the token loss alone


@pytest.mark.parametrize("switches,match", [
    (dict(moe_top_k=5), r"moe_top_k=5 must lie in \[1, moe_experts=4\]"),
    (dict(moe_capacity=-1.0), r"moe_capacity=-1.0 must be >= 0"),
])
def test_bad_moe_settings_raise(switches, match):
    with pytest.raises(ConfigError, match=match):
        cfg(**switches)


def test_capacity_without_experts_raises():
    with pytest.raises(ConfigError, match="Set moe_experts > 0, or moe_capacity=0"):
        DecoderLM(cfg(moe_experts=0, moe_capacity=1.25))

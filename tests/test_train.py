"""The shared training loop: its auxiliary terms (z-loss), its Adam (FlatAdam, torch's arithmetic bit for bit), its
gradient norm and its shared batches, exactly."""

from __future__ import annotations

import copy

import torch

from proofs.optim import FlatAdam
from proofs.tasks import markov_entropy, markov_table, markov_task
from proofs.train import fixed_batches, grad_norm, token_loss, train
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


def _steps(model, opt, x, y, steps: int, drop=lambda step, name: False, clip: float | None = None, sched=None):
    """A plain loop; drop(step, name) -> True removes that parameter's gradient for the step (as for an expert that
    no token reached), both optimisers seeing the same."""
    model.train()
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        token_loss(model(x), y).backward()
        for name, p in model.named_parameters():
            if drop(step, name):
                p.grad = None
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched:
            sched.step()


def _same(a, b) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), f"{name} differs"


def _lm(seed: int, **switches) -> DecoderLM:
    torch.manual_seed(seed)
    base = dict(vocab_size=16, d_model=24, n_heads=3, d_ff=40, n_layers=2, dropout_emb=0.0, dropout_residual=0.0)
    return DecoderLM(TransformerConfig(**{**base, **switches}))


def test_flat_adam_is_torch_foreach_adam_bit_for_bit():
    """FlatAdam against torch.optim.Adam(foreach=True), 25 steps each: with a schedule and clipping, with frozen
    weights, with odd tensor sizes (d_model 24, d_ff 40, 3 heads), and with steps where some parameters get no
    gradient (they keep their own step counts). Equal weights, bit for bit, after every variant."""
    x, y = markov_task(torch.Generator().manual_seed(5), 8, 12, 16)
    drop = lambda step, name: ("layers.1" in name and step % 3 == 1) or ("embed" in name and step < 4)
    for variant in ("plain", "schedule+clip", "frozen", "missing grads"):
        a, b = _lm(1), _lm(1)
        if variant == "frozen":
            for m in (a, b):
                for name, p in m.named_parameters():
                    p.requires_grad_("layers.0" not in name)
        kw = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
        opt_a, opt_b = FlatAdam(a.parameters(), **kw), torch.optim.Adam(b.parameters(), foreach=True, **kw)
        sched = {}
        if variant == "schedule+clip":
            sched = {m: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 10))
                     for m, o in ((a, opt_a), (b, opt_b))}
        for m, o in ((a, opt_a), (b, opt_b)):
            _steps(m, o, x, y, 25, drop=drop if variant == "missing grads" else (lambda s, n: False),
                   clip=0.5 if variant == "schedule+clip" else None, sched=sched.get(m))
        _same(a, b)


def test_flat_adam_state_dict_round_trips_with_torch_adam():
    """The state of FlatAdam reads as torch's (step, exp_avg, exp_avg_sq per parameter) and loads either way: 10
    steps, save, continue 10 more in a fresh optimiser of the other kind; equal weights bit for bit."""
    x, y = markov_task(torch.Generator().manual_seed(6), 8, 12, 16)
    kw = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    for first, second in ((FlatAdam, torch.optim.Adam), (torch.optim.Adam, FlatAdam)):
        a, b = _lm(2), _lm(2)
        opt_a = first(a.parameters(), **kw)
        _steps(a, opt_a, x, y, 10)
        b.load_state_dict(a.state_dict())
        opt_b = second(b.parameters(), **kw)
        opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # torch's load keeps the very tensors it is given
        assert all(float(s["step"]) == 10 for s in opt_b.state_dict()["state"].values())
        _steps(a, opt_a, x, y, 10), _steps(b, opt_b, x, y, 10)
        _same(a, b)


def test_flat_adam_refuses_what_it_cannot_lay_flat_and_train_falls_back():
    """Parameters of two dtypes cannot share one buffer: FlatAdam says so, and train() uses torch's foreach Adam."""
    x, y = markov_task(torch.Generator().manual_seed(8), 8, 12, 16)
    a, b = _lm(3), _lm(3)
    for m in (a, b):
        m.decoder.layers[0].double()  # one layer in float64, cast back to float32 at its output
        m.decoder.layers[0].register_forward_pre_hook(lambda mod, args: (args[0].double(), *args[1:]))
        m.decoder.layers[0].register_forward_hook(lambda mod, args, out: out.float())
    assert not FlatAdam.supports(list(a.parameters()))
    try:
        FlatAdam(a.parameters())
    except ValueError as e:
        assert "torch.optim.Adam" in str(e)
    else:
        raise AssertionError("FlatAdam took parameters of two dtypes")
    train(a, lambda step: (x, y), 5, lr=3e-3)
    _steps(b, torch.optim.Adam(b.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9, foreach=True), x, y, 5)
    _same(a, b)


def test_flat_adam_refuses_what_it_would_get_wrong():
    """Each of these would make the flat layout differ from torch's Adam silently; each is an error instead."""
    x, y = markov_task(torch.Generator().manual_seed(9), 8, 12, 16)

    def fails(setup, match: str) -> None:
        m = _lm(5)
        params = list(m.parameters())
        if setup == "frozen then unfrozen":
            params[0].requires_grad_(False)
        opt = FlatAdam(params, lr=1e-3)
        if setup == "frozen then unfrozen":
            params[0].requires_grad_(True)
        elif setup == "data replaced":
            params[1].data = params[1].data.clone()
        elif setup == "weight decay":
            opt.param_groups[0]["weight_decay"] = 0.1
        elif setup == "second group":
            try:
                opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
            except ValueError as e:
                assert match in str(e)
                return
            raise AssertionError("a second group was accepted")
        token_loss(m(x), y).backward()
        try:
            opt.step()
        except ValueError as e:
            assert match in str(e), str(e)
        else:
            raise AssertionError(f"{setup}: FlatAdam stepped")

    fails("frozen then unfrozen", "frozen")
    fails("data replaced", ".data was replaced")
    fails("weight decay", "weight_decay")
    fails("second group", "lays its parameters out once")
    assert not FlatAdam.supports([torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))])
    base = torch.zeros(6)
    assert not FlatAdam.supports([torch.nn.Parameter(base[:4]), torch.nn.Parameter(base[2:])])  # overlapping views
    assert FlatAdam.supports([torch.nn.Parameter(base[:3]), torch.nn.Parameter(base[3:])])  # disjoint: fine
    assert not FlatAdam.supports([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2).double())])


def test_flat_adam_state_step_counts_as_torch_does():
    """state[p]["step"] is a tensor that counts this parameter's updates after every step, as in torch."""
    x, y = markov_task(torch.Generator().manual_seed(10), 8, 12, 16)
    m = _lm(6)
    opt = FlatAdam(m.parameters(), lr=1e-3)
    _steps(m, opt, x, y, 3, drop=lambda step, name: "layers.1" in name and step == 1)
    for name, p in m.named_parameters():
        assert float(opt.state[p]["step"]) == (2 if "layers.1" in name else 3), name


def test_grad_norm_is_clip_grad_norm_without_the_multiply():
    """Finite norm: the value torch returns, gradients untouched (the multiply by 1 is skipped). Infinite norm: torch's
    call runs, so the gradients turn nan as they always did (a run that overflows stops as before)."""
    x, y = markov_task(torch.Generator().manual_seed(7), 8, 12, 16)
    m = _lm(4)
    token_loss(m(x), y).backward()
    grads = [p.grad.clone() for p in m.parameters()]
    norm = grad_norm(list(m.parameters()))
    assert torch.equal(norm, torch.nn.utils.clip_grad_norm_(m.parameters(), float("inf")))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, m.parameters()))
    first = next(m.parameters())
    first.grad[0, 0] = float("inf")
    assert grad_norm(list(m.parameters())).item() == float("inf")
    assert all(p.grad.isnan().all() for p in m.parameters())  # inf / inf = nan times every gradient, as in torch


def test_fixed_batches_share_draws_and_copies():
    """Two calls with the same arguments read the same draws (those of one generator seeded with the seed), an arm
    that edits its batch in place changes nothing for the next reader, and shared=False draws afresh."""
    one, two = fixed_batches(markov_task, 123, 4, 8, 16), fixed_batches(markov_task, 123, 4, 8, 16)
    g = torch.Generator().manual_seed(123)
    fresh = [markov_task(g, 4, 8, 16) for _ in range(3)]
    x, _ = one(2)
    x.zero_()
    for step in range(3):
        assert all(torch.equal(a, b) for a, b in zip(two(step), fresh[step]))
    calls = []

    def counted(gen, *shape):
        calls.append(shape)
        return {"x": markov_task(gen, *shape)[0]}  # another container: it comes back as it was drawn

    solo = fixed_batches(counted, 123, 4, 8, 16, shared=False)
    assert torch.equal(solo(0)["x"], fresh[0][0]) and len(calls) == 1
    fixed_batches(counted, 123, 4, 8, 16, shared=False)(0)
    assert len(calls) == 2


def test_a_second_run_lays_the_model_out_again_and_still_matches_torch():
    """After train() the parameters are disjoint slices of one buffer; a second train() (fine-tuning) builds a new
    FlatAdam over them, and both runs together equal two runs of torch's foreach Adam, bit for bit."""
    x, y = markov_task(torch.Generator().manual_seed(11), 8, 12, 16)
    a, b = _lm(7), _lm(7)
    train(a, lambda step: (x, y), 5, lr=3e-3)
    assert FlatAdam.supports(list(a.parameters()))
    train(a, lambda step: (x, y), 5, lr=1e-3)
    for lr in (3e-3, 1e-3):
        _steps(b, torch.optim.Adam(b.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9, foreach=True), x, y, 5)
    _same(a, b)

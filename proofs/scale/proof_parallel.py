# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # ZeRO stages 1–3 and tensor parallelism, in real processes
#
# Proofs for `docs/scale/zero-and-tensor-parallel.md`. Everything runs in 2 and 4 real processes joined by
# torch.distributed (gloo, 127.0.0.1) through `proofs/distributed.py`; all checks are exact, at float
# tolerance, or on byte counters (no training to a threshold): equal parameters after a few Adam steps, bytes
# of every tensor storage alive in each rank's process, bytes handed to each collective, and bytes each process
# really wrote to its sockets.
# One spawned group per world size runs every arm (spawning is the slow part) and the tests read its results.
# Run: `pytest proofs/scale/proof_parallel.py`.

# %%
from __future__ import annotations

import functools
import gc
import math
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from proofs.distributed import Comm, ring_bytes, run_distributed, sent_bytes
from proofs.train import token_loss
from proofs.transformer import DecoderLM, FeedForward, TransformerConfig

VOCAB, T, GLOBAL_BATCH, STEPS, LR = 16, 8, 8, 3, 1e-2
WORLDS = (2, 4)
FP32 = 4  # bytes per element: parameters, gradients and Adam moments are all fp32 here


def lm_cfg() -> TransformerConfig:
    return TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout_emb=0.0,
                             dropout_residual=0.0)


def ffn_cfg() -> TransformerConfig:
    return TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=64, n_layers=1, dropout_emb=0.0,
                             dropout_residual=0.0)


def batches(seed: int) -> list[tuple[Tensor, Tensor]]:
    """STEPS global batches of (input, target) token ids, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (STEPS, GLOBAL_BATCH, T + 1), generator=g)
    return [(b[:, :-1], b[:, 1:]) for b in ids]


# %% [markdown]
# ## 1. One flat parameter vector, one Adam that works on any slice of it
#
# ZeRO partitions the model states as one flat vector: rank r owns elements [r·P/N, (r+1)·P/N) of the
# parameters, gradients and Adam moments (P = Ψ rounded up to a multiple of N; the padding is zeros whose
# gradient is 0). Adam is element-wise, so updating a slice with that slice's gradient and moments gives that
# slice of the full update: this is why the stages cannot change the result.

# %%
# --8<-- [start:flat]
class Flat:
    """A module's parameters as one flat fp32 vector (padded to a multiple of `world`) and back."""

    def __init__(self, model: torch.nn.Module, world: int):
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.psi = sum(p.numel() for p in model.parameters())            # Ψ, the parameter count
        self.size = math.ceil(self.psi / world) * world                  # P, padded
        self.shard = self.size // world                                  # P / N elements per rank

    def flatten(self) -> Tensor:
        flat = torch.cat([p.detach().flatten() for p in self.model.parameters()])
        return F.pad(flat, (0, self.size - self.psi))

    def loss(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """The model's loss with its parameters taken from views of `flat`."""
        params, offset = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = shape.numel()
            params[name] = flat[offset:offset + n].view(shape)  # a view: gradients land in flat.grad
            offset += n
        return token_loss(functional_call(self.model, params, (x,)), y)


def adam_(p: Tensor, g: Tensor, m: Tensor, v: Tensor, step: int, lr: float = LR,
          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """torch.optim.Adam's update (same operations, same order), in place, element-wise: any slice works."""
    m.lerp_(g, 1 - betas[0])
    v.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
    denom = (v.sqrt() / math.sqrt(1 - betas[1] ** step)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / (1 - betas[0] ** step))
# --8<-- [end:flat]


def live_bytes(exclude: set[int]) -> dict[int, int]:
    """Every tensor storage alive in this process that Python can reach, as {data_ptr: nbytes}: the tensors the
    garbage collector tracks and their `.grad` (held in C++), deduplicated by storage, leaving out `exclude`
    (the model's buffers, the token ids) and meta tensors (no memory). Objects frozen with gc.freeze() (everything alive
    before the arm started, the batches included) are not listed by gc.get_objects, so they are left out too.
    This measures what the code actually keeps, whatever it declares."""
    found: dict[int, int] = {}
    gc.collect()                                          # unreachable cycles are garbage, not state
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor):
            continue
        try:  # .grad lives on leaves that require grad
            grad = obj.grad if obj.requires_grad and obj.is_leaf else None
        except RuntimeError:  # a no_grad view whose base changed in place since: autograd refuses to say; no .grad
            grad = None
        for t in (obj, grad):
            if t is None or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            if st.nbytes() and st.data_ptr() not in exclude:
                found[st.data_ptr()] = st.nbytes()
    return found


def meta_template(model: torch.nn.Module) -> None:
    """Replace the template module's parameters by meta tensors (shape only, no memory): once they are copied
    into the flat vector, the module only tells functional_call the architecture."""
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(torch.empty(p.shape, device="meta"), requires_grad=False))


# %% [markdown]
# ## 2. Plain data parallel and the three ZeRO stages
#
# Per step, on every rank, with its 1/N of the global batch:
#
# - **DP**: full gradient, all-reduce (mean), every rank runs Adam on all P elements.
# - **ZeRO-1** (P_os): full gradient, *reduce-scatter* it, run Adam on the own shard only (moments for P/N
#   elements), *all-gather* the updated parameters. The full gradient buffer is kept between steps.
# - **ZeRO-2** (P_os+g): the same collectives; the full gradient is freed after the reduce-scatter and the rank
#   keeps only its gradient shard.
# - **ZeRO-3** (P_os+g+p): the rank keeps only its parameter shard. Forward all-gathers the parameters, and
#   the gathered copy is freed (its storage resized to 0) as soon as the forward is done; backward all-gathers
#   them again when autograd unpacks a saved parameter (a saved-tensor hook), then gradients are reduce-scattered.
#
# Transient buffers: our backward produces the whole flat gradient before it is reduce-scattered (all stages),
# and ZeRO-3 gathers the whole parameter vector, because our model is one unit. Real implementations
# reduce gradients bucket by bucket during backward and gather parameters layer by layer, so their transient
# peak is a bucket or a layer. What is measured below is what stays alive between steps.

# %%
# --8<-- [start:stages]
def train(rank: int, world: int, seed: int, stage: str, rs: str = "gloo") -> dict:
    """STEPS Adam steps of the shared DecoderLM under `stage` in {"dp", "zero1", "zero2", "zero3",
    "zero1-no-reduce", "zero2-keeps-grad"}: the last two are controls, one skipping the gradient reduction (the
    switch that should break equality), one a ZeRO-2 that forgets to free the full gradient (a leak the memory
    test must see).
    `rs`: which reduce-scatter the ZeRO stages use, gloo's own or a point-to-point ring (see Comm)."""
    torch.manual_seed(seed)
    data = batches(seed)
    gc.freeze()                 # what exists now (the batches too) is not this arm's state; also makes gc.collect cheap
    try:
        return _train(rank, world, seed, stage, rs, data)
    finally:
        gc.unfreeze()


def _train(rank: int, world: int, seed: int, stage: str, rs: str, data: list[tuple[Tensor, Tensor]]) -> dict:
    flat_model = Flat(DecoderLM(lm_cfg()), world)
    before = {b.untyped_storage().data_ptr() for b in flat_model.model.buffers()}  # positional table: not a state
    before |= {t.untyped_storage().data_ptr() for pair in data for t in pair}        # token ids (views of them)
    P, S = flat_model.size, flat_model.shard
    lo, hi = rank * S, (rank + 1) * S
    comm = Comm(reduce_scatter=rs)
    full = flat_model.flatten()                           # DP, ZeRO-1, ZeRO-2: every rank holds all P parameters
    meta_template(flat_model.model)                       # the module keeps shapes only
    own = full[lo:hi].clone() if stage == "zero3" else None   # ZeRO-3 holds only this shard ...
    full = None if stage == "zero3" else full.requires_grad_()  # ... and no full vector
    n_opt = P if stage == "dp" else S                     # Adam moments: all P (DP) or the own shard
    m, v = torch.zeros(n_opt), torch.zeros(n_opt)
    grad_shard, first_grad = None, None                   # ZeRO-2/3 keep their gradient shard between steps
    written = 0
    for step, (x, y) in enumerate(data, start=1):
        b = GLOBAL_BATCH // world
        x, y = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]   # this rank's 1/N of the batch
        w0 = sent_bytes()
        if stage == "zero3":
            gathered = comm.all_gather(own).requires_grad_()          # forward: all-gather the parameters
            ptr = gathered.untyped_storage().data_ptr()
            regathered: list[Tensor] = []

            def pack(t: Tensor):
                if t.untyped_storage().data_ptr() == ptr:              # a view of the gathered parameters:
                    return ("param", t.storage_offset(), t.shape, t.stride())  # save where, not the data
                return t

            def unpack(saved):
                if not (isinstance(saved, tuple) and saved and saved[0] == "param"):
                    return saved
                if not regathered:                                     # backward: all-gather them again
                    regathered.append(comm.all_gather(own))
                _, offset, shape, stride = saved
                return regathered[0].as_strided(shape, stride, offset)

            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                loss = flat_model.loss(gathered, x, y)
            gathered.untyped_storage().resize_(0)                      # free the gathered parameters
            loss.backward()
            with torch.no_grad():
                grad_shard = comm.reduce_scatter(gathered.grad.div_(world))  # mean gradient, own shard only
            reduced = grad_shard
            gathered.grad = None                                       # free the full gradient ...
            regathered.clear()                                         # ... and the backward's gathered copy
            del gathered, loss                                         # (both measured: see live_bytes)
            adam_(own, grad_shard, m, v, step)
        else:
            full.grad = None
            flat_model.loss(full, x, y).backward()                     # full.grad: all P elements
            with torch.no_grad():
                g = full.grad.div_(world)
                if stage == "dp":
                    comm.all_reduce(g)                                 # every rank: the mean gradient
                    reduced = g
                    adam_(full, g, m, v, step)
                else:
                    grad = g[lo:hi].clone() if stage == "zero1-no-reduce" else comm.reduce_scatter(g)
                    reduced = grad
                    if stage in ("zero2", "zero2-keeps-grad"):
                        grad_shard = grad                              # keep the shard ...
                        if stage == "zero2":
                            full.grad = None                           # ... and free the full gradient
                    adam_(full[lo:hi], grad, m, v, step)               # Adam on the own shard only
                    comm.all_gather(full[lo:hi], out=full)             # everyone gets the updated parameters
                    del grad
            del g
        written += sent_bytes() - w0
        if first_grad is None:                          # the reduced gradient (own shard), as bytes, not a tensor
            first_grad = reduced.numpy().tobytes()
        del reduced
    # After the last step: parameters, gradients, moments, whatever is left. gloo's worker threads drop a finished
    # collective's tensors a moment after it completes, so we look several times, a few barriers apart, and keep
    # the smallest: a buffer still alive at every look is state; one that vanished was transient. (Once in 40
    # seeds, with one look, a stray full-size buffer showed on one rank; its holder was not identified. With three
    # quick looks it still showed once in 8 random seeds on a machine loaded ~5x over its cores: so six looks,
    # spread over ~0.3 s, give a busy machine's gloo threads time to let go.)
    looks = []
    for i in range(6):
        for _ in range(4):
            dist.barrier()
        time.sleep(0.02 * i)
        looks.append(live_bytes(before))
    alive = min(looks, key=lambda found: sum(found.values()))
    final = (Comm().all_gather(own) if stage == "zero3" else full.detach())  # for the comparison only
    return {"params": final[:flat_model.psi], "psi": flat_model.psi, "P": P, "first_grad": first_grad,
            "live_bytes": sum(alive.values()), "live_storages": sorted(alive.values()),
            "live_looks": [sum(found.values()) for found in looks],
            "handed_per_step": {k: b / STEPS for k, b in comm.handed.items()},
            "ring_per_step": comm.ring_total() / STEPS,
            "written_per_step": written / STEPS}
# --8<-- [end:stages]


def single_process(seed: int) -> tuple[Tensor, Tensor, list[str]]:
    """The reference: one process, the whole batch, torch.optim.Adam on the model itself. Returns the parameters
    after STEPS steps, the first step's gradient (both flat) and each flat element's parameter name."""
    torch.manual_seed(seed)
    model = DecoderLM(lm_cfg())
    opt = torch.optim.Adam(model.parameters(), lr=LR, foreach=False)
    first = None
    for x, y in batches(seed):
        opt.zero_grad()
        token_loss(model(x), y).backward()
        if first is None:
            first = torch.cat([p.grad.flatten() for p in model.parameters()])
        opt.step()
    names = [n for n, p in model.named_parameters() for _ in range(p.numel())]
    return torch.cat([p.detach().flatten() for p in model.parameters()]), first, names


def single_process_flat(seed: int) -> Tensor:
    """The same run with our flat vector and `adam_`: checks that they are torch.optim.Adam on the model."""
    torch.manual_seed(seed)
    flat_model = Flat(DecoderLM(lm_cfg()), 1)
    full = flat_model.flatten()
    m, v = torch.zeros_like(full), torch.zeros_like(full)
    for step, (x, y) in enumerate(batches(seed), start=1):
        p = full.clone().requires_grad_()
        flat_model.loss(p, x, y).backward()
        adam_(full, p.grad, m, v, step)
    return full[:flat_model.psi]


# %% [markdown]
# ## 3. Tensor parallelism of the shared FFN (Megatron-LM §3)
#
# Rank r keeps rows [r·h, (r+1)·h) of W1 (column-parallel: output features of the first linear, with their
# biases) and the same columns of W2 (row-parallel: input features of the second linear), h = d_ff / N.
# The activation is element-wise, so each rank's hidden slice is exact without talking to anyone; its
# product with its W2 slice is a partial sum of the output, and one all-reduce adds the N partial sums
# (b2 is added once, after it). Backward: the weight gradients are local; the gradient with respect to the
# input is again a sum of N partial products and needs one all-reduce.

# %%
# --8<-- [start:tp]
def tp_ffn(rank: int, world: int, ffn: FeedForward, x: Tensor, upstream: Tensor, comm: Comm,
           reduce: bool = True) -> dict:
    """One forward and backward of `ffn` split over `world` ranks; `upstream` = dLoss/dOutput (replicated)."""
    d_ff = ffn.lin1.out_features
    if d_ff % world:
        raise ValueError(f"d_ff={d_ff} does not split over {world} ranks: pick d_ff divisible by the world size.")
    h = d_ff // world
    cols = slice(rank * h, (rank + 1) * h)
    w1 = ffn.lin1.weight[cols].detach().clone().requires_grad_()     # (h, d_model): column-parallel
    b1 = ffn.lin1.bias[cols].detach().clone().requires_grad_()       # (h,)
    w2 = ffn.lin2.weight[:, cols].detach().clone().requires_grad_()  # (d_model, h): row-parallel
    xr = x.detach().clone().requires_grad_()
    partial = F.linear(ffn.act(F.linear(xr, w1, b1)), w2)           # (B, T, d_model): this rank's partial sum
    y = partial.detach().clone()
    if reduce:
        comm.all_reduce(y)                                           # g: the forward all-reduce
    y = y + ffn.lin2.bias.detach()                                   # b2 once, after the sum
    (partial * upstream).sum().backward()                            # the all-reduce's backward is the identity
    dx = xr.grad.clone()
    if reduce:
        comm.all_reduce(dx)                                          # f: the backward all-reduce
    return {"y": y, "dx": dx, "dw1": w1.grad, "db1": b1.grad, "dw2": w2.grad, "cols": (cols.start, cols.stop)}
# --8<-- [end:tp]


def tp_run(rank: int, world: int, seed: int) -> dict:
    torch.manual_seed(seed)
    ffn = FeedForward(ffn_cfg())
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(GLOBAL_BATCH, T, ffn_cfg().d_model, generator=g)
    upstream = torch.randn(GLOBAL_BATCH, T, ffn_cfg().d_model, generator=g)
    comm = Comm()
    counts = []
    orig = comm.all_reduce

    def counting(t):
        counts.append(t.numel())
        return orig(t)
    comm.all_reduce = counting
    with_reduce = tp_ffn(rank, world, ffn, x, upstream, comm)
    n_calls = list(counts)
    without = tp_ffn(rank, world, ffn, x, upstream, Comm(), reduce=False)
    # the full FFN on one rank, for reference
    xf = x.clone().requires_grad_()
    ffn.zero_grad()
    yf = ffn(xf)
    (yf * upstream).sum().backward()
    return {"with": with_reduce, "without": without, "all_reduce_numels": n_calls,
            "handed": dict(comm.handed), "full_y": yf.detach(), "full_dx": xf.grad,
            "full_dw1": ffn.lin1.weight.grad, "full_db1": ffn.lin1.bias.grad, "full_dw2": ffn.lin2.weight.grad}


# %% [markdown]
# ## 4. What the backend really sends
#
# `Comm` counts bytes *handed to* a collective. What a rank actually writes to its sockets is read from
# /proc/self/io around one large collective (1 MiB per rank), so small-message overheads do not matter.

# %%
def backend_volumes(rank: int, world: int) -> dict:
    """Bytes written by this rank for one 1 MiB all-reduce, gloo's reduce-scatter, the point-to-point ring
    reduce-scatter (`Comm(reduce_scatter="ring")`) and an all-gather whose output is 1 MiB."""
    out = {}
    t = torch.ones(1 << 18)  # 1 MiB of fp32
    for kind, rs in (("all_reduce", "gloo"), ("reduce_scatter", "gloo"), ("reduce_scatter", "ring"),
                     ("all_gather", "gloo")):
        comm = Comm(reduce_scatter=rs)
        arg = t.clone() if kind != "all_gather" else t[: t.numel() // world].clone()
        w0 = sent_bytes()
        getattr(comm, kind)(arg)
        name = "ring_reduce_scatter" if rs == "ring" else kind
        out[name] = {"written": sent_bytes() - w0, "handed": comm.handed[kind],
                     "ring": ring_bytes(kind, comm.handed[kind], world)}
    return out


def everything(rank: int, world: int, seed: int) -> dict:
    """Every arm in one spawned group."""
    out = {s: train(rank, world, seed, s) for s in ("dp", "zero1", "zero2", "zero3", "zero1-no-reduce")}
    t0 = time.process_time()
    out["zero2-keeps-grad"] = train(rank, world, seed, "zero2-keeps-grad")   # the memory test's control
    out["zero2-keeps-grad"]["cpu_s"] = time.process_time() - t0
    out.update({f"{s}-ring": train(rank, world, seed, s, rs="ring") for s in ("zero1", "zero3")})
    out["tp"] = tp_run(rank, world, seed)
    out["backend"] = backend_volumes(rank, world)
    out["cpu_s"] = time.process_time()  # this worker's CPU seconds (a forked process starts from zero)
    return out


@functools.lru_cache(maxsize=None)
def run(world: int, seed: int) -> list[dict]:
    return run_distributed(everything, world, args=(seed,), timeout=120)


# %% [markdown]
# ## 5. The tests

# %%
LIVE_GRAD = 1e-6         # entries whose first-step gradient is below this × the largest count as zero-gradient
# A harmless reordering, on the other ("live") entries. Seeds 100-139: ring vs DP at N=4 7.9e-8 ± 4.6e-8 (max 3.3e-7),
# DP vs one process 1.0e-7 ± 5.8e-8 (max 3.0e-7); seed 0, DP vs one process at N=2: 2.5e-6, the largest seen.
RING_LIVE_BOUND = 1e-5
# The missing reduction there: 0.058 ± 0.001 (min 0.056) at N=2 and 4, seeds 100-139; divided by the larger harmless
# difference: 6.7e5 ± 2.7e5 at N=4 (min 1.8e5), 6.9e5 ± 2.4e5 at N=2 (min 2.0e5); seed 0 at N=2: 2.4e4.
BROKEN_RATIO, BROKEN_FLOOR = 1000, 1e-2


def floats(raw: bytes) -> Tensor:
    """A float32 tensor from the bytes a worker returned."""
    return torch.frombuffer(bytearray(raw), dtype=torch.float32)


@pytest.mark.claim("C-ZERO-1", "confirmed")
def test_zero_stages_give_the_same_update_as_data_parallel(ev, seed):
    """Real processes (gloo), N = 2 and 4, three Adam steps of a 1-layer DecoderLM: the parameters after ZeRO-1,
    -2 and -3 are bit-identical to plain data parallel's on gloo, on every rank. The switch: ZeRO-1 without the gradient
    reduce-scatter (each rank updates its shard with its own gradient) ends far away, also on the "live" entries
    (true gradient not zero), where it must be at least BROKEN_RATIO times the largest difference a harmless
    reordering leaves there (ring reduce-scatter, one process), which must stay below RING_LIVE_BOUND. Would be
    refuted if any stage's reduced gradient differed from DP's beyond float rounding, or its parameters ended far
    from DP's (on gloo: differed at all; with the ring: beyond RING_LIVE_BOUND on the live entries).

    Bit-identity is a property of gloo's reduction order here (its reduce-scatter delivers the same sums, in the
    same order, as its all-reduce), not a guarantee of ZeRO: with the point-to-point ring reduce-scatter, which
    adds in another order, the reduced gradients agree only to float rounding at N = 4 (at N = 2 a sum of two
    numbers has one order), and Adam turns rounding noise on zero-gradient entries into full steps. On NCCL or
    another ring order, expect equality to float tolerance, not bits. DP itself matches the single-process run
    on the whole batch: its averaged gradient to float rounding."""
    ref, ref_grad, names = single_process(seed)
    ours = single_process_flat(seed)
    ev.record("one process: flat vector + our adam_ vs the module + torch.optim.Adam, largest difference",
              (ours - ref).abs().max().item(), expect="0")
    assert torch.equal(ours, ref)  # so "DP" below is data-parallel torch Adam, not a look-alike
    for world in WORLDS:
        ranks = run(world, seed)
        dp = ranks[0]["dp"]
        psi, S = dp["psi"], dp["P"] // world
        dp_grad = floats(dp["first_grad"])
        # The key bias has a true gradient of exactly 0 (softmax ignores a shift shared by all keys), and a few
        # other entries (e.g. weights of a nearly silent hidden unit) one at rounding level: Adam divides that noise
        # by its own size and takes full steps in its sign. The "live" entries leave them out: not a key bias, and a
        # first-step single-process gradient of at least LIVE_GRAD times the largest one.
        live = torch.tensor([not n.endswith("w_k.bias") for n in names])
        near_zero = live & (ref_grad.abs() < LIVE_GRAD * ref_grad.abs().max())
        live &= ~near_zero
        live = torch.cat([live, torch.zeros(dp["params"].numel() - live.numel(), dtype=torch.bool)])
        ev.record(f"N={world}: entries left out besides the key biases (first-step gradient < {LIVE_GRAD:g} × the "
                  "largest)", int(near_zero.sum()), key=False)
        for stage in ("zero1", "zero2", "zero3"):
            diff = (ranks[0][stage]["params"] - dp["params"]).abs().max().item()
            ev.record(f"N={world}: {stage} vs DP, largest parameter difference after {STEPS} Adam steps", diff,
                      expect="0 (bit-identical on gloo)")
            assert all(torch.equal(r[stage]["params"], dp["params"]) for r in ranks)
            if stage == "zero2":
                continue  # ZeRO-2 sends exactly what ZeRO-1 sends (same code path): no separate ring arm
            # the ring reduce-scatter: another summation order
            gring = max((floats(r[f"{stage}-ring"]["first_grad"]) - dp_grad[i * S:(i + 1) * S]).abs().max().item()
                        for i, r in enumerate(ranks))
            pring = max((r[f"{stage}-ring"]["params"] - dp["params"]).abs().max().item() for r in ranks)
            ev.record(f"N={world}: {stage} with the ring reduce-scatter vs DP, largest reduced-gradient difference, step 1",
                      gring, expect="float rounding")
            ev.record(f"N={world}: {stage} with the ring reduce-scatter vs DP, largest parameter difference", pring)
            if stage == "zero1":
                d = (ranks[0]["zero1-ring"]["params"] - dp["params"]).abs()
                ring_live = d[live].max().item()
                ev.record(f"N={world}: zero1 with the ring reduce-scatter vs DP, largest difference is in",
                          "none: equal" if d.max() == 0 else names[int(d.argmax())])
                ev.record(f"N={world}: zero1 with the ring reduce-scatter vs DP, largest parameter difference "
                          "on the live entries", ring_live, expect="rounding")
                # seeds 100-139, N=4: 7.9e-8 ± 4.6e-8, max 3.3e-7 (N=2: 0, one order); see RING_LIVE_BOUND
                assert ring_live <= RING_LIVE_BOUND
            assert gring <= 1e-6 * dp_grad.abs().max().item()  # float rounding: a tolerance check, no sweep
            if world == 2:
                assert pring == 0  # two addends: one order
        broken = (ranks[0]["zero1-no-reduce"]["params"] - dp["params"]).abs().max().item()
        ev.record(f"N={world}: ZeRO-1 without the reduce-scatter vs DP, largest parameter difference", broken, expect="large")
        gdiff = (dp_grad[:psi] - ref_grad).abs().max().item()
        ev.record(f"N={world}: DP mean gradient vs single-process gradient, largest difference, step 1", gdiff,
                  expect="float rounding")
        ev.record(f"N={world}: largest single-process gradient entry, step 1", ref_grad.abs().max().item())
        assert gdiff < 1e-6
        pdiff = (dp["params"] - ref).abs()
        worst = int(pdiff.argmax())
        single_live = pdiff[live[:pdiff.numel()]].max().item()
        ev.record(f"N={world}: DP vs single process, largest parameter difference after {STEPS} steps", pdiff.max().item())
        ev.record(f"N={world}: that largest difference is in", names[worst])
        ev.record(f"N={world}: DP vs single process, largest parameter difference on the live entries",
                  single_live, expect="rounding")
        ev.record(f"N={world}: that entry's single-process gradient, step 1", ref_grad[worst].item(),
                  expect="≈ 0: Adam divides rounding noise by its own size")
        assert single_live <= RING_LIVE_BOUND  # seeds 100-139: 1.0e-7 ± 5.8e-8, max 3.0e-7; seed 0 N=2: 2.5e-6
        # The switch, where the true gradient is not zero: there a harmless reordering (ring, or one process)
        # leaves rounding only, while the missing reduction is a real error.
        broken_live = (ranks[0]["zero1-no-reduce"]["params"] - dp["params"]).abs()[live].max().item()
        noise = max(ring_live, single_live)
        ev.record(f"N={world}: ZeRO-1 without the reduce-scatter vs DP, largest parameter difference on the live "
                  "entries", broken_live, expect="large: a real error, not rounding")
        ev.record(f"N={world}: on the live entries, no reduce-scatter / largest harmless reordering "
                  "(ring reduce-scatter, one process)", broken_live / noise if noise else "no reordering difference")
        # seeds 100-139: ratio min 1.8e5, broken_live min 0.056 (see BROKEN_RATIO)
        assert broken_live >= BROKEN_RATIO * noise and broken_live > BROKEN_FLOOR
    ev.record("Ψ (parameters of the model)", ranks[0]["dp"]["psi"])
    ev.record("CPU seconds of all workers, every arm of this file, N=2 and N=4 groups together",
              sum(r["cpu_s"] for world in WORLDS for r in run(world, seed)), key=False)


# --8<-- [start:formula]
def paper_bytes(psi: float, n: int, stage: str, k: float = 12, bp: float = 2, bg: float = 2) -> float:
    """Rajbhandari et al. (2020) §5: bp·Ψ parameters + bg·Ψ gradients + K·Ψ optimizer state per rank,
    the first `stage` of (optimizer, gradients, parameters) divided by N_d."""
    o, g, p = k * psi, bg * psi, bp * psi
    return {"dp": p + g + o, "zero1": p + g + o / n, "zero2": p + (g + o) / n, "zero3": (p + g + o) / n}[stage]
# --8<-- [end:formula]


@pytest.mark.claim("C-ZERO-1", "confirmed")
def test_zero_memory_per_rank_matches_the_formula(ev, seed):
    """Bytes of every tensor storage alive in each rank's process after the last step (`live_bytes`: all tensors
    the garbage collector reaches and their .grad, deduplicated by storage, minus what existed before the arm,
    the token ids and the model's positional-table buffer); the smallest of six looks a few barriers apart (a
    tensor a gloo thread releases a moment late is not state). The template module's parameters are meta tensors,
    so they hold nothing. Asserted: DP > ZeRO-1 > ZeRO-2 > ZeRO-3 on what is alive, each equal to §5's formula with our fp32
    numbers (bp = bg = 4, K = 8: two fp32 moments; no master copy) and P = Ψ padded to a multiple of N. Would be
    refuted if a stage left more alive than the formula (e.g. ZeRO-2 still holding the full gradient, ZeRO-3 a
    gathered copy: a first version of our ZeRO-3 did, and this test caught it); a standing control, a ZeRO-2 that
    keeps the full gradient, must measure exactly formula + P·4 bytes, so the test is shown to fail. This is the steady state between
    steps; the transient peak is not measured: in every stage our backward builds the whole flat gradient before
    the reduce-scatter, and ZeRO-3 gathers the whole parameter vector (our model is one unit). Plus the
    paper's own example by the same formula (arithmetic, not a measurement)."""
    for world in WORLDS:
        ranks = run(world, seed)
        P = ranks[0]["dp"]["P"]
        totals = []
        for stage in ("dp", "zero1", "zero2", "zero3"):
            total = ranks[0][stage]["live_bytes"]
            totals.append(total)
            ev.record(f"N={world} {stage}: bytes alive per rank", total,
                      expect=f"{paper_bytes(P, world, stage, k=8, bp=4, bg=4):.0f}")
            ev.record(f"N={world} {stage}: storages alive per rank (bytes each)", ranks[0][stage]["live_storages"])
            ev.record(f"N={world} {stage}: looks (of 6 per rank) that saw more than the smallest",
                      sum(look > r[stage]["live_bytes"] for r in ranks for look in r[stage]["live_looks"]), key=False)
            assert all(r[stage]["live_bytes"] == total for r in ranks)
            assert total == paper_bytes(P, world, stage, k=8, bp=4, bg=4)
        assert totals[0] > totals[1] > totals[2] > totals[3]
        # the standing control: a ZeRO-2 that forgets `full.grad = None` must show one full gradient too many
        leak = ranks[0]["zero2-keeps-grad"]["live_bytes"]
        ev.record(f"N={world} control, zero2 that keeps the full gradient: bytes alive per rank", leak,
                  expect=f"formula + P·4 = {paper_bytes(P, world, 'zero2', k=8, bp=4, bg=4) + P * FP32:.0f}")
        ev.record(f"N={world} control, zero2 that keeps the full gradient: bytes above the formula / (P·4)",
                  (leak - paper_bytes(P, world, "zero2", k=8, bp=4, bg=4)) / (P * FP32), expect="1")
        ev.record(f"N={world} control: CPU seconds of its arm, all {world} workers",
                  sum(r["zero2-keeps-grad"]["cpu_s"] for r in ranks), key=False)
        assert all(r["zero2-keeps-grad"]["live_bytes"] == leak for r in ranks)
        assert leak == paper_bytes(P, world, "zero2", k=8, bp=4, bg=4) + P * FP32  # every seed 100-139 (a count)
        ev.record(f"N={world}: ZeRO-3 bytes alive per rank / DP", totals[3] / totals[0], expect=f"1/{world}")
    # the paper's example (Figure 1, §5.1-5.3, Table 1): Ψ = 7.5B, N_d = 64, K = 12: 120, 31.4, 16.6, 1.88 GB
    printed = {"dp": 120, "zero1": 31.4, "zero2": 16.6, "zero3": 1.88}
    for stage, gb in printed.items():
        ours = paper_bytes(7.5e9, 64, stage) / 1e9
        ev.record(f"paper example Ψ=7.5B N=64 K=12, {stage}: GB per rank", ours, expect=f"{gb} (paper)")
        assert ours == pytest.approx(gb, abs=0.05)


@pytest.mark.claim("C-ZERO-1", "confirmed")
def test_zero_communication_per_rank(ev, seed):
    """Bytes each rank really wrote to its sockets (/proc/self/io), per step and for 1 MiB collectives.
    Asserted on the written bytes: a ring reduce-scatter writes half of gloo's all-reduce (so all-reduce =
    reduce-scatter + all-gather, ZeRO §7.1), an all-gather the other half; with it, ZeRO-1/2 write what DP writes
    and ZeRO-3 1.5× (§7.2.1, §7.2.2). gloo's own reduce-scatter writes as much as its all-reduce, so with it
    ZeRO-1/2 write 1.5× DP and ZeRO-3 2×. Also the ring model from the bytes handed to each collective (exact
    count of our module). Would be refuted if ZeRO-1/2 with a bandwidth-optimal reduce-scatter wrote clearly
    more than DP. The byte counts do not depend on the seed (same sizes); the 0.05 slack covers gloo's
    per-message overhead on our 2.5-10 kB messages, which is a larger share of DP's all-reduce (N=4: 1.116x its
    ring volume) than of ZeRO-1 with the ring (1.087x), so the ratios come out at 0.974 and 1.474."""
    for world in WORLDS:
        r0 = run(world, seed)[0]
        dp, dpw = r0["dp"]["ring_per_step"], r0["dp"]["written_per_step"]
        for stage in ("dp", "zero1", "zero2", "zero3"):
            for kind, b in r0[stage]["handed_per_step"].items():
                ev.record(f"N={world} {stage}: bytes handed to {kind} per step", b)
            ev.record(f"N={world} {stage}: ring-model bytes per rank per step / DP", r0[stage]["ring_per_step"] / dp,
                      expect={"dp": "1", "zero1": "1", "zero2": "1", "zero3": "1.5"}[stage])
            ev.record(f"N={world} {stage}: bytes written per rank per step / DP, gloo reduce-scatter",
                      r0[stage]["written_per_step"] / dpw)
        ev.record(f"N={world} dp: bytes written per step / ring model (headers, small messages)",
                  dpw / dp)
        for stage in ("zero1", "zero3"):
            ev.record(f"N={world} {stage}, ring reduce-scatter: bytes written per step / ring model",
                      r0[f"{stage}-ring"]["written_per_step"] / r0[f"{stage}-ring"]["ring_per_step"])
            ev.record(f"N={world} {stage}: bytes written per rank per step / DP, ring reduce-scatter",
                      r0[f"{stage}-ring"]["written_per_step"] / dpw, expect="1.5" if stage == "zero3" else "1")
        # ring model, from the bytes handed: exact count of our module
        assert r0["dp"]["ring_per_step"] == 2 * (world - 1) / world * r0["dp"]["P"] * FP32
        assert r0["zero1"]["ring_per_step"] == pytest.approx(dp, rel=1e-12)
        assert r0["zero2"]["ring_per_step"] == pytest.approx(dp, rel=1e-12)
        assert r0["zero3"]["ring_per_step"] == pytest.approx(1.5 * dp, rel=1e-12)
        # bytes really written, 1 MiB collectives
        be = r0["backend"]
        ar = be["all_reduce"]["written"]
        for kind, row in be.items():
            ev.record(f"N={world} {kind} of 1 MiB: bytes written / ring model", row["written"] / row["ring"])
            ev.record(f"N={world} {kind} of 1 MiB: bytes written / all-reduce written", row["written"] / ar,
                      expect={"all_reduce": "1", "reduce_scatter": "gloo: 1", "ring_reduce_scatter": "0.5",
                              "all_gather": "0.5"}[kind])
        assert ar / be["all_reduce"]["ring"] == pytest.approx(1, abs=0.01)
        assert be["ring_reduce_scatter"]["written"] / ar == pytest.approx(0.5, abs=0.01)
        assert be["all_gather"]["written"] / ar == pytest.approx(0.5, abs=0.01)
        assert be["reduce_scatter"]["written"] / ar == pytest.approx(1.0, abs=0.01)  # gloo's: all-reduce-sized
        # bytes really written per training step
        for stage, ring_ratio, gloo_ratio in (("zero1", 1.0, 1.5), ("zero3", 1.5, 2.0)):
            assert r0[f"{stage}-ring"]["written_per_step"] / dpw == pytest.approx(ring_ratio, abs=0.05)
            assert r0[stage]["written_per_step"] / dpw == pytest.approx(gloo_ratio, abs=0.05)
        assert r0["zero2"]["written_per_step"] == r0["zero1"]["written_per_step"]  # same collectives, same sizes


@pytest.mark.claim("C-TP-1", "confirmed")
def test_tensor_parallel_ffn_needs_one_all_reduce(ev, seed):
    """The shared FFN (d_model 16, d_ff 64) split column-wise (W1) then row-wise (W2) over 2 and 4 real processes:
    one all-reduce of the (B, T, d_model) partial outputs gives the full FFN's output (float tolerance); with no
    all-reduce the output is wrong. Bytes handed = B·T·d_model·4. Would be refuted if one all-reduce were not
    enough (equality failing) or if more than one were needed in the forward pass."""
    for world in WORLDS:
        ranks = run(world, seed)
        for r in ranks:
            tp = r["tp"]
            assert torch.allclose(tp["with"]["y"], tp["full_y"], atol=1e-6, rtol=0)
        tp = ranks[0]["tp"]
        err = max((r["tp"]["with"]["y"] - r["tp"]["full_y"]).abs().max().item() for r in ranks)
        wrong = max((r["tp"]["without"]["y"] - r["tp"]["full_y"]).abs().max().item() for r in ranks)
        scale = tp["full_y"].abs().max().item()
        ev.record(f"N={world}: TP output vs full FFN, largest difference, one all-reduce", err, expect="float rounding")
        ev.record(f"N={world}: TP output vs full FFN, largest difference, no all-reduce", wrong, expect="large")
        ev.record(f"N={world}: largest full FFN output entry", scale)
        fwd_bytes = tp["all_reduce_numels"][0] * FP32
        ev.record(f"N={world}: bytes handed to the forward all-reduce", fwd_bytes,
                  expect=f"B·T·d_model·4 = {GLOBAL_BATCH * T * 16 * FP32}")
        ev.record(f"N={world}: ring bytes sent per rank for it", ring_bytes("all_reduce", fwd_bytes, world))
        assert wrong > 0.1 * scale
        assert fwd_bytes == GLOBAL_BATCH * T * ffn_cfg().d_model * FP32  # by construction: the shape handed
        assert len(tp["all_reduce_numels"]) == 2  # count of our tp_ffn's calls: one forward (g) + one backward (f)


@pytest.mark.claim("C-TP-1", "confirmed")
def test_tensor_parallel_ffn_backward(ev, seed):
    """Backward of the split FFN: each rank's W1, b1, W2 gradients equal the matching slices of the full FFN's
    gradients (relative tolerance 1e-6) and are the same with or without communication (by construction: no
    collective touches them in tp_ffn); the gradient with respect to the input needs the second all-reduce:
    with it, it matches the full FFN's to relative tolerance 1e-6, without it, it is wrong. Would be refuted if a
    shard's weight gradient differed from the full one's slice (it would need another rank's data)."""
    for world in WORLDS:
        ranks = run(world, seed)
        worst, dx_err = 0.0, 0.0
        for r in ranks:
            tp, (a, b) = r["tp"], r["tp"]["with"]["cols"]
            for name, full in (("dw1", tp["full_dw1"][a:b]), ("db1", tp["full_db1"][a:b]),
                               ("dw2", tp["full_dw2"][:, a:b])):
                worst = max(worst, ((tp["with"][name] - full).abs().max() / full.abs().max()).item())
                # float tolerance, no sweep needed; seeds 100-139, largest difference / largest entry: N=4
                # 1.6e-7 ± 4.2e-8, max 2.5e-7; N=2 exactly 0 every seed
                assert torch.allclose(tp["with"][name], full, rtol=1e-6, atol=1e-6 * full.abs().max().item())
                assert torch.equal(tp["with"][name], tp["without"][name])  # by construction: no communication
            dx_err = max(dx_err, ((tp["with"]["dx"] - tp["full_dx"]).abs().max() / tp["full_dx"].abs().max()).item())
            # float tolerance, no sweep needed; seeds 100-139, largest difference / largest entry: N=4 1.9e-7 ± 3.9e-8,
            # max 2.84e-7 (N=2 1.8e-7 ± 4.1e-8, max 2.80e-7)
            assert torch.allclose(tp["with"]["dx"], tp["full_dx"], rtol=1e-6,
                                  atol=1e-6 * tp["full_dx"].abs().max().item())
        dx_wrong = max((r["tp"]["without"]["dx"] - r["tp"]["full_dx"]).abs().max().item() for r in ranks)
        ev.record(f"N={world}: shard weight gradients vs slices of the full gradients, largest difference / largest entry",
                  worst, expect="float rounding (< 1e-6)")
        ev.record(f"N={world}: input gradient vs full, largest difference / largest entry, with the backward all-reduce",
                  dx_err, expect="float rounding (< 1e-6)")
        ev.record(f"N={world}: input gradient vs full, largest difference, no backward all-reduce", dx_wrong, expect="large")
        assert dx_wrong > 0.1 * ranks[0]["tp"]["full_dx"].abs().max().item()

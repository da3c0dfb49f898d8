"""Run a function in N real processes joined by torch.distributed (gloo, on 127.0.0.1), and count the bytes
handed to its collectives.

    results = run_distributed(fn, world_size=4, args=(...), timeout=60)   # fn(rank, world_size, *args) -> picklable

Each worker is a fresh process (forkserver or spawn, see `run_distributed`) with one torch thread. The port is picked by binding port 0 and
releasing it just before the workers bind it (a small race another program could win; the error then says so).
On a worker's exception, a timeout or a crash, every worker is terminated (then killed) and joined, and the
first worker error is re-raised in the parent as `WorkerError` with the worker's traceback text. Each worker
destroys its process group in a `finally`.

`Comm` wraps the collectives a proof calls and counts, per kind, the bytes *handed to the collective* by this
rank: element_size · numel of the tensor passed in (for all-gather, of this rank's own input; for
reduce-scatter, of the full input). That is not the bytes a ring moves: a ring all-reduce sends
2(N-1)/N of the tensor per rank, reduce-scatter and all-gather (N-1)/N each (`ring_bytes`).
`sent_bytes()` reads what this process actually wrote (/proc/self/io `wchar`), so the two can be compared.
gloo's own reduce-scatter writes as much as its all-reduce (measured in proofs/scale/proof_parallel.py), so
`Comm(reduce_scatter="ring")` swaps in a bandwidth-optimal ring reduce-scatter built from point-to-point
sends: each rank writes (n-1) chunks of 1/n of the tensor.
"""

from __future__ import annotations

import collections
import datetime
import multiprocessing as mp
import pickle
import queue
import socket
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor


# Imported once by the forkserver (when it starts), so forked workers need not: torch, this module, the shared
# model, and pytest, which every proof file imports (a worker imports its function's module to unpickle it).
PRELOAD = ["torch", "proofs.distributed", "proofs.transformer", "proofs.train", "pytest"]


class WorkerError(RuntimeError):
    """A worker raised; the message carries its rank and traceback text."""


def free_port() -> int:
    """A port the OS says is free now: bind port 0 on 127.0.0.1, read the port, release it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, timeout: float, results) -> None:
    torch.set_num_threads(1)
    ok = None
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        # pickled here, by value: a tensor put on the queue as is would be shared through a file descriptor
        # that dies with this process
        ok = (rank, "ok", pickle.dumps(fn(rank, world_size, *args)))
    except BaseException as e:  # noqa: BLE001 — every failure goes back to the parent as text
        # flushed before this rank leaves the group, so the parent hears the cause before its peers'
        # "connection closed" errors
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        results.close()
        results.join_thread()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if ok is not None:
        results.put(ok)


def _stop(procs: list) -> None:
    """Terminate, then kill, then join every worker still alive."""
    procs = [p for p in procs if p.pid is not None]  # never started: nothing to stop
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def run_distributed(fn: Callable, world_size: int, args: tuple = (), timeout: float = 60.0,
                    port: int | None = None, start_method: str = "forkserver") -> list[Any]:
    """fn(rank, world_size, *args) in `world_size` spawned processes (gloo); returns the results in rank order.

    `fn` and `args` must be picklable (a module-level function). Raises WorkerError with the worker's traceback
    on any worker exception, TimeoutError after `timeout` seconds, and leaves no worker alive either way.
    `port`: the rendezvous port on 127.0.0.1 (default: a free one, see `free_port`).
    `start_method`: "forkserver" (default) or "spawn". Both start workers from a fresh interpreter, never by
    forking this (possibly multi-threaded) process. A spawned worker imports torch itself, which took 5-9 s
    for 2-4 workers on our loaded 2-core machine; the forkserver imports torch once (preloaded), then forks a
    worker in milliseconds. The forkserver (and multiprocessing's resource tracker) stay alive as children of
    this process until it exits; they run no worker code and hold no port.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: need at least one process.")
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method={start_method!r}: use 'forkserver' or 'spawn' (never 'fork': it would copy "
                         f"this process's threads and locks into every worker).")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # imported once, by the server
    results = ctx.Queue()
    port = free_port() if port is None else port
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, timeout, results), daemon=True)
             for r in range(world_size)]
    out: dict[int, Any] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(out) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{world_size - len(out)} of {world_size} workers gave no result within "
                                   f"{timeout} s (ranks done: {sorted(out)}); all were terminated.")
            try:
                rank, status, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    time.sleep(0.2)  # a result put just before exiting may still be in the pipe
                    if results.empty():
                        raise WorkerError(f"worker pid {dead[0].pid} died with exit code {dead[0].exitcode} "
                                          f"and no result (port {port} may have been taken).")
                continue
            if status == "error":
                others = []
                try:  # peers of a failed rank fail too (connection closed): name them after the cause
                    while True:
                        r2, s2, v2 = results.get(timeout=0.3)
                        if s2 == "error":
                            others.append(f"rank {r2}: {v2.splitlines()[0][:200]}")
                except queue.Empty:
                    pass
                also = f"\n(then: {'; '.join(others)})" if others else ""
                raise WorkerError(f"rank {rank} of {world_size} failed: {value}{also}")
            out[rank] = pickle.loads(value)
        for p in procs:
            p.join(5)
        return [out[r] for r in range(world_size)]
    finally:
        _stop(procs)
        results.close()
        results.join_thread()


# --8<-- [start:comm]
def ring_bytes(kind: str, handed: int, n: int) -> float:
    """Bytes one rank of a ring of n sends for a collective handed `handed` bytes (the full tensor for all-reduce
    and reduce-scatter, its own shard for all-gather, the tensor for a broadcast relayed along a chain)."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n * handed           # reduce-scatter then all-gather, (n-1)/n each
    if kind == "reduce_scatter":
        return (n - 1) / n * handed               # n-1 chunks of handed/n
    if kind == "all_gather":
        return (n - 1) * handed                   # n-1 shards of `handed` pass through each rank
    if kind == "broadcast":
        return handed                             # pipelined chain: every rank but the last forwards it once
    raise ValueError(f"unknown collective {kind!r}")


def sent_bytes() -> int:
    """Bytes this process has passed to write()-family system calls so far (/proc/self/io wchar; Linux only)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar")).split()[1])


class Comm:
    """The collectives a proof calls, each counting element_size·numel handed to it by this rank, per kind."""

    def __init__(self, reduce_scatter: str = "gloo") -> None:
        if reduce_scatter not in ("gloo", "ring"):
            raise ValueError(f"reduce_scatter={reduce_scatter!r}: use 'gloo' (the backend's own) or 'ring' "
                             f"(point-to-point ring, (n-1)/n of the tensor sent per rank).")
        self.handed: collections.Counter[str] = collections.Counter()
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.rs = reduce_scatter

    def _count(self, kind: str, t: Tensor) -> None:
        self.handed[kind] += t.element_size() * t.numel()

    def all_reduce(self, t: Tensor) -> Tensor:  # in place: t becomes the sum over ranks
        self._count("all_reduce", t)
        dist.all_reduce(t)
        return t

    def reduce_scatter(self, full: Tensor) -> Tensor:
        """This rank's 1/n slice of the sum over ranks of `full` (numel divisible by n)."""
        if full.numel() % self.world:
            raise ValueError(f"reduce_scatter of {full.numel()} elements over {self.world} ranks: pad to a multiple.")
        self._count("reduce_scatter", full)
        if self.rs == "ring":
            return self._ring_reduce_scatter(full)
        out = torch.empty(full.numel() // self.world, dtype=full.dtype)
        dist.reduce_scatter_single(out, full.contiguous())
        return out

    def _ring_reduce_scatter(self, full: Tensor) -> Tensor:
        """Ring reduce-scatter from point-to-point messages: n-1 rounds; in round s rank r sends its partial sum
        of chunk (r-s-1) mod n to rank r+1 and adds what rank r-1 sends into chunk (r-s-2) mod n. After the last
        round chunk r holds the sum over all ranks. Chunk r is summed in the order x_{r+1}, x_{r+2}, ..., x_r."""
        n, r = self.world, self.rank
        chunks = full.detach().reshape(n, -1).clone()      # (n, numel/n): this rank's partial sums, by chunk
        buf = torch.empty(chunks.shape[1], dtype=full.dtype)
        for s in range(n - 1):
            req = dist.isend(chunks[(r - s - 1) % n], (r + 1) % n)
            dist.recv(buf, (r - 1) % n)
            req.wait()
            chunks[(r - s - 2) % n] += buf
        return chunks[r].clone()

    def all_gather(self, shard: Tensor, out: Tensor | None = None) -> Tensor:
        """The n ranks' shards concatenated in rank order (into `out` if given: n·numel elements, contiguous)."""
        self._count("all_gather", shard)
        if out is None:
            out = torch.empty(shard.numel() * self.world, dtype=shard.dtype)
        elif out.numel() != shard.numel() * self.world or not out.is_contiguous():
            raise ValueError(f"all_gather into {tuple(out.shape)}: need a contiguous tensor of "
                             f"{shard.numel() * self.world} elements (shard numel x world size).")
        dist.all_gather_single(out, shard.contiguous())
        return out

    def broadcast(self, t: Tensor, src: int = 0) -> Tensor:
        self._count("broadcast", t)
        dist.broadcast(t, src)
        return t

    def total(self) -> int:
        return sum(self.handed.values())

    def ring_total(self) -> float:
        return sum(ring_bytes(k, v, self.world) for k, v in self.handed.items())
# --8<-- [end:comm]

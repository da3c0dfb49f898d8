"""proofs/distributed.py: real processes (gloo on 127.0.0.1) start, return results, re-raise a worker's error
with its traceback, time out, and leave no process alive and the port free either way."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from proofs.distributed import Comm, WorkerError, free_port, ring_bytes, run_distributed


def _sum_ranks(rank: int, world: int) -> dict:
    comm = Comm()
    t = comm.all_reduce(torch.tensor([float(rank)]))
    g = comm.all_gather(torch.tensor([float(rank)] * 2))
    return {"pid": os.getpid(), "sum": t.item(), "gathered": g.tolist(), "handed": dict(comm.handed),
            "threads": torch.get_num_threads(), "world": dist.get_world_size()}


def _reduce_scatters(rank: int, world: int) -> dict:
    x = torch.arange(world * 4, dtype=torch.float32) * (rank + 1)  # integer-valued: every summation order is exact
    gloo, ring = Comm(), Comm(reduce_scatter="ring")
    out = torch.empty(world * 2)
    gathered = gloo.all_gather(torch.tensor([float(rank)] * 2), out=out)
    try:
        Comm(reduce_scatter="tree")
        bad = ""
    except ValueError as e:
        bad = str(e)
    return {"gloo": gloo.reduce_scatter(x).tolist(), "ring": ring.reduce_scatter(x).tolist(),
            "ring_handed": dict(ring.handed), "into_out": gathered is out, "gathered": out.tolist(), "bad": bad}


def _fail_on_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()  # rank 0 waits here for a rank that never comes: the parent must end it
    time.sleep(60)


def _sleep(rank: int, world: int) -> None:
    time.sleep(60)


HELPERS = ("resource_tracker", "forkserver")  # multiprocessing's own helpers: one each per parent, kept by design


def _no_children_left() -> list:
    """Live child processes other than multiprocessing's resource tracker and forkserver (started with the first
    worker and kept until this process exits; they hold no port and run no worker code)."""
    time.sleep(0.05)
    kids = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    return [p for p in kids if not any(h in a for a in p.cmdline() for h in HELPERS)] + mp.active_children()


def _port_is_free(port: int) -> bool:
    """Nobody listens on the port: we can bind and listen on it. SO_REUSEADDR lets us past the closed
    connections the kernel keeps in TIME_WAIT for a minute; it does not let us past a live listener."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            return True
        except OSError:
            return False


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_runs_n_processes_and_returns_each_rank_result(start_method):
    port = free_port()
    n = 3 if start_method == "forkserver" else 2  # spawn imports torch in every worker: seconds each
    out = run_distributed(_sum_ranks, n, port=port, timeout=60, start_method=start_method)
    assert [r["sum"] for r in out] == [n * (n - 1) / 2] * n  # 0 + 1 (+ 2) on every rank
    assert all(r["gathered"] == [float(i) for i in range(n) for _ in range(2)] for r in out)
    assert len({r["pid"] for r in out}) == n and os.getpid() not in {r["pid"] for r in out}
    assert all(r["threads"] == 1 and r["world"] == n for r in out)
    assert out[0]["handed"] == {"all_reduce": 4, "all_gather": 8}  # float32: 1 element, then 2 per rank
    assert not any(psutil.pid_exists(r["pid"]) and psutil.Process(r["pid"]).status() != psutil.STATUS_ZOMBIE
                   for r in out)
    assert _no_children_left() == [] and _port_is_free(port)


def test_worker_error_is_reraised_with_its_traceback_and_everyone_stopped():
    port = free_port()
    with pytest.raises(WorkerError, match="rank 1 of 2 failed: ValueError: boom from rank 1") as info:
        run_distributed(_fail_on_rank_1, 2, port=port, timeout=60)
    assert "Traceback" in str(info.value) and "_fail_on_rank_1" in str(info.value)
    assert _no_children_left() == [] and _port_is_free(port)


def test_timeout_terminates_every_worker():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="within"):
        run_distributed(_sleep, 2, port=port, timeout=2)
    assert time.monotonic() - t0 < 10
    assert _no_children_left() == [] and _port_is_free(port)


def test_ring_bytes_formulas():
    """Exact arithmetic of the ring model the proof compares against."""
    assert ring_bytes("all_reduce", 400, 4) == 600 and ring_bytes("all_reduce", 400, 1) == 0
    assert ring_bytes("reduce_scatter", 400, 4) == 300 and ring_bytes("all_gather", 100, 4) == 300
    with pytest.raises(ValueError, match="unknown collective"):
        ring_bytes("all_to_all", 1, 2)
    with pytest.raises(ValueError, match="never 'fork'"):
        run_distributed(_sleep, 2, start_method="fork")
    with pytest.raises(ValueError, match="at least one"):
        run_distributed(_sleep, 0)


def test_ring_reduce_scatter_equals_gloo_and_all_gather_into_out():
    """Exact: the point-to-point ring reduce-scatter gives each rank the same slice of the sum as gloo's (3 ranks,
    integer-valued floats so the order of the sum cannot matter); all_gather(out=...) fills the given tensor."""
    n = 3
    out = run_distributed(_reduce_scatters, n, timeout=60)
    total = [sum(i * (r + 1) for r in range(n)) for i in range(n * 4)]
    for rank, r in enumerate(out):
        assert r["gloo"] == r["ring"] == total[rank * 4:(rank + 1) * 4]
        assert r["ring_handed"] == {"reduce_scatter": n * 4 * 4}  # counted like gloo's: the full input
        assert r["into_out"] and r["gathered"] == [float(i) for i in range(n) for _ in range(2)]
        assert "use 'gloo'" in r["bad"]

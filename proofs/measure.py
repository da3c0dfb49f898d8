"""Small measuring instruments shared by proofs and tests."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in elements) that any operator produces inside the block.

        with LargestTensor() as watch:
            attn(x).sum().backward()
        watch.largest  # elements of the biggest intermediate, forward and backward
    """

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


# --8<-- [start:transient]
class TransientBytes(TorchDispatchMode):
    """Peak bytes, over one block, of the tensors the block's operators create and that are gone by its end.

        with TransientBytes() as watch:
            lm(next_token, cache=cache)
        watch.peak   # the activations of that call: logits and the new cache entries (which survive) not counted

    Every operator output whose storage is new (not a view of, or written into, an input) is logged at creation and
    at its release (a weakref finalizer). Outputs still alive when the block ends are survivors: what the step
    leaves behind (new cache entries, logits). The peak is taken over the others only.

    `released`: tensors that existed before the block (e.g. the old cache entries) whose release inside it is logged
    too (they must have no other views). `net_peak` is then the peak of everything the block allocated, survivors
    included, minus what of `released` it had freed by then: the memory the step needs above what it started with.
    A cache that appends by torch.cat allocates a new copy of a layer's entries before dropping the old one; that
    overlap shows in `net_peak`, not in `peak`.
    """

    def __init__(self, released=()):
        super().__init__()
        self.events: list[tuple[int, int, int]] = []  # (time, +bytes | -bytes, key)
        self.alive: dict[int, int] = {}  # key -> bytes, for outputs not yet freed
        self.clock = 0
        self.peak = 0
        self.net_peak = 0
        self.survivors = 0
        self.pre: set[int] = set()  # keys of the `released` tensors
        for t in released:  # no strong reference kept: the finalizer fires when the caller's last one goes
            self.clock += 1
            self.pre.add(self.clock)
            weakref.finalize(t, self._free, self.clock, t.untyped_storage().nbytes())

    def _free(self, key: int, nbytes: int) -> None:
        self.clock += 1
        self.events.append((self.clock, -nbytes, key))
        self.alive.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() in inputs or t._base is not None:
                continue
            self.clock += 1
            nbytes, key = t.untyped_storage().nbytes(), self.clock  # a fresh key (ids of freed tensors are reused)
            self.events.append((self.clock, nbytes, key))
            self.alive[key] = nbytes
            weakref.finalize(t, self._free, key, nbytes)
        return out

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        surviving = set(self.alive) - self.pre  # created in the block, still referenced after it
        self.survivors = sum(self.alive[k] for k in surviving)
        live = net = 0
        for _, delta, key in sorted(self.events):
            net += delta  # everything: block outputs (survivors too) and the released tensors' frees
            self.net_peak = max(self.net_peak, net)
            if key in surviving or key in self.pre:
                continue
            live += delta
            self.peak = max(self.peak, live)
        return result
# --8<-- [end:transient]

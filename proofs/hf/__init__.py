"""The shared model held against Hugging Face `transformers`' own implementations.

Each module here is a written mapping from one `transformers` architecture's parameter names to ours, with the
configuration that makes our model compute the same function. Weights are copied with `copy_strict`: every one
of our parameters must be written exactly once and every one of their keys read by some entry, so a mapping that
forgets a key or leaves one over is an error, not a silent random weight. The check is per key, not per element:
a key counts as read when any slice of it is taken (two entries could take the same rows of a fused tensor and
leave others unread). The logits comparison is what catches a wrong slice.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Union

import torch
from torch import Tensor, nn

# A source is their key, or a function of their whole state dict (for fused, split or transposed weights).
Source = Union[str, Callable[[Mapping[str, Tensor]], Tensor]]


class MappingError(KeyError):
    """A weight mapping that is not one-to-one: a key missing, left over, or of the wrong shape."""


def copy_strict(ours: nn.Module, theirs: Mapping[str, Tensor], mapping: Mapping[str, tuple[Source, Iterable[str]]],
                ignore: Iterable[str] = ()) -> None:
    """Copy `theirs` (a state dict) into `ours` through `mapping`: our name -> (source, their keys it reads).

    Raises MappingError when one of our parameters has no entry, an entry names a parameter we do not have, one of
    their keys (outside `ignore`, e.g. non-persistent rotary tables) is read by no entry, or shapes differ.
    Strict per key, not per element: slices taken from a fused tensor are not checked to cover it exactly once.
    """
    own = dict(ours.named_parameters())
    missing = sorted(set(own) - set(mapping))
    extra = sorted(set(mapping) - set(own))
    if missing or extra:
        raise MappingError(f"our parameters without a source: {missing}; mapped names we do not have: {extra}")
    read: set[str] = set()
    with torch.no_grad():
        for name, (source, keys) in mapping.items():
            keys = list(keys)
            absent = [k for k in keys if k not in theirs]
            if absent:
                raise MappingError(f"{name}: their state dict has no {absent}")
            value = theirs[source] if isinstance(source, str) else source(theirs)
            if value.shape != own[name].shape:
                raise MappingError(f"{name}: ours is {tuple(own[name].shape)}, the source gives {tuple(value.shape)}")
            own[name].copy_(value)
            read.update(keys)
    unread = sorted(set(theirs) - read - set(ignore))
    if unread:
        raise MappingError(f"their keys no mapping reads: {unread}")

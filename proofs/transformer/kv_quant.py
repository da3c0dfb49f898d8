"""A quantised key/value cache: keys and values stored in 2, 4 or 8 bits, per token or per channel (KIVI).

`QuantisedKVCache` is a `KVCache` (cache.py) that the existing decoders drive unchanged: `update` returns what a
cache holding integer codes would hand the attention. Each stored number is asymmetric (min-max) b-bit:

    s = (max x - min x) / (2^b - 1),   z = min x,   q = round((x - z) / s) in [0, 2^b - 1],   x̂ = q s + z

over a block of numbers that share one (s, z) pair. Which numbers share it is the granularity (per head):

    per_token     one (s, z) per token: its hs channels, or groups of `token_group` of them (KIVI's choice for
                  values; KIVI's code uses groups of 32 channels)
    per_channel   one (s, z) per channel over `group` consecutive tokens   (KIVI's choice for keys)

A token's per-channel block is complete only once `group` tokens have arrived, so tokens of an incomplete group
stay in full precision (KIVI keeps them in its residual); `residual` = R keeps, besides, the most recent R tokens
in full precision (KIVI's residual window; KIVI's code differs slightly: its value window is exactly R tokens,
its key window fills up to R tokens and is then quantised whole). Tokens of the current call are read in full precision (they are at
hand this step, as in KIVI's prefill and decode) and stored quantised for the calls that follow. Blocks are
aligned to position 0 and a complete block's codes depend only on its own numbers, so re-deriving the codes of the
stored full-precision tensors at every step gives exactly what a streaming cache that stores codes once would read
(checked in the proof); the full-precision copy is kept only so that truncate/reorder work as in KVCache.

Why not quant.py's `quantise`: that one is symmetric absmax with no zero point and accepts 4 and 8 bits only; KIVI's
2-bit cache needs 4 levels and a zero point. `nbytes` counts codes at b bits, each (s, z) pair at 2 x 16 bits and
full-precision tokens at 16 bits (fp16), the storage a serving system would use; the emulation itself computes in
the model's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .cache import Entries, KVCache
from .config import ConfigError

KV_BITS = (2, 4, 8)
KV_GRANULARITIES = ("per_token", "per_channel")


# --8<-- [start:minmax]
def minmax_fake_quantise(x: Tensor, bits: int, dim: int) -> Tensor:
    """Asymmetric b-bit round trip of x with one (scale, zero point) per slice along `dim`: every element is off by
    at most s/2 = (max - min) / (2 (2^b - 1)) of its block; a constant block is returned exactly."""
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    s = (hi - lo) / (2 ** bits - 1)
    s = torch.where(s > 0, s, torch.ones_like(s))                 # constant block: q = 0, x̂ = z exactly
    q = torch.round((x - lo) / s).clamp(0, 2 ** bits - 1)         # the integer codes
    return q * s + lo
# --8<-- [end:minmax]


# --8<-- [start:cache]
class QuantisedKVCache(KVCache):
    """KVCache whose entries are read back as b-bit codes: keys and values each per token or per channel.

    bits: 2, 4 or 8. key, value: "per_token" or "per_channel" (KIVI: keys per channel, values per token).
    group: tokens per per-channel block (KIVI uses 32). residual: the most recent R tokens kept in full precision.
    token_group: channels per per-token block (None: the whole head; KIVI's code groups a value token's channels by 32).
    """

    def __init__(self, bits: int = 4, key: str = "per_channel", value: str = "per_token", group: int = 32,
                 residual: int = 0, scale_bytes: int = 2, fp_bytes: int = 2, token_group: int | None = None):
        super().__init__()
        if isinstance(bits, bool) or bits not in KV_BITS:
            raise ConfigError(f"bits={bits!r}: a quantised KV cache stores 2, 4 or 8 bits per number; for full "
                              f"precision use the plain KVCache.")
        for name, g in (("key", key), ("value", value)):
            if g not in KV_GRANULARITIES:
                raise ConfigError(f"{name}={g!r}: use one of {KV_GRANULARITIES} (KIVI: key='per_channel', "
                                  f"value='per_token').")
        if group < 1 or residual < 0 or (token_group is not None and token_group < 1):
            raise ConfigError(f"group={group} must be >= 1 tokens and residual={residual} >= 0 tokens.")
        self.bits, self.modes, self.group, self.residual = bits, (key, value), group, residual
        self.scale_bytes, self.fp_bytes = scale_bytes, fp_bytes
        self.token_group = token_group  # channels per per-token (s, z) pair; None = all of a head's channels

    def channels_per_pair(self, hs: int) -> int:
        g = hs if self.token_group is None else self.token_group
        if hs % g:
            raise ConfigError(f"token_group={g} must divide the head width {hs}.")
        return g

    def quantised_columns(self, t: int, mode: str) -> int:
        """How many of the first t cached tokens are stored as codes (the rest, the newest, in full precision)."""
        n = max(t - self.residual, 0)                              # outside the residual window
        return n if mode == "per_token" else n // self.group * self.group  # per channel: complete groups only

    def stored(self, e: Tensor, mode: str) -> Tensor:
        """(B, heads, T, hs) full-precision entries -> what the cache holds: codes dequantised, then the fp tail."""
        n = self.quantised_columns(e.shape[2], mode)
        if n == 0:
            return e
        head = e[:, :, :n]
        if mode == "per_token":
            B, h, _, hs = head.shape
            g = self.channels_per_pair(hs)                         # one (s, z) per (row, head, token, g channels)
            q = minmax_fake_quantise(head.reshape(B, h, n, hs // g, g), self.bits, dim=4).reshape(B, h, n, hs)
        else:
            B, h, _, hs = head.shape
            blocks = head.reshape(B, h, n // self.group, self.group, hs)
            q = minmax_fake_quantise(blocks, self.bits, dim=3).reshape(B, h, n, hs)  # one per (head, channel, group)
        return torch.cat([q, e[:, :, n:]], dim=2)

    def update(self, entries: Entries, pos: Tensor) -> tuple[Entries, Tensor]:
        if len(entries) != 2:
            raise ConfigError("a quantised KV cache holds keys and values; MLA's latent cache is not supported.")
        t_new = entries[0].shape[2]
        full, k_pos = super().update(entries, pos)                 # (B, heads, T, hs) each, full precision
        read = []
        for e, mode in zip(full, self.modes):
            s = self.stored(e, mode)
            read.append(torch.cat([s[:, :, :-t_new], e[:, :, -t_new:]], dim=2))  # this call's tokens: at hand in fp
        return tuple(read), k_pos

    def bytes_per_entry(self, mode: str, t: int, heads: int, hs: int) -> float:
        """Bytes one batch row's keys (or values) of t tokens occupy: codes, (s, z) pairs and full-precision tokens."""
        n = self.quantised_columns(t, mode)
        pairs = n * (hs // self.channels_per_pair(hs)) if mode == "per_token" else (n // self.group) * hs  # per head
        return heads * (n * hs * self.bits / 8 + pairs * 2 * self.scale_bytes + (t - n) * hs * self.fp_bytes)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored codes, scales, zero points and full-precision tokens (all rows)."""
        if self.entries is None:
            return 0
        B, h, t, hs = self.entries[0].shape
        return int(round(B * sum(self.bytes_per_entry(m, t, h, hs) for m in self.modes)))
# --8<-- [end:cache]


def quantised_cache(lm, **options) -> list:
    """Decoder.new_cache()'s layout (per layer a self-attention cache and a cross one) with QuantisedKVCache."""
    return [{"self": QuantisedKVCache(**options), "cross": KVCache()} for _ in lm.decoder.layers]

"""Prompt tuning, prefix tuning and bottleneck adapters, applied to a built DecoderLM and removed again.

    prompt tuning   p trainable vectors in front of the embedded input (Lester et al. 2021, §2)      p · d
    prefix tuning   p trainable keys and values in front of every layer's self-attention            2 · L · p · d_kv
                    (Li & Liang 2021, §4, Eq. 3; d_kv = n_kv_heads · d_head, = d for MHA)
    adapters        a bottleneck d -> r -> d with its own skip, after each sub-layer's output,      2 · L · (2·d·r + d + r)
                    before the residual add (Houlsby et al. 2019, §2.1; the layer norms
                    they also train stay frozen here)
    (LoRA           r · (d_in + d_out) per wrapped matrix: lora.py)

Every `apply_*` freezes the whole model, installs its wrapper modules and returns a handle; `remove_peft(model)`
puts the original modules (the same objects) back and restores every requires_grad flag, so the base model is
recovered bit for bit. No file of the shared model is edited: the wrappers replace attributes.

Prefix tuning needs no change to attention: its trainable keys and values are a KVCache pre-filled at position 0,
handed to the unchanged MultiHeadAttention, and the tokens keep their own positions 0..T-1 (explicit `positions`).
Position 0 is never hidden by the causal mask, so every query reads the whole prefix; absolute position embeddings
of the tokens do not move (a cache filled at positions 0..p-1 would have shifted them to p..p+T-1, a different
model); with RoPE the prefix keys are stored as they are (never rotated) and the tokens' queries are rotated at
0..T-1, so a prefix key is a free vector either way. Position biases (ALiBi, T5), relative scores (Shaw, XL),
latent caches (MLA) and sliding windows would read the prefix's position: ConfigError.

Prompt tuning's vectors carry no position embedding (they are free vectors, so one would be absorbed) and the tokens
keep positions 0..T-1; the head drops the p prompt positions, so logits stay (B, T, V). It runs without a KV cache.

"Starts at the base model" means different things: an adapter's up-projection starts at zero, so the adapted model
computes the base function exactly at step 0; a prompt or a prefix adds keys and values that every query reads, so
outputs change at step 0 by design, and what is exact is only that the base weights are untouched and removing the
prompt or prefix gives the base back.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import MultiHeadAttention
from .cache import KVCache
from .config import ConfigError


def _freeze(model: nn.Module) -> dict:
    """Freeze every parameter; return {parameter: requires_grad before} to restore on removal."""
    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    return flags


def _check_fresh(model: nn.Module) -> None:
    if getattr(model, "_peft", None) is not None:
        raise ConfigError("this model already carries a PEFT method: call remove_peft(model) first (one at a time).")
    if not hasattr(model, "decoder") or not hasattr(model, "embed"):
        raise ConfigError(f"PEFT here adapts a DecoderLM (embed, decoder, head), got {type(model).__name__}.")


# ---------------------------------------------------------------- prompt tuning
class PromptEmbeddings(nn.Module):
    """The model's Embeddings followed by p trainable vectors in front: ids (B, T) -> (B, p + T, C)."""

    def __init__(self, embed: nn.Module, prompt: Tensor):
        super().__init__()
        self.embed = embed
        self.prompt = nn.Parameter(prompt)  # (p, C): the only trainable numbers, p · d of them

    def forward(self, ids: Tensor, start: int = 0, positions: Optional[Tensor] = None) -> Tensor:
        if start != 0 or positions is not None:
            raise ConfigError("prompt tuning here runs without a KV cache (the prompt is re-read on every call): use "
                              "generate(..., use_cache=False), or turn the prompt into a prefix (prefix tuning) to cache it.")
        x = self.embed(ids)  # (B, T, C): tokens at positions 0..T-1, as in the base model
        return torch.cat([self.prompt.expand(x.shape[0], -1, -1), x], dim=1)  # (B, p + T, C)


class DropPrompt(nn.Module):
    """The model's Head, applied to the token positions only: (B, p + T, C) -> (B, T, V)."""

    def __init__(self, head: nn.Module, p: int):
        super().__init__()
        self.head, self.p = head, p

    def forward(self, h: Tensor) -> Tensor:
        return self.head(h[:, self.p:])


def apply_prompt_tuning(model: nn.Module, p: int, init_ids: Optional[Tensor] = None) -> PromptEmbeddings:
    """Freeze `model` and prepend p trainable input vectors, initialised (as Lester et al. recommend) from the
    token embeddings of `init_ids` (p,) (default: p random vocabulary ids from torch's global generator)."""
    _check_fresh(model)
    if p < 1:
        raise ConfigError(f"prompt tuning needs p >= 1 soft tokens, got p={p}.")
    flags = _freeze(model)
    tok = model.embed.tok.weight
    if init_ids is None:
        init_ids = torch.randint(0, tok.shape[0], (p,))
    if init_ids.shape != (p,):
        raise ConfigError(f"init_ids must hold one token id per soft token, shape ({p},), got {tuple(init_ids.shape)}.")
    scale = math.sqrt(model.cfg.d_model) if model.cfg.scale_embeddings else 1.0
    prompt = PromptEmbeddings(model.embed, tok.detach()[init_ids].clone() * scale)  # (p, C)
    originals = {"embed": model.embed, "head": model.head}
    model.embed, model.head = prompt, DropPrompt(model.head, p)
    model._peft = ("prompt", originals, flags)
    return prompt


# ---------------------------------------------------------------- prefix tuning
class PrefixSelfAttention(nn.Module):
    """An unchanged self-attention module that also reads p trainable keys and values, pre-filled into its cache."""

    def __init__(self, attn: MultiHeadAttention, keys: Tensor, values: Tensor):
        super().__init__()
        self.attn = attn
        self.keys = nn.Parameter(keys)      # (1, n_kv, p, hs): what the cache would hold after project_kv
        self.values = nn.Parameter(values)  # (1, n_kv, p, hs)

    def prefilled(self, cache: KVCache, batch: int) -> None:
        p = self.keys.shape[2]
        pos = torch.zeros(1, p, dtype=torch.long, device=self.keys.device)  # position 0: visible to every query
        cache.update((self.keys.expand(batch, -1, -1, -1), self.values.expand(batch, -1, -1, -1)), pos)

    def forward(self, x: Tensor, kv: Optional[Tensor] = None, *, causal: bool = False, key_padding_mask=None,
                attn_mask=None, cache=None, positions: Optional[Tensor] = None, prefix: int = 0) -> Tensor:
        if kv is not None or attn_mask is not None:
            raise ConfigError("prefix tuning's attention takes self-attention without extra kv (no Transformer-XL "
                              "mems) and without an explicit attn_mask.")
        if cache is not None and type(cache) is not KVCache:
            raise ConfigError(f"prefix tuning pre-fills a contiguous KVCache, got {type(cache).__name__}: use "
                              "new_cache('contiguous').")
        B, T = x.shape[:2]
        if positions is None:  # the tokens' own positions, as the base model would give them
            positions = (torch.arange(T, device=x.device)[None] if cache is None or not cache.filled
                         else cache.next_positions(B, T, x.device))
        if cache is None:
            cache = KVCache()  # a fresh one per call: training and cache-free forwards
        if not cache.filled:
            self.prefilled(cache, B)
        if key_padding_mask is not None:  # (B, T) -> (B, p + T): the prefix is never padding
            key_padding_mask = torch.cat([key_padding_mask.new_zeros(B, cache.pos.shape[1] - T), key_padding_mask], 1)
        return self.attn(x, causal=causal, key_padding_mask=key_padding_mask, cache=cache, positions=positions,
                         prefix=prefix)


def apply_prefix_tuning(model: nn.Module, p: int, init_ids: Optional[Tensor] = None) -> list[PrefixSelfAttention]:
    """Freeze `model` and give every layer's self-attention p trainable keys and values. Initialised from the
    base model's own keys and values of p tokens `init_ids` (default random) each at position 0 (Li & Liang
    initialise from real words' activations, §7.4; their training-time MLP reparametrisation, §4.3, is not used here)."""
    _check_fresh(model)
    cfg = model.cfg
    if p < 1:
        raise ConfigError(f"prefix tuning needs p >= 1 virtual tokens, got p={p}.")
    if cfg.positions in ("alibi", "t5", "shaw", "xl") or cfg.kv_latent or cfg.window or cfg.score_fn != "dot":
        raise ConfigError(
            f"prefix tuning as a pre-filled cache needs attention that ignores the keys' positions apart from the "
            f"causal mask: positions in ('none', 'sinusoidal', 'learned', 'rope'), score_fn='dot', no kv_latent (MLA) "
            f"and window=0; got positions={cfg.positions!r}, score_fn={cfg.score_fn!r}, kv_latent={cfg.kv_latent}, "
            f"window={cfg.window}.")
    if init_ids is None:
        init_ids = torch.randint(0, cfg.vocab_size, (p,))
    if init_ids.shape != (p,):
        raise ConfigError(f"init_ids must hold one token id per prefix slot, shape ({p},), got {tuple(init_ids.shape)}.")
    was_training = model.training
    with torch.no_grad():  # p sequences of one token, each at position 0: the base model's own keys and values
        cache = model.decoder.new_cache()
        model.eval()(init_ids[:, None], cache=cache)
    model.train(was_training)
    flags = _freeze(model)
    wrappers, originals = [], []
    for layer, entry in zip(model.decoder.layers, cache):
        k, v = entry["self"].entries  # (p, n_kv, 1, hs) each
        w = PrefixSelfAttention(layer.self_attn, k.transpose(0, 2).clone(), v.transpose(0, 2).clone())
        originals.append(layer.self_attn)
        layer.self_attn = w
        wrappers.append(w)
    model._peft = ("prefix", originals, flags)
    return wrappers


# ---------------------------------------------------------------- adapters
class Adapter(nn.Module):
    """Houlsby et al.'s bottleneck after a sub-layer: f(h) + up(act(down(f(h)))), up starting at zero."""

    def __init__(self, inner: nn.Module, d: int, r: int, dtype=None):
        super().__init__()
        self.inner = inner
        self.down = nn.Linear(d, r, dtype=dtype)  # d·r + r
        self.up = nn.Linear(r, d, dtype=dtype)    # r·d + d
        nn.init.zeros_(self.up.weight)            # zero up-projection: the adapter starts as the identity
        nn.init.zeros_(self.up.bias)

    def forward(self, *args, **kwargs) -> Tensor:
        h = self.inner(*args, **kwargs)  # (B, T, d): the sub-layer's output, before the residual add
        return h + self.up(F.gelu(self.down(h)))


def apply_adapters(model: nn.Module, r: int) -> list[Adapter]:
    """Freeze `model` and put a bottleneck adapter of width r after every layer's self-attention and FFN."""
    _check_fresh(model)
    d = model.cfg.d_model
    if not 1 <= r:
        raise ConfigError(f"adapter bottleneck r={r} must be >= 1 (Houlsby et al. use r << d).")
    if model.cfg.parallel_block:
        raise ConfigError("adapters go after each of two sequential sub-layers; parallel_block=True sums both "
                          "branches in one: set parallel_block=False.")
    flags = _freeze(model)
    dtype = model.embed.tok.weight.dtype
    adapters, originals = [], []
    for layer in model.decoder.layers:
        originals.append((layer.self_attn, layer.ffn))
        layer.self_attn = Adapter(layer.self_attn, d, r, dtype)
        layer.ffn = Adapter(layer.ffn, d, r, dtype)
        adapters += [layer.self_attn, layer.ffn]
    model._peft = ("adapters", originals, flags)
    return adapters


# ---------------------------------------------------------------- removal and counts
def remove_peft(model: nn.Module) -> nn.Module:
    """Put back the modules an apply_* replaced and every requires_grad flag: the base model, bit for bit."""
    state = getattr(model, "_peft", None)
    if state is None:
        raise ConfigError("this model carries no prompt, prefix or adapters to remove.")
    kind, originals, flags = state
    if kind == "prompt":
        model.embed, model.head = originals["embed"], originals["head"]
    elif kind == "prefix":
        for layer, attn in zip(model.decoder.layers, originals):
            layer.self_attn = attn
    else:
        for layer, (attn, ffn) in zip(model.decoder.layers, originals):
            layer.self_attn, layer.ffn = attn, ffn
    for p, flag in flags.items():
        p.requires_grad_(flag)
    model._peft = None
    return model


def peft_formula(method: str, cfg, p_or_r: int) -> int:
    """The trainable count each method should have on a DecoderLM of config cfg (the formulas in the docstring)."""
    L, d = cfg.n_layers, cfg.d_model
    if method == "prompt":
        return p_or_r * d
    if method == "prefix":
        return 2 * L * p_or_r * cfg.kv_heads * cfg.d_head
    if method == "adapters":
        return 2 * L * (2 * d * p_or_r + d + p_or_r)
    raise ConfigError(f"method {method!r} is not one of 'prompt', 'prefix', 'adapters' (LoRA: see lora.py).")

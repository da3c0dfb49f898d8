"""Embeddings, stacks and the three models: EncoderTagger (encoder only), DecoderLM (decoder only) and
EncoderDecoder (the 2017 model), with their initialisation and greedy generation.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from .cache import BlockPool, KVCache, PagedKVCache, RollingKVCache
from .config import ConfigError, TransformerConfig
from .decoding import greedy
from .layers import DecoderLayer, EncoderLayer
from .norms import make_norm
from .positions import sinusoidal_table

ABSOLUTE = ("sinusoidal", "learned")  # positions added to the embeddings; the others live inside attention


class Embeddings(nn.Module):
    """Token embedding (x sqrt(d_model) if scale_embeddings) + absolute position signal, then dropout."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        std = cfg.d_model**-0.5 if cfg.emb_init == "normal_inv_sqrt_d" else 1.0
        nn.init.normal_(self.tok.weight, 0.0, std)
        self.pos = None
        if cfg.positions == "learned":
            self.pos = nn.Parameter(torch.randn(cfg.max_len, cfg.d_model) * cfg.learned_pos_std)  # (max_len, C)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.emb_norm else None  # BLOOM, BERT
        self.drop_emb = nn.Dropout(cfg.dropout_emb)

    def positions(self, T: int, device=None, start: int = 0, pos: Optional[Tensor] = None) -> Optional[Tensor]:
        """(T, C) position signal of positions start .. start+T-1 (or (B, T, C) of the positions `pos`), or None."""
        if self.cfg.positions not in ABSOLUTE:
            return None
        end = start + T if pos is None else int(pos.max()) + 1
        if self.cfg.positions == "learned":
            if end > self.cfg.max_len:
                raise ConfigError(
                    f"sequence length {end} exceeds the learned position table (max_len={self.cfg.max_len}): a learned "
                    f"table has no row for position {self.cfg.max_len}. Raise max_len, or use positions='sinusoidal'."
                )
            table = self.pos
        else:
            table = self.pe if end <= self.pe.shape[0] else sinusoidal_table(end, self.cfg.d_model).to(device)
        return table[start:end] if pos is None else table[pos]

    def forward(self, ids: Tensor, start: int = 0, positions: Optional[Tensor] = None) -> Tensor:
        """ids (B, T) -> (B, T, C). start: the position of ids[:, 0] (incremental decoding feeds one token at a
        time); positions: (B, T) explicit positions instead (rows at different lengths)."""
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32, torch.int64):
            got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
            raise ConfigError(f"expected token ids as an integer tensor of shape (batch, time), got {got}.")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ConfigError(
                f"token ids must lie in [0, {self.vocab_size}); got values in [{int(ids.min())}, {int(ids.max())}]. "
                f"Raise vocab_size or fix the tokenizer."
            )
        x = self.tok(ids)  # (B, T, C)
        if self.cfg.scale_embeddings:
            x = x * math.sqrt(self.cfg.d_model)
        pe = self.positions(ids.shape[1], ids.device, start, positions)
        if pe is not None:
            x = x + pe
        if self.norm is not None:
            x = self.norm(x)
        return self.drop_emb(x)


def deepnorm_constants(n_enc: int, n_dec: int, role: str) -> tuple[float, float]:
    """(alpha, beta) of DeepNet (Wang et al. 2022, Table 1) for a stack: 'encoder'/'decoder' of an encoder-decoder
    with n_enc and n_dec layers, or 'single' (encoder-only or decoder-only, N = n_enc layers)."""
    if role == "single":
        return (2 * n_enc) ** 0.25, (8 * n_enc) ** -0.25
    if role == "encoder":
        return 0.81 * (n_enc**4 * n_dec) ** (1 / 16), 0.87 * (n_enc**4 * n_dec) ** (-1 / 16)
    return (3 * n_dec) ** 0.25, (12 * n_dec) ** -0.25


def share_t5_bias(layers: nn.ModuleList, cfg: TransformerConfig) -> None:
    """cfg.t5_shared_bias: every layer's self-attention reads the first layer's T5 bias table (one per stack)."""
    if cfg.t5_shared_bias:
        for layer in layers[1:]:
            layer.self_attn.rel_bias = layers[0].self_attn.rel_bias
            layer.self_attn.keep_init = [layer.self_attn.rel_bias]


def deepnorm_used(cfg: TransformerConfig, consts: tuple[float, float]) -> tuple[float, float]:
    """The (alpha, beta) a stack applies: the table's, or 1 for the half that cfg.deepnorm_parts leaves out."""
    alpha, beta = consts
    return (1.0 if cfg.deepnorm_parts == "beta" else alpha, 1.0 if cfg.deepnorm_parts == "alpha" else beta)


class Encoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, n_layers: Optional[int] = None, deepnorm_role: str = "single",
                 n_other: int = 0):
        super().__init__()
        self.cfg = cfg
        n = n_layers or cfg.n_layers
        consts = deepnorm_constants(n, n_other, deepnorm_role)
        self.alpha, self.beta = deepnorm_used(cfg, consts) if cfg.depth_init == "deepnorm" else (1.0, 1.0)
        self.layers = nn.ModuleList(EncoderLayer(cfg, self.alpha) for _ in range(n))
        share_t5_bias(self.layers, cfg)
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.norm_position == "pre" else nn.Identity()

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
        for layer in self.layers:
            x = layer(x, key_padding_mask, causal)
        return self.final_norm(x)


class Decoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, cross: bool = True):
        super().__init__()
        self.cfg = cfg
        n = cfg.n_dec_layers or cfg.n_layers
        consts = deepnorm_constants(cfg.n_layers, n, "decoder") if cross else deepnorm_constants(n, 0, "single")
        self.alpha, self.beta = deepnorm_used(cfg, consts) if cfg.depth_init == "deepnorm" else (1.0, 1.0)
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross, self.alpha) for _ in range(n))
        share_t5_bias(self.layers, cfg)
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.norm_position == "pre" else nn.Identity()

    def forward(self, x, memory=None, tgt_padding_mask=None, memory_padding_mask=None, mems=None, cache=None,
                positions: Optional[Tensor] = None, prefix: int = 0) -> Tensor:
        """cache: new_cache(), kept across steps; x then holds only the positions not yet cached."""
        if cache is None:
            if positions is not None:
                raise ConfigError("explicit positions are for decoding with a cache; without one, positions run 0..T-1.")
            return self.forward_with_memory(x, mems, None, memory, tgt_padding_mask, memory_padding_mask, prefix)[0]
        if mems is not None or tgt_padding_mask is not None or len(cache) != len(self.layers):
            raise ConfigError(
                f"with a key/value cache pass no mems and no tgt_padding_mask (generation runs unpadded), and one "
                f"cache entry per layer ({len(self.layers)}, got {len(cache)}): use Decoder.new_cache()."
            )
        for layer, layer_cache in zip(self.layers, cache):
            x = layer(x, memory, None, memory_padding_mask, cache=layer_cache, positions=positions, prefix=prefix)
        return self.final_norm(x)

    # --8<-- [start:new_cache]
    def new_cache(self, kind: str = "contiguous", *, window: Optional[int] = None, sinks: Optional[int] = None,
                  batch: int = 1, n_blocks: int = 64, block_size: int = 16) -> list[dict]:
        """The state of incremental decoding: per layer, a self-attention cache of `kind` and a cross-attention one.

        contiguous: KVCache. rolling: RollingKVCache of `window` (default cfg.window) positions plus `sinks` first
        ones (default cfg.attn_sinks). paged: PagedKVCache over a BlockPool of n_blocks blocks of block_size
        slots per layer, for `batch` sequences of any lengths.
        """
        def self_cache():
            if kind == "contiguous":
                return KVCache()
            if kind == "rolling":
                w = self.cfg.window if window is None else window
                if w < 1:
                    raise ConfigError("a rolling cache keeps the last `window` positions: set cfg.window or pass window=.")
                return RollingKVCache(w, self.cfg.attn_sinks if sinks is None else sinks)
            if kind == "paged":
                return PagedKVCache(BlockPool(n_blocks, block_size), batch)
            raise ConfigError(f"cache kind {kind!r} is not one of 'contiguous', 'rolling', 'paged'.")

        return [{"self": self_cache(), "cross": KVCache()} for _ in self.layers]
    # --8<-- [end:new_cache]

    def forward_with_memory(
        self, x, mems=None, mem_len=None, memory=None, tgt_padding_mask=None, memory_padding_mask=None, prefix: int = 0
    ) -> tuple[Tensor, list[Tensor]]:
        """Transformer-XL segment recurrence: the output and the mems for the next segment.

        mems: None or one (B, M, C) tensor per layer, that layer's inputs over earlier segments.
        New mems: each layer's input appended to its old memory, cut to the last mem_len positions
        (default cfg.mem_len; a larger value at evaluation lets the memory grow) and detached:
        the next segment reads them, but no gradient flows back into this one.
        """
        mem_len = self.cfg.mem_len if mem_len is None else mem_len
        if mem_len < 0:
            raise ConfigError(f"mem_len={mem_len} must be >= 0 (0 keeps no memory).")
        if mems is not None and (len(mems) != len(self.layers) or any(
                m.dim() != 3 or m.shape[0] != x.shape[0] or m.shape[2] != x.shape[2] for m in mems)):
            raise ConfigError(
                f"mems must hold one (batch={x.shape[0]}, M, d_model={x.shape[2]}) tensor per layer ({len(self.layers)}), "
                f"got {[tuple(m.shape) for m in mems]}; pass the new_mems the previous segment returned."
            )
        # --8<-- [start:xl_recurrence]
        new_mems = []
        for layer, mem in zip(self.layers, mems or [None] * len(self.layers)):
            states = x if mem is None else torch.cat([mem, x], dim=1)  # (B, M+T, C) this layer's inputs so far
            new_mems.append(states[:, max(states.shape[1] - mem_len, 0):].detach())  # (B, ≤mem_len, C), SG
            x = layer(x, memory, tgt_padding_mask, memory_padding_mask, mem, prefix=prefix)  # keys/values over [mem ∘ x]
        return self.final_norm(x), new_mems
        # --8<-- [end:xl_recurrence]


class Head(nn.Module):
    """Pre-softmax projection: logits = h E^T (tied to an embedding) or an independent linear map; with
    cfg.scale_head h is first multiplied by d_model^-0.5 (T5), with cfg.head_bias a bias is added (GPT-J)."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int, tied_to: Optional[nn.Embedding]):
        super().__init__()
        self.tied_to = tied_to
        self.proj = None if tied_to is not None else nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if cfg.head_bias else None  # (V,)
        self.h_scale = cfg.d_model**-0.5 if cfg.scale_head else 1.0

    def forward(self, h: Tensor) -> Tensor:
        if self.h_scale != 1.0:
            h = h * self.h_scale
        logits = h @ self.tied_to.weight.t() if self.tied_to is not None else self.proj(h)  # (B, T, V)
        return logits if self.bias is None else logits + self.bias


# --8<-- [start:init]
def init_weights(model: nn.Module) -> None:
    """Xavier-uniform for every weight matrix of the layers (as in the Annotated Transformer and fairseq), then
    the depth-dependent scalings of cfg.depth_init:

    gpt2:     each residual branch's output projection (attention W_O, the FFN's last map) x 1/sqrt(N)
              (Radford et al. 2019, §2.3: "1/sqrt(N) where N is the number of residual layers"): N = 2L for a
              stack of L layers with self-attention and FFN (also in the parallel layout: both branches add
              to the stream), 3L for decoder layers with cross-attention
    deepnorm: W_V, W_O and the FFN's maps x beta (Wang et al. 2022: Xavier with gain beta; W_Q, W_K gain 1)
    """
    keep = {id(p) for m in model.modules() for p in getattr(m, "keep_init", [])}
    for name, p in model.named_parameters():
        if p.dim() == 2 and ".tok." not in f".{name}" and not name.endswith("pos") and id(p) not in keep:
            nn.init.xavier_uniform_(p)
    cfg = model.cfg
    if cfg.depth_init == "none":
        return
    with torch.no_grad():
        for stack in (m for m in model.modules() if isinstance(m, (Encoder, Decoder))):
            branches = sum(3 if getattr(layer, "cross_attn", None) is not None else 2 for layer in stack.layers)
            gain = branches ** -0.5 if cfg.depth_init == "gpt2" else stack.beta
            for layer in stack.layers:
                attns = [layer.self_attn] + ([layer.cross_attn] if getattr(layer, "cross_attn", None) else [])
                ffns = [layer.ffn] if not hasattr(layer.ffn, "experts") else list(layer.ffn.experts)
                out = [a.w_o for a in attns] + [f.lin2 for f in ffns]  # what each residual branch ends with
                if cfg.depth_init == "deepnorm":
                    out += [getattr(a, "w_v", None) or getattr(a, "w_uv") for a in attns]
                    out += [f.lin1 for f in ffns] + [f.gate for f in ffns if f.gate is not None]
                for lin in out:
                    if isinstance(lin, nn.Linear):
                        lin.weight.mul_(gain)
# --8<-- [end:init]


class EncoderTagger(nn.Module):
    """Encoder-only model that predicts one token per input position (copy, reverse, previous-token ...)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg, cfg.vocab_size)
        self.encoder = Encoder(cfg)
        tie = cfg.tie_embeddings != "none"
        self.head = Head(cfg, cfg.vocab_size, self.embed.tok if tie else None)
        init_weights(self)

    def forward(self, ids: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
        return self.head(self.encoder(self.embed(ids), key_padding_mask, causal))  # (B, T, V)


class DecoderLM(nn.Module):
    """Decoder-only language model: causal self-attention layers, no cross-attention."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg, cfg.vocab_size)
        self.decoder = Decoder(cfg, cross=False)
        tie = cfg.tie_embeddings != "none"
        self.head = Head(cfg, cfg.vocab_size, self.embed.tok if tie else None)
        init_weights(self)

    def forward(self, ids: Tensor, padding_mask: Optional[Tensor] = None, mems: Optional[list] = None,
                cache: Optional[list] = None, positions: Optional[Tensor] = None, prefix_len: int = 0) -> Tensor:
        """ids (B, T) -> logits (B, T, V). cache: Decoder.new_cache(), fed only the tokens it has not seen (their
        positions follow the cached ones, per row). prefix_len: a prefix LM whose first prefix_len positions
        attend to each other both ways (causal after it)."""
        if cache is not None and positions is None:
            positions = cache[0]["self"].next_positions(ids.shape[0], ids.shape[1], ids.device)
        x = self.embed(ids, positions=positions)
        return self.head(self.decoder(x, tgt_padding_mask=padding_mask, mems=mems, cache=cache, positions=positions,
                                      prefix=prefix_len))  # (B, T, V)

    def forward_with_memory(
        self, ids: Tensor, mems: Optional[list] = None, mem_len: Optional[int] = None, padding_mask=None
    ) -> tuple[Tensor, list[Tensor]]:
        """One segment of a longer text: (B, T, V) logits and the detached mems for the next (see Decoder)."""
        h, new_mems = self.decoder.forward_with_memory(self.embed(ids), mems, mem_len, tgt_padding_mask=padding_mask)
        return self.head(h), new_mems

    def aux_loss(self) -> Tensor:
        """Sum of the mixture-of-experts load-balancing losses of the last forward (0 without MoE)."""
        return sum((m.aux_loss for m in self.modules() if hasattr(m, "aux_loss") and m is not self), torch.zeros(()))

    # --8<-- [start:generate_lm]
    @torch.no_grad()
    def generate(self, ids: Tensor, steps: int, use_cache: bool = True) -> tuple[Tensor, Tensor]:
        """Greedy continuation of the prompt ids (B, T) by `steps` tokens (call .eval() first).

        With the cache each step feeds the decoder only the tokens it has not seen, at their
        positions; without it each step reruns the whole prefix. Returns (B, T+steps) ids and
        the (B, steps, V) logits each token was picked from.
        """
        cache = self.decoder.new_cache() if use_cache else None

        def last_logits(ids: Tensor, n_new: int) -> Tensor:
            if cache is None:
                return self(ids)[:, -1]  # (B, V): every position recomputed
            return self(ids[:, ids.shape[1] - n_new:], cache=cache)[:, -1]  # only the tokens not yet cached

        return greedy(last_logits, ids, steps)
    # --8<-- [end:generate_lm]


class EncoderDecoder(nn.Module):
    """The 2017 model: encoder over the source, decoder with cross-attention over the encoder output."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.tgt_embed = Embeddings(cfg, cfg.vocab_size)
        self.src_embed = Embeddings(cfg, cfg.src_vocab_size or cfg.vocab_size)
        if cfg.tie_embeddings == "all":
            self.src_embed.tok = self.tgt_embed.tok  # one matrix for both embeddings (and the head below)
        self.encoder = Encoder(cfg, deepnorm_role="encoder", n_other=cfg.n_dec_layers or cfg.n_layers)
        self.decoder = Decoder(cfg, cross=True)
        tie = cfg.tie_embeddings != "none"
        self.head = Head(cfg, cfg.vocab_size, self.tgt_embed.tok if tie else None)
        init_weights(self)

    def encode(self, src: Tensor, src_padding_mask: Optional[Tensor] = None) -> Tensor:
        return self.encoder(self.src_embed(src), src_padding_mask)

    def decode(self, tgt_in: Tensor, memory: Tensor, tgt_padding_mask=None, src_padding_mask=None) -> Tensor:
        return self.head(self.decoder(self.tgt_embed(tgt_in), memory, tgt_padding_mask, src_padding_mask))

    def forward(self, src: Tensor, tgt_in: Tensor, src_padding_mask=None, tgt_padding_mask=None) -> Tensor:
        """tgt_in is the target shifted right (teacher forcing); returns (B, T_tgt, V) logits."""
        return self.decode(tgt_in, self.encode(src, src_padding_mask), tgt_padding_mask, src_padding_mask)

    # --8<-- [start:generate_seq2seq]
    @torch.no_grad()
    def generate(self, src: Tensor, bos: int, steps: int, use_cache: bool = True,
                 src_padding_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """Greedy translation of src (B, S) (call .eval() first): the encoder runs once, the decoder once per token.

        Returns (B, 1+steps) ids starting with bos and the (B, steps, V) logits each token was picked from.
        With the cache, cross-attention projects the encoder output to keys/values once.
        """
        memory = self.encode(src, src_padding_mask)  # (B, S, C), read by every step and every decoder layer
        cache = self.decoder.new_cache() if use_cache else None

        def last_logits(ids: Tensor, n_new: int) -> Tensor:
            if cache is None:
                return self.decode(ids, memory, None, src_padding_mask)[:, -1]  # (B, V): whole prefix again
            start = ids.shape[1] - n_new
            h = self.decoder(self.tgt_embed(ids[:, start:], start), memory, None, src_padding_mask, cache=cache)
            return self.head(h[:, -1])

        return greedy(last_logits, torch.full((src.shape[0], 1), bos, dtype=torch.long, device=src.device), steps)
    # --8<-- [end:generate_seq2seq]

"""Configuration: one dataclass, one field per design choice a question flips.

The defaults are Vaswani et al. (2017): Post-LN, sinusoidal positions, embeddings multiplied by
sqrt(d_model), one matrix shared by both embeddings and the pre-softmax projection, ReLU FFN,
dropout 0.1 on embeddings+PE and on sub-layer outputs. A proof is a one-switch ablation:
`cfg.replace(field=value)`. Settings that cannot work together raise `ConfigError` naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional


class ConfigError(ValueError):
    """A configuration or input that the model cannot use; the message says how to fix it."""


# Allowed values of the string-valued switches, checked in __post_init__.
CHOICES = {
    "attn_scale": ("sqrt_dk", "none", "dk", "learned"),
    "score_fn": ("dot", "additive"),
    "qk_norm": ("none", "layer", "rms"),
    "attn_impl": ("auto", "explicit", "tiled"),
    "norm": ("layer", "rms", "batch", "none"),
    "norm_position": ("post", "pre"),
    "depth_init": ("none", "gpt2", "deepnorm"),
    "deepnorm_parts": ("both", "beta", "alpha"),
    "positions": ("sinusoidal", "learned", "none", "shaw", "xl", "rope", "alibi", "t5"),
    "rope_layout": ("interleaved", "half"),
    "rope_scaling": ("none", "linear", "ntk", "yarn"),
    "emb_init": ("normal_inv_sqrt_d", "normal_1"),
    "tie_embeddings": ("all", "decoder", "none"),
    "mask_fill": ("-inf", "min"),
    "activation": ("relu", "gelu", "gelu_tanh", "silu"),
}
RELATIVE_SCORES = ("shaw", "xl")  # positions that replace the score function (not a bias, not a rotation)


@dataclass
class TransformerConfig:
    # --- sizes -----------------------------------------------------------
    vocab_size: int = 32  # tokens in the (shared) vocabulary V
    src_vocab_size: Optional[int] = None  # encoder vocabulary if different from vocab_size (forbids tie_embeddings="all")
    d_model: int = 64  # C: width of every residual stream (must be divisible by n_heads)
    n_heads: int = 4  # nh: query heads; each has d_k = d_v = d_model / n_heads
    n_kv_heads: Optional[int] = None  # key/value heads: None = n_heads (MHA), 1 = MQA, in between = GQA
    d_ff: int = 128  # hidden width of the position-wise feed-forward network (of each expert, with MoE)
    n_layers: int = 2  # encoder layers (and decoder layers, unless n_dec_layers is set)
    n_dec_layers: Optional[int] = None  # decoder layers of an encoder-decoder or decoder-only model
    max_len: int = 64  # rows of a learned position table; longer inputs are an error for positions="learned"
    # --- attention -------------------------------------------------------
    attn_scale: str = "sqrt_dk"  # divide q.k by sqrt(d_k) (paper), by nothing, by d_k (muP), or learn one scale per head
    score_fn: str = "dot"  # "additive": Bahdanau's v·tanh(W1 q + W2 k) per head instead of q·k
    qk_norm: str = "none"  # "layer"/"rms": normalise each head's q and k over d_k before the dot product (QK-norm)
    share_qk: bool = False  # use one matrix for W_Q and W_K (makes the score matrix symmetric)
    qkv_proj: bool = True  # False: no W_Q, W_K, W_V; each head's q = k = v = its slice of the input (W_O stays)
    mask_fill: str = "-inf"  # value written into hidden scores before softmax: -inf or the dtype's minimum
    attn_impl: str = "auto"  # auto: F.scaled_dot_product_attention when no one needs the weights; explicit: softmax(QKᵀ) always; tiled: online softmax over blocks (FlashAttention's algorithm)
    attn_block: int = 16  # tiled: queries and keys per block
    window: int = 0  # sliding-window attention: a query sees itself and the window-1 keys before it (0 = no window)
    attn_sinks: int = 0  # with a window: the first attn_sinks positions stay visible to every query (StreamingLLM)
    kv_latent: int = 0  # > 0: multi-head latent attention (MLA) caching one latent of this width per token
    mla_rope_dim: int = 0  # MLA with positions="rope": width of the decoupled rotary key shared by all heads
    mla_absorb: bool = False  # MLA: fold the key/value up-projections into the query and output maps (attend over latents)
    # --- normalisation and residuals ---------------------------------------
    norm: str = "layer"  # LayerNorm (per token, over C), RMSNorm (no centring, no bias), BatchNorm (per channel, over B*T tokens) or none
    norm_position: str = "post"  # post: norm(x + f(x)) as in the paper; pre: x + f(norm(x)) plus a final norm
    residual: bool = True  # keep the identity path around every sub-layer
    norm_eps: float = 1e-5  # epsilon inside the norms
    parallel_block: bool = False  # GPT-J/PaLM: x + attn(norm(x)) + ffn(norm(x)), one norm, both read the same input (Pre-LN only)
    depth_init: str = "none"  # gpt2: residual output projections x 1/sqrt(2L) at init; deepnorm: norm(alpha·x + f(x)) with beta-scaled init (Post-LN)
    deepnorm_parts: str = "both"  # deepnorm ablation: "both" (the paper), "beta" (beta init, alpha = 1) or "alpha" (alpha, no beta init)
    # --- positions and embeddings ------------------------------------------
    positions: str = "sinusoidal"  # absolute sinusoids (paper), learned table, none, Shaw or XL relative scores, rotary (RoPE), ALiBi or T5 biases
    rel_clip: int = 16  # Shaw: offsets j-i clipped to [-k, k], so 2k+1 learned vectors serve any length
    rel_on_values: bool = True  # Shaw: add a^V_ij to the values too (a^K_ij on the keys always)
    rel_per_head: bool = False  # Shaw: one relative table per head instead of one shared by all heads
    mem_len: int = 0  # Transformer-XL: previous-segment states cached per layer (0 = no recurrence)
    rope_layout: str = "interleaved"  # RoPE pairs: (0,1),(2,3)... (paper, GPT-J) or (i, i+d/2) "rotate-half" (GPT-NeoX, LLaMA)
    rope_base: float = 10000.0  # RoPE: theta_i = base^(-2i/d_head)
    rope_dims: int = 0  # RoPE: rotate only the first rope_dims channels of each head, with theta_i = base^(-2i/rope_dims) (GPT-J's rotary_dim); 0 = all d_head
    rope_scaling: str = "none"  # stretch RoPE past its training length: linear (position interpolation), ntk (larger base) or yarn
    rope_factor: float = 1.0  # RoPE scaling: target length / training length
    rope_train_len: int = 64  # RoPE scaling (yarn): the length the model was trained at
    t5_buckets: int = 32  # T5 bias: buckets of offsets (half exact, half log-spaced), one learned scalar per head each
    t5_max_distance: int = 128  # T5 bias: offsets at or beyond this share the last bucket
    t5_shared_bias: bool = False  # T5 bias: one table per stack, read by every layer (Raffel et al.) instead of one per layer
    learned_pos_std: float = 1.0  # init std of a learned position table (0.02 tables learn far slower)
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) before adding positions
    emb_norm: bool = False  # a norm (cfg.norm) on token embedding + positions, before dropout (BLOOM's word_embeddings_layernorm, BERT's embedding LayerNorm)
    emb_init: str = "normal_inv_sqrt_d"  # N(0, 1/d_model) as in tensor2tensor, or N(0, 1) as torch.nn.Embedding
    tie_embeddings: str = "all"  # share encoder emb, decoder emb and output projection; or decoder emb+output; or none
    head_bias: bool = False  # a bias vector on the output projection's logits (GPT-J's lm_head)
    scale_head: bool = False  # multiply the final hidden state by d_model^-0.5 before the output projection (T5's tied head)
    # --- feed-forward ----------------------------------------------------
    activation: str = "relu"  # non-linearity of the FFN (gelu_tanh: the tanh approximation; silu = swish)
    ffn_gated: bool = False  # GLU family: act(x W1) ⊙ (x V) then W2 (SwiGLU = gated + silu, GEGLU = gated + gelu)
    moe_experts: int = 0  # > 0: mixture-of-experts FFN with this many experts (each an FFN of width d_ff)
    moe_top_k: int = 2  # MoE: experts per token, gates renormalised over the chosen k
    moe_capacity: float = 0.0  # MoE: capacity factor (tokens per expert = factor · tokens · k / E); 0 = unlimited
    bias: bool = True  # biases in the Q/K/V/O projections and the FFN
    attn_bias: Optional[bool] = None  # biases in the Q/K/V/O projections if they differ from `bias` (GPT-J: none there, the FFN's kept)
    # --- dropout, one probability per site -------------------------------------
    dropout_emb: float = 0.1  # on the sum of embeddings and positional encodings (paper, section 5.4)
    dropout_residual: float = 0.1  # on each sub-layer's output before the residual add (paper, section 5.4)
    dropout_attn: float = 0.0  # on attention weights after softmax (tensor2tensor, not in the paper)
    dropout_ffn: float = 0.0  # on the FFN hidden activations after the ReLU (tensor2tensor, not in the paper)

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(
                    f"TransformerConfig.{name}={value!r} is not an option; use one of {', '.join(map(repr, allowed))}."
                )
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len", "attn_block", "t5_buckets",
                     "t5_max_distance", "rope_train_len"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"TransformerConfig.{name}={getattr(self, name)} must be a positive integer.")
        for name, what in (("rel_clip", "offsets are clipped to [-k, k]"), ("mem_len", "0 = no segment memory"),
                           ("window", "0 = every earlier key"), ("attn_sinks", "0 = none"), ("kv_latent", "0 = no latent attention"),
                           ("mla_rope_dim", "0 = no decoupled rotary key"), ("moe_experts", "0 = a dense FFN"),
                           ("rope_dims", "0 = rotate every channel")):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"TransformerConfig.{name}={getattr(self, name)} must be >= 0 ({what}).")
        if self.d_model % self.n_heads:
            fits = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: each head gets d_model/n_heads "
                f"channels. Pick n_heads from {fits[:12]} or change d_model to a multiple of {self.n_heads}."
            )
        for name in ("dropout_emb", "dropout_residual", "dropout_attn", "dropout_ffn"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"TransformerConfig.{name}={p} must be a probability in [0, 1).")
        self._check_heads()
        self._check_scores()
        self._check_positions()
        self._check_blocks()
        if self.tie_embeddings == "all" and self.src_vocab_size not in (None, self.vocab_size):
            raise ConfigError(
                f"tie_embeddings='all' shares one matrix between encoder and decoder, but src_vocab_size="
                f"{self.src_vocab_size} differs from vocab_size={self.vocab_size}. Use tie_embeddings='decoder' or one vocabulary."
            )

    def _check_heads(self) -> None:
        kv = self.kv_heads
        if kv < 1 or self.n_heads % kv:
            fits = [h for h in range(1, self.n_heads + 1) if self.n_heads % h == 0]
            raise ConfigError(
                f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}: each key/value head serves a group "
                f"of n_heads/n_kv_heads query heads. Pick n_kv_heads from {fits} (1 = MQA, {self.n_heads} = MHA)."
            )
        if kv != self.n_heads and (self.share_qk or not self.qkv_proj):
            raise ConfigError(
                f"n_kv_heads={kv} < n_heads={self.n_heads} gives W_K fewer output heads than W_Q, so "
                f"{'share_qk=True cannot use one matrix for both' if self.share_qk else 'qkv_proj=False (q = k = x) cannot hold'}. "
                f"Set n_kv_heads=None (or {self.n_heads})."
            )
        if self.kv_latent:
            if self.positions not in ("none", "sinusoidal", "learned", "rope"):
                raise ConfigError(
                    f"kv_latent={self.kv_latent} (MLA) works with absolute positions or positions='rope' (on a "
                    f"decoupled key), not positions={self.positions!r}. Pick one of those, or set kv_latent=0."
                )
            if self.positions == "rope" and (self.mla_rope_dim < 2 or self.mla_rope_dim % 2):
                raise ConfigError(
                    f"MLA with positions='rope' rotates a separate key of mla_rope_dim channels (rotating the up-projected "
                    f"keys would stop the absorption); set mla_rope_dim to an even number >= 2, got {self.mla_rope_dim}."
                )
            if (self.score_fn != "dot" or self.share_qk or not self.qkv_proj or self.n_kv_heads is not None
                    or self.qk_norm != "none"):
                raise ConfigError(
                    "kv_latent > 0 (MLA) builds its own keys and values from the latent: leave score_fn='dot', "
                    "share_qk=False, qkv_proj=True, n_kv_heads=None and qk_norm='none'."
                )
        elif self.mla_rope_dim or self.mla_absorb:
            raise ConfigError("mla_rope_dim and mla_absorb belong to multi-head latent attention: set kv_latent > 0 too.")

    def _check_scores(self) -> None:
        if self.score_fn == "additive":
            if self.positions in RELATIVE_SCORES + ("rope", "alibi", "t5"):
                raise ConfigError(
                    f"score_fn='additive' and positions={self.positions!r} each change the attention score; they do "
                    f"not combine. Use positions='sinusoidal' (or 'learned', 'none') with additive scores, or score_fn='dot'."
                )
            if self.qk_norm != "none":
                raise ConfigError(
                    "qk_norm normalises q and k to bound q·k, but score_fn='additive' computes no q·k: its "
                    "logits v·tanh(q + k) are already bounded by ‖v‖₁. Set qk_norm='none' (or score_fn='dot')."
                )
            if self.attn_scale != "sqrt_dk":
                raise ConfigError(
                    f"attn_scale={self.attn_scale!r} scales q·k, which score_fn='additive' does not compute, so it "
                    f"would change nothing. Leave attn_scale='sqrt_dk' (the default, unused by additive scores) or use score_fn='dot'."
                )
        if self.share_qk and not self.qkv_proj:
            raise ConfigError(
                "share_qk=True ties W_K to W_Q, but qkv_proj=False has no W_Q or W_K: q = k = x already. "
                "Set share_qk=False (or qkv_proj=True)."
            )
        if self.attn_impl == "tiled" and (self.score_fn != "dot" or self.positions in RELATIVE_SCORES or self.mla_absorb):
            raise ConfigError(
                "attn_impl='tiled' computes q·k block by block (plus any bias), but additive, Shaw and XL scores and "
                "absorbed MLA replace the score function itself. Use attn_impl='explicit' or 'auto' with them."
            )

    def _check_positions(self) -> None:
        if self.positions == "rope" and self.d_head % 2:
            raise ConfigError(f"positions='rope' rotates pairs of channels, so d_head={self.d_head} must be even.")
        if self.rope_base <= 1:
            raise ConfigError(f"rope_base={self.rope_base} must exceed 1 (theta_i = base^(-2i/d)).")
        if self.rope_factor < 1:
            raise ConfigError(f"rope_factor={self.rope_factor} must be >= 1: it is target length / training length.")
        if self.rope_dims and (self.positions != "rope" or self.kv_latent or self.rope_dims % 2 or self.rope_dims > self.d_head):
            raise ConfigError(
                f"rope_dims={self.rope_dims} rotates the first rope_dims channels of each head: it needs positions='rope' "
                f"without kv_latent, and an even number <= d_head={self.d_head} (0 rotates all of them)."
            )
        if self.t5_shared_bias and self.positions != "t5":
            raise ConfigError("t5_shared_bias=True shares the T5 bias table across layers: set positions='t5'.")
        if self.rope_scaling != "none" and self.positions != "rope" and not (self.kv_latent and self.mla_rope_dim):
            raise ConfigError(f"rope_scaling={self.rope_scaling!r} stretches rotary positions: set positions='rope'.")
        if self.t5_buckets < 4:
            raise ConfigError(
                f"t5_buckets={self.t5_buckets}: need at least 4, so that a bidirectional layer keeps at least one "
                f"exact bucket per direction (half the buckets per direction, half of those exact)."
            )
        if self.t5_max_distance <= self.t5_buckets // 2:
            raise ConfigError(
                f"t5_max_distance={self.t5_max_distance} must exceed t5_buckets/2 = {self.t5_buckets // 2} (the "
                f"exact buckets of a causal layer): the log-spaced buckets span the distances from there to "
                f"t5_max_distance, and an empty span divides by log(1) = 0. Raise t5_max_distance."
            )

    def _check_blocks(self) -> None:
        if self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ConfigError(f"moe_top_k={self.moe_top_k} must lie in [1, moe_experts={self.moe_experts}].")
        if self.moe_capacity < 0:
            raise ConfigError(f"moe_capacity={self.moe_capacity} must be >= 0 (0 = no capacity limit).")
        if self.parallel_block and self.norm_position != "pre":
            raise ConfigError(
                "parallel_block=True adds attn(norm(x)) and ffn(norm(x)) to x (GPT-J, PaLM): a Pre-LN layout. "
                "Set norm_position='pre'."
            )
        if self.depth_init == "deepnorm" and (self.norm_position != "post" or not self.residual):
            raise ConfigError(
                "depth_init='deepnorm' up-weights the residual inside a Post-LN sub-layer, norm(alpha·x + f(x)): set "
                "norm_position='post' and residual=True (for Pre-LN use depth_init='gpt2')."
            )
        if self.deepnorm_parts != "both" and self.depth_init != "deepnorm":
            raise ConfigError(
                f"deepnorm_parts={self.deepnorm_parts!r} keeps one half of DeepNorm: set depth_init='deepnorm' too."
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used: n_kv_heads, or n_heads when it is None."""
        return self.n_heads if self.n_kv_heads is None else int(self.n_kv_heads)

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed: the one-switch ablation every proof makes."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"TransformerConfig has no field(s) {sorted(unknown)}; see the dataclass for the switches.")
        return TransformerConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

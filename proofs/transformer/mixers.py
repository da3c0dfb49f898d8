"""Token mixers other than softmax attention, as one switch of the shared model: `MixerConfig.mixer`.

A decoder layer mixes information across positions in its first sub-layer and transforms each position in its FFN.
The shared model's mixer is softmax attention (attention.py). Here the same DecoderLM gets another mixer in some or
all of its layers; embeddings, residual sub-layers, norms, FFN and head stay the shared ones:

    "softmax"   the shared attention, as make_self_attention builds it (every position's keys and values cached)
    "linear"    causal linear attention, φ = elu + 1 (Katharopoulos et al. 2020, §3.2-3.4): a d×d state
    "delta"     the delta rule (DeltaNet, Yang et al. 2024; gated: Gated DeltaNet, Yang et al. 2025): overwrite, not add
    further names are registered in MIXERS by the files that define them (SSM, sigmoid, gated and sparse attention).

`mixer` is one name for every layer or a tuple with one name per layer (a hybrid, e.g. 3 "linear" : 1 "softmax").
`mixer_lm(cfg)` builds the DecoderLM and puts each layer's mixer in place; its `decoder.new_cache()` then returns, per
layer, the KV cache of attention layers and a `RecurrentState` (fixed size) for recurrent ones, so the shared decoding
code (DecoderLM.generate, decoding.py) drives every mixer unchanged.

A recurrent mixer computes two ways: `parallel` over a whole sequence from an empty state (training), and `recurrent`
token by token from a given state (decoding). The proofs check that the two agree; the mixer uses `parallel` when no
cache is given and `recurrent` over the new tokens when one is.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import MultiHeadAttention
from .cache import KVCache
from .config import ConfigError, TransformerConfig

# name -> (module of this package, class): a file that defines a mixer adds its name here
MIXERS = {
    "softmax": None,  # the shared attention from make_self_attention
    "linear": (".mixers", "LinearAttention"),
    "delta": (".mixers", "DeltaRule"),
    "ssm": (".ssm", "SelectiveSSM"),
    "sigmoid": (".sigmoid_attention", "SigmoidAttention"),
    "gated": (".sigmoid_attention", "GatedAttention"),
    "topk": (".sparse_attention", "TopKAttention"),
    "block": (".sparse_attention", "BlockSparseAttention"),
}
RECURRENT = ("linear", "delta", "ssm")  # mixers whose decoding memory is a fixed-size state, not a KV cache
NO_PAIRWISE = ("shaw", "xl", "rope", "alibi", "t5")  # positions that live in attention scores a recurrent mixer lacks


@dataclass
class MixerConfig(TransformerConfig):
    mixer: Union[str, tuple] = "softmax"  # the token mixer of every layer, or a tuple with one name per layer (hybrids)
    linear_normalise: bool = True  # linear attention: divide by φ(q)ᵀΣφ(k) (Katharopoulos eq. 5); False: no denominator
    delta_gate: bool = False  # delta rule: a learned decay α_t ∈ (0, 1) of the state each step (Gated DeltaNet)
    delta_erase: bool = True  # delta rule: erase the value stored under k_t before writing; False: add only (additive)
    ssm_state: int = 16  # selective SSM: state size N per channel (Mamba's default is 16)
    ssm_selective: bool = True  # SSM: Δ, B, C computed from the input (Mamba's S6); False: fixed (time-invariant, S4-like)
    ssm_conv: int = 0  # SSM: width of a causal depthwise convolution before the scan (Mamba uses 4); 0 = none
    sigmoid_bias: Optional[float] = None  # sigmoid attention: bias b added to every score; None = -log(n), n keys seen
    sparse_keys: int = 0  # sparse attention: keys kept per query (top-k tokens, or blocks × block size); 0 = all
    sparse_block: int = 1  # block-sparse attention: keys per block (1 = token-level selection)

    def __post_init__(self) -> None:
        super().__post_init__()
        names = self.layer_mixers()
        if len(names) != self.n_layers:
            raise ConfigError(f"mixer has {len(names)} names for n_layers={self.n_layers} layers: give one name for every "
                              f"layer or a tuple of exactly n_layers names.")
        for name in names:
            if name not in MIXERS:
                raise ConfigError(f"mixer {name!r} is not one of {', '.join(map(repr, MIXERS))}.")
        if any(n in RECURRENT for n in names) and self.positions in NO_PAIRWISE:
            raise ConfigError(f"positions={self.positions!r} lives in attention's pairwise scores, which the recurrent "
                              f"mixers {RECURRENT} do not form: use positions='none', 'learned' or 'sinusoidal'.")
        if any(n in RECURRENT for n in names) and (self.window or self.kv_latent or self.mem_len):
            raise ConfigError("window, kv_latent and mem_len shape an attention KV cache; a recurrent mixer keeps a state "
                              "instead: set them to 0.")
        if self.ssm_state < 1 or self.ssm_conv < 0 or self.sparse_keys < 0 or self.sparse_block < 1:
            raise ConfigError("ssm_state and sparse_block must be >= 1, ssm_conv and sparse_keys >= 0 (0 = off).")

    def layer_mixers(self) -> tuple:
        """One mixer name per layer."""
        return (self.mixer,) * self.n_layers if isinstance(self.mixer, str) else tuple(self.mixer)

    def replace(self, **changes) -> "MixerConfig":
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"MixerConfig has no field(s) {sorted(unknown)}; see the dataclasses for the switches.")
        return MixerConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})


class RecurrentState:
    """The decoding memory of a recurrent mixer: one fixed-size state, whatever the number of tokens seen.

    It stands where a KVCache stands (Decoder.new_cache), so DecoderLM reads the next positions from it; `state` is
    the mixer's own tuple of tensors, `seen` the number of tokens folded into it.
    """

    def __init__(self):
        self.state: Optional[tuple[Tensor, ...]] = None
        self.seen = 0

    @property
    def filled(self) -> bool:
        return self.state is not None

    def __len__(self) -> int:
        return self.seen

    def next_positions(self, batch: int, t_new: int, device=None) -> Tensor:
        return self.seen + torch.arange(t_new, device=device)[None]  # (1, T_new)

    def nbytes(self) -> int:
        """Bytes the state holds: the same after 10 tokens as after 10,000."""
        return 0 if self.state is None else sum(t.numel() * t.element_size() for t in self.state)

    def truncate(self, length) -> None:
        raise ConfigError("a recurrent state has folded every token into one sum and cannot forget the last ones: copy "
                          "the state before the tokens you may roll back (speculative decoding) and restore the copy.")


def check_call(name: str, kv, causal: bool, key_padding_mask, attn_mask, prefix: int, cache) -> None:
    """A recurrent mixer is causal self-mixing of one unpadded sequence: anything else is a clear error."""
    if kv is not None or not causal or prefix:
        raise ConfigError(f"the {name!r} mixer is causal self-mixing in a DecoderLM: no cross-attention (kv), "
                          f"no bidirectional (causal=False) or prefix-LM use.")
    if key_padding_mask is not None or attn_mask is not None:
        raise ConfigError(f"the {name!r} mixer reads the sequence in order and takes no masks: batch sequences of one "
                          f"length (or left-align them and ignore the tail's outputs).")
    if cache is not None and not isinstance(cache, RecurrentState):
        raise ConfigError(f"the {name!r} mixer keeps a RecurrentState, got {type(cache).__name__}: build the model with "
                          f"mixer_lm() and take its caches from model.decoder.new_cache().")


class RecurrentMixer(MultiHeadAttention):
    """Shared plumbing of the recurrent mixers: attention's projections (W_Q, W_K, W_V, W_O, heads), a state
    instead of a cache. Subclasses define `parallel(q, k, v, x)` and `recurrent(q, k, v, x, state)`."""

    name = "recurrent"

    def forward(self, x: Tensor, kv: Optional[Tensor] = None, *, causal: bool = True, key_padding_mask=None,
                attn_mask=None, cache: Optional[RecurrentState] = None, positions=None, prefix: int = 0) -> Tensor:
        check_call(self.name, kv, causal, key_padding_mask, attn_mask, prefix, cache)
        B, T, C = x.shape
        if C != self.cfg.d_model:
            raise ConfigError(f"the {self.name!r} mixer expects (batch, time, d_model={self.cfg.d_model}), got {tuple(x.shape)}.")
        q = self.project_q(x)  # (B, nh, T, hs)
        k, v = self.keys_values(self.project_kv(x))  # (B, nh, T, hs) each
        if cache is None:
            y = self.parallel(q, k, v, x)  # (B, nh, T, hs)
        else:
            y, cache.state = self.recurrent(q, k, v, x, cache.state)
            cache.seen += T
        return self.w_o(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


def elu1(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 > 0, Katharopoulos et al.'s feature map (§3.2.1)."""
    return F.elu(x) + 1


# --8<-- [start:linear]
class LinearAttention(RecurrentMixer):
    """Causal linear attention: y_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t, S_t = Σ_{j≤t} φ(k_j) v_jᵀ, z_t = Σ_{j≤t} φ(k_j).

    parallel: (φ(Q)φ(K)ᵀ ⊙ causal) V, a T×T matrix like attention's but with no softmax (eq. 4-6);
    recurrent: the state (S, z) of size hs×hs + hs per head, updated once per token (eq. 16-20).
    """

    name = "linear"

    def parallel(self, q: Tensor, k: Tensor, v: Tensor, x: Tensor) -> Tensor:
        fq, fk = elu1(q), elu1(k)  # (B, nh, T, hs)
        T = q.shape[2]
        a = (fq @ fk.transpose(-2, -1)).tril()  # (B, nh, T, T): φ(q_t)·φ(k_j) for j ≤ t, 0 after
        y = a @ v  # (B, nh, T, hs)
        return y / a.sum(-1, keepdim=True) if self.cfg.linear_normalise else y

    def recurrent(self, q: Tensor, k: Tensor, v: Tensor, x: Tensor, state) -> tuple[Tensor, tuple]:
        fq, fk = elu1(q), elu1(k)  # (B, nh, T, hs)
        B, nh, T, hs = q.shape
        S, z = state if state is not None else (q.new_zeros(B, nh, hs, hs), q.new_zeros(B, nh, hs))
        ys = []
        for t in range(T):
            S = S + fk[:, :, t, :, None] @ v[:, :, t, None, :]  # (B, nh, hs_k, hs_v): add φ(k_t) v_tᵀ (an outer product)
            z = z + fk[:, :, t]  # (B, nh, hs)
            y = (fq[:, :, t, None, :] @ S)[:, :, 0]  # (B, nh, hs_v)
            ys.append(y / (fq[:, :, t] * z).sum(-1, keepdim=True) if self.cfg.linear_normalise else y)
        return torch.stack(ys, dim=2), (S, z)  # (B, nh, T, hs)
# --8<-- [end:linear]


# --8<-- [start:delta]
class DeltaRule(RecurrentMixer):
    """The delta rule: S_t = α_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ, y_t = S_t q_t (DeltaNet, Yang et al. 2024;
    the decay α_t is Gated DeltaNet's, Yang et al. 2025).

    Keys and queries are L2-normalised per head, β_t = σ(w_β x_t) ∈ (0, 1) per head is the writing strength, and
    α_t = σ(w_α x_t) the decay when delta_gate (Gated DeltaNet); α = 1 without it. With β = 1 and a unit key the new
    state returns exactly v_t for k_t: the old value under that key is replaced, not added to. delta_erase=False drops
    the erasing term (S_t = α_t S_{t-1} + β_t v_t k_tᵀ, additive like linear attention, same keys and gates).
    `scan` runs the recurrence token by token (decoding); `chunkwise` computes the same numbers with one triangular
    solve per chunk of tokens instead of a loop over them (training).
    """

    name = "delta"

    def __init__(self, cfg: MixerConfig):
        super().__init__(cfg)
        self.w_beta = nn.Linear(cfg.d_model, cfg.n_heads)  # one writing strength per head and token
        self.w_alpha = nn.Linear(cfg.d_model, cfg.n_heads) if cfg.delta_gate else None  # decay per head and token

    def gates(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """β (B, nh, T) and log α (B, nh, T), or None without delta_gate."""
        beta = torch.sigmoid(self.w_beta(x)).transpose(1, 2)  # (B, nh, T)
        log_alpha = None if self.w_alpha is None else F.logsigmoid(self.w_alpha(x)).transpose(1, 2)  # (B, nh, T)
        return beta, log_alpha

    def parallel(self, q: Tensor, k: Tensor, v: Tensor, x: Tensor) -> Tensor:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)  # unit keys: k kᵀ is a projection
        return self.chunkwise(q, k, v, *self.gates(x), erase=self.cfg.delta_erase)[0]

    def recurrent(self, q: Tensor, k: Tensor, v: Tensor, x: Tensor, state) -> tuple[Tensor, tuple]:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        y, S = self.scan(q, k, v, *self.gates(x), state=None if state is None else state[0], erase=self.cfg.delta_erase)
        return y, (S,)

    @staticmethod
    def scan(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_alpha: Optional[Tensor] = None,
             state: Optional[Tensor] = None, erase: bool = True) -> tuple[Tensor, Tensor]:
        """The recurrence, one token at a time: q, k, v (B, nh, T, hs), beta and log_alpha (B, nh, T), state S
        (B, nh, hs_v, hs_k) or None (empty). Returns y (B, nh, T, hs_v) and the last state."""
        B, nh, T, hs = q.shape
        S = state if state is not None else q.new_zeros(B, nh, v.shape[-1], hs)  # (B, nh, hs_v, hs_k)
        ys = []
        for t in range(T):
            kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None]  # (B, nh, hs), (B, nh, hs_v), (B, nh, 1)
            if log_alpha is not None:
                S = log_alpha[:, :, t, None, None].exp() * S  # decay the whole state by α_t
            old = (S @ kt[..., None])[..., 0] if erase else 0  # (B, nh, hs_v): the value the state now returns for k_t
            S = S + (bt * (vt - old))[..., None] * kt[:, :, None, :]  # move it a share β towards v_t
            ys.append((S @ q[:, :, t, :, None])[..., 0])  # (B, nh, hs_v)
        return torch.stack(ys, dim=2), S

    @staticmethod
    def chunkwise(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_alpha: Optional[Tensor] = None,
                  state: Optional[Tensor] = None, erase: bool = True, chunk: int = 64) -> tuple[Tensor, Tensor]:
        """`scan`'s numbers without a loop over tokens (the UT/WY form of Yang et al. 2024, Appendix B). Write the update as
        S_t = α_t S_{t-1} + u_t k_tᵀ with u_t = β_t (v_t - α_t S_{t-1} k_t). With γ_t = α_1⋯α_t inside a chunk that
        starts from S_0, S_t = γ_t S_0 + Σ_{j≤t} (γ_t/γ_j) u_j k_jᵀ, so the u_t solve one unit lower-triangular system
        (I + tril(diag(β)(Γ ⊙ K Kᵀ), -1)) U = diag(β)(V - diag(γ) K S_0ᵀ), Γ_tj = γ_t/γ_j, and every output follows:
        Y = diag(γ) Q S_0ᵀ + (tril(Γ ⊙ Q Kᵀ)) U. One loop step per chunk carries S to the next chunk."""
        if chunk < 1:
            raise ConfigError(f"chunk={chunk}: the chunkwise form needs at least one token per chunk.")
        B, nh, T, hs = q.shape
        S = state if state is not None else q.new_zeros(B, nh, v.shape[-1], hs)  # (B, nh, hs_v, hs_k)
        ys = []
        for s in range(0, T, chunk):
            qc, kc, vc = q[:, :, s:s + chunk], k[:, :, s:s + chunk], v[:, :, s:s + chunk]  # (B, nh, C, hs)
            bc = beta[:, :, s:s + chunk, None]  # (B, nh, C, 1)
            C = qc.shape[2]
            g = (q.new_zeros(B, nh, C) if log_alpha is None else log_alpha[:, :, s:s + chunk].cumsum(-1))  # log γ_t
            causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
            decay = (g[..., :, None] - g[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # Γ, 0 above diagonal
            rhs = bc * (vc - g.exp()[..., None] * (kc @ S.transpose(-2, -1)) if erase else vc)  # (B, nh, C, hs_v)
            if erase:
                a = (bc * (kc @ kc.transpose(-2, -1)) * decay).tril(-1)  # β_t (γ_t/γ_j) k_tᵀk_j for j < t
                eye = torch.eye(C, dtype=q.dtype, device=q.device)
                u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)  # (B, nh, C, hs_v)
            else:
                u = rhs  # no erasing: u_t = β_t v_t
            ys.append(g.exp()[..., None] * (qc @ S.transpose(-2, -1)) + ((qc @ kc.transpose(-2, -1)) * decay) @ u)
            w = (g[..., -1:] - g).exp()  # (B, nh, C): γ_C/γ_j
            S = g[..., -1, None, None].exp() * S + (w[..., None] * u).transpose(-2, -1) @ kc  # (B, nh, hs_v, hs_k)
        return torch.cat(ys, dim=2), S
# --8<-- [end:delta]


def mixer_class(name: str):
    """The class of mixer `name`, imported from the file that defines it. The imports are written out (not built
    from MIXERS' strings) so that proofs/evidence.py, which reads import statements, counts every mixer file in the
    fingerprint of a proof that builds its model with mixer_lm: an edit to ssm.py stales a hybrid's evidence."""
    if name not in MIXERS or MIXERS[name] is None:
        raise ConfigError(f"mixer {name!r} has no class here; one of {', '.join(n for n in MIXERS if MIXERS[n])}.")
    from .sigmoid_attention import GatedAttention, SigmoidAttention  # inside: these files import this one
    from .sparse_attention import BlockSparseAttention, TopKAttention
    from .ssm import SelectiveSSM

    classes = {"linear": LinearAttention, "delta": DeltaRule, "ssm": SelectiveSSM, "sigmoid": SigmoidAttention,
               "gated": GatedAttention, "topk": TopKAttention, "block": BlockSparseAttention}
    cls = classes[name]
    if cls.__module__.rsplit(".", 1)[-1] != MIXERS[name][0].lstrip(".") or cls.__name__ != MIXERS[name][1]:
        raise RuntimeError(f"MIXERS[{name!r}] = {MIXERS[name]} disagrees with the class imported here ({cls}).")
    return cls


def mixer_lm(cfg: MixerConfig):
    """A DecoderLM whose layer i mixes with cfg.layer_mixers()[i]; its decoder.new_cache() serves every mixer."""
    from .models import DecoderLM, init_weights

    if not isinstance(cfg, MixerConfig):
        raise ConfigError(f"mixer_lm takes a MixerConfig (TransformerConfig plus the mixer switches), got "
                          f"{type(cfg).__name__}: MixerConfig(**fields, mixer=...).")
    model = DecoderLM(cfg)
    names = cfg.layer_mixers()
    for layer, name in zip(model.decoder.layers, names):
        if name != "softmax":
            layer.self_attn = mixer_class(name)(cfg)
    if any(n != "softmax" for n in names):
        init_weights(model)  # the swapped-in mixers get the shared initialisation too
    shared_new_cache = model.decoder.new_cache

    def new_cache(kind: str = "contiguous", **options) -> list[dict]:
        """Per layer: a RecurrentState for a recurrent mixer, the shared cache of `kind` for attention layers."""
        caches = shared_new_cache(kind, **options)
        for layer_cache, name in zip(caches, names):
            if name in RECURRENT:
                layer_cache["self"] = RecurrentState()
        return caches

    model.decoder.new_cache = new_cache
    return model


def state_bytes(cache: list[dict]) -> int:
    """Decoding memory of a mixer model's cache list: KV entries of attention layers plus recurrent states."""
    total = 0
    for layer_cache in cache:
        c = layer_cache["self"]
        if isinstance(c, RecurrentState):
            total += c.nbytes()
        elif isinstance(c, KVCache) and c.entries is not None:
            total += sum(e.numel() * e.element_size() for e in c.entries)
    return total

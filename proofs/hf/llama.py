"""LLaMA, Mistral and Mixtral in `transformers` -> the shared model: the matching config and the weight mapping.

    theirs (model.layers.i.)                      ours (decoder.layers.i.)
    embed_tokens.weight (model.)                  embed.tok.weight
    self_attn.{q,k,v,o}_proj.weight               self_attn.w_{q,k,v,o}.weight     (GQA/MQA: k, v have n_kv heads)
    input_layernorm.weight                        sub_self.norm.weight             (RMSNorm gain, before attention)
    post_attention_layernorm.weight               sub_ffn.norm.weight              (RMSNorm gain, before the FFN)
    mlp.gate_proj.weight                          ffn.lin1.weight                  the branch that goes through SiLU
    mlp.up_proj.weight                            ffn.gate.weight                  the linear branch it multiplies
    mlp.down_proj.weight                          ffn.lin2.weight
    mlp.gate.weight (Mixtral)                     ffn.router.weight
    mlp.experts.gate_up_proj[e] (Mixtral)         ffn.experts.e.lin1 (first d_ff rows), ffn.experts.e.gate (the rest)
    mlp.experts.down_proj[e] (Mixtral)            ffn.experts.e.lin2.weight
    norm.weight (model.)                          decoder.final_norm.weight
    lm_head.weight                                head.proj.weight                 (untied)

The names cross: their `gate_proj` is the activated branch, which our FeedForward calls `lin1`, and their
`up_proj` is what our docstring calls V and the code `gate` (the branch that gates). Every weight copies as is:
Hugging Face's LLaMA already uses the rotate-half RoPE layout (its conversion script permuted Meta's rows), so
our `rope_layout="half"` needs no permutation.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: every model here is built from a config

import torch
from torch import nn

from proofs.hf import MappingError, copy_strict
from proofs.transformer import DecoderLM, TransformerConfig

FAMILIES = ("llama", "mistral", "mixtral")


# --8<-- [start:config]
def ours_for(hf) -> TransformerConfig:
    """The configuration of the shared model that computes what `hf` (a LlamaConfig, MistralConfig or
    MixtralConfig) computes. Refuses what it cannot match (biases, other RoPE types, odd head sizes) instead of
    building a model that would differ silently."""
    if hf.model_type not in FAMILIES:
        raise MappingError(f"ours_for maps {FAMILIES}, not {hf.model_type!r}")
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    rope = getattr(hf, "rope_parameters", None) or {"rope_type": "default", "rope_theta": hf.rope_theta}
    unsupported = {
        "head_dim != hidden_size / heads": head_dim * hf.num_attention_heads != hf.hidden_size,
        "hidden_act is not silu": hf.hidden_act != "silu",
        "attention or MLP biases": bool(getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False)),
        "tied input and output embeddings": bool(hf.tie_word_embeddings),
        "RoPE type other than default": rope.get("rope_type", "default") != "default",
        "pretraining_tp > 1": getattr(hf, "pretraining_tp", 1) != 1,
        # at k = 1 their router divides the one gate by itself (1); ours keeps p_e, Switch Transformer's gate
        "num_experts_per_tok = 1": getattr(hf, "num_experts_per_tok", 2) == 1,
    }
    if any(unsupported.values()):
        raise MappingError(f"{hf.model_type}: no matching config for {[k for k, v in unsupported.items() if v]}")
    moe = hf.model_type == "mixtral"
    return TransformerConfig(
        vocab_size=hf.vocab_size, d_model=hf.hidden_size, n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_key_value_heads, n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
        max_len=hf.max_position_embeddings,
        norm="rms", norm_position="pre", norm_eps=hf.rms_norm_eps,  # pre-RMSNorm with their epsilon
        positions="rope", rope_layout="half", rope_base=float(rope["rope_theta"]),  # rotate-half pairs (i, i + d/2)
        ffn_gated=True, activation="silu", bias=False,  # SwiGLU, no biases anywhere
        tie_embeddings="none", scale_embeddings=False,  # untied head; the embedding is not multiplied by √d
        window=getattr(hf, "sliding_window", None) or 0,  # Mistral: a query sees itself and window - 1 keys before it
        moe_experts=hf.num_local_experts if moe else 0, moe_top_k=hf.num_experts_per_tok if moe else 2,
        dropout_emb=0.0, dropout_residual=0.0, dropout_attn=0.0, dropout_ffn=0.0,
    )
# --8<-- [end:config]


# --8<-- [start:mapping]
def mapping(cfg: TransformerConfig, swap_ffn_names: bool = False) -> dict:
    """Our parameter name -> (their key or a function of their state dict, the keys it reads).

    swap_ffn_names: the tempting misreading (their gate_proj into our `gate`, up_proj into `lin1`), for the
    control arm that shows the names matter."""
    act, lin = ("up_proj", "gate_proj") if swap_ffn_names else ("gate_proj", "up_proj")
    m = {"embed.tok.weight": ("model.embed_tokens.weight", ["model.embed_tokens.weight"]),
         "decoder.final_norm.weight": ("model.norm.weight", ["model.norm.weight"]),
         "head.proj.weight": ("lm_head.weight", ["lm_head.weight"])}
    ff = cfg.d_ff
    for i in range(cfg.n_layers):
        t, o = f"model.layers.{i}.", f"decoder.layers.{i}."
        for p in "qkvo":
            m[f"{o}self_attn.w_{p}.weight"] = (f"{t}self_attn.{p}_proj.weight", [f"{t}self_attn.{p}_proj.weight"])
        m[f"{o}sub_self.norm.weight"] = (f"{t}input_layernorm.weight", [f"{t}input_layernorm.weight"])
        m[f"{o}sub_ffn.norm.weight"] = (f"{t}post_attention_layernorm.weight", [f"{t}post_attention_layernorm.weight"])
        if not cfg.moe_experts:
            for ours, theirs in (("lin1", act), ("gate", lin), ("lin2", "down_proj")):
                m[f"{o}ffn.{ours}.weight"] = (f"{t}mlp.{theirs}.weight", [f"{t}mlp.{theirs}.weight"])
            continue
        m[f"{o}ffn.router.weight"] = (f"{t}mlp.gate.weight", [f"{t}mlp.gate.weight"])
        gu, down = f"{t}mlp.experts.gate_up_proj", f"{t}mlp.experts.down_proj"  # (E, 2·d_ff, C), (E, C, d_ff)
        for e in range(cfg.moe_experts):
            first, second = (slice(ff, 2 * ff), slice(0, ff)) if swap_ffn_names else (slice(0, ff), slice(ff, 2 * ff))
            m[f"{o}ffn.experts.{e}.lin1.weight"] = (lambda sd, k=gu, e=e, s=first: sd[k][e, s], [gu])
            m[f"{o}ffn.experts.{e}.gate.weight"] = (lambda sd, k=gu, e=e, s=second: sd[k][e, s], [gu])
            m[f"{o}ffn.experts.{e}.lin2.weight"] = (lambda sd, k=down, e=e: sd[k][e], [down])
    return m
# --8<-- [end:mapping]


def randomise_(model: nn.Module, std: float, seed: int) -> None:
    """Overwrite every parameter of `model` with random values, in the order of named_parameters: matrices (and
    Mixtral's stacked expert tensors) N(0, std²), norm gains 1 + N(0, 0.2²), so that a norm mapped to the wrong
    place, not only a wrong matrix, changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(r * std if p.dim() > 1 else 1.0 + 0.2 * r)


def ours_from(hf_model: nn.Module, swap_ffn_names: bool = False, **switches) -> DecoderLM:
    """Our DecoderLM with `hf_model`'s weights, copied strictly; `switches` flip fields of the matching config
    (the control arms)."""
    cfg = ours_for(hf_model.config).replace(**switches)
    ours = DecoderLM(cfg).eval()
    copy_strict(ours, hf_model.state_dict(), mapping(cfg, swap_ffn_names))
    return ours

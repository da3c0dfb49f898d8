"""Named configurations of the shared model: the switches that make it a published architecture.

Each is held against Hugging Face `transformers`' own implementation in proofs/real/ (weights copied, logits compared),
so the name is a checked statement, not a likeness.
"""

from __future__ import annotations

from .config import TransformerConfig


# --8<-- [start:llama]
def llama_config(**switches) -> TransformerConfig:
    """LLaMA's configuration of the shared model: pre-RMSNorm (eps 1e-6), SwiGLU, rotate-half RoPE, no biases, an
    untied head, embeddings not scaled by √d (held against transformers' LLaMA in proofs/real/proof_llama_family.py).
    Llama 2 and Mixtral use eps 1e-5 (pass norm_eps); sizes come from `switches`."""
    return TransformerConfig(**{**dict(norm="rms", norm_position="pre", norm_eps=1e-6, ffn_gated=True,
                                       activation="silu", bias=False, tie_embeddings="none", scale_embeddings=False,
                                       positions="rope", rope_layout="half", dropout_emb=0.0, dropout_residual=0.0,
                                       max_len=4096), **switches})
# --8<-- [end:llama]

"""One layer of the shared model at width H, and the bytes autograd keeps for its backward pass: the set-up that the
layer-cost and training-memory proofs share.

`saved_activations` hooks `torch.autograd.graph.saved_tensors_hooks` around one training-mode `EncoderLayer` and adds
up the bytes of the distinct storages it saves, weights excluded. `PAPER_LAYER` is the setting of Korthikanti et al.
(2022, section 4.1) where our module can match it: GeLU, dropout after the attention softmax and on both residual
branches, Pre-LN (run in bfloat16 by the callers).
"""

from __future__ import annotations

import torch
from torch import Tensor

from proofs.transformer import EncoderLayer, TransformerConfig


# --8<-- [start:config]
def layer_config(H: int, **switches) -> TransformerConfig:
    """The shared model at width H, with d_ff = 4H (the paper's ratio) unless a switch says otherwise."""
    base = dict(d_model=H, n_heads=4, d_ff=4 * H, dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})
# --8<-- [end:config]


# --8<-- [start:activations]
PAPER_LAYER = dict(activation="gelu", dropout_attn=0.1, dropout_residual=0.1, norm_position="pre")


def saved_activations(b: int, s: int, h: int, a: int, dtype=torch.float32, **switches) -> dict:
    """Bytes autograd keeps for backward in one training-mode EncoderLayer, by distinct storage (weights excluded),
    and the bytes of LayerNorm's per-token statistics (tensors of shape (b, s, 1)) among them."""
    torch.manual_seed(0)
    layer = EncoderLayer(layer_config(h, n_heads=a, attn_impl=switches.pop("attn_impl", "explicit"),
                                      **switches)).to(dtype).train()
    weights = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    kept: dict[int, tuple[int, tuple]] = {}

    def pack(t: Tensor) -> Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            kept[st.data_ptr()] = (st.nbytes(), tuple(t.shape))
        return t

    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return {"bytes": sum(n for n, _ in kept.values()),
            "norm statistics": sum(n for n, shape in kept.values() if shape == (b, s, 1)),
            "largest": max(n for n, _ in kept.values()), "shapes": sorted({shape for _, shape in kept.values()})}
# --8<-- [end:activations]

"""A fact-lookup task for the FFN-width page: memorise (subject, relation) -> object facts.

The facts: S subjects (tokens 1..S) and R relations (tokens S+1..S+R); every pair (s, r) has one object, a subject
token drawn uniformly at random per seed, so nothing but memorisation can predict it (like `lookup_task` with noise
1). The input is the two-token sequence [s, r]; the target is the object at the last position (position 0 is
ignored: target -100, which `token_loss`'s cross-entropy skips). With S·R facts of log2(S) bits each, the task
is a store of known size.

The model: the shared `DecoderLM`, one Pre-LN layer, tied embeddings, no biases, no dropout; attention moves the
subject into the relation's position, and the table is stored in the weights (embeddings and attention hold part of
it; the FFN's width d_ff is the knob the page turns). Training: Adam, full batch (every fact every
step), a fixed number of steps. `memorised` counts the facts whose argmax is the object.

Key–value reading (Geva et al. 2021, §3–4): `unit_keys_and_values` returns each FFN unit's activation on every
fact (at the relation position) and its value, row i of W2 (column i of lin2.weight) read as logits through the
final norm's centring and gain and the tied unembedding E. `agreement` is the share of live units whose value's
top token is the object of one of their top-k triggering facts (Geva's agreement rate); `agreement_z` the mean
z-score, within each value's logits over the object tokens, of those facts' objects (0 by chance). With `perm`
each key is paired with another unit's value: the same statistic with the pairing broken, the control.
"""

from __future__ import annotations

import functools

import torch

from proofs.train import train
from proofs.transformer import DecoderLM, TransformerConfig
from proofs.transformer.config import ConfigError

# --8<-- [start:task]
S, R = 32, 16  # subjects (also the object tokens) and relations: S·R = 512 facts of log2(32) = 5 bits
V = 1 + S + R  # token 0 unused, subjects 1..S, relations S+1..S+R
D, STEPS, LR = 12, 80, 1.5e-2  # base width d_model (d_ff = 4d = 48); Adam, full batch, 80 steps (not converged)


def facts(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All S·R facts: inputs (S·R, 2) = [s, r], targets (S·R, 2) = [-100, object]; objects random per seed."""
    g = torch.Generator().manual_seed(seed)
    s = torch.arange(1, S + 1).repeat_interleave(R)  # (S·R,)
    r = torch.arange(S + 1, S + R + 1).repeat(S)  # (S·R,)
    obj = torch.randint(1, S + 1, (S * R,), generator=g)  # (S·R,)
    x = torch.stack([s, r], 1)
    y = torch.stack([torch.full_like(obj, -100), obj], 1)
    return x, y


def memory_cfg(d_model: int = D, d_ff: int = 4 * D, n_layers: int = 1, **switches) -> TransformerConfig:
    """One Pre-LN layer, one head (so that any d_model is allowed when parameters are matched), no biases."""
    base = dict(vocab_size=V, d_model=d_model, n_heads=1, d_ff=d_ff, n_layers=n_layers, norm_position="pre",
                bias=False, dropout_emb=0.0, dropout_residual=0.0, max_len=2)
    return TransformerConfig(**{**base, **switches})
# --8<-- [end:task]


def non_embedding_params(model: DecoderLM) -> int:
    """Parameters outside the token embedding (Kaplan et al.'s N): attention, FFN and norms."""
    return sum(p.numel() for n, p in model.named_parameters() if ".tok." not in f".{n}")


def ffn_params(model: DecoderLM) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".ffn." in f".{n}")


@functools.lru_cache(maxsize=64)
def run(seed: int, d_model: int = D, d_ff: int = 4 * D, n_layers: int = 1, steps: int = STEPS) -> dict:
    """Train one model on the seed's facts; returns the model, facts memorised and the final loss."""
    torch.manual_seed(seed)  # the initial weights
    model = DecoderLM(memory_cfg(d_model, d_ff, n_layers))
    x, y = facts(seed)
    log = train(model, lambda step: (x, y), steps, lr=LR)
    with torch.no_grad():
        hit = (model(x)[:, -1].argmax(-1) == y[:, -1])
    return {"model": model, "memorised": int(hit.sum()), "loss": log.final(), "x": x, "y": y,
            "params": sum(p.numel() for p in model.parameters()), "non_embedding": non_embedding_params(model),
            "ffn": ffn_params(model)}


# --8<-- [start:keys_values]
@torch.no_grad()
def unit_keys_and_values(model: DecoderLM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 FFN: activations (facts, d_ff) at the last position, and each unit's value read as logits (d_ff, V):
    its W2 row through the final LayerNorm's centring and gain, then the tied unembedding Eᵀ."""
    layer = model.decoder.layers[0]
    ffn = layer.ffn
    acts = {}
    handle = ffn.act.register_forward_hook(lambda m, i, o: acts.__setitem__("h", o))
    model(x)
    handle.remove()
    keys = acts["h"][:, -1]  # (facts, d_ff)
    v = ffn.lin2.weight.t()  # (d_ff, d): row i is unit i's value
    norm = model.decoder.final_norm  # Pre-LN: the stream passes this LayerNorm before the tied head
    v = (v - v.mean(-1, keepdim=True)) * norm.weight  # its centring and gain; its per-token scale ranks nothing
    values = v @ model.embed.tok.weight.t()  # (d_ff, d) @ (d, V) -> (d_ff, V)
    return keys, values


def _check_top_k(keys: torch.Tensor, top_k: int) -> None:
    if not 1 <= top_k <= keys.shape[0]:
        raise ConfigError(f"top_k={top_k} must be between 1 and the number of facts ({keys.shape[0]}); pass a smaller top_k.")


def agreement(keys: torch.Tensor, values: torch.Tensor, objects: torch.Tensor, top_k: int = 8,
              perm: torch.Tensor | None = None) -> float:
    """Share of live units whose value's top-1 token (over subject tokens) is the object of one of the unit's
    top_k triggering facts. perm pairs unit i's key with unit perm[i]'s value (the control)."""
    _check_top_k(keys, top_k)
    live = keys.max(0).values > 0  # a unit that never fires has no triggering facts
    top_facts = keys.topk(top_k, dim=0).indices.t()  # (d_ff, top_k)
    v = values if perm is None else values[perm]
    promoted = v[:, 1:S + 1].argmax(-1) + 1  # (d_ff,) candidate objects are the subject tokens
    hit = (objects[top_facts] == promoted[:, None]).any(-1)  # (d_ff,)
    return hit[live].float().mean().item()


def agreement_z(keys: torch.Tensor, values: torch.Tensor, objects: torch.Tensor, top_k: int = 8,
                perm: torch.Tensor | None = None) -> float:
    """Mean z-score, within each unit's value logits over the S object tokens, of the objects of the unit's top_k
    triggering facts (live units only): > 0 when a unit's value promotes what its keys fire on, 0 by chance."""
    _check_top_k(keys, top_k)
    live = keys.max(0).values > 0
    top_facts = keys.topk(top_k, dim=0).indices.t()  # (d_ff, top_k)
    v = (values if perm is None else values[perm])[:, 1:S + 1]  # (d_ff, S) logits of the object tokens
    z = (v - v.mean(-1, keepdim=True)) / v.std(-1, keepdim=True)  # (d_ff, S)
    zs = z.gather(1, objects[top_facts] - 1)  # (d_ff, top_k)
    return zs[live].mean().item()
# --8<-- [end:keys_values]


def matched_d_ff(d_model: int, target: int, n_layers: int = 1) -> int:
    """The d_ff that brings a d_model-wide model's non-embedding parameters closest to target."""
    def count(d_ff: int) -> int:
        return non_embedding_params(DecoderLM(memory_cfg(d_model, d_ff, n_layers)))
    base = count(1)
    per_unit = count(2) - base  # each hidden unit adds one row of W1 and one column of W2: 2·d_model
    return max(1, round(1 + (target - base) / per_unit))

"""GPT-2, GPT-J, BLOOM, BERT and T5: Hugging Face's models and the shared model configured to compute each.

For every architecture: `hf_<name>(seed)` builds the `transformers` model from a config object (nothing is
downloaded) and fills every parameter with seeded random values; `<name>_config(their_config)` is the
TransformerConfig with the switches that architecture needs; `<name>_mapping(their_config)` is the written map
from our parameter names to their state dict, which `copy_strict` applies (a key missing or left over is an error).
`ours_from(hf, cfg, mapping)` builds our model and copies the weights across.
`transformers` is imported inside the builders, not at the top: every pytest worker imports this module when it
collects the proofs, and most never build a Hugging Face model.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network: models come from config objects

from typing import Callable, Mapping

import torch
from torch import Tensor, nn

from proofs.hf import MappingError, Source, copy_strict
from proofs.transformer import DecoderLM, EncoderDecoder, EncoderTagger, TransformerConfig

# One size for all five: small enough for seconds on a CPU, two layers so that a per-layer slip shows.
VOCAB, D, HEADS, LAYERS, D_FF, MAX_LEN = 96, 32, 4, 2, 64, 32
NO_DROPOUT = dict(dropout_emb=0.0, dropout_residual=0.0, dropout_attn=0.0, dropout_ffn=0.0)

Mapping_ = dict[str, tuple[Source, tuple[str, ...]]]


# --8<-- [start:randomise]
@torch.no_grad()
def randomise(model: nn.Module, seed: int) -> nn.Module:
    """Every parameter of their model to seeded random values, so that no mapping slip can hide behind an init.

    Their inits leave biases at 0 and norm gains at 1, where a swapped or forgotten bias changes nothing.
    Here matrices get N(0, 1/fan) with fan their smaller side (activations stay of order one), vectors that
    start at 1 (norm gains) get 1 + N(0, 0.2²), every other vector (biases) N(0, 0.2²), and T5's bias
    tables N(0, 1), so that every bucket differs from its neighbours.
    """
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if "relative_attention_bias" in name:
            p.copy_(noise)
        elif p.dim() >= 2:
            p.copy_(noise * min(p.shape) ** -0.5)
        elif bool((p == 1).all()):
            p.copy_(1 + 0.2 * noise)
        else:
            p.copy_(0.2 * noise)
    return model.eval()
# --8<-- [end:randomise]


def tied(*keys: str) -> tuple[Source, tuple[str, ...]]:
    """A source that their model stores under several names (tied weights): checks it is one tensor, returns it."""
    def source(sd: Mapping[str, Tensor]) -> Tensor:
        first = sd[keys[0]]
        for k in keys[1:]:
            if sd[k].data_ptr() != first.data_ptr() or sd[k].shape != first.shape:
                raise MappingError(f"{k} is not tied to {keys[0]}: the mapping assumed one matrix")
        return first
    return source, keys


def same(key: str) -> tuple[Source, tuple[str, ...]]:
    return key, (key,)


def rows(key: str, fn: Callable[[Tensor], Tensor]) -> tuple[Source, tuple[str, ...]]:
    """A source computed from one of their tensors (a slice, a transpose)."""
    return (lambda sd: fn(sd[key])), (key,)


def refuse(c, **unsupported: bool) -> None:
    """Raise MappingError naming the options of their config that the matching config below does not cover."""
    if any(unsupported.values()):
        raise MappingError(f"{c.model_type}: no matching config for {[k for k, v in unsupported.items() if v]}")


def ours_from(hf: nn.Module, cfg: TransformerConfig, mapping: Mapping_, cls) -> nn.Module:
    """Our model of class `cls` for cfg, with their weights copied in through the mapping (strict), in eval mode."""
    ours = cls(cfg)
    copy_strict(ours, hf.state_dict(), mapping)
    return ours.eval()


def norm(ours: str, theirs: str, bias: bool = True) -> Mapping_:
    m = {f"{ours}.weight": same(f"{theirs}.weight")}
    if bias:
        m[f"{ours}.bias"] = same(f"{theirs}.bias")
    return m


def linear(ours: str, theirs: str, bias: bool = True) -> Mapping_:
    return norm(ours, theirs, bias)  # nn.Linear to nn.Linear: the same two names


# ---------------------------------------------------------------- GPT-2
# --8<-- [start:gpt2]
def hf_gpt2(seed: int) -> nn.Module:
    import transformers
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=MAX_LEN, n_embd=D, n_layer=LAYERS, n_head=HEADS,
                                  n_inner=D_FF, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    return randomise(transformers.GPT2LMHeadModel(cfg), seed)


def gpt2_config(c) -> TransformerConfig:
    refuse(c, activation_not_gelu_new=c.activation_function != "gelu_new", unscaled_scores=not c.scale_attn_weights,
           scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx, cross_attention=c.add_cross_attention)
    return TransformerConfig(
        vocab_size=c.vocab_size, d_model=c.n_embd, n_heads=c.n_head, d_ff=c.n_inner or 4 * c.n_embd, n_layers=c.n_layer,
        max_len=c.n_positions, norm_eps=c.layer_norm_epsilon, **NO_DROPOUT,
        positions="learned",          # wpe, a learned table added to the token embeddings
        scale_embeddings=False,       # no sqrt(d_model) on wte
        norm_position="pre",          # ln_1, ln_2 before each sub-layer, ln_f after the stack
        activation="gelu_tanh",       # "gelu_new": the tanh approximation
        tie_embeddings="all",         # lm_head is wte
    )


def gpt2_mapping(c) -> Mapping_:
    C = c.n_embd
    m: Mapping_ = {"embed.tok.weight": tied("transformer.wte.weight", "lm_head.weight"),
                   "embed.pos": same("transformer.wpe.weight"),
                   **norm("decoder.final_norm", "transformer.ln_f")}
    for i in range(c.n_layer):
        h, o = f"transformer.h.{i}", f"decoder.layers.{i}"
        # Conv1D stores (in, out): y = x W + b. c_attn's columns are q | k | v; ours are nn.Linear (out, in).
        for j, name in enumerate(("w_q", "w_k", "w_v")):
            m[f"{o}.self_attn.{name}.weight"] = rows(f"{h}.attn.c_attn.weight", lambda w, j=j: w[:, j * C:(j + 1) * C].t())
            m[f"{o}.self_attn.{name}.bias"] = rows(f"{h}.attn.c_attn.bias", lambda b, j=j: b[j * C:(j + 1) * C])
        m[f"{o}.self_attn.w_o.weight"] = rows(f"{h}.attn.c_proj.weight", lambda w: w.t())
        m[f"{o}.self_attn.w_o.bias"] = same(f"{h}.attn.c_proj.bias")
        m[f"{o}.ffn.lin1.weight"] = rows(f"{h}.mlp.c_fc.weight", lambda w: w.t())
        m[f"{o}.ffn.lin1.bias"] = same(f"{h}.mlp.c_fc.bias")
        m[f"{o}.ffn.lin2.weight"] = rows(f"{h}.mlp.c_proj.weight", lambda w: w.t())
        m[f"{o}.ffn.lin2.bias"] = same(f"{h}.mlp.c_proj.bias")
        m.update(norm(f"{o}.sub_self.norm", f"{h}.ln_1"))
        m.update(norm(f"{o}.sub_ffn.norm", f"{h}.ln_2"))
    return m
# --8<-- [end:gpt2]


# ---------------------------------------------------------------- GPT-J
ROTARY_DIM = 4  # of d_head = 8: half of each head turns, as GPT-J-6B turns 64 of 256


# --8<-- [start:gptj]
def hf_gptj(seed: int) -> nn.Module:
    import transformers
    cfg = transformers.GPTJConfig(vocab_size=VOCAB, n_positions=MAX_LEN, n_embd=D, n_layer=LAYERS, n_head=HEADS,
                                  n_inner=D_FF, rotary_dim=ROTARY_DIM, activation_function="gelu_new",
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
                                  bos_token_id=None, eos_token_id=None)
    return randomise(transformers.GPTJForCausalLM(cfg), seed)


def gptj_config(c) -> TransformerConfig:
    refuse(c, activation_not_gelu_new=c.activation_function != "gelu_new", tied_head=c.tie_word_embeddings)
    return TransformerConfig(
        vocab_size=c.vocab_size, d_model=c.n_embd, n_heads=c.n_head, d_ff=c.n_inner or 4 * c.n_embd, n_layers=c.n_layer,
        max_len=c.n_positions, norm_eps=c.layer_norm_epsilon, **NO_DROPOUT,
        positions="rope", rope_layout="interleaved",  # rotate_every_two: pairs (0,1), (2,3), ...
        rope_dims=c.rotary_dim or 0,  # only the first rotary_dim channels of each head turn
        scale_embeddings=False,
        norm_position="pre", parallel_block=True,  # x + attn(ln_1(x)) + mlp(ln_1(x)): one norm per layer
        activation="gelu_tanh",
        attn_bias=False,              # q_proj, k_proj, v_proj, out_proj have no bias; fc_in, fc_out do
        tie_embeddings="none", head_bias=True,  # lm_head: its own matrix and a bias
    )


def gptj_mapping(c) -> Mapping_:
    m: Mapping_ = {"embed.tok.weight": same("transformer.wte.weight"),
                   "head.proj.weight": same("lm_head.weight"), "head.bias": same("lm_head.bias"),
                   **norm("decoder.final_norm", "transformer.ln_f")}
    for i in range(c.n_layer):
        h, o = f"transformer.h.{i}", f"decoder.layers.{i}"
        for ours, theirs in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "out_proj")):
            m[f"{o}.self_attn.{ours}.weight"] = same(f"{h}.attn.{theirs}.weight")
        m.update(linear(f"{o}.ffn.lin1", f"{h}.mlp.fc_in"))
        m.update(linear(f"{o}.ffn.lin2", f"{h}.mlp.fc_out"))
        m.update(norm(f"{o}.sub_self.norm", f"{h}.ln_1"))
    return m
# --8<-- [end:gptj]


# ---------------------------------------------------------------- BLOOM
# --8<-- [start:bloom]
def hf_bloom(seed: int) -> nn.Module:
    import transformers
    cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=D, n_layer=LAYERS, n_head=HEADS,
                                   hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=None, eos_token_id=None,
                                   pad_token_id=None)
    return randomise(transformers.BloomForCausalLM(cfg), seed)


def bloom_config(c) -> TransformerConfig:
    refuse(c, residual_after_layernorm=c.apply_residual_connection_post_layernorm)
    return TransformerConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_heads=c.n_head, d_ff=4 * c.hidden_size,
        n_layers=c.n_layer, max_len=MAX_LEN, norm_eps=c.layer_norm_epsilon, **NO_DROPOUT,
        positions="alibi",            # no position embedding; a per-head linear bias on the scores
        scale_embeddings=False, emb_norm=True,  # word_embeddings_layernorm right after the lookup
        norm_position="pre",
        activation="gelu_tanh",       # bloom_gelu_forward: the tanh form (constant 0.79788456)
        tie_embeddings="all",
    )


def bloom_mapping(c, qkv_blocks: bool = False) -> Mapping_:
    """qkv_blocks: the tempting misreading of query_key_value as [all q; all k; all v] (GPT-2's c_attn order),
    for the control arm that shows the per-head layout matters."""
    C, nh = c.hidden_size, c.n_head
    hd = C // nh
    layout = (lambda w, j: w.reshape(3, C, *w.shape[1:])[j]) if qkv_blocks else (
        lambda w, j: w.reshape(nh, 3, hd, *w.shape[1:])[:, j].reshape(C, *w.shape[1:]))
    m: Mapping_ = {"embed.tok.weight": tied("transformer.word_embeddings.weight", "lm_head.weight"),
                   **norm("embed.norm", "transformer.word_embeddings_layernorm"),
                   **norm("decoder.final_norm", "transformer.ln_f")}
    for i in range(c.n_layer):
        h, o = f"transformer.h.{i}.self_attention", f"decoder.layers.{i}"
        # query_key_value's 3C outputs are grouped by head: (nh, 3, hd), q k v of head 0, then of head 1, ...
        for j, name in enumerate(("w_q", "w_k", "w_v")):
            m[f"{o}.self_attn.{name}.weight"] = rows(f"{h}.query_key_value.weight", lambda w, j=j: layout(w, j))
            m[f"{o}.self_attn.{name}.bias"] = rows(f"{h}.query_key_value.bias", lambda b, j=j: layout(b, j))
        m.update(linear(f"{o}.self_attn.w_o", f"{h}.dense"))
        b = f"transformer.h.{i}"
        m.update(linear(f"{o}.ffn.lin1", f"{b}.mlp.dense_h_to_4h"))
        m.update(linear(f"{o}.ffn.lin2", f"{b}.mlp.dense_4h_to_h"))
        m.update(norm(f"{o}.sub_self.norm", f"{b}.input_layernorm"))
        m.update(norm(f"{o}.sub_ffn.norm", f"{b}.post_attention_layernorm"))
    return m
# --8<-- [end:bloom]


# ---------------------------------------------------------------- BERT
# --8<-- [start:bert]
def hf_bert(seed: int) -> nn.Module:
    import transformers
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, intermediate_size=D_FF, hidden_act="gelu",
                                  max_position_embeddings=MAX_LEN, type_vocab_size=2, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return randomise(transformers.BertModel(cfg, add_pooling_layer=False), seed)  # no pooler: we compare hidden states


def bert_config(c) -> TransformerConfig:
    refuse(c, activation_not_exact_gelu=c.hidden_act != "gelu", decoder=c.is_decoder,
           relative_positions=getattr(c, "position_embedding_type", "absolute") != "absolute")
    return TransformerConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_heads=c.num_attention_heads, d_ff=c.intermediate_size,
        n_layers=c.num_hidden_layers, max_len=c.max_position_embeddings, norm_eps=c.layer_norm_eps, **NO_DROPOUT,
        positions="learned", scale_embeddings=False,
        emb_norm=True,                # LayerNorm(word + position (+ token type)) before the first layer
        norm_position="post",         # LayerNorm(x + sublayer(x)), no final norm
        activation="gelu",            # hidden_act="gelu": the exact erf form
        tie_embeddings="all",         # the head is not compared: BertModel ends at the last hidden state
    )


def bert_mapping(c) -> Mapping_:
    """Their token-type table has no counterpart: its row 0 is a constant added at every position of a one-segment
    input, so it is folded into our position table. Exact for token_type_ids = 0 only (row 1 is read, never used)."""
    e = "embeddings"
    m: Mapping_ = {
        "embed.tok.weight": same(f"{e}.word_embeddings.weight"),
        "embed.pos": ((lambda sd: sd[f"{e}.position_embeddings.weight"] + sd[f"{e}.token_type_embeddings.weight"][0]),
                      (f"{e}.position_embeddings.weight", f"{e}.token_type_embeddings.weight")),
        **norm("embed.norm", f"{e}.LayerNorm"),
    }
    for i in range(c.num_hidden_layers):
        h, o = f"encoder.layer.{i}", f"encoder.layers.{i}"
        for ours, theirs in (("w_q", "query"), ("w_k", "key"), ("w_v", "value")):
            m.update(linear(f"{o}.self_attn.{ours}", f"{h}.attention.self.{theirs}"))
        m.update(linear(f"{o}.self_attn.w_o", f"{h}.attention.output.dense"))
        m.update(norm(f"{o}.sub_attn.norm", f"{h}.attention.output.LayerNorm"))
        m.update(linear(f"{o}.ffn.lin1", f"{h}.intermediate.dense"))
        m.update(linear(f"{o}.ffn.lin2", f"{h}.output.dense"))
        m.update(norm(f"{o}.sub_ffn.norm", f"{h}.output.LayerNorm"))
    return m
# --8<-- [end:bert]


# ---------------------------------------------------------------- T5
# Few buckets and a short max_distance, so that sequences of 12 tokens reach the log-spaced buckets and the
# last, shared one (T5's defaults, 32 and 128, would need sequences of over 16 tokens for the first log bucket).
T5_BUCKETS, T5_MAX_DISTANCE = 8, 10


# --8<-- [start:t5]
def hf_t5(seed: int) -> nn.Module:
    import transformers
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=D, d_kv=D // HEADS, d_ff=D_FF, num_layers=LAYERS,
                                num_decoder_layers=LAYERS, num_heads=HEADS, relative_attention_num_buckets=T5_BUCKETS,
                                relative_attention_max_distance=T5_MAX_DISTANCE, dropout_rate=0.0,
                                feed_forward_proj="relu", tie_word_embeddings=True, eos_token_id=None,
                                pad_token_id=0, decoder_start_token_id=0)
    return randomise(transformers.T5ForConditionalGeneration(cfg), seed)


def t5_config(c) -> TransformerConfig:
    # transformers 5.24's T5Config always sets tie_word_embeddings=True (the head is `shared`) and records the
    # keyword in scale_decoder_outputs (False only when the config was made with tie_word_embeddings=False, as
    # T5 v1.1's are); so the head is tied here and the d_model^-0.5 factor follows their flag, never assumed.
    refuse(c, gated_ffn=c.feed_forward_proj != "relu", untied_head=not c.tie_word_embeddings,
           inner_width_not_d_model=c.d_kv * c.num_heads != c.d_model)
    return TransformerConfig(
        vocab_size=c.vocab_size, d_model=c.d_model, n_heads=c.num_heads, d_ff=c.d_ff, n_layers=c.num_layers,
        n_dec_layers=c.num_decoder_layers, norm_eps=c.layer_norm_epsilon, **NO_DROPOUT,
        positions="t5", t5_buckets=c.relative_attention_num_buckets, t5_max_distance=c.relative_attention_max_distance,
        t5_shared_bias=True,          # one table per stack, in the first layer, read by all (encoder: both ways)
        attn_scale="none",            # q·k is not divided by sqrt(d_k) (T5 folds it into the init)
        norm="rms", norm_position="pre",  # T5LayerNorm: x / RMS(x) · g, no mean, no bias; final_layer_norm
        activation="relu", bias=False,  # DenseReluDense: wi, relu, wo; no biases anywhere
        scale_embeddings=False, tie_embeddings="all",
        scale_head=bool(getattr(c, "scale_decoder_outputs", c.tie_word_embeddings)),  # decoder output x d_model^-0.5
                                      # before the tied lm_head, when their config says so
    )


def t5_mapping(c) -> Mapping_:
    m: Mapping_ = {"tgt_embed.tok.weight": tied("shared.weight", "encoder.embed_tokens.weight",
                                                "decoder.embed_tokens.weight", "lm_head.weight"),
                   **norm("encoder.final_norm", "encoder.final_layer_norm", bias=False),
                   **norm("decoder.final_norm", "decoder.final_layer_norm", bias=False)}

    def attention(o: str, h: str) -> None:
        for name in ("q", "k", "v", "o"):
            m[f"{o}.w_{name}.weight"] = same(f"{h}.{name}.weight")

    for stack, n, sub in (("encoder", c.num_layers, ("sub_attn", "sub_ffn")),
                          ("decoder", c.num_decoder_layers, ("sub_self", "sub_cross", "sub_ffn"))):
        for i in range(n):
            h, o = f"{stack}.block.{i}.layer", f"{stack}.layers.{i}"
            attention(f"{o}.self_attn", f"{h}.0.SelfAttention")
            if stack == "decoder":
                attention(f"{o}.cross_attn", f"{h}.1.EncDecAttention")
            ffn = len(sub) - 1
            m[f"{o}.ffn.lin1.weight"] = same(f"{h}.{ffn}.DenseReluDense.wi.weight")
            m[f"{o}.ffn.lin2.weight"] = same(f"{h}.{ffn}.DenseReluDense.wo.weight")
            for j, s in enumerate(sub):
                m.update(norm(f"{o}.{s}.norm", f"{h}.{j}.layer_norm", bias=False))
        # (buckets, heads) in both: the first layer's table, shared by the stack
        m[f"{stack}.layers.0.self_attn.rel_bias"] = same(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
    return m
# --8<-- [end:t5]


ARCHITECTURES = {  # name -> (their model, our config, the mapping, our class)
    "GPT-2": (hf_gpt2, gpt2_config, gpt2_mapping, DecoderLM),
    "GPT-J": (hf_gptj, gptj_config, gptj_mapping, DecoderLM),
    "BLOOM": (hf_bloom, bloom_config, bloom_mapping, DecoderLM),
    "BERT": (hf_bert, bert_config, bert_mapping, EncoderTagger),
    "T5": (hf_t5, t5_config, t5_mapping, EncoderDecoder),
}


def pair(name: str, seed: int, **switches) -> tuple[nn.Module, nn.Module, TransformerConfig]:
    """(their model, ours with their weights, our config); switches flip fields of our config (the control arms)."""
    make_hf, make_cfg, make_map, cls = ARCHITECTURES[name]
    hf = make_hf(seed)
    cfg = make_cfg(hf.config).replace(**switches)
    return hf, ours_from(hf, cfg, make_map(hf.config), cls), cfg

"""The one shared Transformer that every proof on the site flips switches of.

Every design choice a question asks about is one field of `TransformerConfig`; the defaults are those
of Vaswani et al. (2017). Read the files in this order, each opens with what it holds:

    config.py       TransformerConfig (one field per switch, a comment each) and ConfigError
    positions.py    sinusoids, rotary angles and their long-context scalings, ALiBi slopes, T5 buckets
    norms.py        LayerNorm, RMSNorm, token-wise BatchNorm
    attention.py    MultiHeadAttention (MHA/GQA/MQA; score, bias, mix, place hooks; explicit, fused, tiled paths)
    variants.py     attention variants that override those hooks: additive, Shaw, XL, RoPE, ALiBi, T5
    latent.py       multi-head latent attention (MLA), materialised and absorbed
    feedforward.py  the FFN, the GLU family, mixture of experts
    moe_modern.py   DeepSeekMoE (MoEFeedForward subclass): fine-grained and shared experts, a routing bias for the choice only
    layers.py       residual sub-layers (Post-LN, Pre-LN, DeepNorm, parallel) and encoder/decoder layers
    cache.py        key/value caches: contiguous, rolling (sliding window), paged
    kv_quant.py     a quantised KV cache (KVCache subclass): 2/4/8-bit keys and values per token or per channel, KIVI's residual
    prefix_cache.py prefix caching (a store keyed by token ids from position 0) and chunked prefill over the cache
    eviction.py     token eviction to a budget (recency, H2O, SnapKV, random) on a KVCache; a paged cache that frees empty blocks, compaction
    models.py       embeddings, stacks, EncoderTagger, DecoderLM, EncoderDecoder, initialisation
    decoding.py     greedy decoding, temperature/top-k/top-p sampling and beam search on one next-token function
    speculative.py  speculative decoding: a draft proposes, the target verifies (exact and folk acceptance rules)
    mtp.py          multi-token prediction: a t+2 module on a built DecoderLM, its loss, and a draft for speculative.py
    batching.py     serving many requests: continuous (iteration-level) vs static batching over a paged cache
    penalties.py    repetition controls as logits processors: CTRL penalty (and its sign bug), frequency/presence, no-repeat-n-gram
    quant.py        post-training quantisation: absmax int8/int4 per tensor/channel/group, W8A8 matmul, LLM.int8;
                    QLoRA's NF4 levels, blockwise NF4, bits per parameter with double quantisation
    lora.py         LoRA: a frozen linear layer plus (alpha/r)·B A, applied by name, merged back into nn.Linear
    peft.py         prompt tuning, prefix tuning (a pre-filled KV cache), Houlsby adapters: applied and removed
    mixers.py       other token mixers as one switch (MixerConfig.mixer, per layer for hybrids): linear attention, the
                    delta rule, and the registry of the rest; mixer_lm() builds the DecoderLM, RecurrentState decodes
    ssm.py          Mamba's selective SSM (S6) mixer, the associative scan of h_t = a_t h_{t-1} + b_t, the LTI convolution form
    sparse_attention.py  sparse attention as mixers "topk" (top-k keys per query) and "block" (top blocks by mean-pooled key)
    sigmoid_attention.py  sigmoid attention (σ(s + b), no row normalisation) and gated attention (Y ⊙ σ(X W_θ) before W_O)

Shape comments use B = batch, T = time (Tq queries, Tk keys), nh = query heads, n_kv = key/value
heads, hs = head size (d_k = d_v = d_model / n_heads), C = d_model, V = vocabulary.
Mask convention (as in torch.nn): a bool tensor where True marks a position that must NOT be attended to.
"""

from .attention import MultiHeadAttention, causal_mask, end_aligned, hidden, record_attention, repeat_kv, tiled_attention
from .cache import BlockPool, KVCache, PagedKVCache, RollingKVCache
from .kv_quant import QuantisedKVCache
from .prefix_cache import PrefixStore, chunked_prefill, copy_cache, prefill_with_store
from .eviction import EvictablePagedKVCache, evict, prefill_and_evict
from . import batching, speculative  # modules: from proofs.transformer.speculative import speculative_generate
from .mtp import MTPDraft, MTPLM, MTPModule, mtp_extra_loss
from .config import ConfigError, TransformerConfig
from .decoding import Beams, beam_search, check_filters, filter_logits, gnmt_lp, greedy, lm_beam_fns, nucleus, sample
from .feedforward import FeedForward, MoEFeedForward
from .moe_modern import DeepSeekMoE, apply_deepseek_moe
from .latent import AbsorbedLatentAttention, LatentAttention
from .lora import LoRALinear, apply_lora, merge_lora, trainable_parameters
from .peft import (Adapter, PrefixSelfAttention, PromptEmbeddings, apply_adapters, apply_prefix_tuning, apply_prompt_tuning,
                   peft_formula, remove_peft)
from .mixers import DeltaRule, LinearAttention, MixerConfig, RecurrentState, mixer_lm, state_bytes
from .ssm import SelectiveSSM, associative_scan, causal_conv, combine, lti_kernel
from .sparse_attention import BlockSparseAttention, TopKAttention
from .sigmoid_attention import GatedAttention, SigmoidAttention
from .layers import DecoderLayer, EncoderLayer, Residual
from .models import Decoder, DecoderLM, Embeddings, Encoder, EncoderDecoder, EncoderTagger, Head, init_weights
from .norms import RMSNorm, TokenBatchNorm, make_norm
from .penalties import (banned_by_ngram, frequency_presence_penalty, naive_repetition_penalty, no_repeat_ngram,
                        repetition_penalty, with_processors)
from .positions import (alibi_slopes, apply_rope, rope_cos_sin, rope_inv_freq, rope_permutation, sinusoidal_table,
                        t5_bucket)
from .quant import (Int8Linear, Quantised, bits_per_parameter, dequantise, fake_quantise, int8_matmul, nf4_dequantise,
                    nf4_levels, nf4_quantise, quantise, quantise_model)
from .variants import (AdditiveAttention, ALiBiAttention, RotaryAttention, ShawAttention, T5BiasAttention, XLAttention,
                       make_self_attention, rel_shift)

__all__ = [
    "TransformerConfig", "ConfigError",
    "MultiHeadAttention", "AdditiveAttention", "ShawAttention", "XLAttention", "RotaryAttention", "ALiBiAttention",
    "T5BiasAttention", "LatentAttention", "AbsorbedLatentAttention", "make_self_attention", "rel_shift",
    "causal_mask", "end_aligned", "hidden", "repeat_kv", "tiled_attention", "record_attention",
    "sinusoidal_table", "rope_inv_freq", "rope_cos_sin", "apply_rope", "rope_permutation", "alibi_slopes", "t5_bucket",
    "RMSNorm", "TokenBatchNorm", "make_norm", "FeedForward", "MoEFeedForward", "DeepSeekMoE", "apply_deepseek_moe",
    "Residual", "EncoderLayer", "DecoderLayer", "Embeddings", "Encoder", "Decoder", "Head", "init_weights",
    "EncoderTagger", "DecoderLM", "EncoderDecoder",
    "KVCache", "RollingKVCache", "PagedKVCache", "BlockPool", "greedy",
    "PrefixStore", "chunked_prefill", "copy_cache", "prefill_with_store",
    "filter_logits", "check_filters", "nucleus", "sample", "beam_search", "Beams", "gnmt_lp", "lm_beam_fns",
    "repetition_penalty", "naive_repetition_penalty", "frequency_presence_penalty", "no_repeat_ngram",
    "banned_by_ngram", "with_processors",
    "LoRALinear", "apply_lora", "merge_lora", "trainable_parameters",
    "Adapter", "PrefixSelfAttention", "PromptEmbeddings", "apply_adapters", "apply_prefix_tuning", "apply_prompt_tuning",
    "peft_formula", "remove_peft",
    "MixerConfig", "mixer_lm", "RecurrentState", "LinearAttention", "DeltaRule", "state_bytes",
    "SelectiveSSM", "associative_scan", "combine", "lti_kernel", "causal_conv",
    "TopKAttention", "BlockSparseAttention",
    "SigmoidAttention", "GatedAttention",
    "nf4_levels", "nf4_quantise", "nf4_dequantise", "bits_per_parameter",
    "quantise", "dequantise", "fake_quantise", "Quantised", "int8_matmul", "Int8Linear", "quantise_model",
]

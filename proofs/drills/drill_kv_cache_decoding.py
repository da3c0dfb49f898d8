"""Coding drill: greedy decoding with a key/value cache.

Write `generate_with_cache(model, prompt, steps)` using the model's cache (feed the prompt once, then only
the newest token each step), then run `pytest proofs/drills/drill_kv_cache_decoding.py`.
"""

import torch
from torch import Tensor

from proofs.transformer import DecoderLM

PAGE = "cost/decoding.md"


def generate_with_cache(model: DecoderLM, prompt: Tensor, steps: int) -> Tensor:
    """Greedy continuation of prompt (B, T) by `steps` tokens; returns (B, T + steps) ids.

    Use cache = model.decoder.new_cache() and model(ids_not_yet_seen, cache=cache), which returns the logits
    (B, t, V) of the tokens fed and remembers their keys and values (positions follow the cached ones).
    """
    raise NotImplementedError("write cached greedy decoding here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
from proofs.drills import pick  # noqa: E402
from proofs.transformer import TransformerConfig  # noqa: E402


def reference(model: DecoderLM, prompt: Tensor, steps: int) -> Tensor:
    return model.generate(prompt, steps, use_cache=True)[0]  # the shared model's own cached decoding


def test_same_tokens_as_recomputing_everything():
    f = pick(generate_with_cache, reference)
    torch.manual_seed(8)
    model = DecoderLM(TransformerConfig(vocab_size=20, d_model=32, n_heads=4, d_ff=64, dropout_emb=0.0,
                                        dropout_residual=0.0)).eval()
    prompt = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = model.generate(prompt, 10, use_cache=False)[0]  # every step reruns the whole prefix
        assert torch.equal(f(model, prompt, 10), expected)


def test_each_step_feeds_one_token():
    f = pick(generate_with_cache, reference)
    torch.manual_seed(10)
    model = DecoderLM(TransformerConfig(vocab_size=20, d_model=32, n_heads=4, d_ff=64)).eval()
    lengths = []
    hook = model.embed.register_forward_hook(lambda m, i, o: lengths.append(i[0].shape[1]))
    with torch.no_grad():
        f(model, torch.randint(0, 20, (1, 4)), 6)
    hook.remove()
    assert lengths[0] == 4 and set(lengths[1:]) == {1}, lengths

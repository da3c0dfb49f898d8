"""The rolling (sliding-window) and paged caches against the plain cache and brute-force references.

- the window/sink mask of `hidden` against a loop over (i, j);
- sliding-window attention of one module against a brute-force softmax over the visible keys;
- decoding with RollingKVCache against the full forward pass with the window mask and against the contiguous
  KVCache, for several windows, sinks, position schemes and attention paths; the rolling cache's size bound;
- PagedKVCache against the contiguous cache, rows at different lengths, slots freed and reused, the waste
  bound, and KVCache.truncate with one length per row against recomputing the cut sequences;
- every bad setting raises ConfigError naming the fix.
"""

import pytest
import torch

from proofs.transformer import (BlockPool, ConfigError, DecoderLM, KVCache, MultiHeadAttention, PagedKVCache,
                                RollingKVCache, TransformerConfig, hidden)

V = 16
CFG = TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, max_len=64, dropout_emb=0.0,
                        dropout_residual=0.0)
ATOL = 2e-5


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def lm(**switches) -> DecoderLM:
    return DecoderLM(CFG.replace(**switches)).eval()


@torch.no_grad()
def stepwise(model, ids, cache, first: int = 3):
    """Logits of ids (B, T): the first `first` tokens in one call, then one token per call."""
    outs = [model(ids[:, :first], cache=cache)]
    outs += [model(ids[:, t:t + 1], cache=cache) for t in range(first, ids.shape[1])]
    return torch.cat(outs, 1)


# --- the mask ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window,sinks", [(1, 0), (3, 0), (3, 2), (5, 1), (0, 0)])
def test_window_mask_matches_a_loop(causal, window, sinks):
    T = 9
    pos = torch.arange(T)[None]
    got = hidden(pos, pos, causal, window, sinks)[0, 0]
    for i in range(T):
        for j in range(T):
            visible = (j <= i) if causal else True
            if window:
                near = (i - j < window) if causal else (abs(i - j) < window)
                visible = visible and (near or j < sinks)
            assert bool(got[i, j]) == (not visible), (i, j)


@pytest.mark.parametrize("attn_impl", ["auto", "explicit", "tiled"])
@pytest.mark.parametrize("window,sinks", [(1, 0), (4, 0), (4, 2)])
def test_sliding_window_attention_equals_brute_force(attn_impl, window, sinks):
    """One module, causal, against a softmax over the visible keys of each query written out by hand."""
    cfg = CFG.replace(window=window, attn_sinks=sinks, attn_impl=attn_impl, attn_block=4)
    attn = MultiHeadAttention(cfg).eval()
    x = torch.randn(2, 11, 32)
    with torch.no_grad():
        y = attn(x, causal=True)
        q, k, v = attn.project(x, x)  # (B, nh, T, hs)
        heads = torch.zeros_like(q)
        for i in range(x.shape[1]):
            js = [j for j in range(i + 1) if i - j < window or j < sinks]
            s = q[:, :, i:i + 1] @ k[:, :, js].transpose(-2, -1) * attn.scale  # (B, nh, 1, |js|)
            heads[:, :, i] = (torch.softmax(s, -1) @ v[:, :, js])[:, :, 0]
        ref = attn.w_o(heads.transpose(1, 2).reshape(x.shape))
    assert (y - ref).abs().max().item() < 1e-5


# --- the rolling cache --------------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["sinusoidal", "rope", "alibi", "none"])
@pytest.mark.parametrize("window,sinks", [(1, 0), (4, 0), (4, 2), (6, 1)])
def test_rolling_cache_equals_full_pass_with_window_mask(positions, window, sinks):
    model = lm(positions=positions, window=window, attn_sinks=sinks)
    ids = torch.randint(1, V, (3, 20))
    with torch.no_grad():
        full = model(ids)
    rolling = stepwise(model, ids, model.decoder.new_cache("rolling"))
    contiguous = stepwise(model, ids, model.decoder.new_cache())
    assert (rolling - full).abs().max().item() < ATOL
    assert (contiguous - full).abs().max().item() < ATOL


@pytest.mark.parametrize("attn_impl", ["explicit", "tiled"])
def test_rolling_cache_on_the_other_attention_paths(attn_impl):
    model = lm(window=5, attn_sinks=1, attn_impl=attn_impl, attn_block=4)
    ids = torch.randint(1, V, (2, 17))
    with torch.no_grad():
        full = model(ids)
    assert (stepwise(model, ids, model.decoder.new_cache("rolling")) - full).abs().max().item() < ATOL


def test_rolling_cache_keeps_window_plus_sinks_entries():
    model = lm(window=4, attn_sinks=2)
    cache = model.decoder.new_cache("rolling")
    ids = torch.randint(1, V, (2, 30))
    with torch.no_grad():
        model(ids[:, :3], cache=cache)
        for t in range(3, 30):
            model(ids[:, t:t + 1], cache=cache)
            c = cache[0]["self"]
            kept = c.pos[0].tolist()
            assert kept == sorted({0, 1} | set(range(max(t - 3, 0), t + 1)))  # the sinks and the last `window`
            assert c.nbytes == 2 * 2 * 4 * len(kept) * 8 * 4  # K and V, batch 2, 4 heads, 8 channels, fp32
    assert len(kept) == 6


def test_rolling_cache_without_the_window_mask_is_not_the_full_model():
    """The check above can fail: the cache alone (cfg.window=0) drops keys the unmasked model reads."""
    model = lm()  # no window in the attention
    ids = torch.randint(1, V, (2, 16))
    with torch.no_grad():
        full = model(ids)
    rolled = stepwise(model, ids, model.decoder.new_cache("rolling", window=4))
    assert (rolled[:, :5] - full[:, :5]).abs().max().item() < ATOL  # nothing evicted yet
    assert (rolled[:, 8:] - full[:, 8:]).abs().max().item() > 1e-2


def test_rolling_cache_bad_settings():
    with pytest.raises(ConfigError, match="window >= 1"):
        RollingKVCache(0)
    with pytest.raises(ConfigError, match="window >= 1"):
        RollingKVCache(4, sinks=-1)
    with pytest.raises(ConfigError, match="set cfg.window or pass window="):
        lm().decoder.new_cache("rolling")
    with pytest.raises(ConfigError, match="window=-1 must be >= 0"):
        CFG.replace(window=-1)
    model = lm(window=3)
    cache = model.decoder.new_cache("rolling")
    with torch.no_grad(), pytest.raises(ConfigError, match="use a paged cache"):
        model(torch.randint(1, V, (2, 2)), cache=cache, positions=torch.tensor([[0, 1], [3, 4]]))


# --- the paged cache ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_cache_equals_contiguous(block_size):
    model = lm()
    ids = torch.randint(1, V, (3, 19))
    contiguous = stepwise(model, ids, model.decoder.new_cache())
    paged = stepwise(model, ids, model.decoder.new_cache("paged", batch=3, block_size=block_size))
    assert (paged - contiguous).abs().max().item() < ATOL


def test_paged_rows_at_different_lengths_and_reused_slots():
    """Each slot serves its own sequence at its own length; a freed slot takes a new sequence at position 0."""
    model = lm()
    seqs = [torch.randint(1, V, (n,)) for n in (9, 4, 12, 6)]
    with torch.no_grad():
        refs = [model(s[None])[0] for s in seqs]
    cache = model.decoder.new_cache("paged", batch=2, block_size=4, n_blocks=8)
    got = {0: [], 1: [], 2: [], 3: []}
    plan = {0: [0, 2], 1: [1, 3]}  # slot -> the sequences it serves, one after the other
    cur, fed = {0: 0, 1: 1}, {0: 0, 1: 0}
    with torch.no_grad():
        while cur:
            slots = sorted(cur)
            for layer in cache:
                layer["self"].use_rows(slots)
            toks = torch.tensor([[int(seqs[cur[s]][fed[s]])] for s in slots])
            logits = model(toks, cache=cache)
            for r, s in enumerate(slots):
                got[cur[s]].append(logits[r, 0])
                fed[s] += 1
                if fed[s] == len(seqs[cur[s]]):
                    for layer in cache:
                        layer["self"].free_row(s)
                    plan[s].pop(0)
                    if plan[s]:
                        cur[s], fed[s] = plan[s][0], 0
                    else:
                        del cur[s]
            for layer in cache:
                c = layer["self"]
                assert all(len(t) * 4 - n < 4 for t, n in zip(c.tables, c.lengths))  # < one block wasted per row
    for i, ref in enumerate(refs):
        assert (torch.stack(got[i]) - ref).abs().max().item() < ATOL
    assert sorted(cache[0]["self"].pool.free) == list(range(8))  # every block returned


def test_paged_waste_is_under_one_block_per_sequence():
    pool = BlockPool(n_blocks=400, block_size=8)
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 60, (20,), generator=g).tolist()
    cache = PagedKVCache(pool, batch=20)
    cache.update((torch.zeros(20, 1, 1, 1),), torch.zeros(20, 1, dtype=torch.long))  # one token each
    for b, n in enumerate(lengths):
        cache.use_rows([b])
        if n > 1:
            cache.update((torch.randn(1, 1, n - 1, 1),), torch.zeros(1, n - 1, dtype=torch.long))
    assert cache.lengths == lengths
    assert cache.wasted_slots == sum(-(-n // 8) * 8 - n for n in lengths)
    assert all(len(t) == -(-n // 8) for t, n in zip(cache.tables, lengths))
    assert len(pool.free) == 400 - sum(len(t) for t in cache.tables)


def test_paged_bad_settings():
    with pytest.raises(ConfigError, match="block_size >= 1"):
        BlockPool(4, 0)
    with pytest.raises(ConfigError, match="n_blocks >= 1"):
        BlockPool(0, 16)
    with pytest.raises(ConfigError, match="batch >= 1"):
        PagedKVCache(BlockPool(4, 4), 0)
    model = lm()
    cache = model.decoder.new_cache("paged", batch=2, n_blocks=2, block_size=2)
    with torch.no_grad():
        with pytest.raises(ConfigError, match="the input has 3"):
            model(torch.randint(1, V, (3, 1)), cache=cache)
        with pytest.raises(ConfigError, match="distinct slot ids"):
            cache[0]["self"].use_rows([0, 0])
        with pytest.raises(ConfigError, match="give it more blocks"):
            model(torch.randint(1, V, (2, 3)), cache=cache)  # 2 rows x 3 tokens need 4 blocks of 2


# --- truncation (speculative decoding's rollback) -------------------------------------------------------------

def test_truncate_per_row_equals_recomputing_the_cut_sequences():
    model = lm()
    ids = torch.randint(1, V, (3, 9))
    cache = model.decoder.new_cache()
    lengths = torch.tensor([2, 7, 5])
    nxt = torch.randint(1, V, (3, 1))
    with torch.no_grad():
        model(ids, cache=cache)
        for layer in cache:
            layer["self"].truncate(lengths)
        assert cache[0]["self"].pos.shape[1] == 7  # columns no row needs are dropped
        assert cache[0]["self"].has_gaps
        got = model(nxt, cache=cache, positions=lengths[:, None])[:, 0]
        for b, n in enumerate(lengths.tolist()):
            ref = model(torch.cat([ids[b:b + 1, :n], nxt[b:b + 1]], 1))[0, -1]
            assert (got[b] - ref).abs().max().item() < ATOL


def test_truncate_to_an_int_and_to_nothing():
    c = KVCache()
    k = torch.randn(2, 4, 6, 8)
    c.update((k, k.clone()), torch.arange(6)[None])
    c.truncate(4)
    assert c.entries[0].shape[2] == 4 and torch.equal(c.entries[0], k[:, :, :4]) and not c.has_gaps
    assert c.next_positions(2, 1).tolist() == [[4]]
    c.truncate(0)
    assert not c.filled and len(c) == 0
    with pytest.raises(ConfigError, match="one length per row"):
        c.update((k, k), torch.arange(6)[None])
        c.truncate(torch.tensor([1, 2, 3]))


# --- the serving loop over the paged cache (batching.py) --------------------------------------------------------

def _requests(n=10, seed=4):
    from proofs.transformer.batching import Request

    g = torch.Generator().manual_seed(seed)
    return [Request(torch.randint(1, V, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g),
                    int(torch.randint(1, 12, (1,), generator=g))) for _ in range(n)]


@pytest.mark.parametrize("refill", ["continuous", "static"])
def test_serve_gives_each_request_its_tokens_alone(refill):
    from proofs.transformer.batching import generate_alone, serve

    model = lm()
    reqs = _requests()
    tokens, stats = serve(model, reqs, slots=3, refill=refill, block_size=2, keep_logits=True)
    for r, t, lg in zip(reqs, tokens, stats.logits):
        ref_tokens, ref_logits = generate_alone(model, r)
        assert torch.equal(t, ref_tokens)
        assert (torch.stack(lg) - ref_logits).abs().max().item() < ATOL
    assert stats.busy == sum(r.prompt.numel() + r.max_new - 1 for r in reqs)
    assert stats.idle == stats.steps * 3 - stats.busy
    assert all(w < 2 * a for w, a in zip(stats.wasted_slots, stats.active_rows))  # < one block per active request


def test_continuous_refill_never_finishes_a_request_later():
    from proofs.transformer.batching import serve

    model = lm()
    reqs = _requests(14, seed=9)
    _, cont = serve(model, reqs, slots=4, refill="continuous")
    _, stat = serve(model, reqs, slots=4, refill="static")
    assert all(c <= s for c, s in zip(cont.finish_step, stat.finish_step))
    assert cont.idle < stat.idle


def test_serve_bad_settings():
    from proofs.transformer.batching import Request, serve

    model = lm()
    reqs = _requests(3)
    with pytest.raises(ConfigError, match="slots=0 must be a positive integer"):
        serve(model, reqs, slots=0)
    with pytest.raises(ConfigError, match="refill='lazy' is not one of"):
        serve(model, reqs, slots=2, refill="lazy")
    with pytest.raises(ConfigError, match="block_size >= 1"):
        serve(model, reqs, slots=2, block_size=0)
    with pytest.raises(ConfigError, match="give it more blocks"):
        serve(model, reqs, slots=2, block_size=2, n_blocks=1)
    with pytest.raises(ConfigError, match="max_new=0 must be a positive integer"):
        serve(model, [Request(torch.tensor([1, 2]), 0)], slots=1)
    with pytest.raises(ConfigError, match=r"token ids must lie in \[0, 16\)"):
        serve(model, [Request(torch.tensor([1, 99]), 2)], slots=1)

"""GPT-2 generation through the shared KV cache (oar.models.generation): the cache gives the same
greedy tokens as recomputing every window, batches of different-length prompts give each prompt's
own tokens, the cached logits match Hugging Face's GPT2LMHeadModel with the same weights, sampling
is seeded, streaming yields the same tokens, and decoding allocates no device memory once warm."""

import numpy as np
import pytest
from generation_helpers import assert_decode_allocates_no_device_memory_once_warm, prefill_then_decode_logits

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model(dev):
    import oar
    from oar.models import GPT2, GPT2Config

    oar.manual_seed(5)
    cfg = GPT2Config(vocab_size=97, max_position=40, d_model=32, n_layers=2, n_heads=4, dropout=0.1)
    gpt = GPT2(cfg)
    with oar.no_grad():
        for name, p in gpt.named_parameters():  # larger weights than GPT-2's init, so greedy tokens vary
            if p.ndim == 2 and not name.startswith("wte"):
                p.copy_(oar.mul(p, 10.0))
    return gpt.to(oar.device(dev))


def prompt(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 97, n).astype(np.int64)


def test_greedy_with_cache_equals_greedy_without(model):
    cached = model.generate(prompt(0, 7), 20)
    np.testing.assert_array_equal(cached, model.generate(prompt(0, 7), 20, use_cache=False))
    assert cached.shape == (20,) and cached.dtype == np.int64
    assert len(set(cached.tolist())) > 2  # not a degenerate repeat of one token


def test_a_batch_of_different_lengths_gives_each_prompts_own_tokens(model):
    prompts = [prompt(1, 5), prompt(2, 1), prompt(3, 11)]
    batch = model.generate(prompts, 9)
    for p, row in zip(prompts, batch):
        np.testing.assert_array_equal(row, model.generate(p, 9, use_cache=False))
        np.testing.assert_array_equal(row, model.generate(p, 9))


def test_cached_logits_match_transformers(model):
    tokens = prompt(4, 12)
    hf = model.to_transformers()
    with torch.no_grad():
        ref = hf(torch.from_numpy(tokens[None, :])).logits[0].numpy()
    t = 8
    logits = prefill_then_decode_logits(model, tokens, t, model.wte.weight.device)
    np.testing.assert_allclose(logits, ref[t - 1:], rtol=1e-4, atol=1e-4)


def test_forward_api_is_unchanged_and_training_mode_comes_back(model):
    import oar

    assert model.training
    model.generate(prompt(5, 3), 2)
    assert model.training
    model.eval()
    logits, loss = model(oar.tensor(prompt(5, 6)[None, :], device=model.wte.weight.device))
    model.train()
    assert tuple(logits.shape) == (1, 6, 97) and loss is None


def test_sampling_is_seeded_and_stream_yields_the_same_tokens(model):
    p = prompt(6, 4)
    a = model.generate(p, 14, temperature=0.9, top_p=0.95, seed=7)
    np.testing.assert_array_equal(a, model.generate(p, 14, temperature=0.9, top_p=0.95, seed=7))
    assert not np.array_equal(a, model.generate(p, 14, temperature=0.9, top_p=0.95, seed=8))
    assert list(model.generate(p, 14, temperature=0.9, top_p=0.95, seed=7, stream=True)) == a.tolist()
    np.testing.assert_array_equal(model.generate(p, 6, temperature=1.0, top_k=1, seed=3), model.generate(p, 6))


def test_context_shifts_past_max_position(model):
    tokens = model.generate(prompt(7, 6), 50)  # 56 > max_position 40
    assert tokens.shape == (50,) and tokens.max() < 97


def test_decode_allocates_no_device_memory_once_warm(model):
    assert_decode_allocates_no_device_memory_once_warm(model, [prompt(8, 3), prompt(9, 6)], model.wte.weight.device)


def test_a_prefill_that_does_not_match_begin_prefill_is_named(model):
    import oar
    from oar.models.generation import KVCache

    n_layers, n_heads, head_dim, max_len = model.cache_shape()
    device = model.wte.weight.device
    cache = KVCache(n_layers, 1, n_heads, head_dim, max_len, device)
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        cache.begin_prefill([0], max_len + 1)
    cache.begin_prefill([0], 5)
    tokens = oar.tensor(prompt(10, 6)[None, :], device=device)
    with oar.no_grad(), pytest.raises(ValueError, match="begin_prefill set up 5 tokens"):
        model.forward_cached(tokens, oar.tensor(np.arange(6)[None, :], device=device), cache, 0)

"""Generation with a KV cache (oar.models.generation) on the Llama-style model: the cache gives the
same greedy tokens as recomputing every window, batches of different lengths give each prompt's own
tokens, prefill and decode logits match the model written out in torch, sampling is
seeded, streaming yields the same tokens, and decoding allocates no device memory once warm."""

import numpy as np
import pytest
from generation_helpers import assert_decode_allocates_no_device_memory_once_warm, prefill_then_decode_logits

from oar.models import data

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model(dev):
    import oar
    from oar.models.llama import Llama, LlamaConfig

    cfg = LlamaConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=48, seed=3, init_std=0.08)
    return Llama(cfg).to(oar.device(dev))


def test_greedy_with_cache_equals_greedy_without(model):
    prompt = data.encode("The if statement ")
    cached = model.generate(prompt, 24)
    uncached = model.generate(prompt, 24, use_cache=False)
    np.testing.assert_array_equal(cached, uncached)
    assert cached.shape == (24,) and cached.dtype == np.int64


def test_a_batch_of_different_lengths_gives_each_prompts_own_tokens(model):
    prompts = [data.encode("for x in"), data.encode("A"), data.encode("while True: pass")]
    batch = model.generate(prompts, 10)
    for prompt, row in zip(prompts, batch):
        np.testing.assert_array_equal(row, model.generate(prompt, 10, use_cache=False))


def torch_llama_logits(model, tokens: np.ndarray) -> np.ndarray:
    """Logits [T, V] of the Llama-style model written out in torch (float64) from its weights."""
    cfg = model.cfg
    w = {k: torch.from_numpy(v.numpy()).double() for k, v in model.state_dict().items()}
    t, hd = tokens.shape[0], cfg.head_dim

    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * g

    inv = 1.0 / cfg.rope_theta ** (torch.arange(hd // 2, dtype=torch.float64) / (hd // 2))
    ang = torch.outer(torch.arange(t, dtype=torch.float64), inv).repeat(1, 2)

    def rope(x):
        half = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * ang.cos() + half * ang.sin()

    x = w["tok_emb.weight"][torch.from_numpy(tokens)]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q, k, v = ((h @ w[p + f"attn.w{n}.weight"].T).reshape(t, cfg.n_heads, hd).transpose(0, 1) for n in "qkv")
        att = torch.nn.functional.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + att.transpose(0, 1).reshape(t, -1) @ w[p + "attn.wo.weight"].T
        h = rms(x, w[p + "mlp_norm.weight"])
        gate, up = h @ w[p + "mlp.w1.weight"].T, h @ w[p + "mlp.w3.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.w2.weight"].T
    return (rms(x, w["norm.weight"]) @ w["tok_emb.weight"].T).numpy()


def test_prefill_and_decode_logits_match_torch(model):
    prompt = data.encode("def f(x): return x")
    ref = torch_llama_logits(model, prompt)
    t = len(prompt) - 3
    logits = prefill_then_decode_logits(model, prompt, t, model.tok_emb.weight.device)
    np.testing.assert_allclose(logits, ref[t - 1:], rtol=1e-4, atol=1e-4)


def test_sampling_is_seeded_and_top_k_1_is_greedy(model):
    prompt = data.encode("import ")
    a = model.generate(prompt, 16, temperature=0.9, top_p=0.95, seed=7)
    np.testing.assert_array_equal(a, model.generate(prompt, 16, temperature=0.9, top_p=0.95, seed=7))
    assert not np.array_equal(a, model.generate(prompt, 16, temperature=0.9, top_p=0.95, seed=8))
    np.testing.assert_array_equal(model.generate(prompt, 8, temperature=1.0, top_k=1, seed=3),
                                  model.generate(prompt, 8))


def test_stream_yields_the_same_tokens_and_eos_stops(model):
    prompt = data.encode("class ")
    full = model.generate(prompt, 12, temperature=0.7, seed=2)
    streamed = list(model.generate(prompt, 12, temperature=0.7, seed=2, stream=True))
    assert streamed == full.tolist()
    eos = int(full[4])
    stopped = model.generate(prompt, 12, temperature=0.7, seed=2, eos_token_id=eos)
    first = full.tolist().index(eos)
    np.testing.assert_array_equal(stopped, full[:first + 1])


def test_context_shifts_past_max_seq_len(model):
    tokens = model.generate(data.encode("x = 1\n"), 60)  # 66 > max_seq_len 48
    assert tokens.shape == (60,) and tokens.max() < 256


def test_decode_allocates_no_device_memory_once_warm(model):
    assert_decode_allocates_no_device_memory_once_warm(model, [data.encode("a = b"), data.encode("print(")],
                                                       model.tok_emb.weight.device)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "int4"])
def test_quantized_kv_cache_stays_close(model, kv_cache_dtype):
    from oar.models.generation import KVCache

    prompt = data.encode("The return statement ")
    exact = model.generate(prompt, 12)
    quant = model.generate(prompt, 12, kv_cache_dtype=kv_cache_dtype)
    agree = np.mean(exact == quant)
    assert agree >= (0.75 if kv_cache_dtype == "int8" else 0.5), (exact, quant)
    cfg = model.cfg
    full = KVCache(cfg.n_layers, 2, cfg.n_heads, cfg.head_dim, 32, model.tok_emb.weight.device)
    small = KVCache(cfg.n_layers, 2, cfg.n_heads, cfg.head_dim, 32, model.tok_emb.weight.device, kv_cache_dtype)
    hd = cfg.head_dim  # codes of 1 byte (int8) or half a byte (int4) plus a float32 scale per hd values
    expected = ((hd if kv_cache_dtype == "int8" else hd / 2) + 4) / (4 * hd)
    assert small.nbytes() / full.nbytes() == pytest.approx(expected)


def test_bad_arguments_are_named(model):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        model.generate(data.encode("a"), 2, kv_cache_dtype="int3")
    with pytest.raises(ValueError, match="top_p"):
        model.generate(data.encode("a"), 2, top_p=0.0)
    with pytest.raises(ValueError, match="at least one token"):
        model.generate([data.encode("a"), []], 2)


def test_sample_tokens_follows_the_filtered_distribution():
    from oar.models.generation import sample_tokens

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, 50)) * 2
    probs = torch.softmax(torch.from_numpy(logits[0] / 0.7), 0).numpy()
    order = np.argsort(-probs, kind="stable")
    kept = order[:np.searchsorted(np.cumsum(probs[order]), 0.8) + 1]  # the top-p nucleus
    u = rng.random(4000)
    draws = np.array([sample_tokens(logits, 0.7, 0, 0.8, u[i:i + 1])[0] for i in range(len(u))])
    assert set(draws) <= set(kept.tolist()) and len(set(draws)) == len(kept)
    expected = probs[kept] / probs[kept].sum()
    observed = np.array([(draws == t).mean() for t in kept])
    np.testing.assert_allclose(observed, expected, atol=0.03)  # 4000 draws: ~4 standard errors
    top3 = np.array([sample_tokens(logits, 1.0, 3, 1.0, u[i:i + 1])[0] for i in range(200)])
    assert set(top3) <= set(order[:3].tolist())

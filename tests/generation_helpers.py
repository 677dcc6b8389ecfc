"""Shared by the generation tests: a model's logits when it prefills the first tokens into a KV
cache and then decodes the rest one slot at a time."""

import numpy as np


def prefill_then_decode_logits(model, tokens: np.ndarray, prefill: int, device) -> np.ndarray:
    """Logits (len(tokens) - prefill + 1, vocab): the prefill's last position, then each decode step."""
    import oar
    from oar.models.generation import KVCache

    n_layers, n_heads, head_dim, max_len = model.cache_shape()
    cache = KVCache(n_layers, 1, n_heads, head_dim, max_len, device)
    model.eval()
    try:
        with oar.no_grad():
            cache.begin_prefill([0], prefill)
            logits = [model.forward_cached(oar.tensor(tokens[None, :prefill], device=device),
                                           oar.tensor(np.arange(prefill)[None, :], device=device), cache, 0)
                      .numpy()[0]]
            for slot in range(prefill, len(tokens)):
                cache.open_slot(slot)
                logits.append(model.forward_cached(oar.tensor(tokens[None, slot:slot + 1], device=device),
                                                   oar.tensor(np.asarray([[slot]]), device=device), cache, slot)
                              .numpy()[0])
    finally:
        model.train()
    return np.stack(logits)


def assert_decode_allocates_no_device_memory_once_warm(model, prompts, device) -> None:
    """A sampled, streamed generation of two prompts: after 4 warm-up tokens, 20 more make no plugin
    malloc, while their temporaries still come from the caching allocator."""
    import oar

    stream = model.generate(prompts, 30, temperature=0.8, seed=1, stream=True)
    for _ in range(4):
        next(stream)
    before = oar.memory_stats(device)
    for _ in range(20):
        next(stream)
    after = oar.memory_stats(device)
    stream.close()
    assert after["plugin_mallocs"] == before["plugin_mallocs"], (before, after)
    assert after["num_allocs"] > before["num_allocs"]  # the step's temporaries came from the cache

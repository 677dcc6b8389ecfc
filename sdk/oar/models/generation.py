"""Autoregressive generation with a preallocated KV cache, for any decoder that
speaks the small protocol below (the Llama-style model and GPT-2 do).

    new = generate(model, prompts, max_new_tokens=50, temperature=0.8, top_p=0.9, seed=0)
    for step in generate(model, prompt, 50, stream=True): ...

A model taking part provides

- ``cache_shape()`` -> ``(n_layers, n_heads, head_dim, max_seq_len)``
- ``forward_cached(tokens, positions, cache, start)`` -> logits ``[B, V]`` of the
  last of the ``T`` new tokens: ``tokens`` int64 ``[B, T]`` on the device,
  ``positions`` int64 ``[B, T]`` (each row's own positions: prompts are left
  padded), the :class:`KVCache`, and ``start``, the cache slot of the first token.
  Each attention layer calls ``cache.attend(layer, start, q, k, v)``.

Prompts of different lengths are left padded to a common length, so every row
writes the same cache slot at each step; the cache's additive mask hides the
padding. Sampling draws its uniforms from Oar's Philox stream (the ``rand`` op)
seeded by ``seed``; top-k / top-p filtering and the inverse-CDF pick run on the
host over the ``[B, V]`` logits.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

import oar
import oar.nn.functional as F
from oar import random as oar_random

__all__ = ["KVCache", "generate", "sample_tokens"]

KV_CACHE_DTYPES = (None, "float32", "int8", "int4")


class KVCache:
    """Per-layer key and value buffers ``[B, H, S, hd]`` allocated once, plus the
    additive attention mask ``[B, 1, 1, S]`` of the slot being decoded.

    ``dtype`` ``"int8"`` / ``"int4"`` stores keys and values quantized per
    (row, head, slot) group of ``head_dim`` values with a float32 scale
    (symmetric); int4 packs two values per byte. They are quantized on write and
    dequantized on read (into one reused float32 buffer per layer)."""

    def __init__(self, n_layers: int, batch: int, n_heads: int, head_dim: int, max_len: int,
                 device: Any, dtype: str | None = None):
        if dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {dtype!r} is not one of {KV_CACHE_DTYPES}")
        if dtype == "int4" and head_dim % 2:
            raise ValueError(f"an int4 KV cache packs value pairs: head_dim {head_dim} must be even")
        self.n_layers, self.batch, self.n_heads, self.head_dim = n_layers, batch, n_heads, head_dim
        self.max_len, self.device = max_len, device
        self.dtype = "float32" if dtype is None else dtype
        shape = [batch, n_heads, max_len, head_dim]
        if self.dtype == "float32":
            self.keys = [oar.zeros(shape, device=device) for _ in range(n_layers)]
            self.values = [oar.zeros(shape, device=device) for _ in range(n_layers)]
        else:
            from oar.quantization import kv as kvq

            self._kvq = kvq
            self.keys = [kvq.QuantizedBuffer(shape, self.dtype, device) for _ in range(n_layers)]
            self.values = [kvq.QuantizedBuffer(shape, self.dtype, device) for _ in range(n_layers)]
        self.step_mask = oar.full([batch, 1, 1, max_len], float("-inf"), dtype="float32", device=device)
        self._prefill_mask, self._prefill_length = None, 0

    def nbytes(self) -> int:
        """Bytes the keys and values take on the device (scales included)."""
        if self.dtype == "float32":
            return sum(t.numel() * 4 for t in self.keys + self.values)
        return sum(b.nbytes() for b in self.keys + self.values)

    def begin_prefill(self, pads: Sequence[int], length: int) -> None:
        """Masks for a prompt of ``length`` slots whose row b starts with ``pads[b]`` pad tokens:
        query i sees slots pads[b]..i (a pad query sees itself only, so no row is all -inf). The
        prompt attends over its own ``length`` slots only: causally when no row is padded, else
        through a [B, 1, length, length] mask."""
        if not 0 < length <= self.max_len:
            raise ValueError(f"a prompt of {length} tokens does not fit the KV cache of {self.max_len} slots")
        pads = np.asarray(pads).reshape(-1, 1, 1, 1)
        self._prefill_mask = None
        if pads.any():
            slot = np.arange(length)[None, None, None, :]
            query = np.arange(length)[None, None, :, None]
            hidden = ~(((slot >= pads) & (slot <= query)) | (slot == query))
            mask = np.zeros(hidden.shape, dtype=np.float32)
            mask[hidden] = -np.inf  # (np.where here costs ten times as much on a 512 x 512 prompt)
            self._prefill_mask = oar.tensor(mask, device=self.device)
        slot = np.arange(self.max_len)[None, None, None, :]
        row = np.zeros((pads.shape[0], 1, 1, self.max_len), dtype=np.float32)
        row[~((slot >= pads) & (slot < length))] = -np.inf
        self.step_mask.copy_(oar.tensor(row, device=self.device))
        self._prefill_length = length

    def open_slot(self, slot: int) -> None:
        """Let every row see ``slot`` from now on (the decode step writes it)."""
        if not 0 <= slot < self.max_len:
            raise ValueError(f"cache slot {slot} is outside the cache of {self.max_len} slots")
        oar.slice(self.step_mask, dim=3, start=slot, stop=slot + 1).fill_(0.0)

    def row_view(self, row: int) -> "KVCache":
        """A one-row cache sharing row ``row``'s storage (a server prefills a request in it)."""
        if self.dtype != "float32":
            raise ValueError("row views exist for a float32 KV cache only")
        view = KVCache.__new__(KVCache)
        view.__dict__.update(self.__dict__)
        view.batch = 1
        one = lambda t: oar.slice(t, dim=0, start=row, stop=row + 1)  # noqa: E731
        view.keys, view.values = [one(t) for t in self.keys], [one(t) for t in self.values]
        view.step_mask, view._prefill_mask, view._prefill_length = one(self.step_mask), None, 0
        return view

    def park_row(self, row: int) -> None:
        """Mask row ``row`` down to slot 0 (a free row still computes, and must not see all -inf)."""
        mask = oar.slice(self.step_mask, dim=0, start=row, stop=row + 1)
        mask.fill_(float("-inf"))
        oar.slice(mask, dim=3, start=0, stop=1).fill_(0.0)

    def open_row_slot(self, row: int, slot: int) -> None:
        if not 0 <= slot < self.max_len:
            raise ValueError(f"cache slot {slot} is outside the cache of {self.max_len} slots")
        row_mask = oar.slice(self.step_mask, dim=0, start=row, stop=row + 1)
        oar.slice(row_mask, dim=3, start=slot, stop=slot + 1).fill_(0.0)

    def attend(self, layer: int, start, q, k, v):
        """Write k, v ``[B, H, T, hd]`` at slots start..start+T-1 of ``layer`` (``start`` an int, or
        one slot per row for T = 1, None for a row that writes nothing), then attention of q over
        the whole cache under the current mask; returns ``[B, H, T, hd]``."""
        t = int(q.shape[-2])
        if not isinstance(start, int):
            if self.dtype != "float32" or t != 1:
                raise ValueError("per-row slots need a float32 KV cache and one token per row")
            for row, slot in enumerate(start):
                if slot is not None:
                    for cache, new in ((self.keys[layer], k), (self.values[layer], v)):
                        dst = oar.slice(oar.slice(cache, dim=0, start=row, stop=row + 1), dim=2, start=slot,
                                        stop=slot + 1)
                        dst.copy_(oar.slice(new, dim=0, start=row, stop=row + 1))
            return F.scaled_dot_product_attention(q, self.keys[layer], self.values[layer], attn_mask=self.step_mask,
                                                  training=False)
        if start + t > self.max_len:
            raise ValueError(f"{start + t} tokens do not fit the KV cache of {self.max_len} slots")
        if self.dtype == "float32":
            oar.slice(self.keys[layer], dim=2, start=start, stop=start + t).copy_(k)
            oar.slice(self.values[layer], dim=2, start=start, stop=start + t).copy_(v)
            keys, values = self.keys[layer], self.values[layer]
        else:
            self.keys[layer].write(start, k)
            self.values[layer].write(start, v)
            keys, values = self.keys[layer].read(), self.values[layer].read()
        if t == 1:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.step_mask, training=False)
        if start != 0 or t != self._prefill_length:
            raise ValueError(f"a prefill of {t} tokens at slot {start}: begin_prefill set up "
                             f"{self._prefill_length} tokens at slot 0")
        keys, values = (oar.slice(c, dim=2, start=0, stop=t) for c in (keys, values))
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=self._prefill_mask,
                                              is_causal=self._prefill_mask is None, training=False)


def sample_tokens(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                  uniforms: np.ndarray | None) -> np.ndarray:
    """Pick one token per row of ``logits`` [B, V]: argmax at temperature 0, else the inverse
    CDF at ``uniforms`` [B] of softmax(logits / temperature) kept to the top_k tokens and the
    smallest set whose probability reaches top_p."""
    if temperature <= 0.0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    scaled = logits.astype(np.float64) / temperature
    picks = np.empty(scaled.shape[0], dtype=np.int64)
    for b, row in enumerate(scaled):
        order = np.argsort(-row, kind="stable")
        if 0 < top_k < order.shape[0]:
            order = order[:top_k]
        probs = np.exp(row[order] - row[order[0]])
        probs /= probs.sum()
        if top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        index = int(np.searchsorted(np.cumsum(probs), uniforms[b], side="right"))
        picks[b] = order[min(index, order.shape[0] - 1)]
    return picks


def _rows(input_ids: Any) -> tuple[list[list[int]], bool]:
    """Prompts as lists of ints, and whether a single 1-D prompt was given."""
    if isinstance(input_ids, oar.Tensor):
        input_ids = input_ids.numpy()
    if isinstance(input_ids, np.ndarray) or (input_ids and not isinstance(input_ids[0], (list, tuple, np.ndarray))):
        array = np.asarray(input_ids)
        if array.ndim == 1:
            return [[int(t) for t in array]], True
        if array.ndim != 2:
            raise ValueError(f"input_ids must be 1-D or 2-D, not of shape {array.shape}")
        return [[int(t) for t in row] for row in array], False
    return [[int(t) for t in np.asarray(row).reshape(-1)] for row in input_ids], False


class _Philox:
    """Uniforms from Oar's Philox stream under a seed of our own, leaving the global state as it was."""

    def __init__(self, seed: int | None, device: Any):
        self.state = oar_random.get_rng_state() if seed is None else (int(seed), 0)
        self.own = seed is not None
        self.device = device

    def uniforms(self, n: int) -> np.ndarray:
        if not self.own:
            return oar.rand(n, device=self.device).numpy()
        saved = oar_random.get_rng_state()
        oar_random.set_rng_state(self.state)
        try:
            values = oar.rand(n, device=self.device).numpy()
            self.state = oar_random.get_rng_state()
        finally:
            oar_random.set_rng_state(saved)
        return values


def generate(model: Any, input_ids: Any, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, eos_token_id: int | None = None, stream: bool = False, seed: int | None = None,
             kv_cache_dtype: str | None = None, pad_token_id: int = 0, use_cache: bool = True):
    """Continue each prompt by up to ``max_new_tokens`` (fewer once it emits ``eos_token_id``).

    ``input_ids``: one prompt (1-D ints) or a batch (2-D, or a list of lists of different
    lengths). Returns the new tokens: an int64 array for one prompt, a list of arrays for a
    batch. With ``stream=True`` returns a generator yielding each step's tokens instead (an int
    for one prompt, an int64 array [B] for a batch, ``eos_token_id`` in rows already done).
    ``use_cache=False`` recomputes the whole window every step (the reference for tests).
    When prompt + new tokens outgrow the model's ``max_seq_len``, the context shifts: the
    cache is refilled from the last three quarters of each row."""
    rows, single = _rows(input_ids)
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("generate needs a prompt of at least one token in every row")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, not {max_new_tokens}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], not {top_p}")
    steps = _steps(model, rows, max_new_tokens, temperature, top_k, top_p, eos_token_id, seed,
                   kv_cache_dtype, pad_token_id, use_cache)
    if stream:
        return (int(tokens[0]) for tokens in steps) if single else steps
    new: list[list[int]] = [[] for _ in rows]
    done = [False] * len(rows)
    for tokens in steps:
        for b, token in enumerate(tokens):
            if not done[b]:
                new[b].append(int(token))
                done[b] = eos_token_id is not None and int(token) == eos_token_id
    arrays = [np.asarray(r, dtype=np.int64) for r in new]
    return arrays[0] if single else arrays


def _steps(model, rows, max_new_tokens, temperature, top_k, top_p, eos_token_id, seed, kv_cache_dtype,
           pad_token_id, use_cache) -> Iterator[np.ndarray]:
    n_layers, n_heads, head_dim, max_len = model.cache_shape()
    device = next(iter(model.parameters())).device
    rng = _Philox(seed, device)
    contexts = [list(r) for r in rows]
    done = np.zeros(len(rows), dtype=bool)
    cache = KVCache(n_layers, len(rows), n_heads, head_dim, max_len, device, kv_cache_dtype) if use_cache else None
    was_training = model.training
    model.eval()
    try:
        with oar.no_grad():
            slot = pads = None
            for step in range(max_new_tokens):
                if cache is None:
                    logits = _uncached_logits(model, contexts, max_len, pad_token_id, device)
                elif slot is None or slot >= max_len:
                    keep = max_len if slot is None else max_len - max_len // 4
                    logits, pads, slot = _prefill(model, cache, [c[-keep:] for c in contexts], pad_token_id,
                                                  device)
                else:
                    # the step's tokens and positions in one upload, issued before anything else is queued:
                    # each host-to-device copy waits for the device's queue
                    rows_in = len(contexts)
                    step_in = oar.tensor(np.asarray([[c[-1]] for c in contexts] + [[slot - p] for p in pads],
                                                    dtype=np.int64), device=device)
                    cache.open_slot(slot)
                    logits = model.forward_cached(oar.slice(step_in, dim=0, start=0, stop=rows_in),
                                                  oar.slice(step_in, dim=0, start=rows_in, stop=2 * rows_in),
                                                  cache, slot).numpy()
                    slot += 1
                uniforms = rng.uniforms(len(rows)) if temperature > 0.0 else None
                tokens = sample_tokens(logits, temperature, top_k, top_p, uniforms)
                if eos_token_id is not None:
                    tokens = np.where(done, eos_token_id, tokens)
                    done |= tokens == eos_token_id
                for c, token in zip(contexts, tokens):
                    c.append(int(token))
                yield tokens
                if done.all():
                    break
    finally:
        model.train(was_training)


def _left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    length = max(len(r) for r in rows)
    pads = [length - len(r) for r in rows]
    tokens = np.asarray([[pad_token_id] * p + r for p, r in zip(pads, rows)], dtype=np.int64)
    positions = np.maximum(np.arange(length)[None, :] - np.asarray(pads)[:, None], 0).astype(np.int64)
    return tokens, positions, pads


def _prefill(model, cache: KVCache, rows, pad_token_id, device):
    tokens, positions, pads = _left_pad(rows, pad_token_id)
    length = tokens.shape[1]
    if length > cache.max_len:
        raise ValueError(f"a prompt of {length} tokens is longer than the model's max_seq_len {cache.max_len}")
    cache.begin_prefill(pads, length)
    logits = model.forward_cached(oar.tensor(tokens, device=device), oar.tensor(positions, device=device), cache, 0)
    return logits.numpy(), pads, length


def _uncached_logits(model, contexts, max_len, pad_token_id, device) -> np.ndarray:
    """The last-position logits of each row's last max_len tokens, one full forward per row."""
    out = []
    for c in contexts:
        window = np.asarray(c[-max_len:], dtype=np.int64)[None, :]
        logits = model(oar.tensor(window, device=device))
        if isinstance(logits, tuple):  # GPT-2 returns (logits, loss)
            logits = logits[0]
        out.append(logits[0, -1].numpy())
    return np.stack(out)


def nbytes_per_token(n_layers: int, n_heads: int, head_dim: int, dtype: str | None) -> float:
    """KV-cache bytes per token per row for a cache dtype (scales included)."""
    values = 2 * n_layers * n_heads * head_dim
    scales = 2 * n_layers * n_heads * 4
    if dtype in (None, "float32"):
        return values * 4.0
    return values * (1.0 if dtype == "int8" else 0.5) + scales


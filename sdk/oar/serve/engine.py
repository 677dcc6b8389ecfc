"""Continuous batching: one thread owns the model and a KV cache of ``max_batch``
rows; each request takes a free row, is prefilled alone, then joins the shared
decode step of every active row, one token per row per step. A finished or
cancelled request frees its row at once for the next waiting one."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import oar
from oar.models.generation import KVCache, _Philox, sample_tokens

__all__ = ["Engine", "EngineBusy", "Request"]

_ids = itertools.count(1)


class EngineBusy(RuntimeError):
    """More requests than rows plus the waiting limit."""


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    eos_token_id: int | None = None
    loop: asyncio.AbstractEventLoop | None = None
    queue: asyncio.Queue | None = None
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
    row: int | None = None
    slot: int = 0
    last: int = 0
    generated: int = 0
    rng: Any = None

    def emit(self, item) -> None:
        """Hand a token (int) or the finish reason (str) to the request's event loop."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class Engine:
    def __init__(self, model, max_batch: int = 8, max_waiting: int = 64):
        self.model, self.max_batch, self.max_waiting = model, max_batch, max_waiting
        n_layers, n_heads, head_dim, self.max_len = model.cache_shape()
        self.device = next(iter(model.parameters())).device
        self.cache = KVCache(n_layers, max_batch, n_heads, head_dim, self.max_len, self.device)
        for row in range(max_batch):
            self.cache.park_row(row)
        self.free = list(range(max_batch - 1, -1, -1))
        self.active: dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self.cv = threading.Condition()
        self.stopping = False
        self.counters = {"decode_steps": 0, "rows_in_steps": 0, "max_rows_in_a_step": 0, "finished": 0,
                         "cancelled": 0}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="oar-serve-engine", daemon=True)
        self.thread.start()

    # ---- called from the server's event loop ------------------------------------------------
    def submit(self, request: Request) -> None:
        with self.cv:
            if self.error is not None:
                raise RuntimeError(f"the engine stopped: {self.error}")
            if len(self.waiting) + len(self.active) >= self.max_batch + self.max_waiting:
                raise EngineBusy(f"{self.max_batch} requests running and {self.max_waiting} waiting (the limit)")
            self.waiting.append(request)
            self.cv.notify()

    def cancel(self, request: Request) -> None:
        with self.cv:
            request.cancelled = True
            self.cv.notify()

    def stats(self) -> dict:
        with self.cv:
            return {"active": len(self.active), "waiting": len(self.waiting), "free_rows": len(self.free),
                    "max_batch": self.max_batch, **self.counters}

    def close(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout=30)

    # ---- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        oar.set_device(self.device)
        try:
            with oar.no_grad():
                while True:
                    with self.cv:
                        self._drop_cancelled()
                        while not self.stopping and not self.active and not self.waiting:
                            self.cv.wait()
                        if self.stopping:
                            return
                        admitted = []
                        while self.waiting and self.free:
                            request = self.waiting.popleft()
                            request.row = self.free.pop()
                            self.active[request.row] = request
                            admitted.append(request)
                    for request in admitted:
                        self._prefill(request)
                    if self.active:
                        self._decode_step()
        except BaseException as exc:  # noqa: BLE001 - every waiting client must hear of it
            self.error = exc
            with self.cv:
                for request in list(self.active.values()) + list(self.waiting):
                    request.emit(f"error: {exc}")
            raise

    def _drop_cancelled(self) -> None:
        for request in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(request)
            self.counters["cancelled"] += 1
        for request in [r for r in self.active.values() if r.cancelled]:
            self._release(request, None)
            self.counters["cancelled"] += 1

    def _release(self, request: Request, reason: str | None) -> None:
        self.active.pop(request.row, None)
        self.cache.park_row(request.row)
        self.free.append(request.row)
        if reason is not None:
            self.counters["finished"] += 1
            request.emit(reason)

    def _pick(self, request: Request, logits: np.ndarray) -> None:
        if request.rng is None and request.temperature > 0:
            request.rng = _Philox(request.seed, self.device)
        uniforms = request.rng.uniforms(1) if request.temperature > 0 else None
        token = int(sample_tokens(logits[None, :], request.temperature, request.top_k, request.top_p, uniforms)[0])
        request.last, request.generated = token, request.generated + 1
        request.emit(token)
        reason = None
        if request.eos_token_id is not None and token == request.eos_token_id:
            reason = "stop"
        elif request.generated >= request.max_tokens or request.slot >= self.max_len:
            reason = "length"
        if reason is not None:
            with self.cv:
                self._release(request, reason)

    def _prefill(self, request: Request) -> None:
        view = self.cache.row_view(request.row)
        t = len(request.prompt)
        view.begin_prefill([0], t)
        tokens = oar.tensor(np.asarray([request.prompt], dtype=np.int64), device=self.device)
        positions = oar.tensor(np.arange(t, dtype=np.int64)[None, :], device=self.device)
        logits = self.model.forward_cached(tokens, positions, view, 0).numpy()[0]
        request.slot = t
        self._pick(request, logits)

    def _decode_step(self) -> None:
        with self.cv:
            self._drop_cancelled()
            rows = dict(self.active)
        if not rows:
            return
        tokens = np.zeros((self.max_batch, 1), dtype=np.int64)
        positions = np.zeros((self.max_batch, 1), dtype=np.int64)
        slots: list[int | None] = [None] * self.max_batch
        for row, request in rows.items():
            tokens[row, 0], positions[row, 0], slots[row] = request.last, request.slot, request.slot
            self.cache.open_row_slot(row, request.slot)
        logits = self.model.forward_cached(oar.tensor(tokens, device=self.device),
                                           oar.tensor(positions, device=self.device), self.cache, slots).numpy()
        self.counters["decode_steps"] += 1
        self.counters["rows_in_steps"] += len(rows)
        self.counters["max_rows_in_a_step"] = max(self.counters["max_rows_in_a_step"], len(rows))
        for row, request in rows.items():
            request.slot += 1
            if not request.cancelled:
                self._pick(request, logits[row])



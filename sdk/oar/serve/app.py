"""The HTTP side of ``oar serve``: FastAPI routes over an :class:`Engine`.

POST /v1/completions  {"prompt": text or [token ids], "max_tokens", "temperature", "top_k",
                       "top_p", "seed", "stop_token", "stream"}; text is the byte-level
                       encoding of the shipped tokenizer (oar.models.data)
GET  /health          the engine's counters
Errors are JSON {"error": {"message", "type"}}: 400 malformed, 413 prompt over the limit,
429 over the request limit.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Union

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oar.models import data
from oar.serve.engine import Engine, EngineBusy, Request

__all__ = ["create_app", "run"]


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: Union[str, list[int]]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Union[int, None] = None
    stop_token: Union[int, None] = None
    stream: bool = False
    model: Union[str, None] = None


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def create_app(engine: Engine, model_name: str = "oar-llama", max_tokens_limit: int | None = None) -> FastAPI:
    app = FastAPI(title="oar serve")
    vocab = engine.model.cfg.vocab_size
    prompt_limit = engine.max_len - 1  # room for at least one new token

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, **engine.stats()}

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        try:
            body = CompletionRequest.model_validate(json.loads(await http.body()))
        except json.JSONDecodeError as exc:
            return _error(400, f"the body is not JSON: {exc}", "invalid_request_error")
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
            return _error(400, f"malformed request: {problems}", "invalid_request_error")
        prompt = [int(t) for t in data.encode(body.prompt)] if isinstance(body.prompt, str) else body.prompt
        if not prompt:
            return _error(400, "prompt: at least one token is needed", "invalid_request_error")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            return _error(400, f"prompt: token {bad[0]} is outside the vocabulary [0, {vocab})",
                          "invalid_request_error")
        if len(prompt) > prompt_limit:
            return _error(413, f"prompt of {len(prompt)} tokens is over the limit of {prompt_limit} tokens "
                               f"(the model's max_seq_len {engine.max_len} minus one)", "prompt_too_long")
        if max_tokens_limit is not None and body.max_tokens > max_tokens_limit:
            return _error(400, f"max_tokens {body.max_tokens} is over the limit of {max_tokens_limit}",
                          "invalid_request_error")
        request = Request(prompt=prompt, max_tokens=body.max_tokens, temperature=body.temperature, top_k=body.top_k,
                          top_p=body.top_p, seed=body.seed, eos_token_id=body.stop_token,
                          loop=asyncio.get_running_loop(), queue=asyncio.Queue())
        try:
            engine.submit(request)
        except EngineBusy as exc:
            return _error(429, f"too many requests: {exc}", "rate_limit_error")
        created = int(time.time())
        if body.stream:
            return StreamingResponse(_events(engine, request, model_name, created), media_type="text/event-stream")
        tokens, reason = [], None
        try:
            while True:
                item = await request.queue.get()
                if isinstance(item, str):
                    reason = item
                    break
                tokens.append(item)
        finally:
            engine.cancel(request)  # frees the row if the client went away first
        if reason.startswith("error"):
            return _error(500, reason, "server_error")
        return {"id": f"cmpl-{request.id}", "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "text": data.decode(tokens), "tokens": tokens, "finish_reason": reason}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                          "total_tokens": len(prompt) + len(tokens)}}

    return app


async def _events(engine: Engine, request: Request, model_name: str, created: int):
    """Server-sent events: one chunk per token, a last chunk with the finish reason, then [DONE].
    A client that disconnects cancels this generator, which frees its cache row."""
    try:
        while True:
            item = await request.queue.get()
            done = isinstance(item, str)
            choice = ({"index": 0, "text": "", "tokens": [], "finish_reason": item} if done else
                      {"index": 0, "text": data.decode([item]), "tokens": [item], "finish_reason": None})
            chunk = {"id": f"cmpl-{request.id}", "object": "text_completion", "created": created,
                     "model": model_name, "choices": [choice]}
            yield f"data: {json.dumps(chunk)}\n\n"
            if done:
                yield "data: [DONE]\n\n"
                return
    finally:
        engine.cancel(request)


def run(path: str, device: str | None = None, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 8,
        max_waiting: int = 64, max_tokens_limit: int | None = None) -> None:
    """Load the model file at ``path`` on ``device`` and serve it until interrupted."""
    import os

    import uvicorn

    import oar
    from oar.serve.model_file import load_model

    if device is not None:
        oar.set_device(device)
    model = load_model(path, device=device)
    engine = Engine(model, max_batch=max_batch, max_waiting=max_waiting)
    try:
        uvicorn.run(create_app(engine, os.path.basename(str(path)), max_tokens_limit), host=host, port=port,
                    log_level="warning")
    finally:
        engine.close()

"""``oar serve`` over real HTTP: a uvicorn server in a thread on a free port, httpx clients.
Completions equal the model's own greedy generation, streaming by server-sent events gives the
same tokens, concurrent streams share decode steps, a disconnect frees the cache row, and bad
requests get JSON errors while the server keeps serving."""

import json
import socket
import threading
import time

import numpy as np
import pytest

from oar.models import data

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def served(dev, tmp_path_factory):
    import oar
    from oar.models.llama import Llama, LlamaConfig
    from oar.serve import Engine, create_app, load_model, save_model

    oar.set_device(dev)
    path = tmp_path_factory.mktemp("serve") / "model.safetensors"
    save_model(Llama(LlamaConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=64, seed=2, init_std=0.08)), path)
    model = load_model(path, device=dev)
    engine = Engine(model, max_batch=4, max_waiting=8)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "tiny"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield model, engine, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    engine.close()


def stream_tokens(client, url, body):
    tokens, reason = [], None
    with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return tokens, reason
            choice = json.loads(line[6:])["choices"][0]
            tokens += choice["tokens"]
            reason = choice["finish_reason"] or reason
    raise AssertionError("the stream ended without [DONE]")


def test_completion_equals_the_models_greedy_generation(served):
    model, _, url = served
    prompt = data.encode("def main():")
    with httpx.Client(timeout=60) as client:
        reply = client.post(url + "/v1/completions", json={"prompt": prompt.tolist(), "max_tokens": 12})
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        by_text = client.post(url + "/v1/completions", json={"prompt": "def main():", "max_tokens": 12}).json()
    expected = model.generate(prompt, 12)
    assert choice["tokens"] == expected.tolist() and choice["finish_reason"] == "length"
    assert by_text["choices"][0]["text"] == data.decode(expected)
    assert reply.json()["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 12,
                                     "total_tokens": len(prompt) + 12}


def test_concurrent_streams_share_decode_steps_and_match_alone(served):
    model, engine, url = served
    prompts = ["import os", "x", "while i < 10:", "class A(B):", "return", "print('hi')"]
    results = [None] * len(prompts)

    def client_thread(i):
        with httpx.Client(timeout=120) as client:
            results[i] = stream_tokens(client, url, {"prompt": prompts[i], "max_tokens": 20})

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    for prompt, (tokens, reason) in zip(prompts, results):
        assert tokens == model.generate(data.encode(prompt), 20).tolist() and reason == "length"
    assert engine.stats()["max_rows_in_a_step"] > 1  # requests were decoded together


def test_a_disconnect_frees_the_cache_row(served):
    _, engine, url = served
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", url + "/v1/completions",
                           json={"prompt": "a", "max_tokens": 60, "stream": True}) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("data: "):
                pass
        deadline = time.time() + 30
        while client.get(url + "/health").json()["free_rows"] != engine.max_batch:
            assert time.time() < deadline, engine.stats()
            time.sleep(0.05)
        assert client.post(url + "/v1/completions", json={"prompt": "ok", "max_tokens": 2}).status_code == 200


def test_bad_requests_get_json_errors_and_the_server_keeps_serving(served):
    _, engine, url = served
    with httpx.Client(timeout=60) as client:
        cases = [(b"{not json", 400, "not JSON"),
                 (json.dumps({"prompt": "a", "max_tokens": "many"}).encode(), 400, "max_tokens"),
                 (json.dumps({"prompt": "a", "colour": 1}).encode(), 400, "colour"),
                 (json.dumps({"prompt": [1, 999]}).encode(), 400, "999"),
                 (json.dumps({"prompt": "x" * 200}).encode(), 413, "limit of 63 tokens")]
        for body, status, words in cases:
            reply = client.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
            assert reply.status_code == status, reply.text
            assert words in reply.json()["error"]["message"]
        assert client.get(url + "/health").json()["status"] == "ok"
        assert client.post(url + "/v1/completions", json={"prompt": "ok", "max_tokens": 2}).status_code == 200


def test_the_request_limit(served):
    from oar.serve import EngineBusy, Request

    _, engine, _ = served
    extra = []
    with engine.cv:  # the engine thread cannot admit while we hold its lock
        room = engine.max_batch + engine.max_waiting - len(engine.active) - len(engine.waiting)
        for _ in range(room):
            extra.append(Request(prompt=[1], max_tokens=1))
            engine.submit(extra[-1])
        with pytest.raises(EngineBusy, match="the limit"):
            engine.submit(Request(prompt=[1], max_tokens=1))
    deadline = time.time() + 30
    while engine.stats()["free_rows"] != engine.max_batch or engine.stats()["waiting"]:
        assert time.time() < deadline, engine.stats()
        time.sleep(0.05)


def test_model_file_errors_are_named(tmp_path, dev):
    import oar
    from oar.checkpoint import CheckpointError
    from oar.serve import load_model

    path = tmp_path / "plain.safetensors"
    oar.save({"w": oar.tensor(np.zeros(3, np.float32))}, path)
    with pytest.raises(CheckpointError, match="not a servable model file"):
        load_model(path, device=dev)

"""Inference figures on the demo's Llama-style model trained on the shipped corpus:
validation perplexity per quantization scheme, weight and KV-cache bytes, decode
tokens/s against Hugging Face transformers' generate on torch CPU with the same
weights (and for GPT-2), int4 vs float32 decode (also on a d_model 1024 model whose
weights outgrow the caches), device mallocs per token, time to first token
for a 512-token prompt, and ``oar serve`` under 16 concurrent streaming clients.

    python bench/generate.py [--device npu] [--steps 200] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from common import interleaved_medians, median_seconds, report, select_device  # noqa: E402


def discard(fn):
    """fn as a run for median_seconds (which would take a returned value for its duration)."""
    return lambda: (fn(), None)[1]


def train(dev, steps: int, seed: int = 0):
    import oar
    from oar.models import data
    from oar.models.llama import Llama, LlamaConfig

    cfg = LlamaConfig(d_model=128, n_layers=3, n_heads=4, max_seq_len=64, seed=seed)
    model = Llama(cfg).to(dev)
    batches = data.TextBatches(data.load_corpus(), 24, 64, seed=seed)
    opt = oar.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = oar.optim.lr_scheduler.CosineWithWarmup(opt, max(1, steps // 10), steps, min_lr_ratio=0.1)
    start = time.perf_counter()
    for step in range(steps):
        x, y = (oar.tensor(a, device=dev) for a in batches.batch(step))
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    print(f"trained d_model 128, 3 layers, {steps} steps of 24 x 64 bytes in {time.perf_counter() - start:.0f} s, "
          f"last train loss {loss.item():.3f}")
    return model.eval(), [batches.batch(i, "val") for i in range(4)]


def perplexity(model, val, dev, kv_cache_dtype=None) -> float:
    """exp(mean next-byte cross entropy) over the validation batches, through the KV cache when
    kv_cache_dtype is set (keys and values quantized before attention reads them)."""
    import oar
    from oar.models.generation import KVCache

    losses = []
    with oar.no_grad():
        for x, y in val:
            if kv_cache_dtype is None:
                losses.append(model.loss(oar.tensor(x, device=dev), oar.tensor(y, device=dev)).item())
                continue
            cfg = model.cfg
            cache = KVCache(cfg.n_layers, x.shape[0], cfg.n_heads, cfg.head_dim, cfg.max_seq_len, dev, kv_cache_dtype)
            cache.begin_prefill([0] * x.shape[0], x.shape[1])
            positions = np.broadcast_to(np.arange(x.shape[1]), x.shape).copy()
            logits = model.forward_cached(oar.tensor(x, device=dev), oar.tensor(positions, device=dev), cache, 0,
                                          all_logits=True).numpy().astype(np.float64)
            logits -= logits.max(-1, keepdims=True)
            logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            losses.append(-np.take_along_axis(logp, y[..., None], -1).mean())
    return float(np.exp(np.mean(losses)))


def linear_weight_bytes(model) -> int:
    from oar.quantization import QuantizedLinear
    import oar.nn as nn

    total = 0
    for _, m in model.named_modules():
        if isinstance(m, QuantizedLinear):
            total += m.weight_bytes()
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * 4
    return total


def quantized(model, **scheme):
    from oar.quantization import quantize_weights

    return quantize_weights(copy.deepcopy(model), **scheme)


def decode_speed(model, hf, prompts: np.ndarray, new: int, repeats: int) -> tuple[float, float]:
    import torch

    def ours():
        model.generate(prompts, new)

    def theirs():  # returns None: timed by median_seconds
        with torch.no_grad():
            hf.generate(torch.from_numpy(prompts), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                        attention_mask=torch.ones_like(torch.from_numpy(prompts)), pad_token_id=0)

    ours(), theirs()  # warm
    t_ours, t_theirs = interleaved_medians(ours, theirs, repeats)
    n = prompts.shape[0] * new
    return n / t_ours, n / t_theirs


def int4_vs_float32(model, int4, prompt: np.ndarray, new: int, repeats: int, label: str) -> None:
    """Decode steps only: generating new tokens minus generating one (the prefill and its first
    token), so the int4 prefill's dequantize-then-BLAS path does not count as decode time."""
    full = lambda m: discard(lambda: m.generate(prompt, new))  # noqa: E731
    prefill = lambda m: discard(lambda: m.generate(prompt, 1))  # noqa: E731
    full(model)(), full(int4)()  # warm
    t32, t4 = interleaved_medians(full(model), full(int4), max(repeats, 5))
    p32, p4 = interleaved_medians(prefill(model), prefill(int4), max(repeats, 5))
    steps = new - 1
    report(f"decode tok/s batch 1, int4 weights{label}", steps / (t4 - p4), "float32", steps / (t32 - p32), "tok/s",
           True, 1.5)
    # whether the target is physical: a step bound by weight bytes gains ~8x at int4, one bound by launches none
    for name, m, seconds in (("float32", model, t32 - p32), ("int4", int4, t4 - p4)):
        nbytes = linear_weight_bytes(m)
        print(f"  {name:<8} {1e3 * seconds / steps:7.3f} ms/token, Linear weights {nbytes / 1e6:7.2f} MB/token "
              f"-> {nbytes * steps / seconds / 1e9:5.2f} GB/s (decode steps only)")


def gpt2_decode(dev, prompts8: np.ndarray, new: int, repeats: int, with_hf: bool) -> None:
    """GPT-2 decode through the same KV cache, against HF's GPT2LMHeadModel with the same weights."""
    import oar
    from oar.models import GPT2, GPT2Config

    oar.manual_seed(0)
    gpt = GPT2(GPT2Config(vocab_size=256, max_position=64, d_model=128, n_layers=3, n_heads=4, dropout=0.0))
    gpt = gpt.to(dev).eval()
    for b in (1, 8):
        if with_hf:
            ours, theirs = decode_speed(gpt, gpt.to_transformers(), prompts8[:b], new, repeats)
            report(f"GPT-2 decode tok/s batch {b} (16 + {new})", ours, "HF generate", theirs, "tok/s", True, 1.0)
        else:
            seconds = median_seconds(discard(lambda: gpt.generate(prompts8[:b], new)), repeats)
            print(f"GPT-2 decode tok/s batch {b} (16 + {new}): {b * new / seconds:.1f}")


def mallocs_per_token(model, prompts, dev) -> float:
    import oar

    stream = model.generate(prompts, 40, temperature=0.8, seed=0, stream=True)
    for _ in range(4):
        next(stream)
    before = oar.memory_stats(dev)["plugin_mallocs"]
    count = sum(1 for _ in stream)
    return (oar.memory_stats(dev)["plugin_mallocs"] - before) / (count * len(prompts))


def serve_figures(model, n_clients: int, new: int) -> None:
    import httpx
    import uvicorn

    from oar.serve import Engine, create_app

    engine = Engine(model, max_batch=n_clients, max_waiting=n_clients)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/completions"
    prompts = [f"def f{i}(x):" for i in range(n_clients)]

    def one(prompt, gaps, failures):
        try:
            with httpx.Client(timeout=300) as client:
                with client.stream("POST", url, json={"prompt": prompt, "max_tokens": new, "stream": True}) as r:
                    if r.status_code != 200:
                        failures.append(r.status_code)
                        return 0
                    last, count = time.perf_counter(), 0
                    for line in r.iter_lines():
                        if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["tokens"]:
                            now = time.perf_counter()
                            gaps.append(now - last)
                            last, count = now, count + 1
                    return count
        except Exception as exc:  # noqa: BLE001 - counted as a failed request
            failures.append(repr(exc))
            return 0

    one(prompts[0], [], [])  # warm
    gaps_seq, fails_seq = [], []
    start = time.perf_counter()
    tokens_seq = sum(one(p, gaps_seq, fails_seq) for p in prompts)
    seq_rate = tokens_seq / (time.perf_counter() - start)
    gaps_con, fails_con, counts = [], [], [0] * n_clients

    def worker(i):
        counts[i] = one(prompts[i], gaps_con, fails_con)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    con_rate = sum(counts) / (time.perf_counter() - start)
    report(f"serve {n_clients} concurrent streams", con_rate, "one at a time", seq_rate, "tok/s", True, 1.0)
    for name, gaps in (("one at a time", gaps_seq), (f"{n_clients} concurrent", gaps_con)):
        q = np.percentile(np.asarray(gaps) * 1e3, [50, 99])
        print(f"  time per token, {name:<14} p50 {q[0]:7.2f} ms  p99 {q[1]:7.2f} ms")
    print(f"  requests failed: {len(fails_seq) + len(fails_con)} of {2 * n_clients} "
          f"(max rows in one decode step {engine.stats()['max_rows_in_a_step']})")
    server.should_exit = True
    thread.join(timeout=10)
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=200, help="training steps of the demo model")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma list of: hf, large, gpt2, ttft, serve")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    dev = select_device(args)
    import oar
    from oar.models import data
    from oar.models.generation import nbytes_per_token
    from oar.models.llama import Llama, LlamaConfig

    model, val = train(dev, args.steps)
    cfg = model.cfg
    variants = {"float32": model, "int8": quantized(model, bits=8, group_size=128),
                "int4": quantized(model, bits=4, group_size=128),
                "int4 + Hadamard": quantized(model, bits=4, group_size=128, rotate="hadamard")}
    base = perplexity(model, val, dev)
    print(f"\nvalidation perplexity (4 x 24 x 64 bytes):")
    for name, m in variants.items():
        ppl = perplexity(m, val, dev)
        print(f"  {name:<26} {ppl:8.4f}  ({100 * (ppl / base - 1):+.2f}% vs float32)")
    for kv in ("int8", "int4"):
        ppl = perplexity(variants["int4 + Hadamard"], val, dev, kv_cache_dtype=kv)
        print(f"  {'int4 + Hadamard, ' + kv + ' KV':<26} {ppl:8.4f}  ({100 * (ppl / base - 1):+.2f}% vs float32)")
    f32 = linear_weight_bytes(model)
    print(f"\nweight bytes of the Linear layers (group 128): float32 {f32}, "
          f"int8 {linear_weight_bytes(variants['int8']) / f32:.3f}x, int4 {linear_weight_bytes(variants['int4']) / f32:.3f}x"
          f" (the tied embedding, {cfg.vocab_size * cfg.d_model * 4} bytes, stays float32)")
    kv32 = nbytes_per_token(cfg.n_layers, cfg.n_heads, cfg.head_dim, None)
    print(f"KV-cache bytes per token: float32 {kv32:.0f}, int8 "
          f"{nbytes_per_token(cfg.n_layers, cfg.n_heads, cfg.head_dim, 'int8') / kv32:.3f}x, int4 "
          f"{nbytes_per_token(cfg.n_layers, cfg.n_heads, cfg.head_dim, 'int4') / kv32:.3f}x")

    corpus = data.load_corpus()
    prompts8 = np.stack([corpus[1000 * i:1000 * i + 16] for i in range(1, 9)]).astype(np.int64)
    new = 40
    print()
    if "hf" not in skip:
        hf = model.to_transformers()
        for b in (1, 8):
            ours, theirs = decode_speed(model, hf, prompts8[:b], new, args.repeats)
            report(f"decode tok/s batch {b} (16 + {new})", ours, "HF generate", theirs, "tok/s", True, 1.0)
    int4_vs_float32(model, variants["int4"], prompts8[:1], new, args.repeats, "")
    if "large" not in skip:  # weights far past the caches: decode reads them from memory every token
        large_cfg = LlamaConfig(d_model=1024, n_layers=4, n_heads=16, d_ff=2816, max_seq_len=64, seed=0)
        large = Llama(large_cfg).to(dev).eval()
        int4_vs_float32(large, quantized(large, bits=4, group_size=128), prompts8[:1], 16, args.repeats,
                        ", d_model 1024")
        del large
    if "gpt2" not in skip:
        gpt2_decode(dev, prompts8, new, args.repeats, "hf" not in skip)
    print(f"device mallocs per generated token after warm-up: {mallocs_per_token(model, prompts8, dev):.3f} "
          f"(batch 8, sampled)")

    if "ttft" not in skip:
        long_cfg = LlamaConfig(d_model=128, n_layers=3, n_heads=4, max_seq_len=640, seed=0)
        long_model = Llama(long_cfg).to(dev).eval()
        prompt = np.resize(corpus, 512).astype(np.int64)
        long_model.generate(prompt, 1)
        ours = median_seconds(discard(lambda: long_model.generate(prompt, 1)), args.repeats)
        if "hf" not in skip:
            import torch

            long_hf = long_model.to_transformers()
            ids = torch.from_numpy(prompt[None, :])
            theirs = median_seconds(discard(lambda: long_hf.generate(
                ids, max_new_tokens=1, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)),
                args.repeats)
            report("time to first token, 512 prompt", ours * 1e3, "HF generate", theirs * 1e3, "ms", False, 1.0)
        else:
            print(f"time to first token, 512-token prompt: {ours * 1e3:.1f} ms")
    if "serve" not in skip:
        print()
        serve_figures(model, 16, 32)
    _ = oar


if __name__ == "__main__":
    main()

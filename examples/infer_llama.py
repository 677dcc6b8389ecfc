"""Inference on the Llama-style demo model: export it as ONNX (oar.jit) and check the loaded graph
against eager, save it as a servable model file, quantize it to int4 (Hadamard-rotated), and
generate with the KV cache.

    python examples/train_llama.py --device npu --checkpoint build/demo/llama.safetensors
    python examples/infer_llama.py --device npu --checkpoint build/demo/llama.safetensors

(`make demo` runs both.) Without --checkpoint it uses untrained weights. Prints
the validation loss of float32 and int4 weights, the bytes of each, and a few
sampled bytes from each; exits non-zero if a check fails.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time

import click
import numpy as np

import oar
from oar import quantization, serve
from oar.models import data
from oar.models.llama import Llama, LlamaConfig


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True)
@click.option("--checkpoint", default=None, help="State dict written by examples/train_llama.py.")
@click.option("--seq-len", default=64, show_default=True)
@click.option("--d-model", default=128, show_default=True)
@click.option("--layers", default=3, show_default=True)
@click.option("--heads", default=4, show_default=True)
@click.option("--tokens", default=48, show_default=True)
@click.option("--prompt", default="The \"if\" statement is used ", show_default=True)
def main(device_spec, checkpoint, seq_len, d_model, layers, heads, tokens, prompt) -> None:
    dev = oar.set_device(device_spec)
    cfg = LlamaConfig(d_model=d_model, n_layers=layers, n_heads=heads, max_seq_len=seq_len)
    model = Llama(cfg).to(dev)
    if checkpoint:
        model.load_state_dict(oar.load(checkpoint, device=dev))
    batches = data.TextBatches(data.load_corpus(), 16, seq_len, seed=0)
    val = [tuple(oar.tensor(a, device=dev) for a in batches.batch(i, "val")) for i in range(2)]

    def val_loss(m) -> float:
        with oar.no_grad():
            return sum(m.loss(x, y).item() for x, y in val) / len(val)

    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "llama-int4.safetensors")
        float_loss = val_loss(model.eval())
        float_tokens = model.generate(data.encode(prompt), tokens, temperature=0.7, seed=0)
        # export: the float model as ONNX, run without its Python code, checked against eager
        exported = os.path.join(tmp, "llama.onnx")
        prompt_ids = oar.tensor(np.asarray([data.encode(prompt)], dtype=np.int64), device=dev)
        oar.jit.save(model, exported, (prompt_ids,), dynamic_dims={"tokens": {0: "batch", 1: "seq"}},
                     max_sizes={"seq": seq_len})
        with oar.no_grad():
            eager_logits = model(prompt_ids).numpy()
        loaded_logits = oar.jit.load(exported, device=dev)(prompt_ids).numpy()
        export_error = float(np.abs(loaded_logits - eager_logits).max() / np.abs(eager_logits).max())
        print(f"exported {os.path.getsize(exported) / 1e6:.2f} MB ONNX; oar.jit.load logits vs eager: "
              f"max relative error {export_error:.1e}")
        if not export_error < 1e-5:
            failures.append("exported model's logits within 1e-5 relative of eager")
        quantization.quantize_weights(model, bits=4, group_size=64, rotate="hadamard")
        serve.save_model(model, path)  # what `oar serve PATH` loads
        served = serve.load_model(path, device=dev)
        int4_loss = val_loss(served)
        print(f"model file {os.path.getsize(path) / 1e6:.2f} MB (int4 weights, Hadamard-rotated, group 64)")
    print(f"validation loss: float32 {float_loss:.4f}, int4 {int4_loss:.4f} "
          f"(perplexity {math.exp(float_loss):.3f} -> {math.exp(int4_loss):.3f})")
    if not int4_loss < float_loss + 0.1:
        failures.append("int4 validation loss within 0.1 of float32")
    start = time.perf_counter()
    int4_tokens = served.generate(data.encode(prompt), tokens, temperature=0.7, seed=0)
    seconds = time.perf_counter() - start
    print(f"float32: {prompt}{data.decode(float_tokens)!r}")
    print(f"int4:    {prompt}{data.decode(int4_tokens)!r}  ({tokens / seconds:.0f} tokens/s with the KV cache)")
    batch = served.generate([data.encode("def "), data.encode("The return statement")], 16)
    print(f"a batch of two prompts of different lengths: {[data.decode(b) for b in batch]!r}")
    if not all(len(b) == 16 for b in batch) or np.asarray(int4_tokens).shape != (tokens,):
        failures.append("generation gives the asked number of tokens")
    if failures:
        print(f"FAILED: {failures}")
        sys.exit(1)


if __name__ == "__main__":
    main()

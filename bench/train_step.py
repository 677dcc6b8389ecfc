"""One training step (forward, backward, AdamW) of a 2-layer MLP and of the
Llama-style model on the Oar device vs the same models, from the same initial
weights, in PyTorch eager on the CPU.

    python bench/train_step.py [--device npu] [--repeats 20]

Prints the median step time of each beside the other, the steady-state device
mallocs per step after warm-up (from the caching allocator's stats) and peak
reserved / peak allocated. Checks that both losses agree at step 0.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's spinning OpenMP threads distort a shared machine

import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as tnn
import torch.nn.functional as TF

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# ---- the PyTorch twin of oar.models.llama.Llama (same parameter names) -----------


class TorchAttention(tnn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.wq = tnn.Linear(d_model, d_model, bias=False)
        self.wk = tnn.Linear(d_model, d_model, bias=False)
        self.wv = tnn.Linear(d_model, d_model, bias=False)
        self.wo = tnn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, d = x.shape
        q, k, v = (w(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + mask
        out = torch.softmax(scores, dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, t, d))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class TorchBlock(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = tnn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = TorchAttention(cfg.d_model, cfg.n_heads)
        self.mlp_norm = tnn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = tnn.Module()
        self.mlp.w1 = tnn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.mlp.w3 = tnn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.mlp.w2 = tnn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        h = self.mlp_norm(x)
        return x + self.mlp.w2(TF.silu(self.mlp.w1(h)) * self.mlp.w3(h))


class TorchLlama(tnn.Module):
    """Written independently of oar.models.llama from the same description
    (rotate-half RoPE, additive causal mask, SwiGLU, tied or untied head)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = tnn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = tnn.ModuleList([TorchBlock(cfg) for _ in range(cfg.n_layers)])
        self.norm = tnn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else tnn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        hd = cfg.d_model // cfg.n_heads
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), inv_freq).repeat(1, 2)
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)
        mask = torch.full((cfg.max_seq_len, cfg.max_seq_len), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        cos, sin, mask = self.rope_cos[:t], self.rope_sin[:t], self.mask[:t, :t]
        x = self.tok_emb(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        return TF.linear(x, self.tok_emb.weight) if self.head is None else self.head(x)

    def loss(self, tokens, targets):
        logits = self(tokens)
        return TF.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def torch_twin(cfg, weights: dict[str, np.ndarray]) -> TorchLlama:
    """The twin with ``weights`` (float32 numpy by state_dict name) copied in."""
    model = TorchLlama(cfg)
    model.load_state_dict({name: torch.from_numpy(np.array(w, dtype=np.float32)) for name, w in weights.items()})
    return model


# ---- the benchmark -------------------------------------------------------------------


def torch_train_step(cfg, x_np, y_np, lr: float, betas, weight_decay: float):
    """The PyTorch twin's training step (zero_grad, loss, backward, AdamW) from the weights
    oar.models.llama.init_weights gives; returns the loss."""
    from oar.models.llama import init_weights

    twin = torch_twin(cfg, init_weights(cfg))
    optimizer = torch.optim.AdamW(twin.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    tx, ty = torch.from_numpy(x_np), torch.from_numpy(y_np)

    def step():
        optimizer.zero_grad()
        loss = twin.loss(tx, ty)
        loss.backward()
        optimizer.step()
        return loss
    return step


def mlp_steps(oar, dev, lr: float, betas, weight_decay: float):
    """The 2-layer MLP (Linear 512->1024, GELU, Linear 1024->512, batch 64, MSE loss, AdamW) in
    oar and in torch from the same weights and data: (oar_step, torch_step), each returning the loss."""
    rng = np.random.default_rng(0)
    d_in, d_hidden, batch = 512, 1024, 64
    x_np = rng.standard_normal((batch, d_in), dtype=np.float32)
    y_np = rng.standard_normal((batch, d_in), dtype=np.float32)
    twin = tnn.Sequential(tnn.Linear(d_in, d_hidden), tnn.GELU(), tnn.Linear(d_hidden, d_in))
    model = oar.nn.Sequential(oar.nn.Linear(d_in, d_hidden), oar.nn.GELU(), oar.nn.Linear(d_hidden, d_in))
    with oar.no_grad():
        for (name, ours), (twin_name, theirs) in zip(model.named_parameters(), twin.named_parameters()):
            assert name == twin_name and tuple(ours.shape) == tuple(theirs.shape), (name, twin_name)
            ours.copy_(theirs.detach().numpy())
    model = model.to(dev)
    opt = oar.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    x, y = oar.tensor(x_np, device=dev), oar.tensor(y_np, device=dev)
    tx, ty = torch.from_numpy(x_np), torch.from_numpy(y_np)

    def oar_step():
        opt.zero_grad()
        loss = oar.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        oar.synchronize(dev)
        return loss

    def torch_step():
        twin_opt.zero_grad()
        loss = TF.mse_loss(twin(tx), ty)
        loss.backward()
        twin_opt.step()
        return loss

    return oar_step, torch_step


def compare_steps(name: str, oar_step, torch_step, repeats: int, warmup: int) -> tuple[float, float]:
    """Step 0's losses agree; then the median step times (ms), oar and torch interleaved."""
    ours0, theirs0 = float(oar_step().item()), float(torch_step().item())
    rel = abs(ours0 - theirs0) / abs(theirs0)
    print(f"{name + ' step-0 loss':<34} oar {ours0:.6f}, torch {theirs0:.6f}, relative diff {rel:.2e} "
          f"(target <= 1e-4) {'ok' if rel <= 1e-4 else 'MISSED'}")
    for _ in range(warmup):
        oar_step(), torch_step()
    ours_s, theirs_s = [], []
    for _ in range(repeats):  # interleaved, so drift of the machine hits both alike
        ours_s.append(_timed(oar_step))
        theirs_s.append(_timed(torch_step))
    return statistics.median(ours_s) * 1e3, statistics.median(theirs_s) * 1e3


def _timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main() -> int:
    from common import parse_args, report, select_device

    import oar
    from oar.models import data
    from oar.models.llama import Llama, LlamaConfig

    args = parse_args(__doc__.splitlines()[0])
    dev = select_device(args)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")

    mlp_oar, mlp_torch = mlp_steps(oar, dev, 1e-3, (0.9, 0.999), 0.01)
    mlp_repeats = max(args.repeats, 9)
    ours, theirs = compare_steps("MLP", mlp_oar, mlp_torch, mlp_repeats, warmup=3)
    print(f"device {dev}, MLP Linear 512->1024, GELU, Linear 1024->512, batch 64, MSE, AdamW; median of "
          f"{mlp_repeats} steps after 3 warm-up")
    report("train step MLP 512-1024-512 b64", ours, "torch", theirs, "ms", higher_is_better=False, target=1.2)
    cfg = LlamaConfig(vocab_size=256, d_model=256, n_layers=4, n_heads=4, max_seq_len=128, seed=0)
    batch, seq = 8, 128
    repeats = max(args.repeats, 5)
    warmup = 3
    lr, betas, wd = 1e-3, (0.9, 0.95), 0.1

    batches = data.TextBatches(data.load_corpus(), batch, seq, seed=0)
    x_np, y_np = batches.batch(0)

    model = Llama(cfg).to(dev)
    opt = oar.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=wd)
    x, y = oar.tensor(x_np, device=dev), oar.tensor(y_np, device=dev)

    torch_step = torch_train_step(cfg, x_np, y_np, lr, betas, wd)

    def oar_step():
        opt.zero_grad()
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        oar.synchronize(dev)
        return loss

    ours, theirs = compare_steps("Llama", oar_step, torch_step, repeats, warmup)
    print(f"device {dev}, Llama-style d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
          f"batch {batch} x seq {seq}, vocab {cfg.vocab_size}, AdamW; median of {repeats} steps after {warmup} "
          f"warm-up; torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    report(f"train step d{cfg.d_model} L{cfg.n_layers} b{batch}x{seq}", ours, "torch", theirs, "ms",
           higher_is_better=False, target=1.0)

    # steady state: device mallocs per step after warm-up, and how much the cache holds beyond the peak use
    before = oar.memory_stats(dev)["plugin_mallocs"]
    n = 5
    for _ in range(n):
        oar_step()
    mallocs = (oar.memory_stats(dev)["plugin_mallocs"] - before) / n
    peak_reserved, peak_allocated = oar.max_memory_reserved(dev), oar.max_memory_allocated(dev)
    ratio = peak_reserved / peak_allocated
    print(f"{'device mallocs per step':<34} oar {mallocs:10.1f} (target 0) {'ok' if mallocs == 0 else 'MISSED'}")
    print(f"{'peak reserved / peak allocated':<34} oar {ratio:10.3f} ({peak_reserved / 2**20:.1f} / "
          f"{peak_allocated / 2**20:.1f} MiB, target <= 1.3) {'ok' if ratio <= 1.3 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

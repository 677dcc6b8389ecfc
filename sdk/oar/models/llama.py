"""A Llama-style decoder: token embedding, pre-norm blocks of RMSNorm, causal
multi-head attention with rotary position embeddings and a SwiGLU MLP, a final
RMSNorm and a head tied to the embedding (or its own).

    cfg = LlamaConfig(d_model=128, n_layers=2, n_heads=4, max_seq_len=64)
    model = Llama(cfg)                      # deterministic weights from cfg.seed
    logits = model(tokens)                  # tokens int64 [B, T] -> [B, T, vocab]
    loss = model.loss(tokens, targets)      # mean next-token cross entropy
    model.generate(prompt, 100, temperature=0.8, seed=0)   # KV cache: oar.models.generation

Names of parameters (``state_dict`` keys) follow ``tok_emb``, ``layers.{i}.
attn_norm / attn.wq / attn.wk / attn.wv / attn.wo / mlp_norm / mlp.w1 (gate) /
mlp.w3 (up) / mlp.w2 (down)``, ``norm``, ``head`` (untied only).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

import oar
import oar.nn as nn
import oar.nn.functional as F

__all__ = ["Llama", "LlamaConfig", "init_weights"]


@dataclass
class LlamaConfig:
    vocab_size: int = 256  # bytes
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 0  # 0: SwiGLU's 8/3 * d_model rounded up to a multiple of 64
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    seed: int = 0  # the initial weights are a function of the config, this included

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"rotary embeddings need an even head dim, not {self.d_model // self.n_heads}")
        if self.d_ff <= 0:
            self.d_ff = 64 * math.ceil(8 * self.d_model / 3 / 64)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


def init_weights(cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """The initial weights as float32 numpy arrays by state_dict name, drawn from
    ``cfg.seed``: normal(0, init_std) for embeddings and projections (the
    residual outputs wo and w2 scaled by 1/sqrt(2 n_layers)), ones for norms.
    Linear weights are [out, in] as in torch."""
    rng = np.random.default_rng(cfg.seed)
    d, f, std = cfg.d_model, cfg.d_ff, cfg.init_std
    out_std = std / math.sqrt(2 * cfg.n_layers)

    def normal(shape, s=std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(s)).astype(np.float32)

    w = {"tok_emb.weight": normal((cfg.vocab_size, d))}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        w[p + "attn_norm.weight"] = np.ones(d, np.float32)
        w[p + "attn.wq.weight"] = normal((d, d))
        w[p + "attn.wk.weight"] = normal((d, d))
        w[p + "attn.wv.weight"] = normal((d, d))
        w[p + "attn.wo.weight"] = normal((d, d), out_std)
        w[p + "mlp_norm.weight"] = np.ones(d, np.float32)
        w[p + "mlp.w1.weight"] = normal((f, d))
        w[p + "mlp.w3.weight"] = normal((f, d))
        w[p + "mlp.w2.weight"] = normal((d, f), out_std)
    w["norm.weight"] = np.ones(d, np.float32)
    if not cfg.tie_embeddings:
        w["head.weight"] = normal((cfg.vocab_size, d))
    return w


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x, rotary):
        b, t, d = (int(s) for s in x.shape)
        # [B, T, D] -> [B, H, T, hd]
        q = self.wq(x).reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q, k)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout,
                                             training=self.training)
        # heads x head_dim, not d: under tensor parallelism a rank holds n_heads / tp heads
        return self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    def forward_cached(self, x, cos, sin, cache, layer: int, start: int):
        """Attention of x [B, T, D] at rotary angles cos/sin [B, 1, T, hd] through ``cache``."""
        b, t, d = (int(s) for s in x.shape)
        q = self.wq(x).reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = cache.attend(layer, start, q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)  # gate
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)  # up
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, rotary):
        x = x + self.attn(self.attn_norm(x), rotary)
        return x + self.mlp(self.mlp_norm(x))

    def forward_cached(self, x, cos, sin, cache, layer: int, start: int):
        x = x + self.attn.forward_cached(self.attn_norm(x), cos, sin, cache, layer, start)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig | None = None, device=None):
        super().__init__()
        cfg = LlamaConfig() if cfg is None else cfg
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rotary = nn.RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.load_numpy(init_weights(cfg))
        if device is not None:
            self.to(device)

    def load_numpy(self, weights: dict[str, np.ndarray]) -> None:
        """Set the parameters from float32 arrays by state_dict name (all of them)."""
        self.load_state_dict({name: oar.tensor(array) for name, array in weights.items()})

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens):
        t = int(tokens.shape[1])
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than max_seq_len {self.cfg.max_seq_len}")
        x = self.tok_emb(tokens)
        for layer in self.layers:
            x = layer(x, self.rotary)
        x = self.norm(x)
        if self.head is None:
            return F.linear(x, self.tok_emb.weight)
        return self.head(x)

    def loss(self, tokens, targets):
        """Mean next-token cross entropy of ``tokens`` predicting ``targets`` (both [B, T])."""
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, self.cfg.vocab_size), targets.reshape(-1))

    def cache_shape(self) -> tuple[int, int, int, int]:
        """(n_layers, n_heads, head_dim, max_seq_len): the KV cache oar.models.generation allocates."""
        return self.cfg.n_layers, self.cfg.n_heads, self.cfg.head_dim, self.cfg.max_seq_len

    def forward_cached(self, tokens, positions, cache, start, all_logits: bool = False):
        """Logits [B, V] of the last of tokens [B, T] (int64, at per-row ``positions`` [B, T]),
        whose keys and values go to slots start.. of ``cache`` (see oar.models.generation);
        ``all_logits``: [B, T, V] of every token instead."""
        b, t = (int(s) for s in tokens.shape)
        cos = oar.embedding(self.rotary.cos, positions).reshape(b, 1, t, self.cfg.head_dim)
        sin = oar.embedding(self.rotary.sin, positions).reshape(b, 1, t, self.cfg.head_dim)
        x = self.tok_emb(tokens)
        for i, layer in enumerate(self.layers):
            x = layer.forward_cached(x, cos, sin, cache, i, start)
        if not all_logits:
            x = oar.slice(x, dim=1, start=t - 1, stop=t).reshape(b, self.cfg.d_model)
        x = self.norm(x)
        if self.head is None:
            return F.linear(x, self.tok_emb.weight)
        return self.head(x)

    def generate(self, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, eos_token_id: int | None = None, stream: bool = False,
                 seed: int | None = 0, **options):
        """Continue ``input_ids`` (one prompt or a batch) with a KV cache: see
        :func:`oar.models.generation.generate` (greedy at temperature 0, else sampled from
        Oar's Philox stream seeded by ``seed``). Returns the new tokens as int64 numpy."""
        from oar.models.generation import generate

        return generate(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        eos_token_id=eos_token_id, stream=stream, seed=seed, **options)


    def to_transformers(self):
        """The same model as a Hugging Face ``transformers`` LlamaForCausalLM (float32, CPU torch),
        for comparisons: same config, weights copied."""
        import torch
        from transformers import LlamaConfig as HFConfig, LlamaForCausalLM

        cfg = self.cfg
        hf = LlamaForCausalLM(HFConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
            max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
            tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False))
        names = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                 "head.weight": "lm_head.weight"}
        parts = {"attn_norm": "input_layernorm", "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
                 "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj",
                 "mlp_norm": "post_attention_layernorm", "mlp.w1": "mlp.gate_proj", "mlp.w3": "mlp.up_proj",
                 "mlp.w2": "mlp.down_proj"}
        state = {}
        for name, value in self.state_dict().items():
            if name.startswith("layers."):
                _, i, rest = name.split(".", 2)
                part, leaf = rest.rsplit(".", 1)
                hf_name = f"model.layers.{i}.{parts[part]}.{leaf}"
            else:
                hf_name = names[name]
            state[hf_name] = torch.from_numpy(np.ascontiguousarray(value.numpy()))
        missing, unexpected = hf.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"weights do not map onto LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
        if cfg.tie_embeddings:
            hf.tie_weights()
        return hf.eval()


def _rotate(x, cos, sin):
    """Rotary embedding of x [B, H, T, hd] at per-row angles cos/sin [B, 1, T, hd]."""
    return oar.add(oar.mul(x, cos), oar.mul(nn.RotaryEmbedding.rotate_half(x), sin))

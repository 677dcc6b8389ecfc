"""GPT-2 (Radford et al. 2019) in oar.nn: learned positions, pre-norm blocks with causal
self-attention (separate q/k/v projections) and a tanh-GELU MLP, a final LayerNorm, the
output head tied to the token embedding. Configs from GPT-2 small down to CI sizes."""

from __future__ import annotations

from dataclasses import dataclass

import oar
from oar import nn
from oar.nn import functional as F

__all__ = ["GPT2", "GPT2Config", "GPT2Attention"]


@dataclass
class GPT2Config:
    vocab_size: int = 50257
    max_position: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    dropout: float = 0.1
    eps: float = 1e-5

    @classmethod
    def tiny(cls, vocab_size: int = 100) -> "GPT2Config":
        return cls(vocab_size=vocab_size, max_position=64, d_model=32, n_layers=2, n_heads=4, dropout=0.0)


class GPT2Attention(nn.Module):
    """Causal self-attention over x [B, T, D]. ``past``: an optional (k, v) of earlier positions
    ([B, H, S, hd] each); the result is (out, (k, v)) with those extended by x's positions."""

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not a multiple of n_heads {cfg.n_heads}")
        self.n_heads, self.head_dim, self.dropout = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.dropout
        self.q_proj, self.k_proj = nn.Linear(cfg.d_model, cfg.d_model), nn.Linear(cfg.d_model, cfg.d_model)
        self.v_proj, self.c_proj = nn.Linear(cfg.d_model, cfg.d_model), nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, past=None):
        b, t, d = (int(s) for s in x.shape)
        heads = lambda y: y.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        mask = None
        if past is not None:
            k, v = oar.concat([past[0], k], dim=2), oar.concat([past[1], v], dim=2)
            # queries at positions S..S+T-1 see keys up to their own position (bottom-right aligned)
            mask = F.causal_mask(t, int(k.shape[2]), q.dtype, q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=past is None,
                                             dropout_p=self.dropout, training=self.training)
        out = self.resid_dropout(self.c_proj(out.transpose(1, 2).reshape(b, t, d)))
        return out, (k, v)

    def forward_cached(self, x, cache, layer: int, start):
        """Attention of x [B, T, D] whose keys and values go to slots start.. of ``cache``."""
        b, t, d = (int(s) for s in x.shape)
        heads = lambda y: y.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        out = cache.attend(layer, start, heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.c_proj(out.transpose(1, 2).reshape(b, t, d))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.d_model, eps=cfg.eps), GPT2Attention(cfg)
        self.ln_2, self.mlp = nn.LayerNorm(cfg.d_model, eps=cfg.eps), GPT2MLP(cfg)

    def forward(self, x, past=None):
        attn, present = self.attn(self.ln_1(x), past)
        x = oar.add(x, attn)
        return oar.add(x, self.mlp(self.ln_2(x))), present

    def forward_cached(self, x, cache, layer: int, start):
        x = oar.add(x, self.attn.forward_cached(self.ln_1(x), cache, layer, start))
        return oar.add(x, self.mlp(self.ln_2(x)))


class GPT2(nn.Module):
    """forward(idx [B, T], targets=None, past=None) -> (logits [B, T, V], loss or None); with
    ``return_presents=True`` also the per-layer (k, v) for the next call's ``past``."""

    def __init__(self, cfg: GPT2Config | None = None):
        super().__init__()
        cfg = cfg or GPT2Config()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_position, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList([GPT2Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        for m in self.modules():  # GPT-2's initialization: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None, past=None, return_presents: bool = False):
        b, t = (int(s) for s in idx.shape)
        start = 0 if past is None else int(past[0][0].shape[2])
        if start + t > self.cfg.max_position:
            raise ValueError(f"GPT-2: positions up to {start + t} exceed max_position {self.cfg.max_position}")
        positions = oar.arange(start, start + t, dtype=oar.int64, device=idx.device)
        x = self.drop(oar.add(self.wte(idx), self.wpe(positions)))
        presents = []
        for k, block in enumerate(self.h):
            x, present = block(x, None if past is None else past[k])
            presents.append(present)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.cfg.vocab_size), targets.reshape(-1))
        return (logits, loss, presents) if return_presents else (logits, loss)

    def cache_shape(self) -> tuple[int, int, int, int]:
        """(n_layers, n_heads, head_dim, max_position): the KV cache oar.models.generation allocates."""
        cfg = self.cfg
        return cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.max_position

    def forward_cached(self, tokens, positions, cache, start, all_logits: bool = False):
        """Logits [B, V] of the last of tokens [B, T] (int64, at per-row ``positions`` [B, T]),
        whose keys and values go to slots start.. of ``cache`` (see oar.models.generation);
        ``all_logits``: [B, T, V] of every token instead."""
        b, t = (int(s) for s in tokens.shape)
        x = oar.add(self.wte(tokens), self.wpe(positions))
        for i, block in enumerate(self.h):
            x = block.forward_cached(x, cache, i, start)
        if not all_logits:
            x = oar.slice(x, dim=1, start=t - 1, stop=t).reshape(b, self.cfg.d_model)
        return F.linear(self.ln_f(x), self.wte.weight)

    def generate(self, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, eos_token_id: int | None = None, stream: bool = False,
                 seed: int | None = 0, **options):
        """Continue ``input_ids`` (one prompt or a batch) with a KV cache: see
        :func:`oar.models.generation.generate`. Returns the new tokens as int64 numpy."""
        from oar.models.generation import generate

        return generate(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        eos_token_id=eos_token_id, stream=stream, seed=seed, **options)

    def to_transformers(self):
        """The same model as a Hugging Face ``transformers`` GPT2LMHeadModel (float32, CPU torch),
        for comparisons: same config, weights copied (q/k/v joined into c_attn, Conv1D's [in, out])."""
        import numpy as np
        import torch
        from transformers import GPT2Config as HFConfig, GPT2LMHeadModel

        cfg = self.cfg
        hf = GPT2LMHeadModel(HFConfig(vocab_size=cfg.vocab_size, n_positions=cfg.max_position, n_embd=cfg.d_model,
                                      n_layer=cfg.n_layers, n_head=cfg.n_heads, layer_norm_epsilon=cfg.eps,
                                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None))
        w = {name: np.ascontiguousarray(value.numpy()) for name, value in self.state_dict().items()}
        state = {"transformer.wte.weight": w["wte.weight"], "transformer.wpe.weight": w["wpe.weight"],
                 "transformer.ln_f.weight": w["ln_f.weight"], "transformer.ln_f.bias": w["ln_f.bias"]}
        for i in range(cfg.n_layers):
            ours, theirs = f"h.{i}.", f"transformer.h.{i}."
            for part in ("ln_1", "ln_2"):
                for leaf in ("weight", "bias"):
                    state[f"{theirs}{part}.{leaf}"] = w[f"{ours}{part}.{leaf}"]
            state[theirs + "attn.c_attn.weight"] = np.concatenate(
                [w[f"{ours}attn.{n}_proj.weight"].T for n in "qkv"], axis=1)
            state[theirs + "attn.c_attn.bias"] = np.concatenate([w[f"{ours}attn.{n}_proj.bias"] for n in "qkv"])
            for ours_name, theirs_name in (("attn.c_proj", "attn.c_proj"), ("mlp.c_fc", "mlp.c_fc"),
                                           ("mlp.c_proj", "mlp.c_proj")):
                state[f"{theirs}{theirs_name}.weight"] = w[f"{ours}{ours_name}.weight"].T
                state[f"{theirs}{theirs_name}.bias"] = w[f"{ours}{ours_name}.bias"]
        state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
        missing, unexpected = hf.load_state_dict(state, strict=False)
        missing = [m for m in missing if m != "lm_head.weight" and not m.endswith(".attn.bias")
                   and not m.endswith(".attn.masked_bias")]
        if missing or unexpected:
            raise ValueError(f"weights do not map onto GPT2LMHeadModel: missing {missing}, unexpected {unexpected}")
        hf.tie_weights()
        return hf.eval()

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

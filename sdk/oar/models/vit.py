"""Vision Transformer (Dosovitskiy et al. 2020) in oar.nn: patch embedding by a strided
convolution, a class token, learned positions, pre-norm encoder blocks, a linear head on the
class token. Configs from ViT-B/16 down to CI sizes."""

from __future__ import annotations

from dataclasses import dataclass

import oar
from oar import nn
from oar.nn import functional as F

__all__ = ["ViT", "ViTConfig", "SelfAttention"]


@dataclass
class ViTConfig:
    image_size: int = 224
    patch_size: int = 16
    in_channels: int = 3
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    num_classes: int = 1000
    dropout: float = 0.0
    eps: float = 1e-6

    @classmethod
    def tiny(cls, num_classes: int = 10) -> "ViTConfig":
        return cls(image_size=16, patch_size=4, d_model=32, n_layers=2, n_heads=4, d_ff=64, num_classes=num_classes)


class SelfAttention(nn.Module):
    """Multi-head attention with q/k/v/out projections over [B, T, D], optional mask (additive or
    bool [B, 1, 1, T]), no causal mask."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.n_heads, self.head_dim, self.dropout = n_heads, d_model // n_heads, float(dropout)
        self.q_proj, self.k_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.v_proj, self.out_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x, attn_mask=None):
        b, t, d = (int(s) for s in x.shape)
        heads = lambda y: y.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)),
                                             attn_mask=attn_mask, dropout_p=self.dropout, training=self.training)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class EncoderBlock(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.d_ff, cfg.d_model), nn.Dropout(cfg.dropout))

    def forward(self, x):
        x = oar.add(x, self.attn(self.ln_1(x)))
        return oar.add(x, self.mlp(self.ln_2(x)))


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig | None = None):
        super().__init__()
        cfg = cfg or ViTConfig()
        if cfg.image_size % cfg.patch_size:
            raise ValueError(f"image_size {cfg.image_size} is not a multiple of patch_size {cfg.patch_size}")
        self.cfg = cfg
        patches = (cfg.image_size // cfg.patch_size) ** 2
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.d_model, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(oar.zeros(1, 1, cfg.d_model))
        self.pos_embed = nn.Parameter(oar.zeros(1, patches + 1, cfg.d_model))
        nn.init.normal_(self.pos_embed, 0.0, 0.02)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([EncoderBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.head = nn.Linear(cfg.d_model, cfg.num_classes)

    def forward(self, images):
        shape = [int(s) for s in images.shape]
        if shape[1:] != [self.cfg.in_channels, self.cfg.image_size, self.cfg.image_size]:
            raise ValueError(f"ViT expects images [N, {self.cfg.in_channels}, {self.cfg.image_size}, "
                             f"{self.cfg.image_size}], got {shape}")
        x = self.patch_embed(images)                                   # [N, D, h, w]
        x = x.reshape(shape[0], self.cfg.d_model, -1).transpose(1, 2)  # [N, h*w, D]
        cls = oar.expand(self.cls_token, shape=[shape[0], 1, self.cfg.d_model])
        x = self.dropout(oar.add(oar.concat([cls, x], dim=1), self.pos_embed))
        for block in self.blocks:
            x = block(x)
        x = self.ln(x)
        return self.head(oar.reshape(oar.slice(x, dim=1, start=0, stop=1), shape=[shape[0], -1]))

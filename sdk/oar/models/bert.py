"""A BERT encoder (Devlin et al. 2018) in oar.nn, laid out as Hugging Face's BertModel
(embeddings, encoder.layer.N.{attention, intermediate, output}, pooler): post-norm blocks,
GELU feed-forward, padding masks. Configs from BERT-base down to CI sizes."""

from __future__ import annotations

from dataclasses import dataclass

import oar
from oar import nn
from oar.nn import functional as F

__all__ = ["BertConfig", "BertModel"]


@dataclass
class BertConfig:
    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    max_position: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    eps: float = 1e-12

    @classmethod
    def tiny(cls, vocab_size: int = 100) -> "BertConfig":
        return cls(vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_position=64, dropout=0.0)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embeddings = nn.Embedding(cfg.max_position, cfg.d_model)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.LayerNorm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.max_position = cfg.max_position

    def forward(self, input_ids, token_type_ids=None):
        b, t = (int(s) for s in input_ids.shape)
        if t > self.max_position:
            raise ValueError(f"BERT: sequence of {t} tokens exceeds max_position {self.max_position}")
        positions = oar.arange(t, dtype=oar.int64, device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = oar.zeros(b, t, dtype=oar.int64, device=input_ids.device)
        x = oar.add(oar.add(self.word_embeddings(input_ids), self.position_embeddings(positions)),
                    self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.dropout = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.dropout
        self.query, self.key = nn.Linear(cfg.d_model, cfg.d_model), nn.Linear(cfg.d_model, cfg.d_model)
        self.value = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, mask):
        b, t, d = (int(s) for s in x.shape)
        heads = lambda y: y.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)),
                                             attn_mask=mask, dropout_p=self.dropout, training=self.training)
        return out.transpose(1, 2).reshape(b, t, d)


class BertAddNorm(nn.Module):
    """dense -> dropout -> LayerNorm(. + residual): BertSelfOutput and BertOutput."""

    def __init__(self, d_in: int, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(d_in, cfg.d_model)
        self.LayerNorm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, residual):
        return self.LayerNorm(oar.add(self.dropout(self.dense(x)), residual))


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertAddNorm(cfg.d_model, cfg)

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_ff)

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertAddNorm(cfg.d_ff, cfg)

    def forward(self, x, mask):
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(cfg) for _ in range(cfg.n_layers)])

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        first = oar.reshape(oar.slice(x, dim=1, start=0, stop=1), shape=[int(x.shape[0]), -1])
        return oar.tanh(self.dense(first))


class BertModel(nn.Module):
    """forward(input_ids [B, T], attention_mask [B, T] (1 = token, 0 = padding), token_type_ids)
    -> (last hidden states [B, T, D], pooled [B, D])."""

    def __init__(self, cfg: BertConfig | None = None):
        super().__init__()
        cfg = cfg or BertConfig()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)
        for m in self.modules():  # BERT's initialization: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        b, t = (int(s) for s in input_ids.shape)
        mask = None
        if attention_mask is not None:
            mask = oar.ne(oar.reshape(attention_mask, shape=[b, 1, 1, t]), 0)
        x = self.encoder(self.embeddings(input_ids, token_type_ids), mask)
        return x, self.pooler(x)

"""PyTorch twins of oar.models' ResNet, MobileNetV2, ViT, BERT encoder and GPT-2, written in
torch.nn with the same module and parameter names, and the helpers that copy weights into a
twin and measure how far the two disagree (tests/test_models_real.py, bench/models_real.py)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as tnn
import torch.nn.functional as TF

import oar


# ---- ResNet ------------------------------------------------------------------------------------------

class TorchBasicBlock(tnn.Module):
    expansion = 1

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1 = tnn.Conv2d(cin, width, 3, stride, 1, bias=False), tnn.BatchNorm2d(width)
        self.conv2, self.bn2 = tnn.Conv2d(width, width, 3, 1, 1, bias=False), tnn.BatchNorm2d(width)
        self.relu, self.downsample = tnn.ReLU(), downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class TorchBottleneck(tnn.Module):
    expansion = 4

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1 = tnn.Conv2d(cin, width, 1, bias=False), tnn.BatchNorm2d(width)
        self.conv2, self.bn2 = tnn.Conv2d(width, width, 3, stride, 1, bias=False), tnn.BatchNorm2d(width)
        self.conv3, self.bn3 = tnn.Conv2d(width, width * 4, 1, bias=False), tnn.BatchNorm2d(width * 4)
        self.relu, self.downsample = tnn.ReLU(), downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class TorchResNet(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        block = TorchBasicBlock if cfg.block == "basic" else TorchBottleneck
        self.conv1 = tnn.Conv2d(cfg.in_channels, cfg.width, 7, 2, 3, bias=False)
        self.bn1, self.relu, self.maxpool = tnn.BatchNorm2d(cfg.width), tnn.ReLU(), tnn.MaxPool2d(3, 2, 1)
        cin = cfg.width
        for stage, count in enumerate(cfg.layers):
            width, stride = cfg.width * 2 ** stage, 1 if stage == 0 else 2
            blocks = []
            for k in range(count):
                s = stride if k == 0 else 1
                down = None
                if k == 0 and (s != 1 or cin != width * block.expansion):
                    down = tnn.Sequential(tnn.Conv2d(cin, width * block.expansion, 1, s, bias=False),
                                          tnn.BatchNorm2d(width * block.expansion))
                blocks.append(block(cin, width, s, down))
                cin = width * block.expansion
            setattr(self, f"layer{stage + 1}", tnn.Sequential(*blocks))
        self.avgpool, self.fc = tnn.AdaptiveAvgPool2d(1), tnn.Linear(cin, cfg.num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---- MobileNetV2 -------------------------------------------------------------------------------------

def _make_divisible(v, divisor=8):
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _conv_bn(cin, cout, kernel=3, stride=1, groups=1):
    return tnn.Sequential(tnn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                          tnn.BatchNorm2d(cout), tnn.ReLU6())


class TorchInvertedResidual(tnn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = int(round(cin * expand))
        self.use_residual = stride == 1 and cin == cout
        layers = [_conv_bn(cin, hidden, 1)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, hidden), tnn.Conv2d(hidden, cout, 1, bias=False),
                   tnn.BatchNorm2d(cout)]
        self.conv = tnn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_residual else self.conv(x)


class TorchMobileNetV2(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        cin = _make_divisible(32 * cfg.width_mult)
        last = _make_divisible(cfg.last_channel * max(1.0, cfg.width_mult))
        features = [_conv_bn(cfg.in_channels, cin, stride=2)]
        for t, c, n, s in cfg.settings:
            cout = _make_divisible(c * cfg.width_mult)
            for k in range(n):
                features.append(TorchInvertedResidual(cin, cout, s if k == 0 else 1, t))
                cin = cout
        features.append(_conv_bn(cin, last, 1))
        self.features = tnn.Sequential(*features)
        self.pool = tnn.AdaptiveAvgPool2d(1)
        self.classifier = tnn.Sequential(tnn.Dropout(cfg.dropout), tnn.Linear(last, cfg.num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


# ---- attention models --------------------------------------------------------------------------------

def _heads(y, n_heads):
    b, t, d = y.shape
    return y.reshape(b, t, n_heads, d // n_heads).transpose(1, 2)


def _merge(y):
    b, h, t, hd = y.shape
    return y.transpose(1, 2).reshape(b, t, h * hd)


class TorchSelfAttention(tnn.Module):
    def __init__(self, d, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (tnn.Linear(d, d) for _ in range(4))

    def forward(self, x, attn_mask=None):
        q, k, v = (_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(_merge(TF.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)))


class TorchViTBlock(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.attn = tnn.LayerNorm(cfg.d_model, eps=cfg.eps), TorchSelfAttention(cfg.d_model, cfg.n_heads)
        self.ln_2 = tnn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.mlp = tnn.Sequential(tnn.Linear(cfg.d_model, cfg.d_ff), tnn.GELU(), tnn.Dropout(0.0),
                                  tnn.Linear(cfg.d_ff, cfg.d_model), tnn.Dropout(0.0))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchViT(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        patches = (cfg.image_size // cfg.patch_size) ** 2
        self.patch_embed = tnn.Conv2d(cfg.in_channels, cfg.d_model, cfg.patch_size, cfg.patch_size)
        self.cls_token = tnn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.pos_embed = tnn.Parameter(torch.zeros(1, patches + 1, cfg.d_model))
        self.blocks = tnn.ModuleList([TorchViTBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln, self.head = tnn.LayerNorm(cfg.d_model, eps=cfg.eps), tnn.Linear(cfg.d_model, cfg.num_classes)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], 1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x)[:, 0])


class _TorchBertAddNorm(tnn.Module):
    def __init__(self, d_in, cfg):
        super().__init__()
        self.dense, self.LayerNorm = tnn.Linear(d_in, cfg.d_model), tnn.LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class _TorchBertSelf(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.query, self.key, self.value = (tnn.Linear(cfg.d_model, cfg.d_model) for _ in range(3))

    def forward(self, x, mask):
        q, k, v = (_heads(p(x), self.n_heads) for p in (self.query, self.key, self.value))
        return _merge(TF.scaled_dot_product_attention(q, k, v, attn_mask=mask))


class _TorchBertAttention(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self, self.output = _TorchBertSelf(cfg), _TorchBertAddNorm(cfg.d_model, cfg)

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class _TorchBertLayer(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention = _TorchBertAttention(cfg)
        self.intermediate = tnn.Module()
        self.intermediate.dense = tnn.Linear(cfg.d_model, cfg.d_ff)
        self.output = _TorchBertAddNorm(cfg.d_ff, cfg)

    def forward(self, x, mask):
        x = self.attention(x, mask)
        return self.output(TF.gelu(self.intermediate.dense(x)), x)


class TorchBert(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings = tnn.Module()
        self.embeddings.word_embeddings = tnn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embeddings.position_embeddings = tnn.Embedding(cfg.max_position, cfg.d_model)
        self.embeddings.token_type_embeddings = tnn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.embeddings.LayerNorm = tnn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.encoder = tnn.Module()
        self.encoder.layer = tnn.ModuleList([_TorchBertLayer(cfg) for _ in range(cfg.n_layers)])
        self.pooler = tnn.Module()
        self.pooler.dense = tnn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, ids, attention_mask=None):
        e = self.embeddings
        x = e.word_embeddings(ids) + e.position_embeddings(torch.arange(ids.shape[1])) \
            + e.token_type_embeddings(torch.zeros_like(ids))
        x = e.LayerNorm(x)
        mask = None if attention_mask is None else (attention_mask[:, None, None, :] != 0)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler.dense(x[:, 0]))


class _TorchGPT2Block(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.ln_1, self.ln_2 = tnn.LayerNorm(d, eps=cfg.eps), tnn.LayerNorm(d, eps=cfg.eps)
        self.attn = tnn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "c_proj"):
            setattr(self.attn, name, tnn.Linear(d, d))
        self.mlp = tnn.Module()
        self.mlp.c_fc, self.mlp.c_proj = tnn.Linear(d, 4 * d), tnn.Linear(4 * d, d)
        self.n_heads = cfg.n_heads

    def forward(self, x):
        h, a = self.ln_1(x), self.attn
        q, k, v = (_heads(p(h), self.n_heads) for p in (a.q_proj, a.k_proj, a.v_proj))
        x = x + a.c_proj(_merge(TF.scaled_dot_product_attention(q, k, v, is_causal=True)))
        return x + self.mlp.c_proj(TF.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT2(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte, self.wpe = tnn.Embedding(cfg.vocab_size, cfg.d_model), tnn.Embedding(cfg.max_position, cfg.d_model)
        self.h = tnn.ModuleList([_TorchGPT2Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_f = tnn.LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        loss = None if targets is None else TF.cross_entropy(logits.reshape(-1, self.cfg.vocab_size),
                                                             targets.reshape(-1))
        return logits, loss


# ---- helpers -----------------------------------------------------------------------------------------

def copy_weights(ours, theirs) -> None:
    """Copies every parameter and buffer of the oar model into the torch twin by name (the key sets
    must agree)."""
    mine = ours.state_dict()
    twin = theirs.state_dict()
    if set(mine) != set(twin):
        raise AssertionError(f"state_dict keys differ: only oar {sorted(set(mine) - set(twin))}, "
                             f"only torch {sorted(set(twin) - set(mine))}")
    with torch.no_grad():
        for name, value in twin.items():
            value.copy_(torch.from_numpy(np.asarray(mine[name].numpy()).reshape(tuple(value.shape))))


def _array(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().numpy().astype(np.float64)
    return np.asarray(t if isinstance(t, np.ndarray) else t.numpy(), dtype=np.float64)


def max_rel_error(ours, theirs, floor: float = 1e-30) -> float:
    """max |ours - theirs| / max(max |theirs|, floor) (arrays or tensors)."""
    a, b = _array(ours), _array(theirs)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), floor))


def param_error(ours, theirs, step: float) -> float:
    """The largest max_rel_error over the parameters, by name; a parameter smaller than one
    optimizer step (a zero-initialized bias after the first step) is measured against the step."""
    mine = dict(ours.named_parameters())
    return max(max_rel_error(mine[name], p, floor=step) for name, p in theirs.named_parameters())


def total_fallbacks() -> int:
    return sum(oar.fallback.fallback_stats().values())


__all__ = ["TorchResNet", "TorchMobileNetV2", "TorchViT", "TorchBert", "TorchGPT2", "copy_weights",
           "max_rel_error", "param_error", "total_fallbacks"]

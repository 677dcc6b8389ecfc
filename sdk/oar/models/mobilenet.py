"""MobileNetV2 (Sandler et al. 2018) in oar.nn, laid out as torchvision's (features.N,
classifier.1), with a width multiplier and a settable block table for CI sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

import oar
from oar import nn

__all__ = ["MobileNetV2", "MobileNetV2Config"]

# expansion t, output channels c, repeats n, first stride s (the paper's table 2)
_DEFAULT_SETTINGS = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1],
                     [6, 160, 3, 2], [6, 320, 1, 1]]


@dataclass
class MobileNetV2Config:
    num_classes: int = 1000
    width_mult: float = 1.0
    settings: list = field(default_factory=lambda: [list(row) for row in _DEFAULT_SETTINGS])
    last_channel: int = 1280
    dropout: float = 0.2
    in_channels: int = 3

    @classmethod
    def tiny(cls, num_classes: int = 10) -> "MobileNetV2Config":
        """A CI-sized config: a quarter of the width, one block per stage, 128 final channels."""
        return cls(num_classes=num_classes, width_mult=0.25,
                   settings=[[1, 16, 1, 1], [6, 24, 1, 2], [6, 32, 1, 2], [6, 64, 1, 2], [6, 96, 1, 1]],
                   last_channel=128, dropout=0.0)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's rounding of channel counts: to a multiple of 8, never below 90% of v."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class ConvBNActivation(nn.Sequential):
    """Conv (no bias) -> BatchNorm -> ReLU6 (indices 0, 1, 2 as torchvision)."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                 activation: bool = True):
        layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        super().__init__(*(layers + ([nn.ReLU6()] if activation else [])))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = int(round(cin * expand))
        self.use_residual = stride == 1 and cin == cout
        layers = [ConvBNActivation(cin, hidden, 1)] if expand != 1 else []
        layers += [ConvBNActivation(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        out = self.conv(x)
        return oar.add(x, out) if self.use_residual else out


class MobileNetV2(nn.Module):
    def __init__(self, cfg: MobileNetV2Config | None = None):
        super().__init__()
        cfg = cfg or MobileNetV2Config()
        self.cfg = cfg
        cin = _make_divisible(32 * cfg.width_mult)
        last = _make_divisible(cfg.last_channel * max(1.0, cfg.width_mult))
        features = [ConvBNActivation(cfg.in_channels, cin, stride=2)]
        for t, c, n, s in cfg.settings:
            cout = _make_divisible(c * cfg.width_mult)
            for k in range(n):
                features.append(InvertedResidual(cin, cout, s if k == 0 else 1, t))
                cin = cout
        features.append(ConvBNActivation(cin, last, 1))
        self.features = nn.Sequential(*features)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(last, cfg.num_classes))
        for m in self.modules():  # torchvision's initialization
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.classifier(oar.reshape(x, shape=[int(x.shape[0]), -1]))

"""ResNet (He et al. 2015) in oar.nn, laid out as torchvision's (the same module and
parameter names), with configs from ResNet-18/50 down to CI sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

import oar
from oar import nn

__all__ = ["ResNet", "ResNetConfig", "BasicBlock", "Bottleneck", "resnet18", "resnet50"]


@dataclass
class ResNetConfig:
    block: str = "basic"                      # "basic" (ResNet-18/34) or "bottleneck" (ResNet-50+)
    layers: list = field(default_factory=lambda: [2, 2, 2, 2])
    width: int = 64                           # channels of the stem and of layer1
    num_classes: int = 1000
    in_channels: int = 3

    @classmethod
    def tiny(cls, block: str = "basic", num_classes: int = 10) -> "ResNetConfig":
        """A CI-sized config: one block per stage, 8 base channels."""
        return cls(block=block, layers=[1, 1, 1, 1], width=8, num_classes=num_classes)


def _conv3x3(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(cin, width, stride), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3x3(width, width), nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(oar.add(out, identity))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here, as torchvision's v1.5), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1, self.bn1 = _conv1x1(cin, width), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3x3(width, width, stride), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv1x1(width, width * 4), nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(oar.add(out, identity))


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig | None = None):
        super().__init__()
        cfg = cfg or ResNetConfig()
        if cfg.block not in ("basic", "bottleneck"):
            raise ValueError(f"ResNetConfig.block is 'basic' or 'bottleneck', not {cfg.block!r}")
        if len(cfg.layers) != 4:
            raise ValueError(f"ResNetConfig.layers lists the blocks of 4 stages, not {cfg.layers}")
        self.cfg = cfg
        block = BasicBlock if cfg.block == "basic" else Bottleneck
        self.conv1 = nn.Conv2d(cfg.in_channels, cfg.width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(cfg.width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = cfg.width
        for stage, count in enumerate(cfg.layers):
            width = cfg.width * 2 ** stage
            stride = 1 if stage == 0 else 2
            blocks = []
            for k in range(count):
                s = stride if k == 0 else 1
                down = None
                if k == 0 and (s != 1 or cin != width * block.expansion):
                    down = nn.Sequential(_conv1x1(cin, width * block.expansion, s),
                                         nn.BatchNorm2d(width * block.expansion))
                blocks.append(block(cin, width, s, down))
                cin = width * block.expansion
            setattr(self, f"layer{stage + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, cfg.num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # torchvision: kaiming normal, fan_out
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)
        return self.fc(oar.reshape(self.avgpool(x), shape=[int(x.shape[0]), -1]))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet(ResNetConfig("basic", [2, 2, 2, 2], num_classes=num_classes))


def resnet50(num_classes: int = 1000) -> ResNet:
    return ResNet(ResNetConfig("bottleneck", [3, 4, 6, 3], num_classes=num_classes))

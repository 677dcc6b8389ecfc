"""A small CNN for the 8x8 digits: two 3x3 conv + ReLU + 2x2 max-pool stages, then a linear head.

    [N, 1, 8, 8] -conv-> [N, c1, 8, 8] -pool-> [N, c1, 4, 4] -conv-> [N, c2, 4, 4] -pool-> [N, c2, 2, 2] -linear-> [N, 10]
"""

from __future__ import annotations

import oar.nn as nn
import oar.nn.functional as F

__all__ = ["CNN"]


class CNN(nn.Module):
    def __init__(self, channels: tuple[int, int] = (16, 32), classes: int = 10):
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(1, c1, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1)
        self.fc = nn.Linear(c2 * 2 * 2, classes)

    def forward(self, x):
        """x float32 [N, 1, 8, 8] -> logits [N, classes]."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.reshape(x.shape[0], -1))

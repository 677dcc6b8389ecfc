"""A multilayer perceptron for the 8x8 digits: 64 -> hidden -> hidden -> 10, ReLU."""

from __future__ import annotations

import oar.nn as nn
import oar.nn.functional as F

__all__ = ["MLP"]


class MLP(nn.Module):
    def __init__(self, in_features: int = 64, hidden: int = 128, classes: int = 10, depth: int = 2):
        super().__init__()
        sizes = [in_features] + [hidden] * depth
        self.hidden = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])])
        self.out = nn.Linear(sizes[-1], classes)

    def forward(self, x):
        """x float32 [N, 64] (or [N, 1, 8, 8], flattened here) -> logits [N, classes]."""
        x = x.reshape(x.shape[0], -1)
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.out(x)

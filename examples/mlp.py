"""A multilayer perceptron as an ``nn.Sequential``: each child is one layer.

Example::

    $ pipeplan profile examples/mlp.py -b 8,16,32
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Dense", "build_model", "sample_batch"]

IN_FEATURES = 512
HIDDEN = 1024
CLASSES = 10
DEPTH = 4


class Dense(nn.Module):
    """Linear, layer norm and GELU: one layer of the MLP."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.linear = nn.Linear(cin, cout)
        self.norm = nn.LayerNorm(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.norm(self.linear(x)))


def build_model() -> nn.Module:
    """An input layer, ``DEPTH`` hidden layers and a classifier, as one flat Sequential."""
    torch.manual_seed(0)
    return nn.Sequential(
        Dense(IN_FEATURES, HIDDEN),
        *(Dense(HIDDEN, HIDDEN) for _ in range(DEPTH)),
        nn.Linear(HIDDEN, CLASSES),
    )


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features and class labels (integer targets: cross-entropy loss)."""
    g = torch.Generator().manual_seed(batch_size)
    x = torch.randn(batch_size, IN_FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (batch_size,), generator=g)
    return x, y

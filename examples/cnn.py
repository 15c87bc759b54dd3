"""A small ResNet-style CNN: a stem, residual blocks in an ``nn.Sequential``, a head.

The model itself is not a Sequential, so the profiler captures its forward as a graph and
cuts it between the residual blocks (the largest container), plus the stem and the head.

Example::

    $ pipeplan profile examples/cnn.py -b 1,2,4
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["ResidualBlock", "ResNet", "build_model", "sample_batch"]

IMAGE = 32
CLASSES = 10


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions with batch norm; a 1x1 projection when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """Stem, six residual blocks (widths 32, 64, 128), global pooling and a classifier."""

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.blocks = nn.Sequential(
            ResidualBlock(32, 32),
            ResidualBlock(32, 32),
            ResidualBlock(32, 64, stride=2),
            ResidualBlock(64, 64),
            ResidualBlock(64, 128, stride=2),
            ResidualBlock(128, 128),
        )
        self.fc = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model() -> nn.Module:
    """The model to profile, with fixed initial weights."""
    torch.manual_seed(0)
    return ResNet()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random 32x32 RGB images and class labels."""
    g = torch.Generator().manual_seed(batch_size)
    images = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
    return images, torch.randint(0, CLASSES, (batch_size,), generator=g)

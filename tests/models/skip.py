"""Test model: two inputs, a value computed up front and used by every block, and a residual
that skips the middle blocks, so both must be carried across the cuts between layers."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * scale


class SkipNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        scale = torch.sigmoid(gate)  # used by every block
        h = self.inp(x)
        skip = h  # used again after the last block
        for block in self.blocks:
            h = block(h, scale)
        return self.out(h + skip)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return SkipNet()


def sample_batch(batch_size: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(batch_size)
    x = torch.randn(batch_size, WIDTH, generator=g)
    gate = torch.randn(batch_size, 1, generator=g)
    return (x, gate), torch.randn(batch_size, 1, generator=g)

"""Test model: a value made from a weight alone in the first block (T5's position bias)
and read by every later block, so it crosses cuts as a stage output that depends on no
stage input; it leaves the first block as a view (a transpose)."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 8


class First(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.table = nn.Embedding(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bias = torch.tanh(self.table.weight).t()  # from the weight alone
        return torch.tanh(self.fc(h) + h @ bias), bias


class Later(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(h) + h @ bias)


class PositionBiasNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList([First(), Later(), Later(), Later()])
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, bias = self.blocks[0](self.inp(x))
        for block in self.blocks[1:]:
            h = block(h, bias)
        return self.out(h)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return PositionBiasNet()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 1, generator=g)

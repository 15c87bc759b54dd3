"""Test model: one block (two linear layers) that every layer calls twice, as ALBERT runs one
layer's weights in every block; split between the layers, every stage shares its weights."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 8


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.tanh(self.up(h)))


class Layer(nn.Module):
    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.shared(self.shared(h)))


class RepeatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        shared = Shared()
        self.layers = nn.ModuleList(Layer(shared) for _ in range(4))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return RepeatedNet()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 1, generator=g)

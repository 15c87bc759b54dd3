"""Test model: one table that every layer reads through its own projection, as DeBERTa-v2's
layers read ``rel_embeddings``; split between the layers, every stage shares the table."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 8


class Layer(nn.Module):
    def __init__(self, table: nn.Embedding) -> None:
        super().__init__()
        self.table = table  # one table, registered in every layer
        self.pos = nn.Linear(WIDTH, WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        keys = self.pos(self.table.weight)  # the layer's view of the shared table
        return torch.tanh(self.fc(h) + h @ keys)


class TableNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        table = nn.Embedding(WIDTH, WIDTH)
        self.layers = nn.ModuleList(Layer(table) for _ in range(4))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TableNet()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 1, generator=g)

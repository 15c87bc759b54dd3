"""Test model: a skip tensor that crosses every cut and is used through ``torch.cat`` and
views, so the gradient each stage sends back for it is a strided slice of a larger one."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, joined: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(joined))


class CatSkipNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.out = nn.Linear(2 * WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        skip = h  # crosses every cut after the first layer
        for i, block in enumerate(self.blocks):
            if i % 2:  # through a view: the transposed halves of the skip, flattened back
                side = skip.view(-1, 2, WIDTH // 2).transpose(1, 2).reshape(-1, WIDTH)
            else:
                side = skip
            h = block(torch.cat([h, side], dim=-1))
        return self.out(torch.cat([h, skip], dim=-1))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return CatSkipNet()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 1, generator=g)

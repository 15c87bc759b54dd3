"""Test model: forward branches on a tensor's value, so torch.fx cannot capture it."""

import torch
from torch import nn


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # control flow on a value: not one graph
            x = self.a(x)
        return self.b(x)


def build_model() -> nn.Module:
    return DataDependent()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 4), torch.randn(batch_size, 1)

"""Benchmark model (bench/profile_accuracy.py): four layers of equal-sized matmuls; the
last two do four times the work of the first two, so the second half of the model is 4x
heavier than the first."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 512
BATCH_ROWS = 64  # rows per sample: enough work per matmul that fixed overheads are small


class Repeat(nn.Module):
    def __init__(self, times: int) -> None:
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(times))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc in self.fcs:
            x = torch.relu(fc(x))
        return x


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Repeat(1), Repeat(1), Repeat(4), Repeat(4))


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size * BATCH_ROWS, WIDTH)
    return x, torch.randn(batch_size * BATCH_ROWS, WIDTH)

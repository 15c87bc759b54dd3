"""Test model: BatchNorm in training mode, whose result depends on the microbatch size."""

from __future__ import annotations

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)
    )


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 6), torch.randn(batch_size, 3)

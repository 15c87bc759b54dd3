"""Test model: has sample_batch but forgot build_model."""

import torch


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 4), torch.randn(batch_size, 1)

"""A small MLP whose loss insists on bf16 logits: a run that forgot autocast fails."""

import torch
from torch import nn
from torch.nn import functional as F


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32),
        nn.GELU(), nn.Linear(32, 8),
    )  # fmt: skip


def sample_batch(batch_size):
    x = torch.randn(batch_size, 16)  # the runtime seeds torch per step
    return x, torch.randint(0, 8, (batch_size,))


def loss_fn(outputs, targets):
    if outputs.dtype != torch.bfloat16:
        raise RuntimeError(f"expected bf16 logits under autocast, got {outputs.dtype}")
    return F.cross_entropy(outputs.float(), targets)

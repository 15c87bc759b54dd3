"""An MLP trained in fp16 whose first layer's weight gradient overflows at first.

Input feature 0 is large (about 600) and its weights small, so the forward is ordinary,
but at GradScaler's initial scale (2**16) the first Linear's weight gradient, which fp16
autocast computes in fp16, exceeds fp16's range, while every other gradient fits. Only
the stage holding layer 0 sees the overflow: the others must skip their step with it,
until the scale has backed off enough. The loss insists on fp16 outputs, so a run that
forgot autocast fails.
"""

import torch
from torch import nn
from torch.nn import functional as F


def build_model():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4),
    )  # fmt: skip
    with torch.no_grad():
        model[0].weight[:, 0] *= 1e-3
    return model


def sample_batch(batch_size):
    x = torch.randn(batch_size, 8)  # the runtime seeds torch per step
    x[:, 0] *= 600.0
    return x, torch.randn(batch_size, 4)


def loss_fn(outputs, targets):
    if outputs.dtype != torch.float16:
        raise RuntimeError(f"expected fp16 outputs under autocast, got {outputs.dtype}")
    return F.mse_loss(outputs.float(), targets)

"""A user's model without weights: built on the meta device, then given fake CPU tensors.

The analytic profile must never allocate a weight: a 70B model does not fit a development
machine. ``build_model()`` runs under ``torch.device("meta")``, so every parameter and
buffer it creates is a meta tensor (shape and dtype only; a 405B-parameter model builds in
well under a second). Meta tensors alone would not do for counting: torch.autocast does not
act on them and scaled dot-product attention falls back to its unfused math (materialising
the attention matrix). So each meta tensor becomes a *fake* CPU tensor
(``torch._subclasses.fake_tensor``: still no storage, but CPU dispatch keys), and the model
runs under a ``FakeTensorMode``: autocast casts as on a CPU, attention picks the fused
kernel it would pick there, and nothing is computed. The sample batch (token ids, a few
kilobytes) is converted the same way. Tied parameters stay tied.

Example::

    mode = fake_mode()
    model = build_fake(user, mode)                 # parameters are fake, nothing allocated
    with mode:
        inputs, targets = fake_batch(user, 4, mode)
        split = capture_model(model, inputs)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from planner.errors import InputError
from planner.profile.loader import UserModel

__all__ = ["build_fake", "fake_batch", "fake_mode", "has_values"]


def fake_mode() -> FakeTensorMode:
    """The mode every analytic tensor lives in (real inputs are turned fake on the way in).

    Example::

        with fake_mode():
            x = torch.empty(1 << 40)     # a terabyte, not allocated
    """
    return FakeTensorMode(allow_non_fake_inputs=True)


def has_values(t: torch.Tensor) -> bool:
    """Whether ``t`` holds data (False for meta and fake tensors).

    Example::

        has_values(torch.empty(2, device="meta"))   # False
    """
    return not (t.is_meta or is_fake(t))


def build_fake(user: UserModel, mode: FakeTensorMode) -> nn.Module:
    """``build_model()`` on the meta device, its parameters and buffers then fake CPU
    tensors (see the module docstring); the model is in training mode.

    A parameter the build put on a real device anyway (an explicit ``device=``, a loaded
    checkpoint) is refused: the analytic profile allocates no weights.

    Example::

        model = build_fake(load_model_file("examples/gpt.py"), fake_mode())
    """
    torch.manual_seed(0)
    with torch.device("meta"):
        model = user.build()
    for name, p in model.named_parameters():
        if not p.is_meta:
            raise InputError(
                f"build_model() put parameter {name!r} on {p.device} although the analytic "
                "profile builds the model on the meta device; create parameters without an "
                "explicit device (and load no checkpoint) so that no weights are allocated",
                file=str(user.path),
                field="build_model",
            )
    converted: dict[int, torch.Tensor] = {}
    device = torch.device("cpu")
    for module in model.modules():
        for key, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[key] = _fake(p, mode, device, converted, parameter=True)
        for key, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[key] = _fake(b, mode, device, converted, parameter=False)
    model.train()
    return model


def _fake(
    t: torch.Tensor,
    mode: FakeTensorMode,
    device: torch.device,
    converted: dict[int, torch.Tensor],
    *,
    parameter: bool,
) -> Any:
    """One tensor as a fake tensor on ``device``, the same object for the same input."""
    if id(t) in converted:
        return converted[id(t)]
    if t.is_meta:
        fake = mode.fake_tensor_converter.from_meta_and_device(mode, t.detach(), device)
    else:  # a small real buffer (a constant table): its values do not matter here
        fake = mode.from_tensor(t.detach())
    out: Any = nn.Parameter(fake, requires_grad=t.requires_grad) if parameter else fake
    converted[id(t)] = out
    return out


def fake_batch(user: UserModel, size: int, mode: FakeTensorMode) -> tuple[Any, Any]:
    """``sample_batch(size)`` with every tensor fake (the real batch is a few token ids).

    Example::

        inputs, targets = fake_batch(user, 8, mode)
    """
    inputs, targets = user.batch(size)
    return _to_fake(inputs, mode), _to_fake(targets, mode)


def _to_fake(value: Any, mode: FakeTensorMode) -> Any:
    if isinstance(value, torch.Tensor):
        return value if is_fake(value) else mode.from_tensor(value)
    if isinstance(value, tuple | list):
        return type(value)(_to_fake(v, mode) for v in value)
    if isinstance(value, dict):
        return {k: _to_fake(v, mode) for k, v in value.items()}
    return value

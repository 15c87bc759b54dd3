"""The optimizers pipeplan knows: their torch classes, default rates and state sizes.

One table for the profiler (which times the step and counts the state), the PipeDream
importer (which counts the state) and the runtime (which builds one optimizer per stage):

======== ============================ ========== ===================================
name     torch                        default lr state per byte of parameters
======== ============================ ========== ===================================
adam     ``torch.optim.Adam``         1e-3       2 (two moments)
adamw    ``torch.optim.AdamW``        1e-3       2
momentum ``torch.optim.SGD`` (0.9)    0.01       1 (the momentum buffer)
sgd      ``torch.optim.SGD``          0.01       0
======== ============================ ========== ===================================

Example::

    opt = make_optimizer("adam", model.parameters())
    optimizer_state_bytes(4000, "adam")        # 8000
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from planner.errors import InputError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_LR",
    "STATE_FACTORS",
    "check_optimizer",
    "make_optimizer",
    "optimizer_state_bytes",
]

DEFAULT_LR: dict[str, float] = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "adamw": 1e-3}
"""The learning rate each optimizer gets when none is given."""

STATE_FACTORS: dict[str, int] = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
"""Bytes of optimizer state per byte of parameters."""


def check_optimizer(name: object, *, field: str = "optimizer", file: str | None = None) -> str:
    """``name`` if pipeplan knows the optimizer, else one InputError naming ``field`` (and
    ``file``, where the name came from one).

    Example::

        check_optimizer("adamw", field="--optimizer")   # 'adamw'
    """
    if not isinstance(name, str) or name not in STATE_FACTORS:
        raise InputError(
            f"expected one of {', '.join(STATE_FACTORS)}, got {name!r}",
            file=file,
            field=field,
        )
    return str(name)


def optimizer_state_bytes(param_bytes: int, optimizer: str) -> int:
    """Optimizer state held for ``param_bytes`` of parameters.

    Example::

        optimizer_state_bytes(1000, "adam")   # 2000
    """
    return STATE_FACTORS[check_optimizer(optimizer, field="--optimizer")] * param_bytes


def make_optimizer(
    name: str, params: Iterable[torch.Tensor], lr: float | None = None
) -> torch.optim.Optimizer:
    """The torch optimizer for a profile's ``optimizer`` field; ``lr`` overrides its rate.

    Example::

        make_optimizer("momentum", model.parameters(), lr=0.1)
    """
    import torch

    check_optimizer(name)
    rate = DEFAULT_LR[name] if lr is None else lr
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=rate)
    if name == "momentum":
        return torch.optim.SGD(params, lr=rate, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=rate)
    return torch.optim.Adam(params, lr=rate)

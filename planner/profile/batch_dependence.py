"""Models whose result depends on the microbatch size, found by looking at their modules.

Pipelined training computes each microbatch on its own, so it equals single-process
training that accumulates gradients over the same microbatches; it equals one pass over
the global batch only when the model treats every sample independently. What can be found
reliably from the modules alone is a :class:`torch.nn.modules.batchnorm._BatchNorm`
(``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, the lazy ones) that normalises with the batch's
statistics: in training mode, or without running statistics. ``pipeplan profile`` and
``pipeplan run`` warn once, on one line, when a model has one (docs/run.md says what
else makes a model depend on the microbatch size and cannot be seen this way).

Example::

    names = batch_dependent_modules(model)         # ['bn1 (BatchNorm2d)', ...]
    line = batch_dependence_warning(names)         # one line, or None
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["batch_dependence_warning", "batch_dependent_modules"]


def batch_dependent_modules(model: nn.Module) -> list[str]:
    """``"name (Class)"`` of every module that normalises over the batch it is given.

    Example::

        batch_dependent_modules(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
        # ['1 (BatchNorm1d)']
    """
    from torch.nn.modules.batchnorm import _BatchNorm  # lazy: pulls torch

    return [
        f"{name or '(the model)'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if isinstance(module, _BatchNorm) and (module.training or not module.track_running_stats)
    ]


def batch_dependence_warning(names: Sequence[str], *, shown: int = 3) -> str | None:
    """One line saying that the model's result depends on the microbatch size, naming the
    first ``shown`` modules; None when ``names`` is empty.

    Example::

        batch_dependence_warning(["bn1 (BatchNorm2d)"])
    """
    if not names:
        return None
    listed = ", ".join(names[:shown])
    if len(names) > shown:
        listed += f" and {len(names) - shown} more"
    return (
        f"the model's result depends on the microbatch size: BatchNorm normalises over each "
        f"microbatch ({listed}), so pipelined training equals one process accumulating "
        "gradients over the same microbatches, not one pass over the global batch "
        "(docs/run.md, 'What run promises')"
    )

"""The optimizer a profile names, per stage; and PipeDream-2BW's double-buffered weights.

The optimizers themselves are :mod:`planner.optimizers`'s (``adam``, ``adamw``,
``momentum``, ``sgd``, with their default rates); ``lr`` overrides the rate. Each stage has
its own optimizer over its own parameters, which is the same as one optimizer over the
whole model for these element-wise rules.

2BW (Narayanan et al., 2021) keeps two weight versions: the gradient of iteration ``t`` is
computed with the weights of iteration ``t - 1`` and applied to those of iteration ``t``,

    W(t+1) = W(t) - lr * grad f(W(t-1))        (one-step-stale gradients),

which :class:`TwoBufferedWeights` implements around any of the optimizers above: the
module runs on the stale version, the optimizer owns the current one.

Example::

    opt = make_optimizer("adam", stage.parameters())
    step = TwoBufferedWeights(stage.parameters(), "adam") if two_bw else PlainStep(opt)
    step.step()       # after the flush (or at STEP under 2bw)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from planner.optimizers import DEFAULT_LR, make_optimizer

__all__ = ["DEFAULT_LR", "PlainStep", "StreamedTwoBW", "TwoBufferedWeights", "make_optimizer"]


class PlainStep:
    """Synchronous training: step the optimizer, then clear the gradients."""

    def __init__(self, params: Iterable[torch.nn.Parameter], name: str, lr: float | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = make_optimizer(name, self.params, lr) if self.params else None

    def step(self, iteration: int = 0) -> None:
        if self.optimizer is None:  # a stage without parameters (an activation, say)
            return
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)  # keep the buffers: no page faults

    def skip(self, iteration: int = 0) -> None:
        """An iteration whose step is dropped (fp16 overflow): clear the gradients only."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=False)


class TwoBufferedWeights:
    """PipeDream-2BW: the module computes with ``W(t-1)``; the optimizer owns ``W(t)``.

    At each step the gradients (of ``W(t-1)``) update ``W(t)`` into ``W(t+1)``, and the
    module moves on to ``W(t)``. Two versions are alive between steps, as in 2BW.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], name: str, lr: float | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.current = [p.detach().clone() for p in self.params]  # W(t), optimizer-owned
        self.optimizer = make_optimizer(name, self.current, lr) if self.params else None

    def step(self, iteration: int = 0) -> None:
        if self.optimizer is None:
            return
        with torch.no_grad():
            newer = [c.clone() for c in self.current]  # becomes the module's W(t)
            for c, p in zip(self.current, self.params, strict=True):
                c.grad = p.grad
            self.optimizer.step()  # current: W(t) -> W(t+1)
            for p, w in zip(self.params, newer, strict=True):
                p.copy_(w)
                p.grad = None
            for c in self.current:
                c.grad = None

    def state(self) -> list[Any]:
        """The optimizer-owned (newest) weights."""
        return list(self.current)


class StreamedTwoBW:
    """PipeDream-2BW over a stream of iterations without a flush.

    Iteration ``i`` computes with ``W(i-1)`` (``W(-1) = W(0)``), so its forwards may start
    while iteration ``i-1`` still runs backwards on the version before. Every iteration
    gets its own leaf tensors (``weights(i)``) holding that version; ``step(i)`` applies
    their gradients to the optimizer-owned ``W(i)`` and makes ``W(i+1)``, the version of
    iteration ``i + 2``. Two versions are live at a time, as in 2BW.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], name: str, lr: float | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.current = [p.detach().clone() for p in self.params]
        self.optimizer = make_optimizer(name, self.current, lr) if self.params else None
        self.versions = {0: self._version(), 1: self._version()}

    def _version(self) -> list[torch.Tensor]:
        return [c.detach().clone().requires_grad_(True) for c in self.current]

    def weights(self, iteration: int) -> list[torch.Tensor]:
        """The leaf tensors iteration ``iteration`` computes with."""
        if iteration not in self.versions:
            raise RuntimeError(
                f"2bw: the weights of iteration {iteration} are not ready; the schedule needs "
                "at least as many microbatches as stages"
            )
        return self.versions[iteration]

    def step(self, iteration: int = 0) -> None:
        used = self.versions.pop(iteration)
        if self.optimizer is None:
            self.versions[iteration + 2] = []
            return
        with torch.no_grad():
            for c, v in zip(self.current, used, strict=True):
                c.grad = v.grad if v.grad is not None else torch.zeros_like(c)
            self.optimizer.step()
            for c in self.current:
                c.grad = None
        self.versions[iteration + 2] = self._version()

    def state(self) -> list[Any]:
        """The optimizer-owned (newest) weights."""
        return list(self.current)

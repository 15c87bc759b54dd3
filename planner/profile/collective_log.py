"""The collectives a tensor-parallel shard issues, seen as they are dispatched.

torch's tensor parallelism (DTensor, behind ``parallelize_module``) communicates through
the functional collectives (``_c10d_functional.all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``): in the parallel styles' hooks, in the backward of their
redistributions, and inside DTensor operations whose inputs must change layout. A
``TorchDispatchMode`` sees every one of them, with its tensor, which is what
torch's own ``CommDebugMode`` counts; :class:`CollectiveLog` records each as a
:class:`~planner.profile.sharding.Collective` (the whole tensor's bytes: the tensor
all-reduced, the all-gather's output, the reduce-scatter's input) in the phase it is told.
It lets DTensor run its operations first (returning ``NotImplemented`` on DTensor
arguments), so that the collectives DTensor issues inside an operation are seen too.

:class:`ShardOpCounter` is the analytic profile's counter for a sharded layer: it counts
the local operations each rank runs (the DTensor-level operation is deferred to DTensor,
and the global-shape shadow operations DTensor runs on fake tensors to find output shapes
are not counted), and records the collectives instead of charging them as compute.

Example::

    log = CollectiveLog()
    with log:
        out = layer(x)
        log.phase = "backward"
        out.sum().backward()
    [(c.op, c.bytes, c.phase) for c in log.collectives]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.errors import InputError
from planner.profile.roofline import OpCounter, Roofline
from planner.profile.sharding import Collective

__all__ = [
    "CollectiveLog",
    "SettledLayer",
    "ShardOpCounter",
    "collectives_of",
    "local_ops_only",
    "settled",
]

_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d")
_BOOKKEEPING = {"wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier_"}
# op name -> (pipeplan's name, where the whole tensor is: the output, or argument k)
_KNOWN: dict[str, tuple[str, str | int]] = {
    "all_reduce": ("all_reduce", 0),
    "all_reduce_": ("all_reduce", 0),
    "all_reduce_coalesced": ("all_reduce", 0),
    "all_reduce_coalesced_": ("all_reduce", 0),
    "allreduce_": ("all_reduce", 0),  # c10d's dist.all_reduce: (tensors, group, ...)
    "all_gather_into_tensor": ("all_gather", "out"),
    "all_gather_into_tensor_out": ("all_gather", "out"),
    "all_gather_into_tensor_coalesced": ("all_gather", "out"),
    "_allgather_base_": ("all_gather", 0),  # (output, input, ...)
    "allgather_": ("all_gather", 0),  # (outputs, inputs, ...)
    "reduce_scatter_tensor": ("reduce_scatter", 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output, input, ...)
    "reduce_scatter_": ("reduce_scatter", 1),  # (outputs, inputs, ...)
}


def _bytes(value: Any) -> list[int]:
    return [t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def collectives_of(func: Any, args: tuple[Any, ...], out: Any) -> list[tuple[str, int]]:
    """``(op, whole-tensor bytes)`` of each collective one dispatched operation issues
    (none for other operations); one :class:`InputError` for a collective pipeplan does
    not time (an all-to-all, a broadcast).

    Example::

        collectives_of(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"), y)
        # [('all_reduce', x.numel() * 4)]
    """
    if not _in_c10d(func):
        return []
    name = _name(func)
    if name in _BOOKKEEPING:
        return []
    known = _KNOWN.get(name)
    if known is None:
        raise InputError(
            f"the tensor-parallel plan makes a layer issue {name}, a collective pipeplan does "
            "not time (it times all_reduce, all_gather and reduce_scatter)",
            field="tp_plan",
        )
    op, where = known
    whole = out if where == "out" else args[int(where)]
    return [(op, size) for size in _bytes(whole)]


class CollectiveLog(TorchDispatchMode):
    """Records the collectives dispatched while active, in :attr:`phase` (``"forward"`` or
    ``"backward"``; see the module docstring).

    Example::

        with CollectiveLog() as log:
            layer(x)
        log.collectives   # [Collective('all_reduce', 262144, 'forward'), ...]
    """

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.collectives: list[Collective] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if _has_dtensor(args, kwargs):
            return NotImplemented  # DTensor runs it; its local operations come back here
        out = func(*args, **kwargs)
        for op, size in collectives_of(func, args, out):
            self.collectives.append(Collective(op, size, self.phase))
        return out


class ShardOpCounter(OpCounter):
    """An :class:`~planner.profile.roofline.OpCounter` of one rank's local operations,
    collectives recorded in :attr:`collectives` rather than counted (module docstring).
    Use it inside :func:`local_ops_only`.

    Example::

        with local_ops_only(), ShardOpCounter(roofline) as counter:
            sharded_layer(x)
        counter.cost.flops, counter.collectives
    """

    def __init__(self, roofline: Roofline, phase: str = "forward"):
        super().__init__(roofline)
        self.phase = phase
        self.collectives: list[Collective] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if _has_dtensor(args, kwargs):
            return NotImplemented
        if _SHADOW[0]:  # DTensor finding an output's global shape: no rank runs this
            return func(*args, **kwargs)
        if not _in_c10d(func):
            return super().__torch_dispatch__(func, types, args, kwargs)
        out = func(*args, **kwargs)  # communication: timed on the links, not as compute
        self.collectives += [
            Collective(op, n, self.phase) for op, n in collectives_of(func, args, out)
        ]
        return out


_SHADOW = [0]


@contextlib.contextmanager
def local_ops_only() -> Iterator[None]:
    """While active, the operations DTensor runs on fake tensors of the *global* shapes to
    propagate output metadata (``ShardingPropagator._propagate_tensor_meta_non_cached``)
    are marked, so :class:`ShardOpCounter` leaves them out.

    Example::

        with local_ops_only(), ShardOpCounter(roofline) as counter:
            layer(x)
    """
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def shadow(self: Any, op_schema: Any) -> Any:
        _SHADOW[0] += 1
        try:
            return original(self, op_schema)
        finally:
            _SHADOW[0] -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = shadow  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]


def settled(value: Any) -> Any:
    """``value`` with every pending collective's result waited for (an
    ``AsyncCollectiveTensor`` becomes its plain tensor): what a layer hands the next.

    Example::

        values = settled(layer(*values))
    """
    from torch.distributed._functional_collectives import AsyncCollectiveTensor, wait_tensor

    if isinstance(value, AsyncCollectiveTensor):
        return wait_tensor(value)  # differentiable, unlike value.wait()
    if isinstance(value, tuple | list):
        return type(value)(settled(v) for v in value)
    if isinstance(value, dict):  # in place: a Hugging Face ModelOutput keeps its type
        for key in list(value):
            value[key] = settled(value[key])
    return value


class SettledLayer(nn.Module):
    """A shard's layer whose outputs are plain tensors: a collective's pending result (an
    ``AsyncCollectiveTensor``, what a parallel style returns when its output is a
    collective's) is waited for before the next layer, or a send, takes it.

    Example::

        SettledLayer(split.layers[0])(*inputs)
    """

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, *inputs: Any) -> Any:
        return settled(self.layer(*inputs))


def _has_dtensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(x, DTensor) for x in tree_leaves((args, kwargs)))


def _name(func: Any) -> str:
    return str(func._schema.name.split("::")[-1])


def _in_c10d(func: Any) -> bool:
    return getattr(func, "namespace", None) in _NAMESPACES

"""Tensor-parallel shards of a split model: the degrees asked for, and the shards built.

For each tensor-parallel degree ``t`` (and, with sequence parallelism, each setting) the
profile holds one rank's shard of every layer (:mod:`planner.profile.sharding`). A shard is
built the way a run builds it, so that what is measured is what runs:

1. the model is built (seeded as for the plain profile) and its plan read
   (:func:`~planner.profile.tp_plan.tensor_parallel_plan`);
2. it is captured and split by the plain profile's own code, the modules holding the plan's
   modules kept as module calls in an exported graph (torch.fx calls them anyway), so the
   layers, their names and split points are the plain profile's
   (:func:`capture_for_plan`);
3. then, the plan checked against ``t``, torch's ``parallelize_module`` applies it on a
   ``t``-way device mesh: the layers call the very modules it sharded and hooked
   (:func:`shard_captured`; the profilers shard a deep copy per degree, so one capture
   serves every degree).

:func:`build_shard` does 1-3 for any mesh: the profiler's fake one
(:mod:`planner.profile.fake_group`) or a run's real process group.

Example::

    request = parse_tensor_parallel("2,4", sequence_parallel=True)
    request.settings()     # [(2, False), (2, True), (4, False), (4, True)]
    with fake_group(2) as mesh:
        shard = build_shard(user, model, [inputs], mesh, degree=2, split_at=None,
                            capture="fx")
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.limits import MAX_TENSOR_PARALLEL, check_int
from planner.optimizers import optimizer_state_bytes
from planner.profile.loader import UserModel
from planner.profile.sharding import ShardParams, TensorParallelInfo
from planner.profile.tp_plan import (
    TensorParallelPlan,
    check_degree,
    layer_modules,
    tensor_parallel_plan,
)

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "MAX_DEGREES",
    "Captured",
    "Shard",
    "TensorParallelRequest",
    "build_shard",
    "capture_for_plan",
    "check_readable",
    "check_request",
    "parse_tensor_parallel",
    "shard_captured",
    "shard_params",
]

MAX_DEGREES = 16
"""Degrees one profile holds (as its reader accepts): 2, 4 and 8 are what is used."""


@dataclass(frozen=True)
class TensorParallelRequest:
    """The degrees to profile shards for, each also with sequence parallelism when
    ``sequence_parallel``."""

    degrees: tuple[int, ...]
    sequence_parallel: bool = False

    def settings(self) -> list[tuple[int, bool]]:
        """``(degree, sequence_parallel)`` of every shard entry, in the profile's order.

        Example::

            TensorParallelRequest((2, 4), True).settings()
            # [(2, False), (2, True), (4, False), (4, True)]
        """
        flags = (False, True) if self.sequence_parallel else (False,)
        return [(t, sp) for t in self.degrees for sp in flags]

    def info(self, source: str) -> TensorParallelInfo:
        """The profile's top-level ``tensor_parallel`` for plans from ``source``."""
        return TensorParallelInfo(self.degrees, self.sequence_parallel, source)


def parse_tensor_parallel(
    text: str | Sequence[int] | None, *, sequence_parallel: bool = False
) -> TensorParallelRequest | None:
    """``--tensor-parallel 2,4,8`` (and ``--sequence-parallel``) as a request; None when no
    degree is given (sequence parallelism alone is refused: it needs a degree).

    Example::

        parse_tensor_parallel("8,2")   # TensorParallelRequest(degrees=(2, 8), ...)
    """
    if text is None or (isinstance(text, str) and not text.strip()):
        if sequence_parallel:
            raise InputError(
                "sequence parallelism splits a tensor-parallel group's activations; give "
                "the degrees with --tensor-parallel (e.g. 2,4,8)",
                field="--sequence-parallel",
            )
        return None
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    degrees: list[int] = []
    for item in items:
        value = item
        if isinstance(item, str):
            value = int(item) if item.isdecimal() and len(item) <= 7 else item
        degrees.append(check_int(value, field="--tensor-parallel", low=2, high=MAX_TENSOR_PARALLEL))
    if len(set(degrees)) > MAX_DEGREES:
        raise InputError(
            f"expected at most {MAX_DEGREES} degrees, got {len(set(degrees))}",
            field="--tensor-parallel",
        )
    return TensorParallelRequest(tuple(sorted(set(degrees))), sequence_parallel)


def check_request(
    user: UserModel, model: nn.Module, request: TensorParallelRequest, split_at: str | None
) -> str:
    """Every setting of ``request`` checked on ``model`` before any work (one InputError
    naming the layer at fault); returns where the plans come from (the profile's
    ``tensor_parallel.plan_source``).

    Example::

        check_request(user, user.build(), parse_tensor_parallel("2,4"), None)   # 'tp_plan'
    """
    from planner.profile.split import discover_split_points

    points = discover_split_points(model, split_at)
    sources: list[str] = []
    for sequence_parallel in sorted({sp for _, sp in request.settings()}):
        plan = tensor_parallel_plan(user, model, sequence_parallel=sequence_parallel)
        layer_modules(plan, points)
        for degree in request.degrees:
            check_degree(plan, model, degree, points, file=str(user.path))
        if plan.source not in sources:
            sources.append(plan.source)
    return "+".join(sorted(sources))


@dataclass
class Shard:
    """One rank's shard of a split model: ``splits[k]`` is the model split at the k-th
    microbatch size given (the same object for every size where the capture is not
    specialised to one), every layer calling the sharded modules."""

    plan: TensorParallelPlan
    splits: list[Any]  # SplitModel per size


@dataclass
class Captured:
    """A model captured and split for a plan, not yet sharded: what every degree shards
    (a copy of it each, :func:`shard_captured`)."""

    user: UserModel
    model: Any  # nn.Module
    plan: TensorParallelPlan
    points: list[str]
    splits: list[Any]  # SplitModel per size


def build_shard(
    user: UserModel,
    model: nn.Module,
    inputs: Sequence[Any],
    mesh: Any,
    *,
    degree: int,
    sequence_parallel: bool = False,
    split_at: str | None,
    capture: str,
    names: Sequence[str] | None = None,
) -> Shard:
    """Capture and split ``model`` on each of ``inputs`` (one per microbatch size), then
    shard it on ``mesh`` with torch's ``parallelize_module`` (module docstring). ``names``:
    the plain profile's layers, which the shard's must equal.

    Example::

        shard = build_shard(user, model, [inputs], mesh, degree=2, split_at=None,
                            capture="export")
        shard.splits[0].stage(0, 2)      # rank 0's first three layers, sharded
    """
    captured = capture_for_plan(
        user, model, inputs, sequence_parallel=sequence_parallel, split_at=split_at,
        capture=capture, names=names,
    )  # fmt: skip
    return shard_captured(captured, mesh, degree)


def capture_for_plan(
    user: UserModel,
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    sequence_parallel: bool = False,
    split_at: str | None,
    capture: str,
    names: Sequence[str] | None = None,
    dynamic_batch: bool = False,
) -> Captured:
    """Steps 1-2 of the module docstring: ``model``'s plan read, the model captured and
    split on each of ``inputs`` with the plan's modules kept as calls. ``dynamic_batch``:
    one export for every size where torch allows it (as the analytic profiler captures).

    Example::

        captured = capture_for_plan(user, model, [inputs], split_at=None, capture="fx")
    """
    from planner.profile.split import capture_model, discover_split_points

    plan = tensor_parallel_plan(user, model, sequence_parallel=sequence_parallel)
    points = discover_split_points(model, split_at)
    calls = layer_modules(plan, points)
    once = None
    if dynamic_batch and len(inputs) > 1 and capture != "fx":
        try:
            once = capture_model(
                model,
                inputs[-1],
                split_at,
                capture=capture,
                source=user.path,
                module_calls=calls,
                dynamic_batch=True,
            )
        except InputError:  # the model specialises on the batch size: one capture per size
            once = None
    splits: list[Any] = []
    for value in inputs:
        if splits and splits[-1].batch_size is None:  # fx, or exported for any size
            splits.append(splits[-1])
            continue
        split = once or capture_model(
            model, value, split_at, capture=capture, source=user.path, module_calls=calls
        )
        if names is not None and list(split.names) != list(names):
            raise InputError(
                f"the model splits into other layers for its tensor-parallel shards "
                f"({split.names[:3]}...) than in the profile ({list(names)[:3]}...)",
                file=str(user.path),
                field="--tensor-parallel",
            )
        splits.append(split)
    return Captured(user, model, plan, points, splits)


def shard_captured(captured: Captured, mesh: Any, degree: int, *, copy: bool = False) -> Shard:
    """Step 3: the captured model sharded on ``mesh`` with torch's ``parallelize_module``
    (``copy``: a deep copy of the model and its splits, which share its modules, so that
    ``captured`` serves the next degree too); each layer's outputs waited for
    (:class:`~planner.profile.collective_log.SettledLayer`).

    Example::

        shard = shard_captured(captured, mesh, 4, copy=True)
    """
    import copy as copying

    from torch.distributed.tensor.parallel import parallelize_module

    from planner.profile.collective_log import SettledLayer

    model, splits = captured.model, captured.splits
    check_degree(captured.plan, model, degree, captured.points, file=str(captured.user.path))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # copying a pytree spec
        if copy:
            model, splits = copying.deepcopy((model, splits))
    plan = captured.plan  # module names and styles: the same for the copy
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torch\.distributed.*")
        parallelize_module(model, mesh, dict(plan.styles))
    for split in {id(s): s for s in splits}.values():
        split.layers = [SettledLayer(layer) for layer in split.layers]
    return Shard(plan, splits)


def check_readable(profile: Any, user: UserModel) -> None:
    """Refuse (one InputError naming the field) a profile whose shards its reader would
    refuse: more collectives than :data:`~planner.limits.MAX_COLLECTIVES`, a number beyond
    the limits. Nothing is written then.

    Example::

        check_readable(profile, user)
    """
    from planner.profile.schema import profile_from_dict

    profile_from_dict(profile.to_dict(), source=str(user.path))


def shard_params(split: Any, optimizer: str) -> list[ShardParams]:
    """Each layer's share of the parameters on this rank (a sharded weight's local part, a
    replicated one whole), as the plain profile counts them.

    Example::

        shard_params(shard.splits[0], "adam")[1].param_bytes
    """
    out = []
    for params in split.layer_parameters():
        local = [_local(p) for p in params]
        count = sum(p.numel() for p in local)
        size = sum(p.numel() * p.element_size() for p in local)
        out.append(ShardParams(count, size, optimizer_state_bytes(size, optimizer)))
    return out


def _local(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t

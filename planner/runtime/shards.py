"""A rank's tensor-parallel stages, built as the profiler built them, and what crosses the
cuts between them.

The profiler measured each layer's shard as
:func:`~planner.profile.tensor_parallel.build_shard` builds it: the model captured and split
by the plain profile's code with the planned modules kept as calls
(:func:`~planner.profile.tensor_parallel.capture_for_plan`), then torch's
``parallelize_module`` on a ``t``-way mesh
(:func:`~planner.profile.tensor_parallel.shard_captured`). A run does the same two steps,
on the real group: :func:`shard_stages` captures once, then shards the modules of each stage
this rank holds on that stage's tensor-parallel mesh (:mod:`planner.runtime.mesh`; only the
stage's own modules, so a rank holds the shards of its stages and nothing else is moved or
split). Same capture, same split, same styles: the layers the profile measured.

What crosses a cut may be a part of the activations (sequence parallelism hands on ``1 /
t`` of the sequence, as the plan's styles say), so the shapes the pipeline allocates for its
receives come from the sharded stages themselves: :func:`sharded_cut_specs` runs one
microbatch through the pipeline once, stage after stage, each group's members computing
together, and every rank learns what member ``i`` of each stage hands on.

Example::

    split = shard_stages(user, model, inputs, stages=plan.stages, meshes=meshes,
                         split_at=None, capture="fx")
    specs = sharded_cut_specs(split, plan.stages, split.flat_inputs(inputs), meshes,
                              placement, rank, group=None, device=device)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from planner.errors import InputError
from planner.profile.split import retarget_device
from planner.profile.tensor_parallel import capture_for_plan, shard_captured
from planner.runtime.comm import ValueSpec, value_spec
from planner.tensors import to_device

if TYPE_CHECKING:
    from planner.profile.loader import UserModel
    from planner.runtime.mesh import StageMesh
    from planner.runtime.placement import Placement
    from planner.runtime.reshard import Reshard
    from planner.stages import StageSpec

__all__ = ["shard_stages", "sharded_cut_specs", "stage_module_names"]


def stage_module_names(model: torch.nn.Module, stage: torch.nn.Module) -> set[str]:
    """The names (in ``model``) of the modules a stage's layers call.

    Example::

        stage_module_names(model, split.stage(0, 1))   # {'embed', 'embed.tok', ...}
    """
    held = {id(m) for m in stage.modules()}
    return {name for name, m in model.named_modules() if id(m) in held}


def shard_stages(
    user: UserModel,
    model: torch.nn.Module,
    inputs: Any,
    *,
    stages: Sequence[StageSpec],
    meshes: Mapping[int, StageMesh],
    split_at: str | None,
    capture: str,
) -> Any:
    """``model`` captured and split as the profile's shards were, and the modules of every
    tensor-parallel stage this rank holds (``meshes``) sharded on that stage's group;
    returns the split model (its layers call the sharded modules).

    Example::

        split = shard_stages(user, model, inputs, stages=plan.stages, meshes=meshes,
                             split_at=settings.split_at, capture="export")
    """
    grouped = [st for st in stages if st.tensor_parallel > 1]
    captured = capture_for_plan(
        user,
        model,
        [inputs],
        sequence_parallel=any(st.sequence_parallel for st in grouped),
        split_at=split_at,
        capture=capture,
    )
    split = captured.splits[0]
    covered = max(st.last for st in stages) + 1
    for st in grouped:
        if st.id not in meshes or st.last >= split.num_layers or covered != split.num_layers:
            continue  # not this rank's; a split that does not fit is refused by the caller
        names = stage_module_names(model, split.stage(st.first, st.last))
        try:
            shard_captured(captured, meshes[st.id].tp_mesh, st.tensor_parallel, only=names)
        except InputError as err:  # the profiler's words (--tensor-parallel); the plan's field
            if err.field != "--tensor-parallel":
                raise
            raise InputError(
                f"{err.message} (the model file {user.path})",
                field=f"stages[{st.id}].tensor_parallel",
            ) from None
    return split


def sharded_cut_specs(
    split: Any,
    stages: Sequence[StageSpec],
    inputs: Sequence[Any],
    meshes: Mapping[int, StageMesh],
    placement: Placement,
    rank: int,
    *,
    group: Any,
    device: torch.device,
    reshard: Reshard | None = None,
) -> list[list[ValueSpec]]:
    """``specs[s]``: the values member ``i`` of stage ``s`` hands to member ``i`` of stage
    ``s + 1`` (``i``: this rank's place in its groups), found by one pass of ``inputs`` (a
    microbatch) through the pipeline without gradients: the first replica of each stage
    computes it (its group together) on ``device`` (the stage moved there, as the run
    holds it: ``parallelize_module`` moved only the sharded parameters to a CUDA mesh's
    device), and broadcasts each member's outputs over ``group`` (every rank, gloo). Runs
    under the caller's autocast, so the dtypes are the stages'.
    With ``reshard`` (a plan with resharded cuts) the pass tracks which values depend on
    the weights (autograd), has ``reshard`` learn each resharded cut
    (:meth:`~planner.runtime.reshard.Reshard.learn`), and hands each stage what its
    member at this rank's place joins from its pieces.

    Example::

        specs = sharded_cut_specs(split, plan.stages, inputs, meshes, placement, rank,
                                  group=control, device=torch.device("cpu"))
    """
    import torch.distributed as dist

    position = next(iter(meshes.values())).position if meshes else 0
    values: tuple[Any, ...] = tuple(to_device(list(inputs), device))
    flags: tuple[bool, ...] | None = None if reshard is None else (False,) * len(values)
    out: list[list[ValueSpec]] = []
    for st in stages:
        if st.id == len(stages) - 1:
            out.append([])
            break
        members = [placement.rank_of[d] for d in st.replica_groups[0]]
        result: Any = None
        if rank in members:
            module = split.stage(st.first, st.last).to(device)
            retarget_device(module, device)
            result = _stage_pass(module, values, flags)
        handed: list[Any] = []
        for src in members:
            box = [result if rank == src else None]
            dist.broadcast_object_list(box, src=src, group=group)
            handed.append(box[0])
        outputs = [h[0] for h in handed]
        mine = outputs[position % len(members)]
        if any(len(h) != len(mine) for h in outputs):  # pragma: no cover - a plan's styles
            raise InputError(f"stage {st.id}'s members hand on different values", field="stages")
        out.append([value_spec(v) for v in mine])
        flags = handed[0][1] if reshard is not None else None
        if reshard is not None and reshard.resharded(st.id + 1):
            reshard.learn(st.id + 1, outputs, handed[0][1])
            mine = reshard.received(st.id + 1, outputs, _place(stages[st.id + 1], placement, rank))
        values = tuple(to_device(list(mine), device))
    return out


def _stage_pass(module: Any, values: tuple[Any, ...], flags: tuple[bool, ...] | None) -> Any:
    """One stage's outputs on CPU and which depend on the weights or on an input that does
    (``flags``: the inputs'; None: no tracking, without gradients)."""
    if flags is None:
        with torch.no_grad():
            result = tuple(module(*values))
        return to_device(list(result), "cpu"), ()
    with torch.enable_grad():
        leaves = [
            v.detach().requires_grad_(True)
            if f and torch.is_tensor(v) and v.is_floating_point()
            else v
            for v, f in zip(values, flags, strict=True)
        ]
        result = tuple(module(*leaves))
        depends = tuple(torch.is_tensor(v) and v.requires_grad for v in result)
        result = tuple(v.detach() if torch.is_tensor(v) else v for v in result)
    return to_device(list(result), "cpu"), depends


def _place(stage: StageSpec, placement: Placement, rank: int) -> int:
    """This rank's place in ``stage``'s groups (0 where it holds none of it)."""
    mine = [d for d in placement.devices_of(rank) if d in stage.devices]
    return stage.devices.index(mine[0]) % stage.tensor_parallel if mine else 0

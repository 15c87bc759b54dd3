"""What one device of a tensor-parallel or sharded stage computes and holds.

Tensor parallelism: every member of a stage's group runs one rank's shard of each layer,
whose costs the profile holds per degree (:mod:`planner.profile.sharding`).
:func:`shard_view` is the profile as one rank of a stage sees it: each layer's parameters,
optimizer state and step (``layers[i].sharded["tp2"]``), its times, saved, cut and
workspace bytes (``measurements[k].layers[i].sharded["tp2"]`` or ``"tp2-sp"``), so that
every cost function of :mod:`planner.cost` gives a member's costs unchanged. The optimizer
step's temporaries (not in the format) scale with the shard's parameter bytes.

Sharded data parallelism over a stage's ``r`` replicas (:func:`member_static_bytes`):

* ``zero1``: each replica keeps ``1 / r`` of the optimizer state (weights and gradients
  whole);
* ``fsdp``: between iterations each keeps ``1 / r`` of the weights, gradients and optimizer
  state. Under pipelining, torch's stages (``_PipelineStageBase``) turn gradient sync and
  resharding off for every microbatch but the last, and torchtitan does not reshard after
  forward with PP, so the whole weights are gathered at the stage's first forward of an
  iteration and kept, with whole gradients accumulating, until the gradients are
  reduce-scattered after the last backward: :func:`gathered_bytes` more during the
  iteration.

Example::

    view = shard_view(profile, stage)          # the profile itself for a plain stage
    member_static_bytes(profile, stage)        # weights, gradients, state on one device
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence

from planner.cost import (
    stage_memory_bytes,
    stage_param_bytes,
    stage_static_bytes,
    stage_step_workspace_bytes,
)
from planner.errors import InputError
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.profile.sharding import shard_key
from planner.stages import StageSpec

__all__ = [
    "check_parallel_stages",
    "forget_views",
    "gathered_bytes",
    "member_memory_bytes",
    "member_static_bytes",
    "shard_view",
    "step_workspace_bytes",
]

# Views of the last few profiles (keyed by identity and shard key; each entry holds its
# profile, so an id is not reused while cached). simulate() forgets them when it starts,
# so a profile changed in place between two calls is read as it is.
_VIEWS: OrderedDict[tuple[int, str], tuple[Profile, Profile]] = OrderedDict()
_VIEW_CACHE_SIZE = 8


def forget_views() -> None:
    """Drop the cached shard views (:func:`planner.simulate.simulate` does when it starts:
    within one call the profile does not change, between two it may).

    Example::

        forget_views()
    """
    _VIEWS.clear()
    for forget in FORGOTTEN:
        forget()


# Other caches of what a profile holds, dropped with the views (planner.simulate.tables).
FORGOTTEN: list[Callable[[], None]] = []


def shard_view(profile: Profile, stage: StageSpec) -> Profile:
    """The profile as one member of ``stage``'s tensor-parallel group sees it (the profile
    itself for a stage without tensor parallelism). Cached by the profile's identity until
    the next :func:`planner.simulate.simulate` call starts (:func:`forget_views`).

    Example::

        view = shard_view(profile, parse_stages("0-3:gpu0+gpu1")[0])
        view.layers[0].param_bytes      # one rank's share
    """
    if stage.tensor_parallel == 1:
        return profile
    key = shard_key(stage.tensor_parallel, sequence_parallel=stage.sequence_parallel)
    found = _VIEWS.get((id(profile), key))
    if found is not None and found[0] is profile:
        _VIEWS.move_to_end((id(profile), key))
        return found[1]
    view = _build_view(profile, stage.tensor_parallel, key)
    _VIEWS[(id(profile), key)] = (profile, view)
    while len(_VIEWS) > _VIEW_CACHE_SIZE:
        _VIEWS.popitem(last=False)
    return view


def _build_view(profile: Profile, degree: int, key: str) -> Profile:
    """The shard view (see :func:`shard_view`); the profile holds ``key`` (checked)."""
    params_key = shard_key(degree)
    layers = []
    for layer in profile.layers:
        shard = layer.sharded[params_key]
        ratio = shard.param_bytes / layer.param_bytes if layer.param_bytes else 1.0
        layers.append(
            Layer(
                layer.name,
                shard.param_count,
                shard.param_bytes,
                shard.optimizer_state_bytes,
                shard.optimizer_ms,
                round(layer.optimizer_workspace_bytes * ratio),
            )
        )
    measurements = [
        Measurement(
            m.microbatch_size,
            m.input_bytes,
            [
                LayerTiming(
                    (s := t.sharded[key]).forward_ms,
                    s.backward_ms,
                    s.backward_input_ms,
                    s.backward_weight_ms,
                    s.output_bytes,
                    s.saved_bytes,
                    s.workspace_bytes,
                )
                for t in m.layers
            ],
        )
        for m in profile.measurements
    ]
    return dataclasses.replace(
        profile,
        layers=layers,
        measurements=measurements,
        tensor_parallel=None,
        meta={**profile.meta, "shard": key},
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def member_static_bytes(profile: Profile, stage: StageSpec, *, weight_versions: int = 1) -> int:
    """Weights, gradients and optimizer state one device of ``stage`` holds between
    iterations: its shard's (tensor parallelism), the optimizer state ``/ r`` under
    ``zero1``, everything ``/ r`` under ``fsdp`` (see the module docstring); extra weight
    versions (2bw) on top.

    Example::

        member_static_bytes(profile, with_parallelism(stages, sharding="zero1")[0])
    """
    view = shard_view(profile, stage)
    total = stage_static_bytes(view, stage.first, stage.last, replicas=stage.replicas)
    params = stage_param_bytes(view, stage.first, stage.last)
    r = stage.replicas
    if stage.sharding == "zero1":
        total = 2 * params + _ceil_div(total - 2 * params, r)
    elif stage.sharding == "fsdp":
        total = 2 * _ceil_div(params, r) + _ceil_div(total - 2 * params, r)
    return total + (weight_versions - 1) * params


def gathered_bytes(profile: Profile, stage: StageSpec) -> int:
    """FSDP: the whole weights and gradients a device holds during an iteration, beyond
    :func:`member_static_bytes` (0 for any other sharding).

    Example::

        gathered_bytes(profile, with_parallelism(stages, sharding="fsdp")[0])
    """
    if stage.sharding != "fsdp":
        return 0
    return 2 * stage_param_bytes(shard_view(profile, stage), stage.first, stage.last)


def step_workspace_bytes(profile: Profile, stage: StageSpec) -> int:
    """The optimizer step's temporaries on one device (``/ r`` where the step runs on
    ``1 / r`` of the state: ``zero1``, ``fsdp``).

    Example::

        step_workspace_bytes(profile, stage)
    """
    work = stage_step_workspace_bytes(shard_view(profile, stage), stage.first, stage.last)
    return work if stage.sharding == "none" else _ceil_div(work, stage.replicas)


def member_memory_bytes(
    profile: Profile,
    stage: StageSpec,
    microbatch_size: int,
    in_flight: int,
    *,
    weight_versions: int = 1,
) -> int:
    """Peak memory of one device of ``stage`` with ``in_flight`` microbatches stashed
    (:func:`planner.cost.stage_memory_bytes` for a plain stage; a member's shard, its
    sharded state and FSDP's gathered weights otherwise).

    Example::

        member_memory_bytes(profile, stage, 4, in_flight=3)
    """
    view = shard_view(profile, stage)
    first, last = stage.first, stage.last
    plain = stage_memory_bytes(
        view,
        first,
        last,
        microbatch_size,
        in_flight,
        recompute=stage.recompute,
        weight_versions=weight_versions,
        recompute_layers=stage.recompute_layers,
    )
    if stage.sharding == "none":
        return plain
    static = stage_static_bytes(view, first, last) + (weight_versions - 1) * stage_param_bytes(
        view, first, last
    )
    held = plain - static  # activations and workspaces, as stage_memory_bytes counts them
    return member_static_bytes(profile, stage, weight_versions=weight_versions) + max(
        held + gathered_bytes(profile, stage), step_workspace_bytes(profile, stage)
    )


def check_parallel_stages(profile: Profile, stages: Sequence[StageSpec], *, flush: bool) -> None:
    """Refuse, with one line naming the stage, what the simulator cannot time for these
    stages: a degree (or sequence parallelism) the profile has no entries for, tensor
    parallelism on a stage holding a tied parameter, sharding without a flush (2bw) or on
    a stage without parameters.

    Example::

        check_parallel_stages(profile, stages, flush=True)
    """
    info = profile.tensor_parallel
    for st in stages:
        where = f"stages[{st.id}]"
        if st.tensor_parallel > 1:
            has = (
                info is not None
                and st.tensor_parallel in info.degrees
                and (info.sequence_parallel or not st.sequence_parallel)
            )
            if not has:
                what = f"degree {st.tensor_parallel}" + (
                    " with sequence parallelism" if st.sequence_parallel else ""
                )
                got = "none" if info is None else ", ".join(info.keys())
                raise InputError(
                    f"stage {st.id} is tensor parallel ({st.describe()}) but the profile "
                    f"has no entries for {what} (it has: {got}); profile the model for "
                    "that degree",
                    field=f"{where}.tensor_parallel",
                )
            tied = [t.name for t in profile.tied_parameters if t.held_by(st.first, st.last)]
            if tied:
                raise InputError(
                    f"stage {st.id} is tensor parallel and holds the tied parameter "
                    f"{tied[0]!r}, whose split across the group (vocab-parallel) is not "
                    "modelled; keep the stages that hold it on one device per replica",
                    field=f"{where}.tensor_parallel",
                )
        if st.sharding != "none":
            if not flush:
                raise InputError(
                    f"stage {st.id} is sharded ({st.sharding}), which needs the step after "
                    "a flush; the schedule keeps two weight versions without one (2bw)",
                    field=f"{where}.sharding",
                )
            if stage_param_bytes(shard_view(profile, st), st.first, st.last) == 0:
                raise InputError(
                    f"stage {st.id} has no parameters, so {st.sharding} has nothing to shard",
                    field=f"{where}.sharding",
                )

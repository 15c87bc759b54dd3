"""``run --calibrate``: feed measured per-stage times back into a corrected profile.

For every stage the run measured the mean forward (``F``) and backward (``B``, or the ``I``
and ``W`` halves) time. The profile predicts them as the sum of the stage's layers (plus one
forward in the backward of a recompute stage; a zero-bubble run's ``I + W`` against the
layers' profiled halves, which the simulator used, not the whole backward). Each layer of
the stage is scaled by the stage's measured / predicted ratio - forward and backward
separately - in every measurement of the profile (its tensor-parallel shard entries too), so
solving again with the calibrated profile plans with what the hardware really did (including
the runtime's own per-action overhead). Each timing's spread is scaled with it, so plans
from the calibrated profile keep a band; a tensor-parallel plan is refused (its measured
times hold the collectives the simulator adds).

Example::

    corrected = calibrated_profile(profile, plan, report.stage_ms)
    corrected.save("profiles/mlp.calibrated.json")
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

from planner.cost import stage_times
from planner.errors import InputError
from planner.plan import Plan, StageSpec
from planner.profile.schema import LayerTiming, Profile
from planner.profile.settings import Calibration
from planner.profile.sharding import ShardTiming, shard_key
from planner.simulate.shards import shard_view

__all__ = ["calibrated_profile", "stage_compute_ms", "stage_ratios"]


def stage_compute_ms(profile: Profile, plan: Plan) -> dict[int, float]:
    """Per stage: its profiled forward plus backward per microbatch (what the ratios of
    :func:`stage_ratios` divide by; a tensor-parallel stage's shards').

    Example::

        stage_compute_ms(profile, plan)   # {0: 6.1, 1: 5.9}
    """
    layers = profile.measurement(plan.microbatch_size).layers
    out: dict[int, float] = {}
    for stage in plan.stages:
        span = [_timing(t, stage) for t in layers[stage.first : stage.last + 1]]
        fwd = sum(t.forward_ms for t in span)
        out[stage.id] = fwd + sum(t.backward_ms for t in span) + (fwd if stage.recompute else 0.0)
    return out


def stage_ratios(
    profile: Profile, plan: Plan, stage_ms: Mapping[str, float]
) -> dict[int, tuple[float, float]]:
    """Per stage: (forward ratio, backward ratio) of measured to profiled time. A
    tensor-parallel stage's profiled time is its shards' (``sharded["tp2"]``, or
    ``"tp2-sp"``): their compute alone, while the measured one also holds the collectives
    the group ran inside the stage.

    Example::

        stage_ratios(profile, plan, {"F0": 2.0, "B0": 4.1})   # {0: (1.05, 0.98)}
    """
    layers = profile.measurement(plan.microbatch_size).layers
    out: dict[int, tuple[float, float]] = {}
    for stage in plan.stages:
        span = [_timing(t, stage) for t in layers[stage.first : stage.last + 1]]
        fwd = sum(t.forward_ms for t in span)
        bwd = sum(t.backward_ms for t in span)
        got_f = stage_ms.get(f"F{stage.id}")
        got_b = stage_ms.get(f"B{stage.id}")
        if got_b is None and f"I{stage.id}" in stage_ms:
            got_b = stage_ms[f"I{stage.id}"] + stage_ms.get(f"W{stage.id}", 0.0)
            bwd = _split_backward_ms(profile, stage, plan.microbatch_size)
        else:
            bwd += fwd if stage.recompute else 0.0
        rf = got_f / fwd if got_f is not None and fwd > 0 else 1.0
        rb = got_b / bwd if got_b is not None and bwd > 0 else 1.0
        out[stage.id] = (rf, rb)
    return out


def _split_backward_ms(profile: Profile, stage: StageSpec, microbatch_size: int) -> float:
    """What a zero-bubble run's ``I`` and ``W`` of ``stage`` were predicted to take together,
    by the simulator's own cost model (:func:`planner.cost.stage_times` on the stage's shard
    view): the layers' profiled halves, or the whole backward where the runtime runs it as
    ``I`` (the first stage, a recompute stage with its forward again, a stage without
    weights, a profile without halves).

    Example::

        _split_backward_ms(profile, plan.stages[1], 4)   # 5.2: I + W of the layers
    """
    view = shard_view(profile, stage)
    t = stage_times(view, stage.first, stage.last, microbatch_size, recompute=stage.recompute)
    return t.input_grad_ms + t.weight_grad_ms


def _timing(layer: LayerTiming, stage: StageSpec) -> LayerTiming | ShardTiming:
    """What the profile measured of ``layer`` as ``stage`` runs it: a tensor-parallel
    stage's shard, the whole layer otherwise."""
    if stage.tensor_parallel == 1:
        return layer
    key = shard_key(stage.tensor_parallel, sequence_parallel=stage.sequence_parallel)
    return layer.sharded.get(key, layer)


def calibrated_profile(profile: Profile, plan: Plan, stage_ms: Mapping[str, float]) -> Profile:
    """A copy of ``profile`` with each stage's layer times scaled to the measured ones.

    Example::

        calibrated_profile(profile, plan, report.stage_ms).save("calibrated.json")
    """
    grouped = [st.id for st in plan.stages if st.tensor_parallel > 1]
    if grouped:
        raise InputError(
            f"stage {grouped[0]} is tensor parallel: its measured times hold the group's "
            "collectives, which the simulator adds from the topology, so scaling the "
            "profile's shard times by them would count the collectives twice; calibrate "
            "with a plan without tensor parallelism",
            field="--calibrate",
        )
    ratios = stage_ratios(profile, plan, stage_ms)
    out = copy.deepcopy(profile)
    for stage in plan.stages:
        rf, rb = ratios[stage.id]
        for measurement in out.measurements:
            for t in measurement.layers[stage.first : stage.last + 1]:
                # The layer and its tensor-parallel shards alike: a later solve may split
                # it, and the speed the run measured applies to its shards as well.
                _scale(t, rf, rb)
                for shard in t.sharded.values():
                    _scale(shard, rf, rb)
    note = Calibration(
        plan_schedule=plan.schedule.name,
        microbatch_size=plan.microbatch_size,
        stage_ratios={str(s): [round(f, 4), round(b, 4)] for s, (f, b) in ratios.items()},
        # The profile has no field for it; simulate/solve take it as --step-ms.
        step_ms=round(
            max((v for k, v in stage_ms.items() if k.startswith("STEP")), default=0.0), 4
        ),
    )
    out.settings = dataclasses.replace(out.settings, calibrated=note)
    return out


def _scale(t: LayerTiming | ShardTiming, rf: float, rb: float) -> None:
    """``t``'s forward times by ``rf`` and backward ones by ``rb``, with their spread (so
    plans from the calibrated profile keep a band) and the file's medians, rounded to
    0.1 us as the profiler writes them."""

    def scaled(name: str, x: float) -> float:
        return round(x * (rf if name == "forward_ms" else rb), 4)

    for name in ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms"):
        setattr(t, name, scaled(name, getattr(t, name)))
    t.spread = {name: [scaled(name, x) for x in ends] for name, ends in t.spread.items()}
    t.median = {name: scaled(name, x) for name, x in t.median.items()}

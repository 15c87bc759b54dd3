"""The shape of a plan: what the search proposes, the peers sweep, the simulator times, a
plan holds, and the runtime and export run.

A :class:`PlanShape` is hashable data: its stages (:class:`~planner.stages.StageSpec`:
layer range, devices, recompute), the schedule's name, the microbatch size and count, and
the virtual stages (chunks) per device. The solver keys its cache of simulations by it, a
tuned peer's configuration is one, and :attr:`planner.plan.Plan.shape` gives a plan's.

Example::

    shape = PlanShape(parse_stages("0-3:gpu0;4-7:gpu1"), "1f1b", 4, 8)
    shape.samples, shape.devices_used  # 32, 2
    simulate_shape(profile, topology, shape).iteration_ms
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.stages import StageSpec

__all__ = ["PlanShape"]


@dataclass(frozen=True)
class PlanShape:
    """Stages, schedule and microbatching: a fully specified plan to simulate or run.

    ``stages`` given as a list is kept as a tuple. Recompute lives in the stages.

    Example::

        PlanShape((StageSpec(0, (0, 7), ("gpu0", "gpu1")),), "gpipe", 4, 8).samples  # 32
    """

    stages: tuple[StageSpec, ...]
    schedule: str
    microbatch_size: int
    num_microbatches: int
    virtual_stages: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.stages, tuple):
            object.__setattr__(self, "stages", tuple(self.stages))

    @property
    def samples(self) -> int:
        """Samples per iteration: microbatch size x number of microbatches."""
        return self.microbatch_size * self.num_microbatches

    @property
    def devices_used(self) -> int:
        """Devices over all stages (a device holding several chunks counts each time)."""
        return sum(len(s.devices) for s in self.stages)

    def with_recompute(self, flags: Sequence[bool], *, layers: bool = False) -> PlanShape:
        """This shape with its stages' recompute flags replaced by ``flags`` (each layer
        checkpointed on its own where ``layers``: :attr:`StageSpec.recompute_layers`).

        Example::

            shape.with_recompute([True, False]).stages[0].recompute   # True
        """
        stages = tuple(
            s.with_recompute(bool(f), layers=layers)
            for s, f in zip(self.stages, flags, strict=True)
        )
        return PlanShape(
            stages, self.schedule, self.microbatch_size, self.num_microbatches, self.virtual_stages
        )

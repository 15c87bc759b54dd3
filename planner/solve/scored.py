"""A simulated plan shape (:class:`Scored`) and the order the search ranks them in.

:meth:`Scored.key` orders simulated shapes: fitting first, then time per sample, fewer
devices, the conventional schedule, then the plan itself (:func:`tie_text`), so the
search's choices never depend on iteration order.

Example::

    shape = PlanShape((StageSpec(0, (0, 3), ("gpu0",)), StageSpec(1, (4, 7), ("gpu1",))),
                      "1f1b", 4, 8)
    best = min(scored, key=Scored.key)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.shape import PlanShape
from planner.solve.options import AUTO_SCHEDULES

if TYPE_CHECKING:
    from planner.simulate.result import SimResult

__all__ = ["Scored", "tie_text"]


def tie_text(shape: PlanShape) -> str:
    """The text that breaks ties between equally good plans: each stage's (layers,
    devices, recompute), then schedule, microbatch size, count and chunks, compared as
    text. It is the text the search has always compared (which of two equally fast plans
    wins depends on it), so it is written out rather than left to a ``repr`` that changes
    with the types.

    Example::

        tie_text(shape)   # "PlanShape(stages=(((0, 3), ('gpu0',), False),), schedule=..."
    """
    stages = tuple((s.layers, s.devices, s.recompute) for s in shape.stages)
    return (
        f"PlanShape(stages={stages!r}, schedule={shape.schedule!r}, "
        f"microbatch_size={shape.microbatch_size!r}, "
        f"num_microbatches={shape.num_microbatches!r}, virtual_stages={shape.virtual_stages!r})"
    )


@dataclass
class Scored:
    """A simulated plan shape: its time, whether every device fits, its memory peaks, the
    simulation (None where the schedule cannot run the shape) and who proposed it."""

    shape: PlanShape
    iteration_ms: float
    fits: bool
    memory: dict[str, int]
    result: SimResult | None
    origin: str

    @property
    def per_sample_ms(self) -> float:
        return self.iteration_ms / self.shape.samples

    def key(self) -> tuple[Any, ...]:
        # Fit first, then speed; then fewer devices, then the plan itself, for determinism.
        sched = self.shape.schedule
        return (
            not self.fits,
            round(self.per_sample_ms, 9),
            self.shape.devices_used,
            AUTO_SCHEDULES.index(sched) if sched in AUTO_SCHEDULES else 9,
            tie_text(self.shape),
        )

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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.shape import PlanShape
from planner.solve.options import AUTO_SCHEDULES
from planner.stages import SHARDINGS

if TYPE_CHECKING:
    from planner.simulate.result import SimResult

__all__ = ["LaterTime", "Scored", "stage_key", "tie_text"]


class LaterTime:
    """The rounded time per sample of a plan that overflows, in :meth:`Scored.key`:
    simulated only where two such plans are compared (a plan that fits sorts before it on
    the key's first entry).

    Example::

        LaterTime(scored) < 2.5    # simulates scored, then compares its rounded time
    """

    __slots__ = ("scored",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, scored: Scored) -> None:
        self.scored = scored

    def value(self) -> float:
        return round(self.scored.per_sample_ms, 9)

    def __eq__(self, other: object) -> bool:
        return self.value() == _value(other)

    def __lt__(self, other: object) -> bool:
        return self.value() < _value(other)

    def __le__(self, other: object) -> bool:
        return self.value() <= _value(other)

    def __gt__(self, other: object) -> bool:
        return self.value() > _value(other)

    def __ge__(self, other: object) -> bool:
        return self.value() >= _value(other)


def _value(x: object) -> Any:
    return x.value() if isinstance(x, LaterTime) else x


def stage_key(shape: PlanShape) -> tuple[tuple[Any, ...], ...]:
    """Each stage's layers, devices, tensor-parallel degree, sequence parallelism and
    sharding: what makes two plans distinct places to start a local search from (the
    schedule, microbatching and recompute aside).

    Example::

        stage_key(shape)   # (((0, 3), ('gpu0',), 1, False, 'none'), ...)
    """
    return tuple(
        (s.layers, s.devices, s.tensor_parallel, s.sequence_parallel, s.sharding)
        for s in shape.stages
    )


def tie_text(shape: PlanShape) -> str:
    """The text that breaks ties between equally good plans: each stage's (layers,
    devices, recompute; and its degree, sequence parallelism and sharding where any stage
    has them), then schedule, microbatch size, count and chunks, compared as
    text. It is the text the search has always compared (which of two equally fast plans
    wins depends on it), so it is written out rather than left to a ``repr`` that changes
    with the types.

    Example::

        tie_text(shape)   # "PlanShape(stages=(((0, 3), ('gpu0',), False),), schedule=..."
    """
    stages: tuple[tuple[Any, ...], ...] = tuple(
        (s.layers, s.devices, s.recompute) for s in shape.stages
    )
    if not all(s.is_plain for s in shape.stages):
        # Tensor parallelism and sharding (only then, so plain plans compare as before).
        stages = tuple(
            (
                s.layers,
                s.devices,
                s.recompute,
                s.tensor_parallel,
                s.sequence_parallel,
                SHARDINGS.index(s.sharding),  # ties: none, then ZeRO-1, then FSDP
            )
            for s in shape.stages
        )
    return (
        f"PlanShape(stages={stages!r}, schedule={shape.schedule!r}, "
        f"microbatch_size={shape.microbatch_size!r}, "
        f"num_microbatches={shape.num_microbatches!r}, virtual_stages={shape.virtual_stages!r})"
    )


@dataclass
class Scored:
    """A simulated plan shape: its time, whether every device fits, its memory peaks (of
    the devices that overflow, where it does not fit), the simulation (None: not kept, or
    the schedule cannot run the shape, ``runs`` False) and who proposed it.

    The search keeps no simulation (a thousand devices' maps and a schedule of thousands
    of microbatches each): :meth:`planner.solve.search.Search.result_of` simulates a plan
    again where its result is needed, the same numbers.
    """

    shape: PlanShape
    _iteration_ms: float
    fits: bool
    memory: dict[str, int]
    result: SimResult | None
    origin: str
    runs: bool = True
    # A plan that overflows is simulated as far as its memory (which needs no times); its
    # time, where anything asks, by this (then forgotten). Its time is finite.
    later: Callable[[], float] | None = None

    @property
    def iteration_ms(self) -> float:
        """The simulated iteration (worked out on first use for a plan that overflows)."""
        if self.later is not None:
            self._iteration_ms, self.later = self.later(), None
        return self._iteration_ms

    @iteration_ms.setter
    def iteration_ms(self, value: float) -> None:
        self._iteration_ms, self.later = value, None

    @property
    def per_sample_ms(self) -> float:
        return self.iteration_ms / self.shape.samples

    def infinite(self) -> bool:
        """Whether the time is infinite (a shape the schedule cannot run), without
        simulating a plan that overflows (its time is finite)."""
        return self.later is None and math.isinf(self._iteration_ms)

    def key(self) -> tuple[Any, ...]:
        # Fit first, then speed; then fewer devices, then the plan itself, for determinism.
        sched = self.shape.schedule
        return (
            not self.fits,
            LaterTime(self) if self.later is not None else round(self.per_sample_ms, 9),
            self.shape.devices_used,
            AUTO_SCHEDULES.index(sched) if sched in AUTO_SCHEDULES else 9,
            tie_text(self.shape),
        )

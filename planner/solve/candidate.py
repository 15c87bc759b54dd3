"""A plan the search considers (:class:`Candidate`) and a simulated one (:class:`Scored`).

A candidate is hashable data: its stages (:class:`~planner.stages.StageSpec`: layer range,
devices, recompute), schedule, microbatch size and count, and chunks per device.
:meth:`Scored.key` orders simulated candidates: fitting first, then time per sample, fewer
devices, the conventional schedule, then the plan itself, so the search's choices never
depend on iteration order.

Example::

    cand = Candidate((StageSpec(0, (0, 3), ("gpu0",)), StageSpec(1, (4, 7), ("gpu1",))),
                     "1f1b", 4, 8)
    cand.samples, [s.layers for s in cand.specs()]  # 32, [(0, 3), (4, 7)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.plan import StageSpec
from planner.solve.options import AUTO_SCHEDULES

__all__ = ["Candidate", "Scored", "tie_text", "with_recompute"]


@dataclass(frozen=True)
class Candidate:
    """A fully specified plan to simulate."""

    stages: tuple[StageSpec, ...]
    schedule: str
    microbatch_size: int
    num_microbatches: int
    virtual_stages: int = 1

    def specs(self) -> list[StageSpec]:
        return list(self.stages)

    @property
    def samples(self) -> int:
        return self.microbatch_size * self.num_microbatches


def tie_text(cand: Candidate) -> str:
    """The text that breaks ties between equally good plans: each stage's (layers,
    devices, recompute), then schedule, microbatch size, count and chunks, compared as
    text. It is the text the search has always compared (what equally fast plan wins
    depends on it), so it is written out rather than left to a ``repr`` that changes with
    the types.

    Example::

        tie_text(cand)   # "Candidate(stages=(((0, 3), ('gpu0',), False),), schedule=..."
    """
    stages = tuple((s.layers, s.devices, s.recompute) for s in cand.stages)
    return (
        f"Candidate(stages={stages!r}, schedule={cand.schedule!r}, "
        f"microbatch_size={cand.microbatch_size!r}, "
        f"num_microbatches={cand.num_microbatches!r}, virtual_stages={cand.virtual_stages!r})"
    )


@dataclass
class Scored:
    """A simulated candidate."""

    cand: Candidate
    iteration_ms: float
    fits: bool
    memory: dict[str, int]
    result: Any
    origin: str

    @property
    def per_sample_ms(self) -> float:
        return self.iteration_ms / self.cand.samples

    def key(self) -> tuple[Any, ...]:
        # Fit first, then speed; then fewer devices, then the plan itself, for determinism.
        used = sum(len(s.devices) for s in self.cand.stages)
        return (
            not self.fits,
            round(self.per_sample_ms, 9),
            used,
            AUTO_SCHEDULES.index(self.cand.schedule) if self.cand.schedule in AUTO_SCHEDULES else 9,
            tie_text(self.cand),
        )


def with_recompute(cand: Candidate, flags: Sequence[bool]) -> Candidate:
    """``cand`` with its stages' recompute flags replaced by ``flags``.

    Example::

        with_recompute(cand, [True, False])
    """
    stages = tuple(s.with_recompute(bool(f)) for s, f in zip(cand.stages, flags, strict=True))
    return Candidate(
        stages, cand.schedule, cand.microbatch_size, cand.num_microbatches, cand.virtual_stages
    )

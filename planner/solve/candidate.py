"""A plan the search considers (:class:`Candidate`) and a simulated one (:class:`Scored`).

A candidate is hashable data: its stages (layer range, device list, recompute), schedule,
microbatch size and count, and chunks per device. :meth:`Scored.key` orders simulated
candidates: fitting first, then time per sample, fewer devices, the conventional schedule,
then the plan itself, so the search's choices never depend on iteration order.

Example::

    cand = Candidate((((0, 3), ("gpu0",), False), ((4, 7), ("gpu1",), False)), "1f1b", 4, 8)
    cand.samples, [s.layers for s in cand.specs()]  # 32, [(0, 3), (4, 7)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.plan import StageSpec
from planner.solve.options import AUTO_SCHEDULES

__all__ = ["Candidate", "Scored", "StageKey", "with_recompute"]

StageKey = tuple[tuple[int, int], tuple[str, ...], bool]


@dataclass(frozen=True)
class Candidate:
    """A fully specified plan to simulate."""

    stages: tuple[StageKey, ...]
    schedule: str
    microbatch_size: int
    num_microbatches: int
    virtual_stages: int = 1

    def specs(self) -> list[StageSpec]:
        return [
            StageSpec(id=i, layers=r, devices=list(d), recompute=rc)
            for i, (r, d, rc) in enumerate(self.stages)
        ]

    @property
    def samples(self) -> int:
        return self.microbatch_size * self.num_microbatches


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
        used = sum(len(d) for _, d, _ in self.cand.stages)
        return (
            not self.fits,
            round(self.per_sample_ms, 9),
            used,
            AUTO_SCHEDULES.index(self.cand.schedule) if self.cand.schedule in AUTO_SCHEDULES else 9,
            repr(self.cand),
        )


def with_recompute(cand: Candidate, flags: Sequence[bool]) -> Candidate:
    """``cand`` with its stages' recompute flags replaced by ``flags``.

    Example::

        with_recompute(cand, [True, False])
    """
    stages = tuple((r, d, bool(f)) for (r, d, _), f in zip(cand.stages, flags, strict=True))
    return Candidate(
        stages, cand.schedule, cand.microbatch_size, cand.num_microbatches, cand.virtual_stages
    )

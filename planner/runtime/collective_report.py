"""``pipeplan run --count-collectives``: a run's collectives per stage and microbatch beside
what the plan's profile lists for the stage's layers.

A tensor-parallel stage's collectives are issued inside its modules; the run counts those of
the last step's forwards and backwards (:mod:`planner.runtime.collective_count`). Per stage
and phase (``forward``: ``F``; ``backward``: ``B`` or ``I``) this summary gives what one
microbatch issued on one member, whether every member and microbatch issued the same, and
what the profile lists for the stage's layers at the stage's degree (and sequence
parallelism); the simulator times exactly those. A recomputed stage runs its forward's
collectives again in its backward. Counts are compared as multisets of (operation, bytes).

Example::

    rows = collective_summary(report.collectives, plan, profile)
    rows[0]   # CollectiveRow(stage=0, group='cpu0+cpu1', phase='forward', counted=[...],
              #               listed=[...], uniform=True, match=True)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from planner.plan import Plan
from planner.profile.schema import Profile
from planner.profile.sharding import shard_key
from planner.runtime.measured import CountedCollective
from planner.units import format_bytes

__all__ = ["CollectiveCount", "CollectiveRow", "collective_summary", "describe_collectives"]

PHASES = ("forward", "backward")


@dataclass(frozen=True)
class CollectiveCount:
    """One operation of one size, and how many times one microbatch issued it."""

    op: str
    bytes: int
    count: int


@dataclass(frozen=True)
class CollectiveRow:
    """One tensor-parallel stage and phase: what one microbatch issued on one member
    (``counted``), what the profile lists (``listed``, None without the profile), whether
    every member and microbatch issued the same (``uniform``) and the profile's
    (``match``, None without the profile)."""

    stage: int
    group: str
    phase: str
    counted: list[CollectiveCount]
    listed: list[CollectiveCount] | None
    uniform: bool
    match: bool | None

    def to_dict(self) -> dict[str, Any]:
        """The row as ``run --json`` prints it.

        Example::

            json.dumps([row.to_dict() for row in rows])
        """
        return asdict(self)


def collective_summary(
    counted: Sequence[CountedCollective], plan: Plan, profile: Profile | None
) -> list[CollectiveRow]:
    """One row per tensor-parallel stage and phase (module docstring); ``listed`` and
    ``match`` are None without the profile.

    Example::

        collective_summary(report.collectives, plan, load_profile("profiles/llama.json"))
    """
    issued: dict[tuple[int, str, int, str], list[tuple[str, int]]] = {}
    for c in counted:
        if c.peer:  # a point-to-point message, not a collective
            continue
        issued.setdefault((c.stage, c.device, c.microbatch, c.phase), []).append((c.op, c.bytes))
    rows: list[CollectiveRow] = []
    for stage in plan.stages:
        if stage.tensor_parallel == 1:
            continue
        listed = _listed(stage, plan, profile)
        for phase in PHASES:
            runs = [
                Counter(ops) for (s, _, _, p), ops in issued.items() if s == stage.id and p == phase
            ]
            runs += [Counter()] * (_actions(stage, plan, phase) - len(runs))
            first = runs[0] if runs else Counter()
            want = None if listed is None else Counter(listed[phase])
            rows.append(
                CollectiveRow(
                    stage=stage.id,
                    group="+".join(stage.replica_groups[0]),
                    phase=phase,
                    counted=_as_list(first),
                    listed=None if want is None else _as_list(want),
                    uniform=all(r == first for r in runs),
                    match=None if want is None else all(r == want for r in runs),
                )
            )
    return rows


def describe_collectives(entries: Sequence[CollectiveCount] | None) -> str:
    """Counted operations as one line: ``2 x all_gather 256 KiB, ...``; ``-`` for None.

    Example::

        describe_collectives([CollectiveCount("all_reduce", 4096, 2)])   # '2 x all_reduce 4 KiB'
    """
    if entries is None:
        return "-"
    if not entries:
        return "none"
    return ", ".join(f"{e.count} x {e.op} {format_bytes(e.bytes)}" for e in entries)


def _listed(stage: Any, plan: Plan, profile: Profile | None) -> dict[str, list[Any]] | None:
    """The collectives the profile lists for one microbatch of ``stage``, by phase."""
    if profile is None:
        return None
    key = shard_key(stage.tensor_parallel, sequence_parallel=stage.sequence_parallel)
    try:
        layers = profile.measurement(plan.microbatch_size).layers[stage.first : stage.last + 1]
        listed = [c for t in layers for c in t.sharded[key].collectives]
    except (KeyError, ValueError):  # a profile without the entries: nothing to compare
        return None
    out: dict[str, list[Any]] = {p: [] for p in PHASES}
    for c in listed:
        out[c.phase].append((c.op, c.bytes))
    if stage.recompute:  # the backward runs the forward again, collectives and all
        out["backward"] += out["forward"]
    return out


def _actions(stage: Any, plan: Plan, phase: str) -> int:
    """How many (member, microbatch) actions of ``phase`` the last step ran for ``stage``:
    every member of every replica runs each of its replica's microbatches once."""
    kinds = {"F"} if phase == "forward" else {"B", "I"}
    return sum(
        1
        for device, actions in plan.schedule.devices.items()
        for a in actions
        if a.kind.name in kinds and a.stage == stage.id and device in stage.devices
    )


def _as_list(ops: Counter[tuple[str, int]]) -> list[CollectiveCount]:
    return [CollectiveCount(op, size, n) for (op, size), n in sorted(ops.items())]

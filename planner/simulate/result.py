"""What a simulation returns: the timed iteration (:class:`SimResult`) and its events.

Example::

    result = simulate(profile, topology, stages, "1f1b", 8)
    result.iteration_ms, result.events[0], result.transfers[0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from planner.plan import Prediction
from planner.schedule import Schedule
from planner.simulate.program import KIND_NAMES

__all__ = ["EngineOutput", "SimEvent", "SimResult", "TransferEvent", "bubble"]


class SimEvent(NamedTuple):
    """One timed action on one device (compute, all-reduce or optimizer step)."""

    device: str
    kind: str  # "F" "B" "I" "W" "ALLREDUCE" "STEP"
    stage: int
    microbatch: int  # -1 for ALLREDUCE/STEP
    start_ms: float
    end_ms: float


class TransferEvent(NamedTuple):
    """One transfer between devices: activations ("F") or gradients ("B")."""

    src: str
    dst: str
    kind: str
    stage: int  # the receiving stage
    microbatch: int
    start_ms: float
    end_ms: float
    nbytes: int


@dataclass
class SimResult:
    """What one simulated iteration costs.

    ``memory_timeline[dev]`` is a step curve ``[(time_ms, bytes), ...]``; ``staleness``
    lists, per stage, how many optimizer steps old the weights are that its gradients are
    computed with (asynchronous schedules only).
    """

    iteration_ms: float
    memory_bytes: dict[str, int]
    busy_ms: dict[str, float]
    bubble_fraction: float
    lower_bound_ms: float
    staleness: list[int] | None
    raw_events: list[tuple[int, int, int, int, float, float]]
    schedule: Schedule
    raw_transfers: list[tuple[int, int, int, int, float, float, int]] = field(default_factory=list)
    memory_timeline: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    memory_limit_bytes: dict[str, int] = field(default_factory=dict)
    static_bytes: dict[str, int] = field(default_factory=dict)
    makespan_ms: float = 0.0
    microbatch_size: int = 0
    num_microbatches: int = 0
    device_names: list[str] = field(default_factory=list)
    # Iterations the events cover (a no-flush schedule is timed as a stream).
    iterations: int = 1
    # Optimizer step per stage (its slowest device's), as the iteration includes it.
    step_ms: list[float] = field(default_factory=list)
    # Tensor parallelism: each group's leader (a name in device_names, which the events
    # use) and its group; the per-device maps list every member.
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def label(self, device: str) -> str:
        """A row's name: the device, or its tensor-parallel group (``gpu0+gpu1``).

        Example::

            result.label("gpu0")   # 'gpu0+gpu1'
        """
        group = self.groups.get(device)
        return device if group is None else "+".join(group)

    @property
    def transfers(self) -> list[TransferEvent]:
        """Timed transfers between devices (built on first use)."""
        cached: list[TransferEvent] | None = self.__dict__.get("_transfers")
        if cached is None:
            names, total = self.device_names, self.num_microbatches * self.iterations
            cached = [
                TransferEvent(
                    names[src],
                    names[dst],
                    "B" if back else "F",
                    into // total,
                    into % total,
                    start,
                    end,
                    nbytes,
                )
                for src, dst, back, into, start, end, nbytes in self.raw_transfers
            ]
            self.__dict__["_transfers"] = cached
        return cached

    @property
    def events(self) -> list[SimEvent]:
        """Timed compute, all-reduce and step actions (built on first use)."""
        cached: list[SimEvent] | None = self.__dict__.get("_events")
        if cached is None:
            names = self.device_names
            cached = [
                SimEvent(names[di], KIND_NAMES[code], s, k, start, end)
                for di, code, s, k, start, end in self.raw_events
            ]
            self.__dict__["_events"] = cached
        return cached

    @property
    def samples_per_s(self) -> float:
        return (
            self.num_microbatches * self.microbatch_size / self.iteration_ms * 1e3
            if (self.iteration_ms > 0)
            else math.inf
        )

    @property
    def fits(self) -> bool:
        """Every device's peak memory is within its limit (True without a topology)."""
        return all(self.memory_bytes[d] <= limit for d, limit in self.memory_limit_bytes.items())

    @property
    def idle_ms(self) -> dict[str, float]:
        return {d: max(0.0, self.iteration_ms - b) for d, b in self.busy_ms.items()}

    def predicted(self) -> dict[str, Any]:
        """The plan's ``predicted`` object of this simulation
        (:meth:`planner.plan.Prediction.from_result`, as JSON).

        Example::

            result.predicted()["iteration_ms"]
        """
        return Prediction.from_result(self).to_dict()


class EngineOutput(NamedTuple):
    """What an engine leaves: per device its clock and per link when it is free, the raw
    events and transfers (when recorded), per device its memory curve and final level."""

    clock: list[float]
    link_free: list[float]
    raw_events: list[tuple[int, int, int, int, float, float]]
    raw_transfers: list[tuple[int, int, int, int, float, float, int]]
    mem: list[list[tuple[float, int]]]
    levels: list[int]


def bubble(busy: dict[str, float], iteration_ms: float) -> float:
    """The idle share of all devices' time over an iteration.

    Example::

        bubble({"a": 3.0, "b": 1.0}, 4.0)    # 0.5
    """
    if iteration_ms <= 0 or not busy:
        return 0.0
    return max(0.0, 1.0 - sum(busy.values()) / (len(busy) * iteration_ms))

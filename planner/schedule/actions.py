"""Schedules as data: for each device, the ordered list of actions it runs.

Modelled on ``torch.distributed.pipelining.schedules`` (``_Action``/``_ComputationType``):
one executor walks each device's list, so the simulator times exactly what ``run`` will
execute. A :class:`Schedule` is one type at both levels: generated schedules keep their
compact per-rank compute order (``order``: ``("F", stage, microbatch)`` tuples) and expand
it into device lists with sends, receives, all-reduces and steps (``devices``) only when
asked (``is_expanded`` says whether that happened); schedules read from a plan have the
device lists only. The actions and their text form are :mod:`planner.schedule.action`'s.

Example::

    sched = Schedule.from_dict(plan_json["schedule"])   # plan.schedule: already one
    sched.weight_versions, sched.flush, sched.splits_backward
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from planner.errors import InputError
from planner.schedule.action import COMPUTE, Action, ActionType
from planner.schedule.expand import expand

__all__ = ["COMPUTE", "Action", "ActionType", "Schedule"]


class Schedule:
    """Per-device ordered action lists plus what generated them.

    ``flush`` is False for asynchronous schedules (2bw): consecutive iterations may
    overlap; ``iterations`` says how many iterations the lists contain (normally 1).
    Generated schedules keep their compact per-rank compute ``order`` and expand the
    device lists (with sends, receives, all-reduces and steps) only when asked, so the
    solver's simulation loop never builds them. ``generated``: the lists are what the named
    family's generator makes (:func:`planner.schedule.build_schedule` says so; it is not
    written to a plan, so a schedule read from one is not assumed to be).
    """

    def __init__(
        self,
        name: str,
        num_stages: int,
        num_microbatches: int,
        devices: dict[str, list[Action]] | None = None,
        *,
        virtual_stages: int = 1,
        flush: bool = True,
        iterations: int = 1,
        meta: dict[str, Any] | None = None,
        order: dict[int, list[tuple[str, int, int]]] | None = None,
        stages: Sequence[Any] | None = None,
        generated: bool = False,
    ):
        if devices is None and (order is None or stages is None):
            raise ValueError("a Schedule needs device lists or an order with its stages")
        self.name = name
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches
        self.virtual_stages = virtual_stages
        self.flush = flush
        self.iterations = iterations
        self.meta = dict(meta or {})
        self.order = order
        self.stages = list(stages) if stages is not None else None
        self._devices = devices
        self.generated = generated

    @property
    def devices(self) -> dict[str, list[Action]]:
        """``{device: [Action, ...]}`` in execution order."""
        if self._devices is None:
            assert self.order is not None and self.stages is not None
            self._devices = expand(self.stages, self.order, num_microbatches=self.num_microbatches)
        return self._devices

    @property
    def is_expanded(self) -> bool:
        """Whether the device lists exist (read from a plan, or expanded on request); a
        generated schedule that was never asked for them has its compact ``order`` only."""
        return self._devices is not None

    @property
    def weight_versions(self) -> int:
        """Weight versions a stage keeps: 2 without a flush (2bw: iterations overlap and
        gradients are one step stale), else 1."""
        return 1 if self.flush else 2

    @property
    def splits_backward(self) -> bool:
        """Whether backwards run as separate input (I) and weight (W) halves."""
        if self.order is not None:
            return any(op[0] == "I" for ops in self.order.values() for op in ops)
        return any(a.kind is ActionType.I for acts in self.devices.values() for a in acts)

    def __repr__(self) -> str:
        return (
            f"Schedule({self.name!r}, stages={self.num_stages}, "
            f"microbatches={self.num_microbatches}, virtual_stages={self.virtual_stages})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan's ``schedule`` object.

        Example::

            plan_json["schedule"] = schedule.to_dict()
        """
        out: dict[str, Any] = {
            "name": self.name,
            "virtual_stages": self.virtual_stages,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "flush": self.flush,
            "devices": {dev: [str(a) for a in acts] for dev, acts in self.devices.items()},
        }
        if self.iterations != 1:
            out["iterations"] = self.iterations
        if self.meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> Schedule:
        """Read a plan's ``schedule`` object (structure only; see ``validate``).

        Example::

            Schedule.from_dict(plan_json["schedule"], source="plan.json")
        """
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise InputError('expected an object with "name"', file=source, field="schedule")
        raw = data.get("devices")
        if not isinstance(raw, dict) or not raw:
            raise InputError(
                "expected a per-device op order {device: [actions]}",
                file=source,
                field="schedule.devices",
            )
        devices: dict[str, list[Action]] = {}
        for dev, items in raw.items():
            where = f"schedule.devices.{dev}"
            if not isinstance(items, list):
                raise InputError("expected a list of actions", file=source, field=where)
            try:
                devices[str(dev)] = [
                    Action.parse(item, where=f"{where}[{i}]") for i, item in enumerate(items)
                ]
            except InputError as exc:
                raise InputError(exc.message, file=source, field=exc.field) from None
        stages = [a.stage for acts in devices.values() for a in acts]
        mbs = [a.microbatch for acts in devices.values() for a in acts]

        def count(key: str, default: int) -> int:
            value = data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(
                    f"expected a positive integer, got {value!r}",
                    file=source,
                    field=f"schedule.{key}",
                )
            return value

        return cls(
            data["name"],
            count("num_stages", max(stages, default=0) + 1),
            count("num_microbatches", max(mbs, default=0) + 1),
            devices,
            virtual_stages=count("virtual_stages", 1),
            flush=bool(data.get("flush", True)),
            iterations=count("iterations", 1),
            meta=dict(data.get("meta") or {}),
        )

    def compute_actions(self, device: str) -> Iterable[Action]:
        """The compute actions (F, B, I, W) of one device, in order."""
        return (a for a in self.devices[device] if a.kind in COMPUTE)

    def text(self) -> str:
        """One line per device, e.g. ``gpu0: F0.0 SEND_F0.0->gpu1 F0.1 ...``."""
        return "\n".join(
            f"{dev}: " + " ".join(str(a) for a in acts) for dev, acts in self.devices.items()
        )

"""Schedules as data: for each device, the ordered list of actions it runs.

Modelled on ``torch.distributed.pipelining.schedules`` (``_Action``/``_ComputationType``):
one executor walks each device's list, so the simulator times exactly what ``run`` will
execute. The compact text form of an action (see docs/schedules.md)::

    F3.7             forward of stage 3 on microbatch 7
    B3.7             whole backward            I3.7 / W3.7   its input- / weight-gradient half
    SEND_F3.7->gpu4  send stage 3's output of microbatch 7 (non-blocking)
    RECV_F4.7<-gpu3  receive stage 4's input of microbatch 7 (blocks until it arrived)
    SEND_B4.7->gpu3  send stage 4's input gradient   RECV_B3.7<-gpu4  receive stage 3's
                     output gradient
    ALLREDUCE3       all-reduce stage 3's gradients among its replicas
    STEP3            optimizer step of stage 3

Example::

    a = Action.parse("SEND_F0.3->gpu1")
    str(a)                                   # 'SEND_F0.3->gpu1'
    sched = Schedule.from_dict(plan_json["schedule"])   # plan.schedule: already one
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any, NamedTuple

from planner.errors import InputError

__all__ = [
    "COMPUTE",
    "Action",
    "ActionType",
    "Schedule",
]


class ActionType(str, Enum):
    """What an action does; the value is its spelling in the compact text form."""

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 - the standard name of the input-gradient half
    W = "W"
    SEND_ACT = "SEND_F"
    RECV_ACT = "RECV_F"
    SEND_GRAD = "SEND_B"
    RECV_GRAD = "RECV_B"
    ALLREDUCE = "ALLREDUCE"
    OPTIMIZER_STEP = "STEP"
    # torch.distributed.pipelining's spellings of the same four (Enum aliases).
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"


COMPUTE = frozenset({ActionType.F, ActionType.B, ActionType.I, ActionType.W})
_SENDS = frozenset({ActionType.SEND_ACT, ActionType.SEND_GRAD})
_RECVS = frozenset({ActionType.RECV_ACT, ActionType.RECV_GRAD})
_PATTERN = re.compile(
    r"^(?P<kind>SEND_F|RECV_F|SEND_B|RECV_B|ALLREDUCE|STEP|F|B|I|W)"
    r"(?P<stage>\d+)(?:\.(?P<mb>\d+))?(?:(?P<arrow>->|<-)(?P<peer>\S+))?$"
)


class Action(NamedTuple):
    """One step of one device: ``kind`` of ``stage`` on ``microbatch`` (``-1`` for
    ALLREDUCE/STEP); ``peer`` is the other device of a send or receive."""

    kind: ActionType
    stage: int
    microbatch: int = -1
    peer: str | None = None

    def __str__(self) -> str:
        head = f"{self.kind.value}{self.stage}"
        if self.kind in (ActionType.ALLREDUCE, ActionType.OPTIMIZER_STEP):
            return head
        head = f"{head}.{self.microbatch}"
        if self.kind in _SENDS:
            return f"{head}->{self.peer}"
        if self.kind in _RECVS:
            return f"{head}<-{self.peer}"
        return head

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @classmethod
    def parse(cls, text: str, *, where: str = "schedule") -> Action:
        """Parse the compact text form; an InputError names the bad entry.

        Example::

            Action.parse("RECV_B2.0<-gpu3")
        """
        match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise InputError(
                f"cannot read action {text!r}; expected e.g. F0.3, B0.3, I0.3, W0.3, "
                "SEND_F0.3->gpu1, RECV_B0.3<-gpu1, ALLREDUCE0, STEP0 (see docs/schedules.md)",
                field=where,
            )
        kind = ActionType(match["kind"])
        stage = int(match["stage"])
        mb = match["mb"]
        peer = match["peer"]
        collective = kind in (ActionType.ALLREDUCE, ActionType.OPTIMIZER_STEP)
        if collective and (mb is not None or peer is not None):
            raise InputError(f"{text!r}: {kind.value} takes only a stage", field=where)
        if not collective and mb is None:
            raise InputError(f"{text!r}: expected STAGE.MICROBATCH", field=where)
        wants = "->" if kind in _SENDS else "<-" if kind in _RECVS else None
        if wants != match["arrow"]:
            need = f"'{wants}PEER'" if wants else "no peer"
            raise InputError(f"{text!r}: expected {need}", field=where)
        return cls(kind, stage, -1 if mb is None else int(mb), peer)


class Schedule:
    """Per-device ordered action lists plus what generated them.

    ``flush`` is False for asynchronous schedules (2bw): consecutive iterations may
    overlap; ``iterations`` says how many iterations the lists contain (normally 1).
    Generated schedules keep their compact per-rank compute ``order`` and expand the
    device lists (with sends, receives, all-reduces and steps) only when asked, so the
    solver's simulation loop never builds them.
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

    @property
    def devices(self) -> dict[str, list[Action]]:
        """``{device: [Action, ...]}`` in execution order."""
        if self._devices is None:
            from planner.schedule.expand import expand

            assert self.order is not None and self.stages is not None
            self._devices = expand(self.stages, self.order, num_microbatches=self.num_microbatches)
        return self._devices

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

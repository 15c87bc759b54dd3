"""The actions of a schedule: what one device does next, and its compact text form.

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
"""

from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple

from planner.errors import InputError

__all__ = ["COMPUTE", "RECVS", "SENDS", "Action", "ActionType"]


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
SENDS = frozenset({ActionType.SEND_ACT, ActionType.SEND_GRAD})
RECVS = frozenset({ActionType.RECV_ACT, ActionType.RECV_GRAD})
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
        if self.kind in SENDS:
            return f"{head}->{self.peer}"
        if self.kind in RECVS:
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
        wants = "->" if kind in SENDS else "<-" if kind in RECVS else None
        if wants != match["arrow"]:
            need = f"'{wants}PEER'" if wants else "no peer"
            raise InputError(f"{text!r}: expected {need}", field=where)
        return cls(kind, stage, -1 if mb is None else int(mb), peer)

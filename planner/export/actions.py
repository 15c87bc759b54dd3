"""A plan's per-device action lists as torch.distributed.pipelining's per-rank CSV rows.

``torch.distributed.pipelining.schedules._PipelineScheduleRuntime`` runs a schedule given as
one CSV row per pipeline rank, each cell an ``_Action`` in its text form
``{stage}{kind}{microbatch}``: ``0F3``, ``1B3``, ``1I3``, ``1W3``, ``0SEND_F3``, ``1RECV_F3``,
``1SEND_B3``, ``0RECV_B3``. Its stage indices mean what pipeplan's mean (a send names the
sending stage, a receive the receiving one), so each pipeplan action maps to one cell:

    F0.3 -> 0F3      SEND_F0.3->gpu1 -> 0SEND_F3      RECV_F1.3<-gpu0 -> 1RECV_F3
    B1.3 -> 1B3      SEND_B1.3->gpu0 -> 1SEND_B3      RECV_B0.3<-gpu1 -> 0RECV_B3
    I1.3 -> 1I3      W1.3 -> 1W3

``STEP`` is the optimizer step the user's loop takes after ``schedule.step()`` and
``ALLREDUCE`` the data-parallel gradient all-reduce (see :func:`torch_layout`); neither is
a cell. The ``compute_comms`` rows keep pipeplan's exact order of computation and
communication (``_load_csv(path, format="compute_comms")``); the ``compute_only`` rows keep
only F/B/I/W, and torch adds the communication itself (``_load_csv(path)``, what torchtitan
calls).

A plan whose every stage has ``r`` replicas is ``r`` independent pipelines (microbatch
``k`` runs on replica ``k % r`` of every stage) joined by the all-reduce: a data-parallel
mesh dimension of degree ``r``. Replica ``j`` runs microbatches ``j, j + r, ...``, numbered
``0, 1, ...`` in its own rows.

Example::

    layout = torch_layout(plan.stages, plan.schedule)
    layout.rows[0][1]        # ['1RECV_F0', '1F0', '1B0', '1SEND_B0', ...] (replica 0, rank 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import InputError
from planner.plan import StageSpec
from planner.schedule import COMPUTE, Action, ActionType, Schedule, device_groups

__all__ = ["TorchLayout", "torch_cell", "torch_layout"]

_CELL = {
    ActionType.F: "F",
    ActionType.B: "B",
    ActionType.I: "I",
    ActionType.W: "W",
    ActionType.SEND_ACT: "SEND_F",
    ActionType.RECV_ACT: "RECV_F",
    ActionType.SEND_GRAD: "SEND_B",
    ActionType.RECV_GRAD: "RECV_B",
}


@dataclass(frozen=True)
class TorchLayout:
    """Ranks, stage placement and CSV rows of a plan for torch.distributed.pipelining.

    ``rows[j][r]``: the compute and communication cells of pipeline rank ``r`` in
    data-parallel replica ``j``; ``compute_rows`` the same without communication.
    ``stage_to_rank[s]``: the pipeline rank that holds stage ``s``. Global rank of
    (replica ``j``, pipeline rank ``r``) is ``j * pp_degree + r``.
    """

    pp_degree: int
    dp_degree: int
    stage_to_rank: list[int]
    microbatches_per_replica: int
    rows: list[list[list[str]]]
    compute_rows: list[list[list[str]]]

    @property
    def stages_per_rank(self) -> int:
        return len(self.stage_to_rank) // self.pp_degree


def torch_cell(action: Action, replicas: int = 1) -> str | None:
    """The ``_Action`` text of one pipeplan action, or None for ALLREDUCE/STEP.

    ``replicas`` renumbers microbatch ``k`` as ``k // replicas`` (its index within its
    data-parallel replica).

    Example::

        torch_cell(Action.parse("SEND_F0.3->gpu1"))    # '0SEND_F3'
        torch_cell(Action.parse("STEP0"))              # None
    """
    kind = _CELL.get(action.kind)
    if kind is None:
        return None
    return f"{action.stage}{kind}{action.microbatch // replicas}"


def torch_layout(
    stages: Sequence[StageSpec], schedule: Schedule, *, source: str | None = None
) -> TorchLayout:
    """Map the plan's devices to (replica, pipeline rank) and its lists to CSV rows.

    Raises InputError when the stages have different replica counts (torch has one
    data-parallel degree per pipeline) or a stage's replicas split the microbatches
    unevenly.

    Example::

        torch_layout(parse_stages("0-2:gpu0;3-5:gpu1"), build_schedule("1f1b", stages, 4))
    """
    counts = sorted({len(s.devices) for s in stages})
    if len(counts) > 1:
        which = ", ".join(f"stage {s.id}: {len(s.devices)}" for s in stages)
        raise InputError(
            f"heterogeneous replica counts ({which}): torch.distributed.pipelining has one "
            "data-parallel degree for the whole pipeline; solve with equal replicas per stage",
            file=source,
            field="stages",
        )
    dp = counts[0]
    m = schedule.num_microbatches
    if m % dp:
        raise InputError(
            f"{m} microbatches do not divide evenly among {dp} data-parallel replicas",
            file=source,
            field="num_microbatches",
        )
    groups = device_groups(stages)
    pp_rank = {group: r for r, group in enumerate(groups)}
    stage_to_rank = [pp_rank[tuple(s.devices)] for s in stages]
    rows: list[list[list[str]]] = [[[] for _ in groups] for _ in range(dp)]
    compute: list[list[list[str]]] = [[[] for _ in groups] for _ in range(dp)]
    placed: set[str] = set()
    for stage in stages:
        for j, dev in enumerate(stage.devices):
            r = stage_to_rank[stage.id]
            if dev in placed:
                continue  # an interleaved device: its list is already placed
            placed.add(dev)
            for action in schedule.devices.get(dev, []):
                _check_replica(action, j, dp, dev, source)
                cell = torch_cell(action, dp)
                if cell is not None:
                    rows[j][r].append(cell)
                    if action.kind in COMPUTE:
                        compute[j][r].append(cell)
    return TorchLayout(len(groups), dp, stage_to_rank, m // dp, rows, compute)


def _check_replica(action: Action, replica: int, dp: int, device: str, source: str | None) -> None:
    if action.microbatch >= 0 and action.microbatch % dp != replica:
        raise InputError(
            f"device {device} (replica {replica}) runs {action}, a microbatch of replica "
            f"{action.microbatch % dp}; torch's data-parallel replicas are independent "
            "pipelines",
            file=source,
            field=f"schedule.devices.{device}",
        )

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
``0, 1, ...`` in its own rows. A replica that is a tensor-parallel group of ``t`` devices
is ``t`` ranks that run the same rows (member ``i`` of a group talks to member ``i`` of the
next): a tensor-parallel dimension of degree ``t``. The ranks form a device mesh
``(pp, dp, tp)`` in torchtitan's order (``ParallelDims``: pipeline outermost, tensor
parallel innermost): rank ``(r * dp + j) * tp + i`` is pipeline rank ``r``, replica ``j``,
member ``i``.

Example::

    layout = torch_layout(plan.stages, plan.schedule)
    layout.rows[0][1]        # ['1RECV_F0', '1F0', '1B0', '1SEND_B0', ...] (replica 0, rank 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.errors import InputError
from planner.plan import StageSpec
from planner.schedule import COMPUTE, Action, ActionType, Schedule, device_groups

__all__ = ["TorchLayout", "fsdp_cells", "torch_cell", "torch_layout"]

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
    data-parallel replica ``j`` (every tensor-parallel member runs them);
    ``compute_rows`` the same without communication. ``stage_to_rank[s]``: the pipeline
    rank that holds stage ``s``. ``devices[r][j][i]``: the plan's device at pipeline rank
    ``r``, replica ``j``, tensor-parallel member ``i``, which is global rank
    ``(r * dp_degree + j) * tp_degree + i`` (:meth:`rank`).
    """

    pp_degree: int
    dp_degree: int
    stage_to_rank: list[int]
    microbatches_per_replica: int
    rows: list[list[list[str]]]
    compute_rows: list[list[list[str]]]
    tp_degree: int = 1
    devices: list[list[list[str]]] = field(default_factory=list)

    @property
    def stages_per_rank(self) -> int:
        return len(self.stage_to_rank) // self.pp_degree

    @property
    def world_size(self) -> int:
        return self.pp_degree * self.dp_degree * self.tp_degree

    def rank(self, pp: int, dp: int, tp: int) -> int:
        """The global rank at mesh coordinates ``(pp, dp, tp)``.

        Example::

            layout.rank(1, 0, 1)     # 3 with dp_degree 1 and tp_degree 2
        """
        return (pp * self.dp_degree + dp) * self.tp_degree + tp

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """``(pp, dp, tp)`` of global ``rank`` (the inverse of :meth:`rank`).

        Example::

            layout.coordinates(3)    # (1, 0, 1) with dp_degree 1 and tp_degree 2
        """
        rest, tp = divmod(rank, self.tp_degree)
        pp, dp = divmod(rest, self.dp_degree)
        return pp, dp, tp


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
    data-parallel degree per pipeline), a stage's replicas split the microbatches
    unevenly, or the members of a tensor-parallel group run different lists.

    Example::

        torch_layout(parse_stages("0-2:gpu0;3-5:gpu1"), build_schedule("1f1b", stages, 4))
    """
    counts = sorted({s.replicas for s in stages})
    if len(counts) > 1:
        which = ", ".join(f"stage {s.id}: {s.replicas}" for s in stages)
        raise InputError(
            f"heterogeneous replica counts ({which}): torch.distributed.pipelining has one "
            "data-parallel degree for the whole pipeline; solve with equal replicas per stage",
            file=source,
            field="stages",
        )
    degrees = {s.tensor_parallel for s in stages}
    if len(degrees) > 1:
        which = ", ".join(f"stage {s.id}: {s.tensor_parallel}" for s in stages)
        raise InputError(
            f"tensor-parallel degrees differ between stages ({which}): the exported "
            "script runs one DeviceMesh of pp x dp x tp, one degree for the whole "
            "pipeline; `pipeplan run` runs this plan, or simulate it with one degree",
            file=source,
            field="stages",
        )
    dp, tp = counts[0], stages[0].tensor_parallel
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
    devices = [[list(g) for g in s.replica_groups] for s in _first_stage_per_rank(stages, groups)]
    placed: set[str] = set()
    for stage in stages:
        r = stage_to_rank[stage.id]
        for j, group in enumerate(stage.replica_groups):
            if group[0] in placed:
                continue  # an interleaved device: its list is already placed
            placed.add(group[0])
            cells = _cells(schedule, group[0], j, dp, source)
            for member in group[1:]:
                _check_member(schedule, cells, member, group[0], j, dp, source)
            rows[j][r] = [cell for cell, _ in cells]
            compute[j][r] = [cell for cell, is_compute in cells if is_compute]
    fsdp = {s.id for s in stages if s.sharding == "fsdp"}
    rows = [[fsdp_cells(row, fsdp) for row in replica] for replica in rows]
    return TorchLayout(len(groups), dp, stage_to_rank, m // dp, rows, compute, tp, devices)


def fsdp_cells(row: list[str], fsdp: set[int]) -> list[str]:
    """``row`` with the cells torch's runtime needs for each stage in ``fsdp`` (sharded
    with FSDP2's ``fully_shard``): ``UNSHARD`` (all-gather its parameters) before its
    first compute, ``REDUCE_GRAD`` (reduce-scatter its gradients) after its last
    backward, then ``RESHARD``: gathered once per step, as torch's own lowering of a
    compute-only schedule does with ``max_active_stages`` large enough.

    Example::

        fsdp_cells(["0F0", "0B0"], {0})   # ['0UNSHARD', '0F0', '0B0', '0REDUCE_GRAD', '0RESHARD']
    """
    if not fsdp:
        return row
    compute = [k for k, c in enumerate(row) if c.lstrip("0123456789")[:1] in ("F", "B", "I", "W")]
    stage_of = {k: int(row[k][: len(row[k]) - len(row[k].lstrip("0123456789"))]) for k in compute}
    first = {s: min(k for k in compute if stage_of[k] == s) for s in fsdp if s in stage_of.values()}
    last = {s: max(k for k in compute if stage_of[k] == s) for s in first}
    out: list[str] = []
    for k, cell in enumerate(row):
        out += [f"{s}UNSHARD" for s, at in first.items() if at == k]
        out.append(cell)
        out += [c for s, at in last.items() if at == k for c in (f"{s}REDUCE_GRAD", f"{s}RESHARD")]
    return out


def _first_stage_per_rank(
    stages: Sequence[StageSpec], groups: Sequence[tuple[str, ...]]
) -> list[StageSpec]:
    """One stage of each pipeline rank, in rank order."""
    return [next(s for s in stages if tuple(s.devices) == g) for g in groups]


def _cells(
    schedule: Schedule, device: str, replica: int, dp: int, source: str | None
) -> list[tuple[str, bool]]:
    """``device``'s list as ``(cell, is compute)`` pairs (ALLREDUCE and STEP left out)."""
    out = []
    for action in schedule.devices.get(device, []):
        _check_replica(action, replica, dp, device, source)
        cell = torch_cell(action, dp)
        if cell is not None:
            out.append((cell, action.kind in COMPUTE))
    return out


def _check_member(
    schedule: Schedule,
    cells: list[tuple[str, bool]],
    member: str,
    leader: str,
    replica: int,
    dp: int,
    source: str | None,
) -> None:
    """Refuse a tensor-parallel member whose list is not its leader's: torch runs one
    row per pipeline rank for every member."""
    if _cells(schedule, member, replica, dp, source) != cells:
        raise InputError(
            f"device {member} runs another order of actions than {leader}, the first "
            "device of its tensor-parallel group; the members of a group run the same "
            "actions in the same order",
            file=source,
            field=f"schedule.devices.{member}",
        )


def _check_replica(action: Action, replica: int, dp: int, device: str, source: str | None) -> None:
    if action.microbatch >= 0 and action.microbatch % dp != replica:
        raise InputError(
            f"device {device} (replica {replica}) runs {action}, a microbatch of replica "
            f"{action.microbatch % dp}; torch's data-parallel replicas are independent "
            "pipelines",
            file=source,
            field=f"schedule.devices.{device}",
        )

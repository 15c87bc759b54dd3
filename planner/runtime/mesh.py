"""The process groups and device meshes of a plan: data-parallel rings and tensor-parallel
groups, per stage.

A stage's devices are ``replicas x tensor_parallel`` (:class:`~planner.stages.StageSpec`,
replica-major). At run time every plan device is one process (tensor-parallel and sharded
plans run one process per device: :func:`check_parallel_run`), and per stage:

* the ranks of each replica's group form a **tensor-parallel** process group (``t > 1``);
* member ``i`` of every replica forms a **data-parallel** process group, ring ``i``
  (``replicas > 1``): the gradients of member ``i``'s shard are summed over it (plain
  data parallelism has one ring, the stage's devices, as before);
* a rank holding the stage gets a :class:`~torch.distributed.device_mesh.DeviceMesh` of
  shape ``(replicas, t)`` (dims ``"dp"``, ``"tp"``) built from those two groups
  (``DeviceMesh.from_group``): ``mesh["tp"]`` is what ``parallelize_module`` shards on and
  ``mesh["dp"]`` what FSDP2's ``fully_shard`` shards over; slices of one mesh, as FSDP2
  requires for two dimensions. A plan's stages need not share one grid (replicas may differ
  per stage), so each stage has its own groups and mesh.

``torch.distributed`` requires every rank to create every group, in one order: stage order,
tensor-parallel groups before data-parallel ones. Stages without tensor parallelism create
exactly the replica groups runs always created (one per stage), and no mesh unless sharded
by FSDP.

Example::

    meshes = stage_meshes(plan.stages, placement, rank, "cpu")
    meshes[0].tp_mesh, meshes[0].dp_group, meshes[0].position
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import InputError

if TYPE_CHECKING:
    from planner.plan import Plan
    from planner.profile.tied import TiedParameter
    from planner.runtime.placement import Placement
    from planner.stages import StageSpec

__all__ = [
    "StageMesh",
    "check_parallel_run",
    "describe_device",
    "is_parallel",
    "member_position",
    "refuse_parallel_ties",
    "stage_meshes",
]


@dataclass
class StageMesh:
    """What one rank holds of a stage's groups: its place in the stage, the stage's
    tensor-parallel and data-parallel groups through this rank, and their mesh."""

    stage: int
    replica: int  # which replica this rank's device belongs to
    position: int  # this rank's place in its replica's tensor-parallel group (0: the leader)
    tp_group: Any = None  # ProcessGroup of the replica's group (t > 1)
    dp_group: Any = None  # ProcessGroup of ring ``position`` over the replicas (replicas > 1)
    mesh: Any = None  # DeviceMesh (dp, tp), (tp,) or (dp,): tensor parallel or FSDP only

    @property
    def tp_mesh(self) -> Any:
        """The one-dimensional tensor-parallel mesh (None without tensor parallelism)."""
        if self.mesh is None or "tp" not in (self.mesh.mesh_dim_names or ()):
            return None
        return self.mesh["tp"] if self.mesh.ndim > 1 else self.mesh

    @property
    def dp_mesh(self) -> Any:
        """The one-dimensional data-parallel mesh (None without one)."""
        if self.mesh is None or "dp" not in (self.mesh.mesh_dim_names or ()):
            return None
        return self.mesh["dp"] if self.mesh.ndim > 1 else self.mesh


def is_parallel(stages: Sequence[StageSpec]) -> bool:
    """Whether any stage is tensor parallel or sharded (what plain runs never were).

    Example::

        is_parallel(parse_stages("0:a+b;1:c+d")), is_parallel(parse_stages("0:a;1:b"))
        # True, False
    """
    return any(not st.is_plain for st in stages)


def member_position(stage: StageSpec, device: str) -> int:
    """``device``'s place in its replica's tensor-parallel group (0 for the leader and for
    every device of a stage without tensor parallelism).

    Example::

        member_position(parse_stages("0:a+b,c+d")[0], "d")   # 1
    """
    return stage.devices.index(device) % stage.tensor_parallel


def stage_meshes(
    stages: Sequence[StageSpec], placement: Placement, rank: int, device_type: str
) -> dict[int, StageMesh]:
    """Create every stage's groups (on every rank, in one order) and return this rank's
    :class:`StageMesh` of each stage it holds.

    Example::

        stage_meshes(plan.stages, placement, 0, "cpu")[0].dp_group
    """
    import torch.distributed as dist

    out: dict[int, StageMesh] = {}
    for st in stages:
        grid = [[placement.rank_of[d] for d in g] for g in st.replica_groups]
        tp = [dist.new_group(g) if st.tensor_parallel > 1 else None for g in grid]
        rings = [[g[i] for g in grid] for i in range(st.tensor_parallel)]
        if st.tensor_parallel == 1:  # plain data parallelism: the ring of the stage's ranks
            rings = [sorted({r for g in grid for r in g})]
        dp = [dist.new_group(ring) if len(ring) > 1 else None for ring in rings]
        mine = [(j, i) for j, g in enumerate(grid) for i, r in enumerate(g) if r == rank]
        if not mine:
            continue
        j, i = mine[0]
        held = StageMesh(st.id, j, i, tp[j], dp[i])
        if st.tensor_parallel > 1 or st.sharding == "fsdp":
            held.mesh = _mesh(grid, held, device_type, st)
        out[st.id] = held
    return out


def _mesh(grid: list[list[int]], held: StageMesh, device_type: str, st: StageSpec) -> Any:
    """The stage's mesh, (dp, tp) or one of them, from the groups through this rank."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    dims = [name for name, n in (("dp", st.replicas), ("tp", st.tensor_parallel)) if n > 1]
    groups = [held.dp_group if name == "dp" else held.tp_group for name in dims]
    ranks = torch.tensor(grid)
    return DeviceMesh.from_group(
        groups if len(groups) > 1 else groups[0],
        device_type,
        mesh=ranks if len(dims) > 1 else ranks.reshape(-1),
        mesh_dim_names=tuple(dims),
    )


def check_parallel_run(
    plan: Plan,
    placement: Placement,
    precision: str | None,
    *,
    source: str | None = None,
    ties: Sequence[TiedParameter] = (),
) -> None:
    """Refuse, in one line naming the stage, a tensor-parallel or sharded plan this run
    cannot execute exactly: several plan devices in one process (shared mode: a group's
    members must be processes of their own, and one process would block in one stage's
    collective while its peer waits in another's), 2bw (two weight versions; sharding
    steps after a flush), FSDP with zero bubble's split backward, fp16 loss scaling, and a
    tied parameter (``ties``: the plan's profile's) on such a stage
    (:func:`refuse_parallel_ties`).

    Example::

        check_parallel_run(plan, placement, "fp32", source="plan.json")
    """
    refuse_parallel_ties(ties, plan.stages, source)
    schedule = plan.schedule
    for st in plan.stages:
        if st.is_plain:
            continue
        where = f"stages[{st.id}]"
        field = f"{where}.tensor_parallel" if st.tensor_parallel > 1 else f"{where}.sharding"
        what = f"stage {st.id} ({st.describe()})"
        refusal = _refusal(placement, plan, precision)
        if refusal is not None:
            raise InputError(f"{what}: {refusal}", file=source, field=field)
        if st.sharding == "fsdp" and schedule.splits_backward:
            raise InputError(
                f"{what}: FSDP reduce-scatters the gradients inside a stage's whole "
                "backward, which zero bubble splits in two; use 1f1b or interleaved",
                file=source,
                field=f"{where}.sharding",
            )


def refuse_parallel_ties(
    ties: Sequence[TiedParameter], stages: Sequence[StageSpec], source: str | None
) -> None:
    """A tied parameter on a tensor-parallel or sharded stage: one line naming the stage.
    Its copies meet outside the stage's sharding (:mod:`planner.runtime.tied` sums whole
    gradients), and a vocabulary-parallel split of a tied embedding is not run. The
    launcher checks the profile's ties before any process starts; each rank checks the
    ties it finds in the model (a plan whose profile is not at hand).

    Example::

        refuse_parallel_ties(profile.tied_parameters, plan.stages, "plan.json")
    """
    for tie in ties:
        for spec in stages:
            if not spec.is_plain and tie.held_by(spec.first, spec.last):
                raise InputError(
                    f"stage {spec.id} ({spec.describe()}) holds the tied parameter "
                    f"{tie.name!r}, which run does not split or shard; keep the stages "
                    "that hold it on one device per replica, unsharded",
                    file=source,
                    field=f"stages[{spec.id}]",
                )


def _refusal(placement: Placement, plan: Plan, precision: str | None) -> str | None:
    if placement.shared:
        return (
            f"tensor parallelism and sharding run one process per plan device, but this run "
            f"puts {len(placement.devices)} devices on {placement.world_size} processes "
            "(shared mode); give each device a process (a GPU each on CUDA)"
        )
    if plan.schedule.weight_versions == 2:
        return (
            "run does not run tensor parallelism or sharding under 2bw (two weight "
            "versions); use 1f1b, interleaved or zb"
        )
    if precision == "fp16":
        return (
            "fp16 loss scaling is not run with tensor parallelism or sharding; profile at "
            "bf16 or fp32"
        )
    return None


def describe_device(stages: Sequence[StageSpec], device: str) -> str:
    """How ``device`` takes part in tensor parallelism and sharding, for the run report's
    placement ('' for a device of plain stages only).

    Example::

        describe_device(parse_stages("0:a+b,c+d"), "c")   # 'TP group c+d'
    """
    parts: list[str] = []
    for st in stages:
        if device not in st.devices or st.is_plain:
            continue
        bits = []
        if st.tensor_parallel > 1:
            group = st.replica_groups[st.devices.index(device) // st.tensor_parallel]
            bits.append(f"TP group {'+'.join(group)}")
            if st.sequence_parallel:
                bits.append("SP")
        if st.sharding != "none":
            bits.append(f"{st.sharding} over {st.replicas} replicas")
        text = ", ".join(bits)
        if text not in parts:
            parts.append(text)
    return "; ".join(parts)

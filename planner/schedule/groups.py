"""Tensor-parallel groups in schedules: the leaders' lists, and every member's mirror of them.

The members of a tensor-parallel group run identical action lists: the group's leader
(its first device, :attr:`~planner.stages.StageSpec.leaders`) runs the schedule's actions,
and member ``i`` runs the same actions with each peer replaced by member ``i`` of the peer's
group (member ``i`` of a group sends to and receives from member ``i`` of the neighbouring
stage's group; between groups of different sizes see :func:`mirror`). Generators and the
simulator therefore work on the *leader view* of a partition (:func:`leader_stages`: one
device per replica, the leader), and the device lists of a plan hold every member
(:func:`mirror`); :func:`unmirror` checks that a plan's lists are such mirrors and gives
back the leaders' lists.

Example::

    stages = parse_stages("0:a+b;1:c+d")
    lead = leader_stages(stages)                 # 0:a;1:c
    mirror({"a": [Action.parse("SEND_F0.0->c")]}, stages)["b"]   # [SEND_F0.0->d]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.errors import InputError
from planner.schedule.action import SENDS, Action
from planner.stages import StageSpec, boundary_pairs

__all__ = ["group_of_leader", "is_grouped", "leader_stages", "mirror", "unmirror"]


def is_grouped(stages: Sequence[StageSpec]) -> bool:
    """Whether any stage runs on tensor-parallel groups of two or more devices.

    Example::

        is_grouped(parse_stages("0:a+b")), is_grouped(parse_stages("0:a,b"))   # True, False
    """
    return any(st.tensor_parallel > 1 for st in stages)


def leader_stages(stages: Sequence[StageSpec]) -> list[StageSpec]:
    """The partition as its leaders run it: each stage on its replicas' leaders, one device
    per replica (layers and recompute kept; the groups' other options are the cost model's).

    Example::

        leader_stages(parse_stages("0-1:a+b,c+d"))[0].devices   # ('a', 'c')
    """
    return [
        st if st.tensor_parallel == 1 else StageSpec(st.id, st.layers, st.leaders, st.recompute)
        for st in stages
    ]


def group_of_leader(stages: Sequence[StageSpec]) -> dict[str, tuple[str, ...]]:
    """Each leader's group, for the stages that are tensor parallel.

    Example::

        group_of_leader(parse_stages("0:a+b;1:c+d"))   # {'a': ('a', 'b'), 'c': ('c', 'd')}
    """
    out: dict[str, tuple[str, ...]] = {}
    for st in stages:
        if st.tensor_parallel > 1:
            for group in st.replica_groups:
                out[group[0]] = group
    return out


def mirror(
    lists: Mapping[str, Sequence[Action]], stages: Sequence[StageSpec]
) -> dict[str, list[Action]]:
    """Every device's list from the leaders' ``lists``: each member right after its leader,
    with the leader's actions and each peer mapped to the peer group's member at the same
    place. Between groups of different sizes (:func:`~planner.stages.boundary_peers`) a
    member receives from the peer group's member ``i mod u`` and sends to each member ``k``
    with ``k mod t == i`` (``t``, ``u``: its group's and the peer group's sizes), so a send
    may become several or none. Where sequence parallelism splits the values on one side
    or both and the layouts differ (:func:`~planner.stages.boundary_pieces`), a member
    also receives from every member holding a part of the range it needs, in sequence
    order.

    Example::

        mirror({"a": [Action.parse("RECV_F1.0<-c")]}, parse_stages("0:c+d;1:a+b"))
        # {'a': [RECV_F1.0<-c], 'b': [RECV_F1.0<-d]}
        mirror({"c": [Action.parse("SEND_B1.0->a")]}, parse_stages("0:a+b;1:c"))
        # {'c': [SEND_B1.0->a, SEND_B1.0->b]}
        mirror({"c": [Action.parse("RECV_F1.0<-a")]},
               with_parallelism(parse_stages("0:a+b;1:c"), sequence_parallel=True))
        # {'c': [RECV_F1.0<-a, RECV_F1.0<-b]}
    """
    groups = group_of_leader(stages)
    peers = _Peers(groups, {d for st in stages if st.sequence_parallel for d in st.devices})
    out: dict[str, list[Action]] = {}
    for leader, acts in lists.items():
        group = groups.get(leader, (leader,))
        for i, member in enumerate(group):
            out[member] = _member_actions(acts, group, i, peers)
    return out


class _Peers:
    """Who a member sends to and receives from across a boundary
    (:func:`~planner.stages.boundary_pairs`), cached per pair of groups."""

    def __init__(self, groups: Mapping[str, tuple[str, ...]], split: set[str]):
        self.groups = groups
        self.split = split  # devices of sequence-parallel stages
        self.found: dict[tuple[tuple[str, ...], tuple[str, ...]], list[tuple[str, str]]] = {}

    def group(self, dev: str) -> tuple[str, ...]:
        return self.groups.get(dev, (dev,))

    def pairs(self, senders: tuple[str, ...], receivers: tuple[str, ...]) -> list[tuple[str, str]]:
        """The ``(sender, receiver)`` transfers between two groups, per receiver in order."""
        key = (senders, receivers)
        hit = self.found.get(key)
        if hit is None:
            split = (senders[0] in self.split, receivers[0] in self.split)
            hit = boundary_pairs(senders, receivers, split=split)
            self.found[key] = hit
        return hit


def _member_actions(
    acts: Sequence[Action], group: tuple[str, ...], place: int, peers: _Peers
) -> list[Action]:
    """The list of member ``place`` of ``group`` (see :func:`mirror`)."""
    out: list[Action] = []
    me = group[place]
    for a in acts:
        if a.peer is None:
            out.append(a)
            continue
        other = peers.group(a.peer)
        if a.kind in SENDS:
            pairs = peers.pairs(group, other)
            out.extend(a._replace(peer=r) for s, r in pairs if s == me)
        else:
            pairs = peers.pairs(other, group)
            out.extend(a._replace(peer=s) for s, r in pairs if r == me)
    return out


def unmirror(
    lists: Mapping[str, Sequence[Action]],
    stages: Sequence[StageSpec],
    *,
    source: str | None = None,
) -> dict[str, list[Action]]:
    """The leaders' lists of a plan's device lists, after checking that every member's list
    is its leader's mirror (:func:`mirror`); one InputError naming the first difference.

    Example::

        unmirror(plan.schedule.devices, plan.stages, source="plan.json")
    """
    groups = group_of_leader(stages)
    members = {m for g in groups.values() for m in g[1:]}
    # A leader's own list may send to members too (to a larger group): those sends follow
    # from the leader's send to the peer group's leader, as the members' lists do.
    leaders = {
        d: [a for a in acts if a.peer not in members]
        for d, acts in lists.items()
        if d not in members
    }
    expected = mirror(leaders, stages)
    for dev in members:
        if dev not in lists:
            raise InputError(
                "missing: every member of a tensor-parallel group runs its leader's actions",
                file=source,
                field=f"schedule.devices.{dev}",
            )
    for dev, want in expected.items():
        got = list(lists[dev])
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
            at = min(len(got), len(want)) if at is None else at
            shown = str(want[at]) if at < len(want) else "the end of the list"
            raise InputError(
                f"expected {shown} (the mirror of its group leader's list: a group's "
                "members run the leader's actions, each with its own peer)",
                file=source,
                field=f"schedule.devices.{dev}[{at}]",
            )
    return leaders

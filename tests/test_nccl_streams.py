"""The pipeline's sends and receives under NCCL's stream rules, checked without a GPU.

torch's ProcessGroupNCCL runs every unbatched ``isend``/``irecv`` between two ranks of a
process group on one stream of that pair (both directions), and NCCL lets a send finish
only once its receive runs (messages beyond NCCL's buffers; small ones may go eagerly, so
a deadlock shows only at real sizes). A queued receive holds its stream until its message
arrives. gloo has no streams, so the CPU runs cannot show a deadlock of this kind.

torch also creates a group's NCCL communicator for a pair at its first send or receive
there, and both ranks' hosts block until the other arrives.

The test drives :func:`~planner.runtime.comm.p2p_groups` and
:class:`~planner.runtime.comm.P2P` exactly as one process per plan device does
(``prefetch``, then each action's ``send`` or ``recv(...).wait()``), records what every
rank posts with a stand-in for ``torch.distributed``, and plays the posts on a model of
the GPU: per rank, one FIFO per (process group, pair of ranks); a send and its receive
complete together when both head their FIFOs and everything the rank waited for before
posting them (its earlier receives) has completed. The hosts are modelled too: each rank
walks its streams in the order it first touches them, and a stream's communicator exists
once both ranks have reached it. Three real processes (gloo) then carry a 1F1B step's
messages on the groups a NCCL run creates.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from planner.plan import parse_stages
from planner.runtime.comm import P2P, ValueSpec, message_key, message_order, p2p_groups
from planner.schedule import ActionType, build_schedule

_SEND = (ActionType.SEND_ACT, ActionType.SEND_GRAD)
_RECV = (ActionType.RECV_ACT, ActionType.RECV_GRAD)


@dataclass
class _Op:
    """One posted send or receive on the model's GPU."""

    kind: str  # "send" or "recv"
    peer: int
    stream: tuple[Any, frozenset[int]]  # (process group, pair of ranks): torch's NCCL stream
    after: int  # how many of the rank's receive waits came before it (its dependencies)
    warm: bool = False  # posted by p2p_groups (creating the communicators)
    done: bool = False


@dataclass
class _Rank:
    ops: list[_Op] = field(default_factory=list)
    waited: list[int] = field(default_factory=list)  # op index of each receive waited for


class _Work:
    def __init__(self, rank: _Rank, index: int | None):
        self.rank, self.index = rank, index

    def wait(self) -> None:
        if self.index is not None:  # a receive: the rank's stream now waits for it
            self.rank.waited.append(self.index)

    def is_completed(self) -> bool:
        return True


def _fake_dist(rank_id: int, ranks: dict[int, _Rank], monkeypatch: Any) -> None:
    """Stand-ins for ``torch.distributed`` recording rank ``rank_id``'s posts; its groups
    are numbered in creation order (so every rank names one group alike)."""
    rank = ranks[rank_id]
    made: list[tuple[int, ...]] = []

    def op(kind: str, peer: int, group: Any, warm: bool = False) -> _Op:
        stream = ("default" if group is None else group, frozenset((rank_id, peer)))
        return _Op(kind, peer, stream, after=len(rank.waited), warm=warm)

    def isend(t: torch.Tensor, dst: int, group: Any = None) -> _Work:
        rank.ops.append(op("send", dst, group))
        return _Work(rank, None)

    def irecv(t: torch.Tensor, src: int, group: Any = None) -> _Work:
        rank.ops.append(op("recv", src, group))
        return _Work(rank, len(rank.ops) - 1)

    def send(t: torch.Tensor, dst: int, group: Any = None) -> None:
        rank.ops.append(op("send", dst, group, warm=True))

    def recv(t: torch.Tensor, src: int, group: Any = None) -> None:
        rank.ops.append(op("recv", src, group, warm=True))
        rank.waited.append(len(rank.ops) - 1)

    def new_group(members: list[int]) -> tuple[int, ...]:
        made.append((len(made), *members))
        return made[-1]

    for name, fake in [("isend", isend), ("irecv", irecv), ("send", send), ("recv", recv),
                       ("new_group", new_group)]:  # fmt: skip
        monkeypatch.setattr(dist, name, fake)


def _hosts_block(ranks: Mapping[int, _Rank], warm: bool = True) -> bool:
    """True when the hosts would wait for each other in a circle creating communicators:
    each rank meets its streams in the order it first posts on them (``warm=False``:
    as if ``p2p_groups`` had posted nothing)."""
    firsts: dict[int, list[Any]] = {}
    for rid, r in ranks.items():
        seen: list[Any] = []
        for o in r.ops:
            if (warm or not o.warm) and o.stream not in seen:
                seen.append(o.stream)
        firsts[rid] = seen
    at = dict.fromkeys(ranks, 0)
    progress = True
    while progress:
        progress = False
        for rid, seen in firsts.items():
            if at[rid] == len(seen):
                continue
            stream = seen[at[rid]]
            (peer,) = stream[1] - {rid}
            if at[peer] < len(firsts[peer]) and firsts[peer][at[peer]] == stream:
                at[rid] += 1
                at[peer] += 1
                progress = True
    return any(at[rid] < len(seen) for rid, seen in firsts.items())


def _deadlocks(ranks: Mapping[int, _Rank]) -> bool:
    """Play every rank's posts on the model GPU; True when some never complete."""

    def ready(r: _Rank, i: int) -> bool:
        return all(r.ops[j].done for j in r.waited[: r.ops[i].after])

    def head(r: _Rank, stream: Any) -> int | None:
        return next((i for i, o in enumerate(r.ops) if o.stream == stream and not o.done), None)

    progress = True
    while progress:
        progress = False
        for rid, r in ranks.items():
            for i, o in enumerate(r.ops):
                if o.done or o.kind != "send" or head(r, o.stream) != i or not ready(r, i):
                    continue
                peer = ranks[o.peer]
                j = head(peer, o.stream)
                if j is None:
                    continue
                mate = peer.ops[j]
                if mate.kind == "recv" and mate.peer == rid and ready(peer, j):
                    o.done = mate.done = True
                    progress = True
    return any(not o.done for r in ranks.values() for o in r.ops)


def _play(text: str, schedule: str, m: int, directed: bool, monkeypatch: Any) -> dict[int, _Rank]:
    """One step of the plan's lists (one process per device) posted through P2P, each
    rank's posts recorded (``directed``: with NCCL's groups per direction)."""
    stages = parse_stages(text)
    devices = build_schedule(schedule, stages, m).devices
    rank_of = {d: i for i, d in enumerate(devices)}
    order = message_order(devices, stages, rank_of)
    spec = ValueSpec(True, (2, 2), torch.float32)
    specs = [[spec] for _ in stages[:-1]] + [[]]
    ranks = {r: _Rank() for r in rank_of.values()}
    for dev, r in rank_of.items():
        _fake_dist(r, ranks, monkeypatch)
        groups = p2p_groups(order, "nccl" if directed else "gloo", r)
        assert bool(groups) == directed
        p2p = P2P(r, order, specs, torch.device("cpu"), groups=groups)
        p2p.prefetch()
        for a in devices[dev]:
            assert a.peer is not None or a.kind not in (*_SEND, *_RECV)
            if a.kind in _SEND:
                p2p.send(message_key(a), rank_of[str(a.peer)], [torch.zeros(2, 2)])
            elif a.kind in _RECV:
                p2p.recv(message_key(a), rank_of[str(a.peer)]).wait()
        p2p.finish()
    return ranks


CASES = [
    ("0:a;1:b", "gpipe", 4),
    ("0:a;1:b", "1f1b", 4),
    ("0:a;1:b;2:c;3:d", "1f1b", 8),
    ("0:a;1:b;2:a;3:b", "interleaved", 4),
    ("0:a;1:b;2:c", "zb", 6),
]


@pytest.mark.parametrize(("stages", "schedule", "m"), CASES)
def test_nccl_pipeline_messages_cannot_deadlock_on_the_gpu(
    stages: str, schedule: str, m: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a process group per direction (what a NCCL run creates) every message
    completes and the communicators are created without the hosts waiting in a circle; on
    one group per pair (torch's default, what gloo runs use) the receive posted ahead
    blocks the sends behind it: the model finds the deadlock."""
    directed = _play(stages, schedule, m, directed=True, monkeypatch=monkeypatch)
    assert not _deadlocks(directed) and not _hosts_block(directed)
    assert _deadlocks(_play(stages, schedule, m, directed=False, monkeypatch=monkeypatch))


def test_without_the_first_messages_the_hosts_would_block_creating_communicators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three stages: rank 1 first receives from rank 0 while rank 0 first receives from
    rank 1 (its prefetch), each on a group the other first touches later. The one message
    per group that p2p_groups sends, in one order everywhere, creates them first."""
    ranks = _play("0:a;1:b;2:c", "1f1b", 4, directed=True, monkeypatch=monkeypatch)
    assert _hosts_block(ranks, warm=False) and not _hosts_block(ranks)


def test_p2p_groups_are_nccl_only_one_per_direction(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = {r: _Rank() for r in range(3)}
    _fake_dist(2, ranks, monkeypatch)
    order: dict[tuple[int, int], list[Any]] = {(1, 0): [], (0, 1): [], (1, 2): []}
    assert p2p_groups(order, "gloo", 2) == {} and ranks[2].ops == []
    groups = p2p_groups(order, "nccl", 2)  # every rank: the same groups, in one order
    assert groups == {(0, 1): (0, 0, 1), (1, 0): (1, 0, 1), (1, 2): (2, 1, 2)}
    assert [(o.kind, o.peer, o.stream[0]) for o in ranks[2].ops] == [("recv", 1, (2, 1, 2))]


_RANK_SCRIPT = """
import sys, datetime
import torch, torch.distributed as dist
from planner.plan import parse_stages
from planner.runtime.comm import P2P, ValueSpec, message_key, message_order, p2p_groups
from planner.schedule import ActionType, build_schedule

rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=3, timeout=datetime.timedelta(seconds=60))
stages = parse_stages("0:a;1:b;2:c")
devices = build_schedule("1f1b", stages, 4).devices
rank_of = {d: i for i, d in enumerate(devices)}
order = message_order(devices, stages, rank_of)
groups = p2p_groups(order, "nccl", rank, torch.device("cpu"))  # NCCL's groups, on gloo
spec = ValueSpec(True, (2, 2), torch.float32)
p2p = P2P(rank, order, [[spec], [spec], []], torch.device("cpu"), groups=groups)
code = lambda key: (1 if key[0] == "F" else 2) * 100 + key[1] * 10 + key[2]
p2p.prefetch()
dev = [d for d, r in rank_of.items() if r == rank][0]
for a in devices[dev]:
    if a.kind in (ActionType.SEND_ACT, ActionType.SEND_GRAD):
        key = message_key(a)
        p2p.send(key, rank_of[a.peer], [torch.full((2, 2), float(code(key)))])
    elif a.kind in (ActionType.RECV_ACT, ActionType.RECV_GRAD):
        key = message_key(a)
        pending = p2p.recv(key, rank_of[a.peer])
        pending.wait()
        assert pending.buffers[0].eq(code(key)).all(), (rank, key, pending.buffers[0])
p2p.finish()
dist.barrier()
dist.destroy_process_group()
print("ok", rank, len(groups))
"""


def test_the_groups_per_direction_carry_a_pipelines_messages_on_real_processes(
    tmp_path: Path,
) -> None:
    """Three processes (gloo; the groups NCCL runs get): p2p_groups' groups and first
    messages, then one 1F1B step's activations and gradients through P2P on them, each
    message arriving where its receive expects it."""
    from planner.runtime.launch import free_port, worker_env

    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=worker_env(),
        )
        for r in range(3)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0 and f"ok {r} 4" in out, out[-2000:]

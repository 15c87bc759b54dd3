"""Point-to-point transfers between processes, with shapes known before the first step.

What crosses a cut is fixed by the split (see :mod:`planner.profile.split`): a tuple of
values per microbatch. :func:`cut_specs` finds their shapes and dtypes with one forward of
the split model on ``sample_batch(microbatch_size)``; tensors are then sent one by one
(activations, and gradients for the floating-point ones), and values that are not
tensors (an int, a None) never travel: both sides know them from that pass.

Matching: gloo and NCCL match the messages between two ranks in posting order (NCCL
ignores tags), so both sides must agree on one order per pair of ranks. With one plan
device per process that is the sender's action order; a process driving several plan
devices (shared mode) may produce messages in another order, so :func:`message_order`
fixes a canonical order from a sequential walk of the schedule, senders hold messages
back until the earlier ones to the same rank are posted, and receivers post their
``irecv``s in that order ahead of need so receiving overlaps compute: on the CPU (gloo) as
many as :data:`RECV_AHEAD_BYTES` of buffers allow, every receive of a step at its start
for the examples, because gloo sends a message at once only to a receive already posted
(otherwise the sender's gloo thread sends it when the receive is announced, and on a host
whose cores the ranks fill that thread waits for a core: measured 1-3 ms per message on
the 2-core VM); on CUDA one ahead.

Example::

    specs = cut_specs(split, stages, inputs)        # specs[s]: what stage s sends on
    order = message_order(schedule.devices, stages, placement.rank_of)
    p2p = P2P(rank, order, specs, device)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.schedule.actions import Action, ActionType
from planner.tensors import to_device

if TYPE_CHECKING:
    import torch

    from planner.plan import StageSpec

__all__ = [
    "P2P",
    "RECV_AHEAD_BYTES",
    "MessageKey",
    "Pending",
    "ValueSpec",
    "cut_specs",
    "message_key",
    "message_order",
    "p2p_groups",
    "value_spec",
]

RECV_AHEAD_BYTES = 256 * 2**20
"""How many bytes of receive buffers a CPU (gloo) rank posts ahead of need, per step."""

MessageKey = tuple[str, int, int]
"""``("F", stage, mb)``: activations into ``stage``; ``("B", stage, mb)``: gradients into it."""


@dataclass(frozen=True)
class ValueSpec:
    """One value crossing a cut: a tensor (shape, dtype) or a constant."""

    is_tensor: bool
    shape: tuple[int, ...] = ()
    dtype: Any = None
    constant: Any = None

    @property
    def has_grad(self) -> bool:
        """Floating-point tensors carry a gradient back."""
        return bool(self.is_tensor and self.dtype.is_floating_point)


def cut_specs(
    split: Any, stages: Sequence[StageSpec], inputs: Sequence[Any], device: Any = None
) -> list[list[ValueSpec]]:
    """``specs[s]``: the values stage ``s`` hands to stage ``s + 1`` (empty for the last).

    Runs the split model once without gradients on ``inputs`` (one microbatch), under the
    caller's autocast, so the dtypes are those the stages will produce. On the CPU by
    default; with a CUDA ``device`` each stage in turn is moved there, run, and moved back
    (so CUDA autocast decides the dtypes, one stage's weights at a time on the device).

    Example::

        with autocast("cuda", "bf16"):
            specs = cut_specs(split, plan.stages, inputs, device=torch.device("cuda", 0))
    """
    import torch

    from planner.profile.split import retarget_device  # lazy: pulls torch

    moving = device is not None and torch.device(device).type != "cpu"
    out: list[list[ValueSpec]] = []
    values: tuple[Any, ...] = tuple(to_device(list(inputs), device) if moving else inputs)
    with torch.no_grad():
        for spec in stages:
            module = split.stage(spec.first, spec.last)
            if moving:
                module.to(device)
                retarget_device(module, device)
            try:
                result = module(*values)
            finally:
                if moving:
                    module.to("cpu")
                    retarget_device(module, "cpu")
            if spec.id == len(stages) - 1:
                out.append([])
                break
            values = tuple(result)
            out.append([value_spec(v) for v in values])
    return out


def _check_message(key: MessageKey, tensors: Sequence[Any], specs: Sequence[ValueSpec]) -> None:
    """A message must be what the receiver allocated: the cut's shapes and dtypes."""
    for i, (t, spec) in enumerate(zip(tensors, specs, strict=False)):
        if tuple(t.shape) != spec.shape or t.dtype != spec.dtype:
            what = "activation" if key[0] == "F" else "gradient"
            raise RuntimeError(
                f"{what} {i} of message {key} is {t.dtype} {tuple(t.shape)}, but the cut was "
                f"measured as {spec.dtype} {spec.shape}"
            )
    if len(tensors) != len(specs):
        raise RuntimeError(f"message {key} has {len(tensors)} tensors, expected {len(specs)}")


def _spec_bytes(spec: ValueSpec) -> int:
    """The bytes of a tensor value's buffer."""
    import math

    return math.prod(spec.shape) * spec.dtype.itemsize


def value_spec(value: Any) -> ValueSpec:
    """What a value crossing a cut is: a tensor's shape and dtype, or the constant itself.

    Example::

        value_spec(torch.zeros(2, 3)).shape   # (2, 3)
    """
    import torch

    if isinstance(value, torch.Tensor):
        return ValueSpec(True, tuple(value.shape), value.dtype)
    return ValueSpec(False, constant=value)


def message_order(
    devices: Mapping[str, Sequence[Action]],
    stages: Sequence[StageSpec],
    rank_of: Mapping[str, int],
) -> dict[tuple[int, int], list[MessageKey]]:
    """Per ``(src_rank, dst_rank)``: the messages between two processes in canonical order.

    The order is that of a sequential walk that advances every device as far as its
    receives and all-reduces allow, so it is one the real run can always follow.

    Example::

        order = message_order(schedule.devices, plan.stages, {"cpu0": 0, "cpu1": 1})
        order[(0, 1)][:2]    # [('F', 1, 0), ('F', 1, 1)]
    """
    names = list(devices)
    lists = [list(devices[d]) for d in names]
    pos = [0] * len(names)
    sent: set[MessageKey] = set()
    order: dict[tuple[int, int], list[MessageKey]] = {}
    passed: set[tuple[int, int]] = set()
    seen_ar: list[dict[int, int]] = [{} for _ in names]
    progress = True
    while progress:
        progress = False
        for di, acts in enumerate(lists):
            p = pos[di]
            while p < len(acts):
                a = acts[p]
                if a.kind in (ActionType.SEND_ACT, ActionType.SEND_GRAD):
                    key = message_key(a)
                    sent.add(key)
                    assert a.peer is not None
                    src, dst = rank_of[names[di]], rank_of[a.peer]
                    if src != dst:
                        order.setdefault((src, dst), []).append(key)
                elif a.kind in (ActionType.RECV_ACT, ActionType.RECV_GRAD):
                    if message_key(a) not in sent:
                        break
                elif a.kind is ActionType.ALLREDUCE:
                    occ = seen_ar[di].get(a.stage, 0)
                    if (a.stage, occ) not in passed:
                        break
                    seen_ar[di][a.stage] = occ + 1
                p += 1
            if p != pos[di]:
                pos[di] = p
                progress = True
        waiting: dict[tuple[int, int], int] = {}
        for di, acts in enumerate(lists):
            if pos[di] < len(acts) and acts[pos[di]].kind is ActionType.ALLREDUCE:
                s = acts[pos[di]].stage
                key2 = (s, seen_ar[di].get(s, 0))
                waiting[key2] = waiting.get(key2, 0) + 1
                if waiting[key2] == len(stages[s].devices):
                    passed.add(key2)
                    progress = True
    if any(pos[di] < len(lists[di]) for di in range(len(names))):  # pragma: no cover
        raise RuntimeError("the schedule deadlocks (validate_schedule should have said so)")
    return order


def p2p_groups(
    order: Mapping[tuple[int, int], Sequence[MessageKey]],
    backend: str,
    rank: int,
    device: Any = None,
) -> dict[tuple[int, int], Any]:
    """NCCL: one process group per direction of every pair of ranks that exchange messages
    (``order``'s keys, ``(src, dst)``), created on every rank in one order; gloo: none.

    torch runs every unbatched ``isend``/``irecv`` between two ranks on one NCCL stream of
    that pair, both directions alike, and a queued receive holds that stream until its
    message arrives. A rank that posted a receive from its neighbour (ahead of need, as
    :class:`P2P` does) and then sends to it would queue the send behind the receive while
    the neighbour's send waits behind its own receive of that message: a deadlock on the
    GPU that gloo (no streams) never shows. With a group per direction, a rank's sends to
    ``dst`` and its receives from ``dst`` run on streams of their own, and each stream
    carries one direction's messages in the canonical order on both sides.

    torch creates a group's NCCL communicator at its first send or receive, and both ranks
    block there until the other arrives; ranks that first touched their groups in the order
    their programs post (each its own) could wait for each other in a circle. So each group
    carries one element from ``src`` to ``dst`` (on ``device``) here, the pairs in one
    order on every rank.

    Example::

        groups = p2p_groups(order, "nccl", rank, device)   # {(0, 1): group, (1, 0): group}
        P2P(rank, order, specs, device, groups=groups)
    """
    if backend != "nccl":
        return {}
    import torch
    import torch.distributed as dist

    groups = {pair: dist.new_group(sorted(pair)) for pair in sorted(order)}
    for (src, dst), group in groups.items():
        if rank == src:
            dist.send(torch.zeros(1, device=device), dst, group=group)
        elif rank == dst:
            dist.recv(torch.zeros(1, device=device), src, group=group)
    return groups


def message_key(action: Action) -> MessageKey:
    """The message a send or receive action moves, named by the stage that receives it.

    Example::

        message_key(Action.parse("SEND_F0.3->gpu1"))   # ('F', 1, 3)
    """
    kind = action.kind
    if kind is ActionType.SEND_ACT:
        return ("F", action.stage + 1, action.microbatch)
    if kind is ActionType.RECV_ACT:
        return ("F", action.stage, action.microbatch)
    if kind is ActionType.SEND_GRAD:
        return ("B", action.stage - 1, action.microbatch)
    if kind is ActionType.RECV_GRAD:
        return ("B", action.stage, action.microbatch)
    raise ValueError(f"{action} moves no message")


class Pending:
    """Outstanding work objects (receives, an all-reduce): ``ready()`` polls, ``wait()``
    completes them.

    gloo marks a receive complete only inside ``wait()`` (``is_completed()`` stays False
    until then), and a second ``wait()`` waits for another message. So with ``threaded``
    (CPU processes that drive several plan devices and must poll) a helper thread does
    the one ``wait()``; otherwise ``is_completed()`` is polled (NCCL) or the caller
    blocks in ``wait()`` (one plan device per process).
    """

    def __init__(self, works: list[Any], buffers: list[Any], *, threaded: bool = False):
        self.works = works
        self.buffers = buffers
        self.threaded = threaded
        self.future: Any = None
        self.done = False
        self.nbytes = sum(b.numel() * b.element_size() for b in buffers)

    def ready(self) -> bool:
        if self.done:
            return True
        if not self.threaded:
            return all(w.is_completed() for w in self.works)
        if self.future is None:
            self.future = _waiters().submit(self._wait_all)
        return bool(self.future.done())

    def wait(self) -> None:
        if self.done:
            return
        if self.future is not None:
            self.future.result()
        else:
            self._wait_all()
        self.done = True

    def _wait_all(self) -> None:
        for w in self.works:
            w.wait()


_POOL: Any = None


def _waiters() -> Any:
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="pipeplan-wait")
    return _POOL


class P2P:
    """Non-blocking sends and receives of whole messages between this rank and others.

    ``send`` posts ``isend``s (held back until the earlier messages to that rank in the
    canonical order are posted); ``recv`` posts the ``irecv``s up to the one asked for
    and one beyond, or more while the posted and not yet taken buffers stay within
    ``ahead_bytes``, and returns a handle with ``ready()``/``wait()``; ``finish`` waits for
    every send of the step. ``specs[s]`` are the values stage ``s`` sends on (from
    :func:`cut_specs`); ``pieces[(kind, stage, peer)]`` the tensors of the messages of a
    resharded cut exchanged with rank ``peer`` (:mod:`planner.runtime.reshard`);
    ``groups[(src, dst)]`` the process group of that direction (:func:`p2p_groups`; absent:
    the default group).
    """

    def __init__(
        self,
        rank: int,
        order: Mapping[tuple[int, int], list[MessageKey]],
        specs: Sequence[Sequence[ValueSpec]],
        device: torch.device,
        *,
        threaded: bool = False,
        ahead_bytes: int = 0,
        pieces: Mapping[tuple[str, int, int], list[ValueSpec]] | None = None,
        groups: Mapping[tuple[int, int], Any] | None = None,
    ):
        self.rank = rank
        self.groups = groups or {}
        self.pieces = pieces or {}
        self.threaded = threaded
        self.ahead_bytes = ahead_bytes
        self.specs = specs
        self.device = device
        self.out_order = {dst: keys for (src, dst), keys in order.items() if src == rank}
        self.in_order = {src: keys for (src, dst), keys in order.items() if dst == rank}
        self.reset()

    def reset(self) -> None:
        """Start a step: every pair's order begins again."""
        self.out_next = dict.fromkeys(self.out_order, 0)
        self.in_next = dict.fromkeys(self.in_order, 0)
        # Per (peer rank, message): a message may go to several ranks, or come from several
        # (groups of different degrees).
        self.held: dict[tuple[int, MessageKey], list[torch.Tensor]] = {}
        self.posted: dict[tuple[int, MessageKey], Pending] = {}
        self.posted_bytes = 0  # buffers posted and not taken yet
        self.send_works: list[tuple[Any, torch.Tensor]] = []

    def specs_of(self, key: MessageKey, peer: int = -1) -> list[ValueSpec]:
        """The tensors of a message: the cut into stage ``s`` (F) or its float part (B);
        across a resharded cut, the piece exchanged with rank ``peer`` (``pieces``)."""
        kind, stage, _ = key
        piece = self.pieces.get((kind, stage, peer))
        if piece is not None:
            return piece
        if kind == "F":
            return [v for v in self.specs[stage - 1] if v.is_tensor]
        return [v for v in self.specs[stage] if v.has_grad]

    def send(self, key: MessageKey, dst: int, tensors: list[torch.Tensor]) -> None:
        """Post the message's ``isend``s (in canonical order per destination)."""
        _check_message(key, tensors, self.specs_of(key, dst))
        self.held[(dst, key)] = tensors
        keys = self.out_order[dst]
        i = self.out_next[dst]
        import torch.distributed as dist

        while i < len(keys) and (dst, keys[i]) in self.held:
            for t in self.held.pop((dst, keys[i])):
                t = t.contiguous()
                self.send_works.append((dist.isend(t, dst, **self._group(self.rank, dst)), t))
            i += 1
        self.out_next[dst] = i

    def recv(self, key: MessageKey, src: int) -> Pending:
        """Post receives up to ``key`` (and one beyond, to overlap); return its handle."""
        keys = self.in_order[src]
        if (src, key) not in self.posted:
            target = keys.index(key, self.in_next[src])
            self._post(src, target + 1)
        self._post(src, self.in_next[src] + 1)  # one message ahead
        pending = self.posted.pop((src, key))
        self.posted_bytes -= pending.nbytes
        self._post_ahead()
        return pending

    def prefetch(self) -> None:
        """Post the first receive from every peer (at the start of a step), then more
        while ``ahead_bytes`` allows."""
        for src in self.in_order:
            self._post(src, 1)
        self._post_ahead()

    def _post_ahead(self) -> None:
        """Post further receives, in turn from each peer, while their buffers fit in
        ``ahead_bytes`` beside those posted already."""
        more = self.ahead_bytes > 0
        while more:
            more = False
            for src, keys in self.in_order.items():
                i = self.in_next[src]
                if (
                    i < len(keys)
                    and self.posted_bytes + self._bytes(keys[i], src) <= self.ahead_bytes
                ):
                    self._post(src, i + 1)
                    more = True

    def _group(self, src: int, dst: int) -> dict[str, Any]:
        """``group=`` for the messages from ``src`` to ``dst`` (none: the default group)."""
        group = self.groups.get((src, dst))
        return {} if group is None else {"group": group}

    def _bytes(self, key: MessageKey, src: int) -> int:
        return sum(_spec_bytes(s) for s in self.specs_of(key, src))

    def _post(self, src: int, upto: int) -> None:
        import torch
        import torch.distributed as dist

        keys = self.in_order[src]
        i = self.in_next[src]
        while i < min(upto, len(keys)):
            specs = self.specs_of(keys[i], src)
            bufs = [torch.empty(s.shape, dtype=s.dtype, device=self.device) for s in specs]
            works = [dist.irecv(b, src, **self._group(src, self.rank)) for b in bufs]
            pending = Pending(works, bufs, threaded=self.threaded)
            self.posted[(src, keys[i])] = pending
            self.posted_bytes += pending.nbytes
            i += 1
        self.in_next[src] = i

    def finish(self) -> None:
        """Wait for this step's sends (every message was posted: the order is complete)."""
        if self.held:  # pragma: no cover - message_order covers every send
            raise RuntimeError(f"messages never sent: {sorted(self.held)[:3]}")
        for work, _ in self.send_works:
            work.wait()
        self.send_works.clear()

"""Runs the plan's per-device action lists of one process, exactly in their order.

Each plan device this process drives is a *program*: a generator that walks its action
list and yields whenever it must wait (a receive not yet arrived, an all-reduce or a step
waiting for the other local replicas). With one device per process (the normal case) the
program simply blocks in ``wait()``; in shared mode (several plan devices per process,
e.g. a whole plan on one GPU) the programs are interleaved cooperatively, each on its own
CUDA stream, handing tensors to each other in memory.

Actions:

* ``F s.k`` / ``B s.k`` / ``I s.k`` / ``W s.k``: :class:`~planner.runtime.stage.StageRuntime`;
  the first stage reads microbatch ``k`` of the step's global batch, the last stage
  computes the loss on its targets;
* ``SEND_*``: non-blocking ``isend`` (waited for at the end of the step); ``RECV_*``:
  ``irecv`` posted ahead of need, waited for here; between plan devices of one process
  both are hand-offs in memory;
* ``ALLREDUCE s``: the stage's data-parallel gradient sync among the processes holding its
  replicas, tied parameters left out (:mod:`planner.runtime.grad_sync`: one flattened
  all-reduce, or ZeRO-1's reduce-scatter; under FSDP the last backward did it); ``STEP s``:
  the stage's optimizer step. The first STEP of a stage holding a tied parameter that each program
  reaches in an iteration first exchanges the tied gradients
  (:class:`~planner.runtime.tied.TiedExchange`; all local programs holding one meet there).
  In fp16 the first STEP of each program in an iteration also meets every other local
  program there; the process unscales all its gradients, all-reduces the overflow flag
  over every rank and then steps, or skips, every local stage as every rank does
  (:class:`~planner.runtime.loss_scale.AgreedLossScaler`).

Tensor parallelism: each member of a stage's group is a process running its own mirrored
list (member ``i`` sends to and receives from member ``i`` of the neighbouring stage's
group; next to a stage of another degree, as :func:`~planner.stages.boundary_peers` pairs
them: a member may send one value to several members, or to none); the group's
collectives run inside the stage modules (DTensor), and only the leaders (member 0)
report the loss. With ``counter`` the collectives each forward and
backward issues are recorded (:class:`~planner.runtime.collective_count.CollectiveCounter`).

Example::

    executor = ProcessExecutor(rank, placement, plan.stages, schedule.devices, ...)
    result = executor.run_step(inputs, targets)   # microbatch lists for this step
    result.losses, result.events
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from planner.runtime.comm import P2P, MessageKey, Pending, ValueSpec, message_key
from planner.runtime.measured import CountedCollective, MeasuredEvent
from planner.runtime.mesh import member_position
from planner.schedule.actions import Action, ActionType
from planner.stages import Piece

if TYPE_CHECKING:
    from planner.plan import StageSpec
    from planner.runtime.collective_count import CollectiveCounter
    from planner.runtime.loss_scale import AgreedLossScaler
    from planner.runtime.placement import Placement
    from planner.runtime.reshard import Reshard
    from planner.runtime.stage import StageRuntime
    from planner.runtime.tied import TiedExchange, TiedRound

__all__ = ["MeasuredEvent", "ProcessExecutor", "StepResult"]

_T = ActionType


@dataclass
class StepResult:
    """What one step of this process produced."""

    losses: list[float] = field(default_factory=list)  # unscaled loss per last-stage microbatch
    loss_microbatches: list[int] = field(default_factory=list)  # ... and their microbatches
    events: list[MeasuredEvent] = field(default_factory=list)
    seconds: float = 0.0
    collectives: list[CountedCollective] = field(default_factory=list)  # with a counter


class _Wait:
    """A point where a program waits: ``ready()`` polls, ``wait()`` blocks."""

    def __init__(self, ready: Callable[[], bool], wait: Callable[[], None] | None = None):
        self.ready = ready
        self._wait = wait

    def wait(self, deadline: float) -> None:
        if self._wait is not None:
            self._wait()
            return
        while not self.ready():
            if time.monotonic() > deadline:
                raise TimeoutError("no progress")
            time.sleep(2e-5)


class _Clock:
    """Action timings: wall clock on CPU, CUDA events on GPU (resolved after the step)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.marks: list[tuple[str, str, int, int, Any, Any, int]] = []

    def start_step(self) -> None:
        self.marks = []
        self.t0 = time.perf_counter()
        if self.cuda:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e0.record()

    def now(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def add(self, dev: str, kind: str, s: int, k: int, a: Any, b: Any, it: int = 0) -> None:
        self.marks.append((dev, kind, s, k, a, b, it))

    def events(self) -> list[MeasuredEvent]:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [
                MeasuredEvent(d, kd, s, k, self.e0.elapsed_time(a), self.e0.elapsed_time(b), it)
                for d, kd, s, k, a, b, it in self.marks
            ]
        return [
            MeasuredEvent(d, kd, s, k, (a - self.t0) * 1e3, (b - self.t0) * 1e3, it)
            for d, kd, s, k, a, b, it in self.marks
        ]


class ProcessExecutor:
    """Executes the action lists of the plan devices that process ``rank`` drives."""

    def __init__(
        self,
        rank: int,
        placement: Placement,
        stages: Sequence[StageSpec],
        device_actions: Mapping[str, Sequence[Action]],
        runtimes: Mapping[int, StageRuntime],
        steppers: Mapping[int, Any],
        specs: Sequence[Sequence[ValueSpec]],
        p2p: P2P,
        syncs: Mapping[int, Any],
        device: torch.device,
        *,
        timeout_s: float = 300.0,
        heartbeat: Callable[[], None] | None = None,
        tied: TiedExchange | None = None,
        scaler: AgreedLossScaler | None = None,
        scale_group: Any = None,
        counter: CollectiveCounter | None = None,
        reshard: Reshard | None = None,
    ):
        self.rank = rank
        self.reshard = reshard if reshard is not None and reshard.cuts else None
        self.placement = placement
        self.stages = stages
        self.local = placement.devices_of(rank)
        self.actions = {d: list(device_actions[d]) for d in self.local}
        self.runtimes = runtimes
        self.steppers = steppers
        self.specs = specs
        self.p2p = p2p
        self.syncs = syncs
        self.device = device
        self.timeout_s = timeout_s
        self.heartbeat = heartbeat
        self.clock = _Clock(device)
        # Each local device's place in its tensor-parallel groups (0: a leader, or no group).
        self.place = {d: next(member_position(s, d) for s in stages if d in s.devices)
                      for d in self.local}  # fmt: skip
        self.counter = counter
        # How many of this process's plan devices hold each stage (local replicas).
        self.local_replicas = {s.id: sum(1 for d in s.devices if d in self.local) for s in stages}
        self.streams: dict[str, Any] = {}
        if device.type == "cuda" and len(self.local) > 1:
            self.streams = {d: torch.cuda.Stream(device) for d in self.local}
        # Several programs must poll; gloo completes work only in wait(): use threads.
        self.threaded = device.type == "cpu" and len(self.local) > 1
        self.tied = tied
        # The local programs that meet at each tied-gradient exchange.
        holding = tied.holding if tied is not None else frozenset()
        self.tie_programs = sum(
            1 for d in self.local if any(s.id in holding and d in s.devices for s in stages)
        )
        # fp16: the loss scale, and the group (every rank) that agrees on overflows.
        self.scaler = scaler
        self.scale_group = scale_group

    # -- one step ---------------------------------------------------------------------

    def run_step(self, inputs: Sequence[Any] | None, targets: Sequence[Any] | None) -> StepResult:
        """Run every local action list once; ``inputs[k]``/``targets[k]`` per microbatch."""
        self.inputs, self.targets = inputs, targets
        self.mailbox: dict[MessageKey, tuple[Any, Any]] = {}
        self.outbox: dict[tuple[MessageKey, str], list[torch.Tensor]] = {}  # per consumer
        self.partial: dict[MessageKey, dict[str, list[torch.Tensor]]] = {}  # resharded pieces
        self.arrived: dict[tuple[str, int, int], int] = {}
        self.done: dict[tuple[str, int, int], Any] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.tie_rounds: dict[str, int] = {}  # per program: iterations it has exchanged
        self.ties: dict[int, TiedRound] = {}  # per iteration: the exchange
        self.scale_rounds: dict[str, int] = {}  # per program: iterations it has agreed on
        self.overflow: dict[int, Pending] = {}  # per iteration: the all-reduced flag
        self.skips: dict[int, bool] = {}  # per iteration: every rank skips its step
        self.p2p.reset()
        for stream in self.streams.values():  # the step's inputs were copied on the default
            stream.wait_stream(torch.cuda.current_stream(self.device))
        self.clock.start_step()
        start = time.perf_counter()
        self.p2p.prefetch()
        self._drive({d: self._program(d) for d in self.local})
        self.p2p.finish()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        ks = sorted(self.losses)
        losses = [float(self.losses[k]) for k in ks]
        counted = self.counter.take() if self.counter is not None else []
        return StepResult(losses, ks, self.clock.events(), seconds, counted)

    def _drive(self, programs: dict[str, Iterator[_Wait]]) -> None:
        waiting: dict[str, _Wait | None] = dict.fromkeys(programs)
        last_progress = time.monotonic()
        while programs:
            progressed = False
            for dev in list(programs):
                w = waiting[dev]
                if w is not None and not w.ready():
                    continue
                try:
                    waiting[dev] = next(programs[dev])
                except StopIteration:
                    del programs[dev]
                progressed = True
            now = time.monotonic()
            if progressed:
                last_progress = now
                continue
            if len(programs) == 1:
                (dev,) = programs
                w = waiting[dev]
                assert w is not None
                w.wait(last_progress + self.timeout_s)
            elif now - last_progress > self.timeout_s:
                where = ", ".join(sorted(programs))
                raise TimeoutError(f"no progress for {self.timeout_s:.0f} s on {where}")
            else:
                time.sleep(2e-5)

    def _sync_streams(self) -> None:
        # Shared mode on CUDA: the local replicas' gradients were made on several streams;
        # the all-reduce and the step read them all, so wait for every stream first.
        if self.streams:
            torch.cuda.synchronize(self.device)

    def _stream(self, dev: str) -> Any:
        stream = self.streams.get(dev)
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def _event(self, dev: str) -> Any:
        if dev not in self.streams:
            return None
        e = torch.cuda.Event()
        e.record(self.streams[dev])
        return e

    def _take(self, dev: str, key: MessageKey) -> Any:
        values, event = self.mailbox.pop(key)
        if event is not None:
            torch.cuda.current_stream().wait_event(event)
        if self.streams:
            # Shared mode on CUDA: the tensors were made on another stream (a local
            # device's, or the default one's receive buffers). Freed, the caching allocator
            # would hand their memory to that stream's next tensor while this stream's
            # kernels may still read it; record_stream holds it until they are done.
            stream = torch.cuda.current_stream()
            for v in values:
                if isinstance(v, torch.Tensor):
                    v.record_stream(stream)
        return values

    # -- the program of one plan device -----------------------------------------------

    def _program(self, dev: str) -> Iterator[_Wait]:
        steps: dict[int, int] = {}  # STEPs of each stage so far: the iteration of the next
        for a in self.actions[dev]:
            kind = a.kind
            if kind is _T.F:
                with self._stream(dev), self._counting(dev, a):
                    self._forward(dev, a.stage, a.microbatch)
            elif kind in (_T.B, _T.I):
                with self._stream(dev), self._counting(dev, a):
                    self._backward(dev, a)
            elif kind is _T.W:
                with self._stream(dev), self._counting(dev, a):
                    t0 = self.clock.now()
                    self.runtimes[a.stage].backward_weight(a.microbatch)
                    self.clock.add(dev, "W", a.stage, a.microbatch, t0, self.clock.now())
            elif kind in (_T.SEND_ACT, _T.SEND_GRAD):
                assert a.peer is not None
                dst = self.placement.rank_of[a.peer]
                if dst != self.rank:
                    with self._stream(dev):  # NCCL orders the send after this stream's work
                        tensors = self.outbox.pop((message_key(a), a.peer))
                        self.p2p.send(message_key(a), dst, tensors)
                    if self.counter is not None:
                        nbytes = sum(t.numel() * t.element_size() for t in tensors)
                        self.counter.sent(dev, kind.value, a.stage, a.microbatch, a.peer, nbytes)
            elif kind in (_T.RECV_ACT, _T.RECV_GRAD):
                yield from self._receive(dev, a)
            elif kind is _T.ALLREDUCE:
                yield from self._allreduce(dev, a.stage)
            elif kind is _T.OPTIMIZER_STEP:
                iteration = steps.get(a.stage, 0)
                steps[a.stage] = iteration + 1
                t0 = self.clock.now()
                tied = yield from self._exchange_ties(dev, a.stage, iteration)
                skip = yield from self._agree_overflow(dev, iteration)
                started = t0 if tied or self.scaler is not None else None
                yield from self._step(dev, a.stage, started, skip)

    def _forward(self, dev: str, s: int, k: int) -> None:
        runtime = self.runtimes[s]
        if s == 0:
            assert self.inputs is not None
            inputs = self.inputs[k]
        else:
            inputs = self._take(dev, ("F", s, k))
        targets = None
        if runtime.is_last:
            assert self.targets is not None
            targets = self.targets[k]
        t0 = self.clock.now()
        out = runtime.forward(k, inputs, targets)
        self.clock.add(dev, "F", s, k, t0, self.clock.now())
        if runtime.is_last:
            if self.place[dev] == 0:  # a group's members compute the same loss
                self.losses[k] = out
            return
        if self._resharded(s + 1):
            self._send_pieces(dev, ("F", s + 1, k), out)
            return
        self._deliver(dev, ("F", s + 1, k), self._consumers(dev, s, s + 1, k), out)

    def _backward(self, dev: str, a: Action) -> None:
        s, k = a.stage, a.microbatch
        runtime = self.runtimes[s]
        grads = None
        if not runtime.is_last:
            flat = iter(self._take(dev, ("B", s, k)))
            grads = [next(flat) if v.has_grad else None for v in self.specs[s]]
        t0 = self.clock.now()
        if a.kind is _T.B:
            in_grads = runtime.backward(k, grads)  # type: ignore[arg-type]
        else:
            in_grads = runtime.backward_input(k, grads)  # type: ignore[arg-type]
        self.clock.add(dev, a.kind.value, s, k, t0, self.clock.now())
        if s > 0 and self._resharded(s):
            self._send_pieces(dev, ("B", s - 1, k), in_grads)
        elif s > 0:
            self._deliver(dev, ("B", s - 1, k), self._consumers(dev, s, s - 1, k), in_grads)

    def _consumers(self, dev: str, own: int, s: int, k: int) -> list[str]:
        """The devices of stage ``s`` that take microbatch ``k`` from ``dev`` (of stage
        ``own``): in the group of the replica running ``k``, each member ``j`` with
        ``j mod t == dev's place`` (``t``: ``own``'s degree; of equal degrees, the member
        at ``dev``'s place; :func:`~planner.stages.boundary_peers`)."""
        group = self.stages[s].replica_groups[k % self.stages[s].replicas]
        return list(group[self.place[dev] :: self.stages[own].tensor_parallel])

    def _counting(self, dev: str, a: Action) -> Any:
        if self.counter is None:
            return contextlib.nullcontext()
        return self.counter.action(dev, a.kind.value, a.stage, a.microbatch)

    def _deliver(self, dev: str, key: MessageKey, consumers: list[str], values: Any) -> None:
        """Hand a message to a local consumer, or keep its tensors for each consumer's
        SEND action."""
        for consumer in consumers:
            if self.placement.rank_of[consumer] == self.rank:
                self.mailbox[key] = (values, self._event(dev))
            else:
                self.outbox[(key, consumer)] = [v for v in values if isinstance(v, torch.Tensor)]

    def _receive(self, dev: str, a: Action) -> Iterator[_Wait]:
        key = message_key(a)
        assert a.peer is not None
        src = self.placement.rank_of[a.peer]
        if src == self.rank:
            if key not in self.mailbox:
                yield _Wait(lambda: key in self.mailbox)
            return
        incoming = self.p2p.recv(key, src)
        if not incoming.ready():
            yield _Wait(incoming.ready, incoming.wait)
        with self._stream(dev):
            incoming.wait()  # once ready: completes it (NCCL: orders this device's stream)
        buffers = list(incoming.buffers)
        if self._resharded(_cut_of(key)):
            parts = self.partial.setdefault(key, {})
            parts[a.peer] = buffers
            senders = [p.sender for p in self._pieces(key, dev) if p.receiver == dev]
            if any(s not in parts for s in senders):
                return  # more pieces to come (a RECV each)
            assert self.reshard is not None
            del self.partial[key]
            buffers = self.reshard.join(key[0], _cut_of(key), [parts[s] for s in senders])
        if key[0] == "F":
            tensors = iter(buffers)
            values: Any = tuple(
                next(tensors) if v.is_tensor else v.constant for v in self.specs[key[1] - 1]
            )
        else:
            values = buffers
        self.mailbox[key] = (values, None)

    # -- resharded cuts (sequence parallelism next to another degree) -----------------

    def _resharded(self, c: int) -> bool:
        """Whether cut ``c`` (into stage ``c``) is resharded (:mod:`planner.runtime.reshard`)."""
        return self.reshard is not None and c in self.reshard.cuts

    def _pieces(self, key: MessageKey, dev: str) -> list[Piece]:
        """The pieces of message ``key`` between the groups of the replicas running its
        microbatch (``dev`` is in one of them)."""
        assert self.reshard is not None
        kind, stage, k = key
        c = _cut_of(key)
        before, after = self.stages[c - 1], self.stages[c]
        groups = (
            before.replica_groups[k % before.replicas],
            after.replica_groups[k % after.replicas],
        )
        senders, receivers = groups if kind == "F" else groups[::-1]
        return self.reshard.pieces(kind, c, senders, receivers)

    def _send_pieces(self, dev: str, key: MessageKey, values: Any) -> None:
        """Keep each piece ``dev`` sends of message ``key`` for its SEND action."""
        assert self.reshard is not None
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        for p in self._pieces(key, dev):
            if p.sender != dev:
                continue
            if self.placement.rank_of[p.receiver] == self.rank:  # pragma: no cover
                raise RuntimeError("a resharded cut between devices of one process")
            piece = self.reshard.piece(key[0], _cut_of(key), p, tensors)
            self.outbox[(key, p.receiver)] = piece

    def _rendezvous(self, what: str, dev: str, s: int) -> tuple[str, int, int]:
        """Count this replica in at the next ``what`` of stage ``s``; return its key."""
        occurrence = 0
        while (what, s, occurrence) in self.done or self.arrived.get((what, s, occurrence), 0) >= (
            self.local_replicas[s]
        ):
            occurrence += 1
        key = (what, s, occurrence)
        self.arrived[key] = self.arrived.get(key, 0) + 1
        return key

    def _allreduce(self, dev: str, s: int) -> Iterator[_Wait]:
        key = self._rendezvous("AR", dev, s)
        t0 = self.clock.now()
        if self.arrived[key] == self.local_replicas[s]:
            self._sync_streams()
            self.done[key] = self._launch_allreduce(s, key[2])
        if key not in self.done or not self._allreduce_ready(key):
            entry = self.done.get(key)
            blocking = entry[0].wait if entry is not None else None
            yield _Wait(lambda: key in self.done and self._allreduce_ready(key), blocking)
        self._finish_allreduce(key)
        self.clock.add(dev, "ALLREDUCE", s, -1, t0, self.clock.now(), key[2])

    def _launch_allreduce(self, s: int, iteration: int) -> Any:
        sync = self.syncs.get(s)
        if sync is None:
            return None
        params = self._untied(s, self.runtimes[s].params_for(iteration))
        pending = sync.launch(params, threaded=self.threaded)
        return None if pending is None else (pending, [False])

    def _allreduce_ready(self, key: tuple[str, int, int]) -> bool:
        entry = self.done[key]
        return entry is None or entry[1][0] or entry[0].ready()

    def _finish_allreduce(self, key: tuple[str, int, int]) -> None:
        entry = self.done[key]
        if entry is None or entry[1][0]:
            return
        pending, finished = entry
        params = self._untied(key[1], self.runtimes[key[1]].params_for(key[2]))
        self.syncs[key[1]].finish(pending, params)
        finished[0] = True

    def _untied(self, s: int, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(params) if self.tied is None else self.tied.untied(s, params)

    def _exchange_ties(self, dev: str, s: int, iteration: int) -> Generator[_Wait, None, bool]:
        """Before this program's first STEP of a tie-holding stage in ``iteration``: meet
        the other local programs holding one, then sum the tied gradients. Returns whether
        this STEP did the exchange."""
        if self.tied is None or s not in self.tied.holding:
            return False
        if iteration < self.tie_rounds.get(dev, 0):
            return False  # exchanged at an earlier STEP of this iteration
        self.tie_rounds[dev] = iteration + 1
        key = ("TIE", -1, iteration)
        self.arrived[key] = self.arrived.get(key, 0) + 1
        if self.arrived[key] == self.tie_programs:
            self._sync_streams()
            self.ties[iteration] = self.tied.launch(
                self.runtimes, iteration, threaded=self.threaded
            )
        if iteration not in self.ties or not self.ties[iteration].ready():
            rnd = self.ties.get(iteration)
            blocking = rnd.wait if rnd is not None else None
            yield _Wait(lambda: iteration in self.ties and self.ties[iteration].ready(), blocking)
        self.ties[iteration].finish()
        return True

    def _agree_overflow(self, dev: str, iteration: int) -> Generator[_Wait, None, bool]:
        """fp16, at this program's first STEP of ``iteration``: once every local program is
        here, unscale every local gradient and all-reduce the overflow flag over every rank.
        Returns whether the iteration's steps are skipped (on every rank alike)."""
        if self.scaler is None:
            return False
        if iteration < self.scale_rounds.get(dev, 0):
            return self.skips[iteration]  # agreed at an earlier STEP of this iteration
        self.scale_rounds[dev] = iteration + 1
        key = ("SCALE", -1, iteration)
        self.arrived[key] = self.arrived.get(key, 0) + 1
        if self.arrived[key] == len(self.local):
            self._sync_streams()
            found = self.scaler.unscale(self._local_grads(iteration))
            works = []
            if self.scale_group is not None:
                import torch.distributed as dist

                op = dist.ReduceOp.MAX
                works.append(dist.all_reduce(found, op=op, group=self.scale_group, async_op=True))
            self.overflow[iteration] = Pending(works, [found], threaded=self.threaded)
        if iteration not in self.overflow or not self.overflow[iteration].ready():
            rnd = self.overflow.get(iteration)
            blocking = rnd.wait if rnd is not None else None
            yield _Wait(
                lambda: iteration in self.overflow and self.overflow[iteration].ready(), blocking
            )
        if iteration not in self.skips:
            pending = self.overflow[iteration]
            pending.wait()
            self.skips[iteration] = self.scaler.settle(pending.buffers[0])
        return self.skips[iteration]

    def _local_grads(self, iteration: int) -> list[torch.Tensor]:
        """Every gradient of this process's stages in ``iteration``, each tensor once."""
        seen: dict[int, torch.Tensor] = {}
        for runtime in self.runtimes.values():
            for p in runtime.params_for(iteration):
                if p.grad is not None:
                    seen.setdefault(id(p.grad), p.grad)
        return list(seen.values())

    def _step(self, dev: str, s: int, started: Any = None, skip: bool = False) -> Iterator[_Wait]:
        key = self._rendezvous("STEP", dev, s)
        if self.arrived[key] == self.local_replicas[s]:
            self._sync_streams()
            t0 = self.clock.now() if started is None else started
            with self._stream(dev):
                if skip:  # fp16: some rank overflowed; every rank drops this iteration
                    self.steppers[s].skip(key[2])
                else:
                    self.steppers[s].step(key[2])
                # On CUDA the end is an event on the stream that ran the step (shared mode:
                # the device's own; recorded on the default stream it ended at once).
                self.clock.add(dev, "STEP", s, -1, t0, self.clock.now(), key[2])
            self._sync_streams()  # the new weights, before any stream uses them
            self.done[key] = True
            if self.heartbeat is not None:
                self.heartbeat()
        elif key not in self.done:
            yield _Wait(lambda: key in self.done)


def _cut_of(key: MessageKey) -> int:
    """The cut a message crosses: ``("F", s)`` enters stage ``s``, ``("B", s)`` leaves
    stage ``s + 1``."""
    return key[1] if key[0] == "F" else key[1] + 1

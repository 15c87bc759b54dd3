"""The event engine: every device runs its program until it must wait, transfers start when
their data is ready and their links are free. This is the simulator's definition.

* compute and steps take their slot's duration; a receive blocks the device until the
  data has arrived; a send is non-blocking;
* each directed link carries one transfer at a time, in the order of its queue
  (:func:`planner.simulate.links.link_queues`); a transfer holds all links of its route for
  ``latency + bytes / bottleneck bandwidth``;
* ``ALLREDUCE s`` waits for every replica of stage ``s`` (:class:`Rendezvous`) and then
  takes its slot's duration on all of them.

With ``links=None`` communication is free (data arrives when it is sent); that run, over
the reference durations, is also the reference run that fixes the links' queues.

Example::

    engine = EventEngine(programs, tables.durations, tables, num_keys, links=None, record=True)
    engine.run()
    engine.output().clock
"""

from __future__ import annotations

from typing import Any

from planner.simulate.links import LinkQueues, Route
from planner.simulate.program import (
    ALLREDUCE,
    LAST_COMPUTE,
    STEP,
    Program,
    describe_entry,
)
from planner.simulate.result import EngineOutput
from planner.simulate.tables import StageTables

__all__ = ["EventEngine", "Rendezvous"]


class Rendezvous:
    """The all-reduce barriers: the replicas of stage ``s`` meet at their n-th ALLREDUCE of
    ``s``, which starts when the last of them arrives.

    Example::

        meet = Rendezvous(2, [2])
        meet.arrive(0, 0, 1.0)    # None: device 1 has not arrived
        meet.arrive(1, 0, 3.0)    # (3.0, [0]): starts at 3.0, device 0 waited
    """

    def __init__(self, num_devices: int, replicas: list[int]) -> None:
        self._replicas = replicas
        self._seen = [dict[int, int]() for _ in range(num_devices)]
        self._groups: dict[tuple[int, int], list[Any]] = {}

    def arrive(self, di: int, s: int, t: float) -> tuple[float, list[int]] | None:
        """Device ``di`` reaches an ALLREDUCE of stage ``s`` at ``t``: None while replicas
        are missing, else the start and the devices that waited for it."""
        occ = self._seen[di].get(s, 0)
        group = self._groups.setdefault((s, occ), [0, 0.0, []])
        if di not in group[2]:
            group[0] += 1
            group[1] = max(group[1], t)
            group[2].append(di)
        if group[0] < self._replicas[s]:
            return None
        for w in group[2]:
            self._seen[w][s] = occ + 1
        return group[1], [w for w in group[2] if w != di]


class EventEngine:
    """One run of compiled programs (see the module's description).

    ``durations[i][slot]`` is how long ``slot`` takes on device ``i`` (``tables.durations``,
    or the reference run's); from ``tables`` the memory each slot takes and gives back
    (recorded as curves when ``record``), each device's memory throughout and how many
    devices meet at each stage's all-reduces; ``num_keys`` how many transfer keys exist.
    ``start_at_send=False`` starts transfers in a pass after every device has run as far as
    it can (as the first versions did) instead of at their send: the same results.

    Example::

        engine = EventEngine(shape.programs, tables.durations, tables, num_keys,
                             links=None, record=True)
        engine.run()
        engine.stuck(tables.devices, 8) or engine.output().clock
    """

    def __init__(
        self,
        programs: list[Program],
        durations: list[list[float]],
        tables: StageTables,
        num_keys: int,
        *,
        links: LinkQueues | None,
        record: bool,
        start_at_send: bool = True,
    ) -> None:
        n = len(programs)
        self.programs, self.durations = programs, durations
        self.grows, self.shrinks = tables.grows, tables.shrinks
        self.record, self.start_at_send = record, start_at_send
        self.clock = [0.0] * n
        self.pos = [0] * n
        self.levels = [tables.static[d] for d in tables.devices]
        self.mem: list[list[tuple[float, int]]] = [[(0.0, x)] for x in self.levels]
        self.arrival = [-1.0] * num_keys  # when the data is at its receiver
        self.waiting = [-1] * num_keys  # the device blocked on receiving it
        self.runnable = list(range(n - 1, -1, -1))
        self.rendezvous = Rendezvous(n, tables.replicas)
        self.raw_events: list[tuple[int, int, int, int, float, float]] = []
        self.raw_transfers: list[tuple[int, int, int, int, float, float, int]] = []
        # Set to a list to have the sends listed in the order they run (free communication).
        self.sends: list[int] | None = None
        # How many sends had run when a device first reached an ALLREDUCE (-1: none has).
        self.sends_before_allreduce = -1
        self.free_comm = links is None
        self.route_of: list[Route] = []
        self.queues: list[list[int]] = []
        if links is not None:
            self.route_of, self.queues = links
        self.head = [0] * len(self.queues)
        self.head_key = [q[0] for q in self.queues]  # the transfer each link serves next
        self.link_free = [0.0] * len(self.queues)
        # When its send ran; one more entry, never ready, for the key ending each link queue.
        self.ready_at = [-1.0] * (num_keys + 1) if links is not None else []
        # What _launch reads, in one tuple: it runs once per send, and one unpacking is
        # cheaper than an attribute lookup per list.
        self._link_state = (
            self.arrival,
            self.ready_at,
            self.route_of,
            self.head,
            self.head_key,
            self.link_free,
            self.queues,
            self.waiting,
            self.runnable,
            self.raw_transfers,
            record,
        )

    def output(self) -> EngineOutput:
        """What the run leaves: clocks, link-free times, events, transfers, memory."""
        return EngineOutput(
            self.clock, self.link_free, self.raw_events, self.raw_transfers, self.mem, self.levels
        )

    def stuck(self, devices: list[str], total_mb: int) -> list[str]:
        """Where each device that did not finish waits (empty after a complete run)."""
        return [
            f"{devices[di]} waits at {describe_entry(prog[self.pos[di]], devices, total_mb)}"
            for di, prog in enumerate(self.programs)
            if self.pos[di] < len(prog)
        ]

    def run(self) -> None:
        """Run every device as far as it can; the transfers started along the way."""
        programs, durations, grows, shrinks = (
            self.programs,
            self.durations,
            self.grows,
            self.shrinks,
        )
        clock, pos, levels, mem = self.clock, self.pos, self.levels, self.mem
        arrival, waiting, ready_at = self.arrival, self.waiting, self.ready_at
        raw_events, runnable, sends = self.raw_events, self.runnable, self.sends
        record, free_comm, at_send = self.record, self.free_comm, self.start_at_send
        launch, allreduce = self._launch, self._allreduce
        last_compute, allreduce_code, step_code = LAST_COMPUTE, ALLREDUCE, STEP
        pending: list[int] = []
        while True:
            while runnable:
                di = runnable.pop()
                prog = programs[di]
                dtab = durations[di]
                n = len(prog)
                p = pos[di]
                t = clock[di]
                dmem = mem[di]
                level = levels[di]
                while p < n:
                    code, s, k, slot, rkey, skey, _ = prog[p]
                    if rkey >= 0:
                        at = arrival[rkey]
                        if at < 0.0:
                            waiting[rkey] = di
                            break
                        if at > t:
                            t = at
                    if code <= last_compute:
                        dur = dtab[slot]
                        if record:
                            # The memory curve; the peaks and busy times need no times and
                            # are summed in program order afterwards (program_totals).
                            end = t + dur
                            grow = grows[slot]
                            if grow:
                                level += grow
                                dmem.append((t, level))
                            shrink = shrinks[slot]
                            if shrink:
                                level += shrink
                                dmem.append((end, level))
                            raw_events.append((di, code, s, k, t, end))
                        t += dur
                    elif code == allreduce_code:
                        done = allreduce(di, s, t, dtab[slot])
                        if done is None:
                            break
                        t = done
                    elif code == step_code:
                        dur = dtab[slot]
                        if record and dur > 0:
                            raw_events.append((di, step_code, s, -1, t, t + dur))
                        if record and (grows[slot] or shrinks[slot]):
                            # The step's temporaries (CUDA profiles); FSDP's whole weights
                            # and gradients, gone when it starts (a negative grow).
                            dmem.append((t, level + grows[slot]))
                            level += grows[slot] + shrinks[slot]
                            dmem.append((t + dur, level))
                        t += dur
                    if skey >= 0:
                        if free_comm:
                            arrival[skey] = t
                            if sends is not None:
                                sends.append(skey)
                            w = waiting[skey]
                            if w >= 0:
                                waiting[skey] = -1
                                runnable.append(w)
                        else:
                            ready_at[skey] = t
                            if not at_send:
                                pending.append(skey)
                                p += 1
                                continue
                            launch([skey])
                    p += 1
                pos[di] = p
                clock[di] = t
                levels[di] = level
            if not pending:
                break
            launch(pending)

    def _allreduce(self, di: int, s: int, t: float, dur: float) -> float | None:
        """Device ``di`` reaches an ALLREDUCE of stage ``s`` at ``t``: its end, or None
        while replicas are missing (the last to arrive restarts the others)."""
        if self.sends_before_allreduce < 0 and self.sends is not None:
            self.sends_before_allreduce = len(self.sends)
        met = self.rendezvous.arrive(di, s, t)
        if met is None:
            return None
        start, others = met
        end = start + dur
        for w in others:
            self.clock[w] = end
            self.pos[w] += 1
            self.runnable.append(w)
            if self.record:
                self.raw_events.append((w, ALLREDUCE, s, -1, start, end))
        if self.record:
            self.raw_events.append((di, ALLREDUCE, s, -1, start, end))
        return end

    def _launch(self, stack: list[int]) -> None:
        """Start every transfer in ``stack`` that is next in line on all links of its route,
        and then the ones behind it that became next in line and whose data is ready.

        A transfer's start is its ready time or, if later, the end of the transfer before it
        on each of its links: it does not depend on when this runs, so a transfer is
        started as soon as its send has run and its links' queues reach it.
        """
        (
            arrival,
            ready_at,
            route_of,
            head,
            head_key,
            link_free,
            queues,
            waiting,
            runnable,
            raw_transfers,
            record,
        ) = self._link_state
        while stack:
            key = stack.pop()
            if arrival[key] >= 0.0:
                continue  # queued twice (by its send and by the link ahead), started once
            links, lat, wire_ms, src, dst, nbytes = route_of[key]
            start = ready_at[key]
            for link in links:
                if head_key[link] != key:
                    break  # it starts when the transfers ahead of it on this link are done
                if link_free[link] > start:
                    start = link_free[link]
            else:
                end = start + lat + wire_ms
                for link in links:
                    link_free[link] = end
                    h = head[link] + 1
                    head[link] = h
                    after = queues[link][h]  # the sentinel when the queue is done
                    head_key[link] = after
                    if ready_at[after] >= 0.0:
                        stack.append(after)
                arrival[key] = end
                if record:
                    raw_transfers.append((src, dst, key & 1, key >> 1, start, end, nbytes))
                w = waiting[key]
                if w >= 0:
                    waiting[key] = -1
                    runnable.append(w)

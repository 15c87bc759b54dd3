"""The fixed-order pass: the event engine's times, computed action by action in one order.

Every action and transfer depends only on actions and transfers whose time in the
reference run (:mod:`planner.simulate.links`) is earlier, or the same and that ran before
it there: its device's previous action, the send of the data it receives, and the
transfers ahead of it in its links' queues (which are ordered by that very key). So the
reference run's order of execution (:class:`Order`, which depends on the programs alone
and is cached with them), sorted stably by the reference times, is an order in which
everything an action waits for is known when it is reached: no device blocks, no queue is
kept, and each time is the same maximum of the same sums as in the event engine, so the
same float. It needs a topology and programs without all-reduces (their barriers) that do
not deadlock.

Example::

    order = reference_order(programs, num_keys, total_mb, len(stages))
    run_in_order(order, topology, tables, num_keys, record=True).clock
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, NamedTuple

from planner.simulate.links import Route, route_of_way
from planner.simulate.program import ALLREDUCE, LAST_COMPUTE, SLOTS, STEP, Program
from planner.simulate.result import EngineOutput
from planner.simulate.tables import StageTables, reference_durations

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["Order", "reference_order", "run_in_order"]

# An action as run_in_order reads it (see Order).
Step = tuple[int, int, int, int, int, int, int]


class Order(NamedTuple):
    """The actions of all devices in the order the reference run executes them (which
    depends on the programs alone, not on any time).

    ``steps`` holds per action ``(device, recv, ref_slot, slot, send, way, index)``,
    ``index`` being its place in its device's program (``programs``). Only ints, so
    that the collector stops tracking them. Slots index the devices' duration tables laid
    end to end, followed by a 0 for an action that takes no time (``ref_slot``: the
    reference run times compute only). ``recv`` is the received key or ``num_keys`` (a
    time that stays 0) for none; ``send`` the sent key or ``num_keys + 1`` (written, never
    read) for none. ``way`` is a send's way (:func:`planner.simulate.links.send_ways`;
    ``ways``: all of them).

    Example::

        order = shape.order(num_keys, total_mb, len(stages))
        order.steps[0]      # (0, num_keys, 0, 0, 16, 4, 0): device 0's first action
    """

    steps: list[Step]
    ways: set[int]
    programs: list[Program]


def reference_order(
    programs: list[Program], num_keys: int, total_mb: int, num_stages: int
) -> Order | None:
    """Run the programs as the reference run does (a device runs until a receive whose
    send has not run yet; the same stack of runnable devices), without times, and list the
    actions in the order they run. None for programs with all-reduces or that deadlock.

    Example::

        reference_order(shape.programs, 2 * len(stages) * 8, 8, len(stages)).steps[0]
    """
    if any(ALLREDUCE in {e[0] for e in prog} for prog in programs):
        return None
    per_device = _steps_per_device(programs, num_keys, total_mb, num_stages)
    no_recv = num_keys
    steps: list[Step] = []
    n = len(programs)
    pos = [0] * n
    sent = bytearray(num_keys + 2)
    sent[no_recv] = 1
    waiting = [-1] * (num_keys + 2)
    runnable = list(range(n - 1, -1, -1))
    while runnable:
        di = runnable.pop()
        own, start = per_device[di], pos[di]
        p, size = start, len(own)
        while p < size:
            _, recv, _, _, send, _, _ = own[p]
            if not sent[recv]:
                waiting[recv] = di
                break
            sent[send] = 1
            w = waiting[send]
            if w >= 0:
                waiting[send] = -1
                runnable.append(w)
            p += 1
        pos[di] = p
        steps += own[start:p]
    if len(steps) != sum(map(len, programs)):
        return None
    return Order(steps, {step[5] for step in steps if step[5] >= 0}, programs)


def _steps_per_device(
    programs: list[Program], num_keys: int, total_mb: int, num_stages: int
) -> list[list[Step]]:
    """Each device's program as :class:`Order` steps."""
    n = len(programs)
    width = SLOTS * num_stages
    zero = n * width
    no_recv, no_send = num_keys, num_keys + 1
    cuts = num_stages + 1
    # One int object per slot: a cached order holds hundreds of thousands of them.
    slots = list(range(zero + 1))
    return [
        [
            (
                di,
                rkey if rkey >= 0 else no_recv,
                slots[di * width + slot] if kind <= LAST_COMPUTE else zero,
                slots[di * width + slot] if kind <= LAST_COMPUTE or kind == STEP else zero,
                skey if skey >= 0 else no_send,
                # The send's way: links.send_ways's formula, inlined (one pass, not two).
                (di * n + dst) * cuts + (skey >> 1) // total_mb + (skey & 1) if skey >= 0 else -1,
                at,
            )
            for at, (kind, _, _, slot, rkey, skey, dst) in enumerate(prog)
        ]
        for di, prog in enumerate(programs)
    ]


def _routes(
    ways: set[int],
    topology: Topology,
    devices: list[str],
    cut: list[int],
    groups: dict[str, tuple[str, ...]],
) -> tuple[dict[int, Route], int]:
    """Each way's route, and how many links they use."""
    link_ids: dict[tuple[str, str], int] = {}
    routes = {
        way: route_of_way(topology, devices, cut, way, link_ids, groups) for way in sorted(ways)
    }
    return routes, len(link_ids)


def _ranked(steps: list[Step], ref: list[float], num_devices: int, num_keys: int) -> list[int]:
    """The steps' indices sorted stably by their end in the reference run (``ref``: the
    reference durations laid end to end, then a 0)."""
    # A key's time is only read after its send wrote it; the entry after the keys stays 0
    # for "no receive", the one after it takes "no send".
    clock = [0.0] * num_devices
    ready = [0.0] * (num_keys + 2)
    ends: list[float] = []
    end_of = ends.append
    for di, recv, slot, _, send, _, _ in steps:
        t = clock[di]
        at = ready[recv]
        if at > t:
            t = at
        t += ref[slot]
        clock[di] = t
        ready[send] = t
        end_of(t)
    # Stable: among equal times, the order the reference run executed them.
    return sorted(range(len(ends)), key=ends.__getitem__)


def run_in_order(
    order: Order,
    topology: Topology,
    tables: StageTables,
    num_keys: int,
    *,
    record: bool,
) -> EngineOutput:
    """The event engine's times for ``order``'s programs over ``topology`` (see the
    module's description): clocks, link-free times, events, transfers, memory curves and
    levels, as :class:`~planner.simulate.events.EventEngine` leaves them.

    Example::

        run_in_order(order, topology, tables, num_keys, record=False).clock
    """
    steps = order.steps
    devices = tables.devices
    # Durations of all devices end to end, then the empty action's 0.
    table = [*chain.from_iterable(tables.durations), 0.0]
    ref = [*chain.from_iterable(reference_durations(tables, topology)), 0.0]
    routes, num_links = _routes(order.ways, topology, devices, tables.cut, tables.groups)
    ranked = _ranked(steps, ref, len(devices), num_keys)
    link_free = [0.0] * num_links
    if not record:
        return _lean_pass(steps, ranked, table, routes, link_free, num_keys, tables)
    return _recording_pass(order, ranked, table, routes, link_free, num_keys, tables)


# The lean and the recording pass are the same loop, kept twice on purpose: the lean one
# (the solver's, events=False) leaves out the events and memory curve and unrolls the
# usual two-link route, which a shared loop with flags would slow down.


def _lean_pass(
    steps: list[Step],
    ranked: list[int],
    table: list[float],
    routes: dict[int, Route],
    link_free: list[float],
    num_keys: int,
    tables: StageTables,
) -> EngineOutput:
    """The times alone (``events=False``)."""
    no_send = num_keys + 1
    clock = [0.0] * len(tables.devices)
    arrival = [0.0] * (num_keys + 2)  # written by each key's send before it is read
    for di, recv, _, slot, skey, way, _ in map(steps.__getitem__, ranked):
        t = clock[di]
        at = arrival[recv]
        if at > t:
            t = at
        t += table[slot]
        clock[di] = t
        if skey != no_send:
            links, lat, wire_ms, _, _, _ = routes[way]
            start = t
            if len(links) == 2:  # through one switch, the usual route: unrolled
                first, second = links
                if link_free[first] > start:
                    start = link_free[first]
                if link_free[second] > start:
                    start = link_free[second]
                link_free[first] = link_free[second] = end = start + lat + wire_ms
            else:
                for link in links:
                    if link_free[link] > start:
                        start = link_free[link]
                end = start + lat + wire_ms
                for link in links:
                    link_free[link] = end
            arrival[skey] = end
    levels = [tables.static[d] for d in tables.devices]
    mem = [[(0.0, x)] for x in levels]
    return EngineOutput(clock, link_free, [], [], mem, levels)


def _recording_pass(
    order: Order,
    ranked: list[int],
    table: list[float],
    routes: dict[int, Route],
    link_free: list[float],
    num_keys: int,
    tables: StageTables,
) -> EngineOutput:
    """The times with the events, transfers and memory curves."""
    steps, programs = order.steps, order.programs
    grows, shrinks = tables.grows, tables.shrinks
    no_send = num_keys + 1
    clock = [0.0] * len(programs)
    arrival = [0.0] * (num_keys + 2)  # written by each key's send before it is read
    levels = [tables.static[d] for d in tables.devices]
    mem = [[(0.0, x)] for x in levels]
    raw_events: list[tuple[int, int, int, int, float, float]] = []
    raw_transfers: list[tuple[int, int, int, int, float, float, int]] = []
    event = raw_events.append
    transfer = raw_transfers.append
    last_compute, step_code = LAST_COMPUTE, STEP
    for j in ranked:
        di, recv, _, slot, skey, way, index = steps[j]
        code, s, k, kslot, _, _, _ = programs[di][index]
        t = clock[di]
        at = arrival[recv]
        if at > t:
            t = at
        dur = table[slot]
        end = t + dur
        if code <= last_compute:
            grow = grows[kslot]
            shrink = shrinks[kslot]
            if grow or shrink:
                level = levels[di]
                if grow:
                    level += grow
                    mem[di].append((t, level))
                if shrink:
                    level += shrink
                    mem[di].append((end, level))
                levels[di] = level
            event((di, code, s, k, t, end))
        elif code == step_code:
            if dur > 0:
                event((di, step_code, s, -1, t, end))
            if grows[kslot]:  # the step's temporaries (CUDA profiles)
                mem[di].append((t, levels[di] + grows[kslot]))
                mem[di].append((end, levels[di]))
        t = end
        clock[di] = t
        if skey != no_send:
            links, lat, wire_ms, src, dst, nbytes = routes[way]
            start = t
            for link in links:
                if link_free[link] > start:
                    start = link_free[link]
            end = start + lat + wire_ms
            for link in links:
                link_free[link] = end
            arrival[skey] = end
            transfer((src, dst, skey & 1, skey >> 1, start, end, nbytes))
    return EngineOutput(clock, link_free, raw_events, raw_transfers, mem, levels)

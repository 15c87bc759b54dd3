"""Integer program (PuLP + CBC): joint partition and device mapping on any topology.

For a fixed number of stages ``S`` it chooses, at once, the contiguous layer range of every
stage, the device of every stage (one stage per device, heterogeneous speeds and memories)
and recompute per stage, minimising

    (M - 1) * bottleneck + sum over stages of (compute + outgoing transfer)

-- the steady state plus fill/drain of a pipeline of ``M`` microbatches -- where a stage's
transfer is priced on the topology's actual route between the two chosen devices and every
device must hold its stage with the schedule's in-flight microbatches.

Variables (``L`` layers, ``D`` devices):

- ``u[l, s]`` binary: layer ``l`` belongs to stage ``s`` or an earlier one (monotone prefix
  indicators; ``x[l, s] = u[l, s] - u[l, s-1]`` is the layer-to-stage assignment, so
  contiguity is ``u[l, s] >= u[l+1, s]``);
- ``y[s, d]`` binary: stage ``s`` runs on device ``d``; ``rc[s]`` binary: recompute;
- continuous stage compute ``t[s]``, transfer ``c[s]``, activation memory ``a[s]``,
  workspace ``w[s]`` and the bottleneck ``B``.

Products of the partition with the device choice (compute / speed, bytes x route cost) are
linearised with big-M constraints per (stage, device) and (stage, device, next device).

Example::

    result = solve_ilp(costs, topology, num_stages=4, in_flight=[4, 3, 2, 1],
                       num_microbatches=8, time_limit=10.0)
    result.ranges, result.devices, result.status, result.gap
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.partition.dp import LayerCosts
from planner.partition.mapping import transfer_cost

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["IlpResult", "solve_ilp"]


@dataclass(frozen=True)
class IlpResult:
    """What CBC found: the plan (None when it found none), its objective, status and gap."""

    ranges: list[tuple[int, int]] | None
    devices: list[str] | None
    recompute: list[bool] | None
    objective_ms: float | None
    bound_ms: float | None
    status: str
    gap: float | None
    seconds: float


def _parse_cbc_log(text: str) -> tuple[float | None, float | None]:
    """(objective, lower bound) from a CBC log, when it printed them."""
    obj = bound = None
    m = re.search(r"Objective value:\s*([-+0-9.eE]+)", text)
    if m:
        obj = float(m.group(1))
    m = re.search(r"Lower bound:\s*([-+0-9.eE]+)", text)
    if m:
        bound = float(m.group(1))
    elif "Optimal solution found" in text and obj is not None:
        bound = obj
    return obj, bound


def solve_ilp(
    costs: LayerCosts,
    topology: Topology,
    *,
    num_stages: int,
    in_flight: Sequence[int],
    num_microbatches: int,
    devices: Sequence[str] | None = None,
    weight_versions: int = 1,
    time_limit: float = 60.0,
    warm_start: tuple[Sequence[tuple[int, int]], Sequence[str], Sequence[bool]] | None = None,
) -> IlpResult:
    """Solve the joint partition + mapping problem for ``num_stages`` stages with CBC.

    ``devices`` restricts the candidates (default: all of the topology's). ``warm_start`` is
    ``(ranges, devices, recompute)`` of a known feasible plan (e.g. from the DP); CBC starts
    from it, so the answer is never worse than it under the model. Runs single-threaded so
    that the same inputs give the same plan.

    Example::

        res = solve_ilp(costs, topo, num_stages=2, in_flight=[2, 1], num_microbatches=4)
    """
    with warnings.catch_warnings():
        # PuLP 3 announces API changes for PuLP 4 on every variable; they are not ours to fix.
        warnings.simplefilter("ignore", DeprecationWarning)
        return _solve(
            costs,
            topology,
            num_stages=num_stages,
            in_flight=in_flight,
            num_microbatches=num_microbatches,
            devices=devices,
            weight_versions=weight_versions,
            time_limit=time_limit,
            warm_start=warm_start,
        )


def _solve(
    costs: LayerCosts,
    topology: Topology,
    *,
    num_stages: int,
    in_flight: Sequence[int],
    num_microbatches: int,
    devices: Sequence[str] | None = None,
    weight_versions: int = 1,
    time_limit: float = 60.0,
    warm_start: tuple[Sequence[tuple[int, int]], Sequence[str], Sequence[bool]] | None = None,
) -> IlpResult:
    import pulp

    start_clock = time.perf_counter()
    n = costs.num_layers
    names = list(devices) if devices is not None else topology.device_names()
    dev = [topology.device(x) for x in names]
    s_count = num_stages
    if s_count < 1 or s_count > n or s_count > len(names):
        return IlpResult(None, None, None, None, None, "Infeasible", None, 0.0)
    m = num_microbatches
    layers = range(n)
    stages = range(s_count)
    dids = range(len(names))
    work = [(costs.fwd[i + 1] - costs.fwd[i]) + (costs.bwd[i + 1] - costs.bwd[i]) for i in layers]
    fwd = [costs.fwd[i + 1] - costs.fwd[i] for i in layers]
    static = [
        (costs.static[i + 1] - costs.static[i])
        + (weight_versions - 1) * (costs.params[i + 1] - costs.params[i])
        for i in layers
    ]
    saved = [costs.saved[i + 1] - costs.saved[i] for i in layers]
    wsp = [float(costs.workspace[i, i]) for i in layers]
    cut = [float(costs.cut_bytes[i]) for i in layers]
    inputs = [float(costs.input_bytes[i]) for i in layers]
    link = {(a, b): transfer_cost(topology, names[a], names[b]) for a in dids for b in dids}
    max_speed = max(d.speed for d in dev)
    max_cut = max(cut) if cut else 0.0
    cheapest_lat = min((c.latency_ms for (a, b), c in link.items() if a != b), default=0.0)
    cheapest_mpb = min((c.ms_per_byte for (a, b), c in link.items() if a != b), default=0.0)
    max_act = max(in_flight, default=1) * (sum(saved) + max(inputs)) + sum(saved) + 1.0

    prob = pulp.LpProblem("pipeplan_partition_mapping", pulp.LpMinimize)
    u = {(i, s): pulp.LpVariable(f"u_{i}_{s}", cat="Binary") for i in layers for s in stages}
    y = {(s, d): pulp.LpVariable(f"y_{s}_{d}", cat="Binary") for s in stages for d in dids}
    rc = {s: pulp.LpVariable(f"rc_{s}", cat="Binary") for s in stages}
    t = {s: pulp.LpVariable(f"t_{s}", lowBound=0) for s in stages}
    c = {s: pulp.LpVariable(f"c_{s}", lowBound=0) for s in stages}
    act = {s: pulp.LpVariable(f"a_{s}", lowBound=0) for s in stages}
    wmax = {s: pulp.LpVariable(f"w_{s}", lowBound=0) for s in stages}
    bott = pulp.LpVariable("B", lowBound=0)

    def x(i: int, s: int) -> Any:
        return u[i, s] - (u[i, s - 1] if s > 0 else 0)

    def end(i: int, s: int) -> Any:  # stage s ends at layer i (s < S - 1, i < L - 1)
        return u[i, s] - u[i + 1, s]

    def start(i: int, s: int) -> Any:
        if s == 0:
            return 1 if i == 0 else 0
        return end(i - 1, s - 1) if i > 0 else 0

    prob += (m - 1) * bott + pulp.lpSum(t[s] + c[s] for s in stages)
    for s in stages:
        prob += u[n - 1, s] == (1 if s == s_count - 1 else 0)
        for i in range(n - 1):
            prob += u[i, s] >= u[i + 1, s]
        if s > 0:
            for i in layers:
                prob += u[i, s] >= u[i, s - 1]
        prob += pulp.lpSum(x(i, s) for i in layers) >= 1
        prob += pulp.lpSum(y[s, d] for d in dids) == 1
        load = pulp.lpSum(work[i] * x(i, s) for i in layers)
        redo = pulp.lpSum(fwd[i] * x(i, s) for i in layers)
        for d in dids:
            sp = dev[d].speed
            # Big-M as small as valid (the most the stage could cost on this device) keeps
            # the LP relaxation, and so CBC's bound, tight.
            big = (sum(work) + sum(fwd)) / sp
            prob += t[s] >= load * (1.0 / sp) - big * (1 - y[s, d])
            prob += t[s] >= (load + redo) * (1.0 / sp) - big * (2 - y[s, d] - rc[s])
        prob += t[s] >= load * (1.0 / max_speed)  # valid whatever the device
        # Activation memory: all in-flight microbatches' saved tensors, or with recompute
        # their stage inputs plus one microbatch rebuilt during its backward.
        held = pulp.lpSum(saved[i] * x(i, s) for i in layers)
        stage_in = pulp.lpSum(inputs[i] * start(i, s) for i in layers)
        prob += act[s] >= in_flight[s] * held - max_act * rc[s]
        one = held if in_flight[s] > 0 else 0
        prob += act[s] >= in_flight[s] * stage_in + one - max_act * (1 - rc[s])
        for i in layers:
            prob += wmax[s] >= wsp[i] * x(i, s)
        prob += pulp.lpSum(static[i] * x(i, s) for i in layers) + act[s] + wmax[s] <= pulp.lpSum(
            float(dev[d].memory_bytes) * y[s, d] for d in dids
        )
        if s < s_count - 1:
            sent = pulp.lpSum(cut[i] * end(i, s) for i in range(n - 1))
            for a in dids:
                for b in dids:
                    if a == b:
                        continue
                    lc = link[a, b]
                    big = lc.latency_ms + lc.ms_per_byte * max_cut
                    prob += c[s] >= lc.latency_ms + lc.ms_per_byte * sent - big * (
                        2 - y[s, a] - y[s + 1, b]
                    )
            prob += c[s] >= cheapest_lat + cheapest_mpb * sent
        else:
            prob += c[s] == 0
        prob += bott >= t[s] + c[s]
    prob += s_count * bott >= pulp.lpSum(t[s] + c[s] for s in stages)  # max >= mean
    # The S stages together run at most at the S fastest devices' combined speed.
    fastest = sum(sorted((d.speed for d in dev), reverse=True)[:s_count])
    prob += bott >= sum(work) / fastest
    for d in dids:
        prob += pulp.lpSum(y[s, d] for s in stages) <= 1
    # Symmetry breaking: interchangeable devices (same speed, memory and links to all
    # others) are used in order, the earlier one by the earlier stage. Any plan can be
    # permuted into this form at the same cost, so CBC need not explore the copies.
    classes = _interchangeable(topology, names)
    for cls in classes:
        for d1, d2 in zip(cls, cls[1:], strict=False):
            used1 = pulp.lpSum(y[s, d1] for s in stages)
            used2 = pulp.lpSum(y[s, d2] for s in stages)
            prob += used1 >= used2
            prob += pulp.lpSum(s * y[s, d1] for s in stages) <= pulp.lpSum(
                s * y[s, d2] for s in stages
            ) + s_count * (1 - used2)

    if warm_start is not None:
        ranges, warm_devs, flags = warm_start
        warm_start = (ranges, _canonical(list(warm_devs), classes, names), flags)
        _apply_warm_start(warm_start, names, u, y, rc, n, s_count)

    fd, log_path = tempfile.mkstemp(prefix="pipeplan-cbc-", suffix=".log")
    os.close(fd)
    try:
        solver = pulp.PULP_CBC_CMD(
            msg=False,
            timeLimit=max(0.1, float(time_limit)),
            warmStart=warm_start is not None,
            threads=1,
            logPath=log_path,
        )
        prob.solve(solver)
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            log = handle.read()
    finally:
        os.unlink(log_path)
    seconds = time.perf_counter() - start_clock
    status = pulp.LpStatus[prob.status]
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if not has_solution:
        return IlpResult(None, None, None, None, None, status, None, seconds)
    ranges, chosen, flags = _read_solution(u, y, rc, names, n, s_count)
    objective = float(pulp.value(prob.objective))
    _, bound = _parse_cbc_log(log)
    if prob.sol_status == pulp.LpSolutionOptimal:
        bound = objective
        status = "Optimal"
    else:
        status = "Feasible (time limit)"
    gap = None
    if bound is not None and objective > 0:
        gap = max(0.0, (objective - bound) / objective)
    return IlpResult(ranges, chosen, flags, objective, bound, status, gap, seconds)


def _interchangeable(topology: Topology, names: list[str]) -> list[list[int]]:
    """Groups of device indices any two of which can swap roles without changing a cost."""

    def same(a: int, b: int) -> bool:
        da, db = topology.device(names[a]), topology.device(names[b])
        if (da.speed, da.memory_bytes) != (db.speed, db.memory_bytes):
            return False
        if transfer_cost(topology, names[a], names[b]) != transfer_cost(
            topology, names[b], names[a]
        ):
            return False
        for x in range(len(names)):
            if x in (a, b):
                continue
            if transfer_cost(topology, names[a], names[x]) != transfer_cost(
                topology, names[b], names[x]
            ) or transfer_cost(topology, names[x], names[a]) != transfer_cost(
                topology, names[x], names[b]
            ):
                return False
        return True

    classes: list[list[int]] = []
    for d in range(len(names)):
        for cls in classes:
            if all(same(d, other) for other in cls):
                cls.append(d)
                break
        else:
            classes.append([d])
    return [cls for cls in classes if len(cls) > 1]


def _canonical(devices: list[str], classes: list[list[int]], names: list[str]) -> list[str]:
    """The warm start's devices permuted within each class into the symmetry-broken form."""
    out = list(devices)
    for cls in classes:
        members = {names[d] for d in cls}
        stages = [k for k, dev in enumerate(devices) if dev in members]
        for k, d in zip(stages, cls, strict=False):
            out[k] = names[d]
    return out


def _apply_warm_start(
    warm: tuple[Sequence[tuple[int, int]], Sequence[str], Sequence[bool]],
    names: list[str],
    u: dict[tuple[int, int], Any],
    y: dict[tuple[int, int], Any],
    rc: dict[int, Any],
    n: int,
    s_count: int,
) -> None:
    ranges, devs, flags = warm
    if len(ranges) != s_count or any(d not in names for d in devs):
        return
    for s in range(s_count):
        last = ranges[s][1]
        for i in range(n):
            u[i, s].setInitialValue(1 if i <= last else 0)
        for d, name in enumerate(names):
            y[s, d].setInitialValue(1 if name == devs[s] else 0)
        rc[s].setInitialValue(1 if flags[s] else 0)


def _read_solution(
    u: dict[tuple[int, int], Any],
    y: dict[tuple[int, int], Any],
    rc: dict[int, Any],
    names: list[str],
    n: int,
    s_count: int,
) -> tuple[list[tuple[int, int]], list[str], list[bool]]:
    ranges = []
    first = 0
    for s in range(s_count):
        last = max((i for i in range(n) if (u[i, s].value() or 0) > 0.5), default=first - 1)
        ranges.append((first, last))
        first = last + 1
    chosen = []
    for s in range(s_count):
        weights = [(y[s, d].value() or 0.0, -d) for d in range(len(names))]
        chosen.append(names[max(range(len(names)), key=weights.__getitem__)])
    flags = [(rc[s].value() or 0) > 0.5 for s in range(s_count)]
    return ranges, chosen, flags

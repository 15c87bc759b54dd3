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
        import pulp

        start_clock = time.perf_counter()
        n = costs.num_layers
        names = list(devices) if devices is not None else topology.device_names()
        if num_stages < 1 or num_stages > n or num_stages > len(names):
            return IlpResult(None, None, None, None, None, "Infeasible", None, 0.0)
        k = _coefficients(costs, topology, names, in_flight, num_microbatches, weight_versions)
        prob = pulp.LpProblem("pipeplan_partition_mapping", pulp.LpMinimize)
        v = _variables(pulp, n, num_stages, len(names))
        prob += (k.num_microbatches - 1) * v.bott + pulp.lpSum(
            v.t[s] + v.c[s] for s in range(num_stages)
        )
        for s in range(num_stages):
            _stage_constraints(pulp, prob, v, k, s, num_stages)
        classes = _global_constraints(pulp, prob, v, k, num_stages, topology)
        if warm_start is not None:
            ranges, warm_devs, flags = warm_start
            warm_start = (ranges, _canonical(list(warm_devs), classes, names), flags)
            _apply_warm_start(warm_start, names, v.u, v.y, v.rc, n, num_stages)
        log = _run_cbc(pulp, prob, time_limit, warm_start is not None)
        return _result(pulp, prob, v, names, n, num_stages, log, time.perf_counter() - start_clock)


def _result(
    pulp: Any,
    prob: Any,
    v: _Variables,
    names: list[str],
    n: int,
    num_stages: int,
    log: str,
    seconds: float,
) -> IlpResult:
    """What CBC found: the plan, its objective, the bound from CBC's log and the gap."""
    status = pulp.LpStatus[prob.status]
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if not has_solution:
        return IlpResult(None, None, None, None, None, status, None, seconds)
    ranges, chosen, flags = _read_solution(v.u, v.y, v.rc, names, n, num_stages)
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


@dataclass
class _Coefficients:
    """Per-layer and per-link numbers of one problem (what the constraints are made of)."""

    n: int
    names: list[str]
    dev: list[Any]  # the Device of each name
    num_microbatches: int
    in_flight: Sequence[int]
    work: list[float]  # forward + backward
    fwd: list[float]
    static: list[float]  # weights (and a second version), gradients, optimizer state
    saved: list[float]
    wsp: list[float]  # workspace
    cut: list[float]  # bytes crossing the cut after the layer
    inputs: list[float]  # bytes entering the layer
    link: dict[tuple[int, int], Any]  # transfer cost between device indices
    max_speed: float
    max_cut: float
    cheapest_lat: float
    cheapest_mpb: float
    max_act: float  # a valid big-M for activation memory


def _coefficients(
    costs: LayerCosts,
    topology: Topology,
    names: list[str],
    in_flight: Sequence[int],
    num_microbatches: int,
    weight_versions: int,
) -> _Coefficients:
    n = costs.num_layers
    layers = range(n)
    dids = range(len(names))
    dev = [topology.device(x) for x in names]
    saved = [costs.saved[i + 1] - costs.saved[i] for i in layers]
    inputs = [float(costs.input_bytes[i]) for i in layers]
    cut = [float(costs.cut_bytes[i]) for i in layers]
    link = {(a, b): transfer_cost(topology, names[a], names[b]) for a in dids for b in dids}
    return _Coefficients(
        n=n,
        names=names,
        dev=dev,
        num_microbatches=num_microbatches,
        in_flight=in_flight,
        work=[
            (costs.fwd[i + 1] - costs.fwd[i]) + (costs.bwd[i + 1] - costs.bwd[i]) for i in layers
        ],
        fwd=[costs.fwd[i + 1] - costs.fwd[i] for i in layers],
        static=[
            (costs.static[i + 1] - costs.static[i])
            + (weight_versions - 1) * (costs.params[i + 1] - costs.params[i])
            for i in layers
        ],
        saved=saved,
        wsp=[float(costs.workspace[i, i]) for i in layers],
        cut=cut,
        inputs=inputs,
        link=link,
        max_speed=max(d.speed for d in dev),
        max_cut=max(cut) if cut else 0.0,
        cheapest_lat=min((c.latency_ms for (a, b), c in link.items() if a != b), default=0.0),
        cheapest_mpb=min((c.ms_per_byte for (a, b), c in link.items() if a != b), default=0.0),
        max_act=max(in_flight, default=1) * (sum(saved) + max(inputs)) + sum(saved) + 1.0,
    )


@dataclass
class _Variables:
    """The model's variables: ``u[i, s]`` layer i is in stage s or earlier, ``y[s, d]``
    stage s on device d, ``rc[s]`` recompute; per-stage time, transfer, activation memory
    and workspace; the bottleneck."""

    u: dict[tuple[int, int], Any]
    y: dict[tuple[int, int], Any]
    rc: dict[int, Any]
    t: dict[int, Any]
    c: dict[int, Any]
    act: dict[int, Any]
    wmax: dict[int, Any]
    bott: Any

    def x(self, i: int, s: int) -> Any:  # layer i is in stage s
        return self.u[i, s] - (self.u[i, s - 1] if s > 0 else 0)

    def end(self, i: int, s: int) -> Any:  # stage s ends at layer i (s < S - 1, i < L - 1)
        return self.u[i, s] - self.u[i + 1, s]

    def start(self, i: int, s: int) -> Any:  # stage s starts at layer i
        if s == 0:
            return 1 if i == 0 else 0
        return self.end(i - 1, s - 1) if i > 0 else 0


def _variables(pulp: Any, n: int, s_count: int, d_count: int) -> _Variables:
    layers, stages, dids = range(n), range(s_count), range(d_count)
    return _Variables(
        u={(i, s): pulp.LpVariable(f"u_{i}_{s}", cat="Binary") for i in layers for s in stages},
        y={(s, d): pulp.LpVariable(f"y_{s}_{d}", cat="Binary") for s in stages for d in dids},
        rc={s: pulp.LpVariable(f"rc_{s}", cat="Binary") for s in stages},
        t={s: pulp.LpVariable(f"t_{s}", lowBound=0) for s in stages},
        c={s: pulp.LpVariable(f"c_{s}", lowBound=0) for s in stages},
        act={s: pulp.LpVariable(f"a_{s}", lowBound=0) for s in stages},
        wmax={s: pulp.LpVariable(f"w_{s}", lowBound=0) for s in stages},
        bott=pulp.LpVariable("B", lowBound=0),
    )


def _stage_constraints(
    pulp: Any, prob: Any, v: _Variables, k: _Coefficients, s: int, s_count: int
) -> None:
    """Stage ``s``: contiguous layers, one device, its time, memory and outgoing transfer."""
    n, layers, dids = k.n, range(k.n), range(len(k.names))
    prob += v.u[n - 1, s] == (1 if s == s_count - 1 else 0)
    for i in range(n - 1):
        prob += v.u[i, s] >= v.u[i + 1, s]
    if s > 0:
        for i in layers:
            prob += v.u[i, s] >= v.u[i, s - 1]
    prob += pulp.lpSum(v.x(i, s) for i in layers) >= 1
    prob += pulp.lpSum(v.y[s, d] for d in dids) == 1
    load = pulp.lpSum(k.work[i] * v.x(i, s) for i in layers)
    redo = pulp.lpSum(k.fwd[i] * v.x(i, s) for i in layers)
    for d in dids:
        sp = k.dev[d].speed
        # Big-M as small as valid (the most the stage could cost on this device) keeps
        # the LP relaxation, and so CBC's bound, tight.
        big = (sum(k.work) + sum(k.fwd)) / sp
        prob += v.t[s] >= load * (1.0 / sp) - big * (1 - v.y[s, d])
        prob += v.t[s] >= (load + redo) * (1.0 / sp) - big * (2 - v.y[s, d] - v.rc[s])
    prob += v.t[s] >= load * (1.0 / k.max_speed)  # valid whatever the device
    # Activation memory: all in-flight microbatches' saved tensors, or with recompute
    # their stage inputs plus one microbatch rebuilt during its backward.
    held = pulp.lpSum(k.saved[i] * v.x(i, s) for i in layers)
    stage_in = pulp.lpSum(k.inputs[i] * v.start(i, s) for i in layers)
    prob += v.act[s] >= k.in_flight[s] * held - k.max_act * v.rc[s]
    one = held if k.in_flight[s] > 0 else 0
    prob += v.act[s] >= k.in_flight[s] * stage_in + one - k.max_act * (1 - v.rc[s])
    for i in layers:
        prob += v.wmax[s] >= k.wsp[i] * v.x(i, s)
    prob += pulp.lpSum(k.static[i] * v.x(i, s) for i in layers) + v.act[s] + v.wmax[
        s
    ] <= pulp.lpSum(float(k.dev[d].memory_bytes) * v.y[s, d] for d in dids)
    if s < s_count - 1:
        sent = pulp.lpSum(k.cut[i] * v.end(i, s) for i in range(n - 1))
        for a in dids:
            for b in dids:
                if a == b:
                    continue
                lc = k.link[a, b]
                big = lc.latency_ms + lc.ms_per_byte * k.max_cut
                prob += v.c[s] >= lc.latency_ms + lc.ms_per_byte * sent - big * (
                    2 - v.y[s, a] - v.y[s + 1, b]
                )
        prob += v.c[s] >= k.cheapest_lat + k.cheapest_mpb * sent
    else:
        prob += v.c[s] == 0
    prob += v.bott >= v.t[s] + v.c[s]


def _global_constraints(
    pulp: Any, prob: Any, v: _Variables, k: _Coefficients, s_count: int, topology: Topology
) -> list[list[int]]:
    """Bounds on the bottleneck, one stage per device, and symmetry breaking; returns the
    classes of interchangeable devices."""
    stages, dids = range(s_count), range(len(k.names))
    prob += s_count * v.bott >= pulp.lpSum(v.t[s] + v.c[s] for s in stages)  # max >= mean
    # The S stages together run at most at the S fastest devices' combined speed.
    fastest = sum(sorted((d.speed for d in k.dev), reverse=True)[:s_count])
    prob += v.bott >= sum(k.work) / fastest
    for d in dids:
        prob += pulp.lpSum(v.y[s, d] for s in stages) <= 1
    # Symmetry breaking: interchangeable devices (same speed, memory and links to all
    # others) are used in order, the earlier one by the earlier stage. Any plan can be
    # permuted into this form at the same cost, so CBC need not explore the copies.
    classes = _interchangeable(topology, k.names)
    for cls in classes:
        for d1, d2 in zip(cls, cls[1:], strict=False):
            used1 = pulp.lpSum(v.y[s, d1] for s in stages)
            used2 = pulp.lpSum(v.y[s, d2] for s in stages)
            prob += used1 >= used2
            prob += pulp.lpSum(s * v.y[s, d1] for s in stages) <= pulp.lpSum(
                s * v.y[s, d2] for s in stages
            ) + s_count * (1 - used2)
    return classes


def _run_cbc(pulp: Any, prob: Any, time_limit: float, warm: bool) -> str:
    """Solve with CBC (one thread, the time limit); returns CBC's log."""
    fd, log_path = tempfile.mkstemp(prefix="pipeplan-cbc-", suffix=".log")
    os.close(fd)
    try:
        solver = pulp.PULP_CBC_CMD(
            msg=False,
            timeLimit=max(0.1, float(time_limit)),
            warmStart=warm,
            threads=1,
            logPath=log_path,
        )
        prob.solve(solver)
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    finally:
        os.unlink(log_path)


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

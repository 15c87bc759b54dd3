"""The ILP: optimal on its own model (checked by enumeration), warm start, memory, time limit."""

from __future__ import annotations

import itertools

import pytest
from test_dp import random_profile

from planner.cost import boundary_bytes, stage_compute_ms, stage_memory_bytes
from planner.partition.dp import layer_costs
from planner.partition.ilp import solve_ilp
from planner.partition.mapping import transfer_cost
from planner.topology import topology_from_dict


def hetero_topology(mem: str = "80 GiB") -> object:
    return topology_from_dict(
        {
            "schema": "pipeplan.topology/v1",
            "name": "tiny-hetero",
            "devices": [
                {"name": "fast0", "memory": mem, "speed": 2.0, "host": "a"},
                {"name": "slow0", "memory": mem, "speed": 0.5, "host": "b"},
                {"name": "fast1", "memory": mem, "speed": 2.0, "host": "a"},
                {"name": "mid0", "memory": mem, "speed": 1.0, "host": "b"},
            ],
            "switches": ["sa", "sb"],
            "links": [
                {"between": ["fast0", "sa"], "bandwidth": "100 GB/s", "latency": "1 us"},
                {"between": ["fast1", "sa"], "bandwidth": "100 GB/s", "latency": "1 us"},
                {"between": ["slow0", "sb"], "bandwidth": "100 GB/s", "latency": "1 us"},
                {"between": ["mid0", "sb"], "bandwidth": "100 GB/s", "latency": "1 us"},
                {"between": ["sa", "sb"], "bandwidth": "1 GB/s", "latency": "50 us"},
            ],
        }
    )


def _model_objective(profile, topo, ranges, devs, m, mb, in_flight):  # type: ignore[no-untyped-def]
    """The ILP's objective for one plan, computed directly (inf if it does not fit)."""
    times = []
    for k, ((a, b), d) in enumerate(zip(ranges, devs, strict=True)):
        device = topo.device(d)
        best = float("inf")
        for rc in (False, True):
            if (
                stage_memory_bytes(profile, a, b, mb, in_flight[k], recompute=rc)
                <= device.memory_bytes
            ):
                f, bw = stage_compute_ms(profile, a, b, mb, speed=device.speed, recompute=rc)
                best = min(best, f + bw)
        if k < len(ranges) - 1:
            best += transfer_cost(topo, d, devs[k + 1])(boundary_bytes(profile, b, mb))
        times.append(best)
    return (m - 1) * max(times) + sum(times)


def _brute(profile, topo, s, m, mb, in_flight):  # type: ignore[no-untyped-def]
    n = profile.num_layers
    best = float("inf")
    for cuts in itertools.combinations(range(n - 1), s - 1):
        bounds = [-1, *cuts, n - 1]
        ranges = [(bounds[k] + 1, bounds[k + 1]) for k in range(s)]
        for devs in itertools.permutations(topo.device_names(), s):
            best = min(best, _model_objective(profile, topo, ranges, devs, m, mb, in_flight))
    return best


@pytest.mark.parametrize(("n", "s", "seed"), [(5, 2, 0), (6, 3, 1), (5, 3, 2)])
def test_ilp_is_optimal_on_its_model(n: int, s: int, seed: int) -> None:
    profile = random_profile(n, seed)
    topo = hetero_topology()
    in_flight = [s - k for k in range(s)]
    res = solve_ilp(
        layer_costs(profile, 1),
        topo,
        num_stages=s,
        in_flight=in_flight,
        num_microbatches=6,
        time_limit=120,  # a guard against a stalled machine; these solve in well under 1 s
    )
    assert res.status == "Optimal" and res.gap == 0.0
    assert res.ranges is not None and res.devices is not None
    expected = _brute(profile, topo, s, 6, 1, in_flight)
    got = _model_objective(profile, topo, res.ranges, res.devices, 6, 1, in_flight)
    assert got == pytest.approx(expected, rel=1e-6)
    assert res.objective_ms == pytest.approx(expected, rel=1e-4)


def test_ilp_respects_memory_and_uses_recompute() -> None:
    profile = random_profile(6, 4)
    whole = stage_memory_bytes(profile, 0, 5, 1, 4)
    half = stage_memory_bytes(profile, 0, 5, 1, 4, recompute=True)
    limit = f"{int((whole + half) // 2)} B"
    topo = hetero_topology(limit)
    res = solve_ilp(
        layer_costs(profile, 1),
        topo,
        num_stages=1,
        in_flight=[4],
        num_microbatches=4,
        # Milliseconds of work; the limit only guards against a stalled machine (a CI run on
        # the shared VM once saw CBC stop on this 10 s wall-clock limit).
        time_limit=120,
    )
    assert res.status == "Optimal" and res.recompute == [True]
    topo_tiny = hetero_topology("1 KiB")
    res = solve_ilp(
        layer_costs(profile, 1),
        topo_tiny,
        num_stages=2,
        in_flight=[2, 1],
        num_microbatches=4,
        time_limit=10,
    )
    assert res.ranges is None and res.status == "Infeasible"


def test_warm_start_is_kept_and_deterministic() -> None:
    profile = random_profile(8, 5)
    topo = hetero_topology()
    costs = layer_costs(profile, 1)
    warm = ([(0, 3), (4, 7)], ["fast0", "fast1"], [False, False])
    runs = [
        solve_ilp(
            costs,
            topo,
            num_stages=2,
            in_flight=[2, 1],
            num_microbatches=8,
            time_limit=10,
            warm_start=warm,
        )
        for _ in range(2)
    ]
    assert runs[0].ranges == runs[1].ranges and runs[0].devices == runs[1].devices
    assert runs[0].devices is not None and set(runs[0].devices) == {"fast0", "fast1"}

"""Every simulated number on a broad set of plans, as JSON: run it before and after a change
to the simulator that must not change a result, and compare the two files byte for byte.

Cases: every bundled profile (``profiles/*.json``) under its own precision, fp16, and with
tied parameters, plus a synthetic profile with optimizer times and CUDA-style workspaces;
every bundled topology (``topologies/*.yaml``) and free communication (``topology=None``);
the schedules gpipe, 1f1b, interleaved (one and two virtual stages), zb, 2bw, optimized and a
hand-written (expanded) 1f1b; partitions of 1, 2 and 4 stages (even and uneven, devices in
and out of order), replicated stages, recompute, explicit step times and ``events=False``;
a deadlocking schedule's message. Per case: iteration, makespan, bubble, lower bound, memory
peaks and limits, busy and step times, staleness, the raw events and transfers and the
memory curves (JSON writes floats with ``repr``, so equal files mean equal bits).

Run::

    .venv/bin/python bench/simulate_identity.py --out /tmp/before.json
    # ... change the simulator ...
    .venv/bin/python bench/simulate_identity.py --out /tmp/after.json
    cmp /tmp/before.json /tmp/after.json && echo identical
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.plan import StageSpec
from planner.profile import load_profile
from planner.profile.schema import Profile
from planner.profile.tied import TiedParameter
from planner.schedule import Schedule, build_schedule
from planner.simulate import SimResult, simulate, simulate_schedule
from planner.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb", "2bw", "optimized", "written"]
MICROBATCHES = 6


def _tied(profile: Profile) -> Profile:
    """The profile with its first and last layers sharing a weight (as GPT-2's embedding and
    head do) and, with enough layers, two middle layers sharing another."""
    n = profile.num_layers
    first = profile.layers[0]
    ties = [TiedParameter("embed", (0, n - 1), first.param_count, first.param_bytes)]
    if n >= 5:
        mid = profile.layers[1]
        ties.append(TiedParameter("shared", (1, n - 2), mid.param_count, mid.param_bytes))
    return dataclasses.replace(profile, tied_parameters=ties)


def _cuda_like() -> Profile:
    """A synthetic profile with optimizer times and workspaces, which CPU profiles lack."""
    base = synthetic_profile(8, optimizer_ms=0.3, output_bytes=1 << 20, saved_bytes=1 << 18)
    layers = [
        dataclasses.replace(layer, optimizer_workspace_bytes=1000 * (i + 1))
        for i, layer in enumerate(base.layers)
    ]
    measurements = [
        dataclasses.replace(
            m,
            layers=[
                dataclasses.replace(t, workspace_bytes=(i % 3) * 5000, forward_ms=0.5 + 0.25 * i)
                for i, t in enumerate(m.layers)
            ],
        )
        for m in base.measurements
    ]
    return dataclasses.replace(base, model="cuda-like", layers=layers, measurements=measurements)


def _profiles() -> Iterator[tuple[str, Profile]]:
    for path in sorted((ROOT / "profiles").glob("*.json")):
        profile = load_profile(path)
        yield path.stem, profile
        yield path.stem + "+fp16", dataclasses.replace(profile, precision="fp16")
        yield path.stem + "+tied", _tied(profile)
    cuda = _cuda_like()
    yield "cuda-like", cuda
    yield "cuda-like+tied+fp16", dataclasses.replace(_tied(cuda), precision="fp16")


def _topologies() -> Iterator[tuple[str, Topology | None, list[str]]]:
    yield "none", None, ["a", "b", "c", "d"]
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        topo = load_topology(path)
        yield path.stem, topo, [d.name for d in topo.devices]


def _split(n: int, sizes: list[int]) -> list[tuple[int, int]]:
    """Layer ranges of the given relative sizes covering ``0..n-1``."""
    total, out, first = sum(sizes), [], 0
    for i, size in enumerate(sizes):
        last = n - 1 if i == len(sizes) - 1 else max(first, first + n * size // total - 1)
        out.append((first, last))
        first = last + 1
    return out


def _partitions(n: int, devs: list[str]) -> Iterator[tuple[str, list[StageSpec]]]:
    def make(sizes: list[int], placed: list[list[str]], recompute: bool = False) -> list[StageSpec]:
        ranges = _split(n, sizes)
        return [
            StageSpec(i, r, d, recompute)
            for i, (r, d) in enumerate(zip(ranges, placed, strict=True))
        ]

    yield "one", make([1], [[devs[0]]])
    yield "two", make([1, 1], [[devs[0]], [devs[1]]])
    yield "two-uneven-recompute", make([3, 1], [[devs[1]], [devs[0]]], recompute=True)
    if len(devs) >= 3:
        yield "replicated", make([1, 2], [[devs[0], devs[1]], [devs[2]]])
    if len(devs) >= 4 and n >= 4:
        yield "four", make([1, 2, 1, 3], [[devs[0]], [devs[2]], [devs[1]], [devs[3]]])
        yield "shared", make([1, 1, 1, 1], [[devs[0]], [devs[1]], [devs[0]], [devs[1]]])


def _dump(result: SimResult) -> dict[str, Any]:
    return {
        "iteration_ms": result.iteration_ms,
        "makespan_ms": result.makespan_ms,
        "bubble_fraction": result.bubble_fraction,
        "lower_bound_ms": result.lower_bound_ms,
        "memory_bytes": result.memory_bytes,
        "memory_limit_bytes": result.memory_limit_bytes,
        "static_bytes": result.static_bytes,
        "busy_ms": result.busy_ms,
        "step_ms": result.step_ms,
        "staleness": result.staleness,
        "iterations": result.iterations,
        "schedule": result.schedule.name,
        "predicted": result.predicted(),
        "events": [list(e) for e in result.raw_events],
        "transfers": [list(t) for t in result.raw_transfers],
        "memory_timeline": result.memory_timeline,
        "named_events": [list(e) for e in result.events[:50]],
        "named_transfers": [list(t) for t in result.transfers[:50]],
    }


def _cases() -> Iterator[tuple[str, Any]]:
    profiles = list(_profiles())
    for topo_name, topo, devs in _topologies():
        for prof_name, profile in profiles:
            variant = "+" in prof_name
            if variant and topo_name not in ("none", "nvlink", "two-node-ib", "hetero"):
                continue  # fp16 and tied over a few topologies: the exchanges need one
            for part_name, stages in _partitions(profile.num_layers, devs):
                for name in SCHEDULES:
                    shared = part_name == "shared"
                    if shared != (name == "interleaved") and not (
                        name == "interleaved" and part_name == "two"
                    ):
                        continue
                    if name == "optimized" and (variant or part_name == "replicated"):
                        continue  # a search: kept to the plain profiles
                    key = f"{prof_name}|{topo_name}|{part_name}|{name}"
                    yield key, lambda p=profile, t=topo, s=stages, n=name: _run(p, t, s, n)
                    if name in ("1f1b", "2bw") and not variant:
                        yield (
                            key + "|lean",
                            lambda p=profile, t=topo, s=stages, n=name: _run(
                                p, t, s, n, events=False
                            ),
                        )
                        yield (
                            key + "|step",
                            lambda p=profile, t=topo, s=stages, n=name: _run(
                                p, t, s, n, step_ms=[0.25 * (i + 1) for i in range(len(s))]
                            ),
                        )
    two = [StageSpec(0, (0, 1), ["gpu0"]), StageSpec(1, (2, 3), ["gpu1"])]
    yield (
        "deadlock",
        lambda: _run(
            synthetic_profile(4), load_topology(ROOT / "topologies" / "nvlink.yaml"), two, "stuck"
        ),
    )


def _run(
    profile: Profile,
    topo: Topology | None,
    stages: list[StageSpec],
    name: str,
    events: bool = True,
    step_ms: list[float] | None = None,
) -> Any:
    m = MICROBATCHES
    try:
        if name == "written":
            sched = Schedule.from_dict(build_schedule("1f1b", stages, m).to_dict())
            result = simulate(profile, topo, stages, sched, m, events=events, step_ms=step_ms)
        elif name == "stuck":
            stuck = Schedule.from_dict(
                {
                    "name": "mine",
                    "devices": {
                        "gpu0": ["RECV_B0.0<-gpu1", "F0.0", "SEND_F0.0->gpu1", "B0.0"],
                        "gpu1": ["RECV_F1.0<-gpu0", "F1.0", "B1.0", "SEND_B1.0->gpu0"],
                    },
                }
            )
            return {"error": str(simulate_error(profile, topo, stages, stuck))}
        else:
            result = simulate(profile, topo, stages, name, m, events=events, step_ms=step_ms)
    except InputError as e:
        return {"error": str(e)}
    return _dump(result)


def simulate_error(
    profile: Profile, topo: Topology | None, stages: list[StageSpec], sched: Schedule
) -> InputError | None:
    try:
        simulate_schedule(profile, topo, stages, sched, profile.microbatch_sizes[0])
    except InputError as e:
        return e
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for key, run in _cases():
        results[key] = run()
    text = json.dumps(results, indent=0, sort_keys=True) + "\n"
    Path(args.out).write_text(text)
    errors = sum(1 for r in results.values() if "error" in r)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    print(
        f"{len(results)} cases ({errors} errors) in {time.perf_counter() - started:.1f} s: "
        f"{args.out} sha256 {digest}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

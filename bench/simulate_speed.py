"""How long one simulation takes: the solver calls ``simulate`` in a loop.

For each shape (stages x microbatches) and schedule, three timings (best of ``REPEATS``):

* ``cold``: ``simulate`` with a schedule name whose order is not cached yet -- generate the
  order, validate it (completeness, order, deadlock check), compile, run, memory, events;
* ``warm``: the same call again (the order is cached per schedule name, microbatches and
  device lists, as in the solver's loop where only the layer ranges change);
* ``lean``: warm with ``events=False`` (no event list or memory curve, as a solver would);
* ``cpu``: the warm call's CPU time (``time.process_time``), steadier on a shared machine.

Free communication (``topology=None``) and a uniform topology (one switch, 100 GB/s links)
where every transfer reserves links.

Run::

    .venv/bin/python bench/simulate_speed.py          # table + bench/results/simulate_speed.json
    .venv/bin/python bench/simulate_speed.py --quick  # the two smallest shapes, one repeat
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from planner.cost import synthetic_profile
from planner.plan import StageSpec
from planner.schedule import _pattern_order
from planner.simulate import simulate
from planner.topology import uniform_topology

SHAPES = [(8, 64), (16, 128), (32, 256), (64, 512)]
SCHEDULES = ["1f1b", "gpipe", "zb", "2bw"]
REPEATS = 3


def _best(fn: Any, repeats: int = REPEATS, clock: Any = time.perf_counter) -> float:
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two smallest shapes, one repeat")
    args = parser.parse_args()
    shapes = SHAPES[:2] if args.quick else SHAPES
    repeats = 1 if args.quick else REPEATS
    best = functools.partial(_best, repeats=repeats)
    rows: list[dict[str, Any]] = []
    print(
        f"{'stages':>6} {'mbs':>5} {'schedule':>8} {'comm':>8} {'actions':>8} "
        f"{'cold s':>7} {'warm s':>7} {'lean s':>7} {'cpu s':>7} {'iteration ms':>13}"
    )
    for p, m in shapes:
        prof = synthetic_profile(p, output_bytes=1 << 20)
        for comm in ("free", "topology"):
            topo = (
                uniform_topology(p, bandwidth=100e9, latency_ms=0.002) if comm != "free" else None
            )
            stages = [StageSpec(i, (i, i), [f"gpu{i}"]) for i in range(p)]
            for name in SCHEDULES:
                call = functools.partial(simulate, prof, topo, stages, name, m)
                cold_s = best(lambda call=call: (_pattern_order.cache_clear(), call()))
                result = call()
                warm_s = best(call)
                lean_s = best(functools.partial(call, events=False))
                # CPU time of the warm call: less sensitive to other jobs on a shared VM.
                cpu_s = best(call, clock=time.process_time)
                actions = sum(len(a) for a in result.schedule.devices.values())
                row = {
                    "stages": p,
                    "microbatches": m,
                    "schedule": name,
                    "communication": comm,
                    "actions": actions,
                    "cold_s": round(cold_s, 4),
                    "warm_s": round(warm_s, 4),
                    "lean_s": round(lean_s, 4),
                    "warm_cpu_s": round(cpu_s, 4),
                    "iteration_ms": round(result.iteration_ms, 3),
                }
                rows.append(row)
                print(
                    f"{p:>6} {m:>5} {name:>8} {comm:>8} {actions:>8} {cold_s:>7.3f} "
                    f"{warm_s:>7.3f} {lean_s:>7.3f} {cpu_s:>7.3f} {result.iteration_ms:>13.1f}"
                )
    out = Path(__file__).parent / "results" / "simulate_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": f"{platform.machine()}, {platform.python_version()}",
                "repeats": repeats,
                "quick": args.quick,
                "load_average": list(os.getloadavg()),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Every plan ``solve`` writes on a broad set of inputs, as JSON: run it before and after a
change to the solver, the peers or the simulator that must not change a plan, and compare the
two files byte for byte.

Cases: every bundled profile (``profiles/*.json``) on every bundled topology
(``topologies/*.yaml``), each with six sets of options: the defaults (``2 x devices``
microbatches, schedule auto); a global batch of 8 of the largest profiled microbatch; a global
batch and a number of microbatches together; two fixed schedules (every schedule ``solve``
accepts, in rotation over the pairs, so each is solved 14 times); and the default options on
the same topology with every device's memory cut to 40 % of the default plan's peak, which
forces recompute, more stages or an infeasible answer (its message is the case's result).
Then a few option sets on a few pairs: no exhaustive search, no ILP, the ILP everywhere, no
peers. Per case: the plan JSON ``pipeplan solve`` would write, minus the wall times (the
solver's and the ILP's ``seconds``), or the one-line error. Every ILP here finishes
(status Optimal) long before its time limit, so nothing depends on the clock; a case whose
ILP did not is named on stderr.

Run::

    .venv/bin/python bench/solve_identity.py --out /tmp/before.json
    # ... change the solver ...
    .venv/bin/python bench/solve_identity.py --out /tmp/after.json
    cmp /tmp/before.json /tmp/after.json && echo identical

``--quick``: the gpt and mlp profiles on three topologies (cpu, nvlink, hetero) only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.profile import load_profile
from planner.profile.schema import Profile
from planner.solve import SCHEDULE_CHOICES, SolveOptions, solve
from planner.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]
FIXED = [s for s in SCHEDULE_CHOICES if s != "auto"]  # gpipe, 1f1b, interleaved, zb, 2bw
MICROBATCHES = 8
# A fraction of the default plan's peak memory per device: forces recompute or more stages.
TIGHT = 0.4
QUICK_PROFILES = ("gpt", "mlp")
QUICK_TOPOLOGIES = ("cpu", "nvlink", "hetero")

Case = Callable[[], Any]


def _with_memory(topology: Topology, memory_bytes: int) -> Topology:
    """``topology`` with every device's memory set to ``memory_bytes``."""
    return topology.with_memory(memory_bytes, name=topology.name + "-tight")


def plan_without_times(plan: Any) -> dict[str, Any]:
    """The plan JSON without its wall times (the solver's and the ILP's ``seconds``)."""
    data = plan.to_dict()
    solver = data.get("solver", {})
    solver.pop("seconds", None)
    ilp = solver.get("ilp")
    if isinstance(ilp, dict):
        ilp.pop("seconds", None)
    return data


def _solve(
    profile: Profile, path: str, topology: Topology, topo_path: str | None, **kw: Any
) -> Any:
    """The plan's JSON, or the one-line error."""
    try:
        plan = solve(profile, topology, profile_path=path, topology_path=topo_path, **kw)
    except InputError as e:
        return {"error": str(e)}
    return plan_without_times(plan)


def _tight(profile: Profile, path: str, topology: Topology, topo_path: str) -> Any:
    """The default options with every device's memory cut to :data:`TIGHT` of the default
    plan's peak (in memory, so the plan names no topology file)."""
    try:
        plan = solve(profile, topology, profile_path=path, topology_path=topo_path)
    except InputError as e:
        return {"error": "default plan: " + str(e)}
    assert plan.predicted is not None
    peak = max(plan.predicted.memory_bytes.values())
    return _solve(profile, path, _with_memory(topology, int(peak * TIGHT)), None)


def _pair_cases(
    index: int, prof_name: str, profile: Profile, topo_name: str, topology: Topology
) -> Iterator[tuple[str, Case]]:
    path = f"profiles/{prof_name}.json"
    topo_path = f"topologies/{topo_name}.yaml"
    key = f"{prof_name}|{topo_name}"
    args = (profile, path, topology, topo_path)
    sizes = profile.microbatch_sizes
    yield f"{key}|default", lambda: _solve(*args)
    batch = 8 * sizes[-1]
    yield f"{key}|gb={batch}", lambda: _solve(*args, global_batch=batch)
    both = MICROBATCHES * sizes[0]
    yield (
        f"{key}|gb={both}|m={MICROBATCHES}",
        lambda: _solve(*args, global_batch=both, num_microbatches=MICROBATCHES),
    )
    for k in range(2):
        sched = FIXED[(2 * index + k) % len(FIXED)]
        yield (
            f"{key}|m={MICROBATCHES}|{sched}",
            lambda s=sched: _solve(*args, num_microbatches=MICROBATCHES, schedule=s),
        )
    yield f"{key}|tight", lambda: _tight(*args)


def _option_cases(
    profiles: dict[str, Profile], topologies: dict[str, Topology]
) -> Iterator[tuple[str, Case]]:
    """A few option sets on a few pairs: the search's other paths."""
    variants = {
        "no-exhaustive": SolveOptions(exhaustive_limit=0),
        "no-ilp": SolveOptions(use_ilp=False),
        "ilp": SolveOptions(use_ilp=True),
        "no-peers": SolveOptions(baselines=False),
        "few": SolveOptions(top_candidates=2, local_search_evals=40),
    }
    for prof_name in ("gpt", "pipedream-gnmt"):
        for topo_name in ("cpu", "nvlink", "hetero"):
            if prof_name not in profiles or topo_name not in topologies:
                continue
            args = (
                profiles[prof_name],
                f"profiles/{prof_name}.json",
                topologies[topo_name],
                f"topologies/{topo_name}.yaml",
            )
            for label, opts in variants.items():
                yield (
                    f"{prof_name}|{topo_name}|{label}",
                    lambda a=args, o=opts: _solve(*a, options=o),
                )


def _cases(quick: bool) -> Iterator[tuple[str, Case]]:
    profiles = {p.stem: load_profile(p) for p in sorted((ROOT / "profiles").glob("*.json"))}
    topologies = {t.stem: load_topology(t) for t in sorted((ROOT / "topologies").glob("*.yaml"))}
    if quick:
        profiles = {k: v for k, v in profiles.items() if k in QUICK_PROFILES}
        topologies = {k: v for k, v in topologies.items() if k in QUICK_TOPOLOGIES}
    index = 0
    for prof_name, profile in profiles.items():
        for topo_name, topology in topologies.items():
            yield from _pair_cases(index, prof_name, profile, topo_name, topology)
            index += 1
    yield from _option_cases(profiles, topologies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--quick", action="store_true", help="2 profiles x 3 topologies")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    os.chdir(ROOT)  # the plans name their inputs as `pipeplan solve` run here would
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for key, run in _cases(args.quick):
        results[key] = run()
        ilp = results[key].get("solver", {}).get("ilp")
        if ilp is not None and ilp.get("status") != "Optimal":
            print(f"{key}: the ILP ended {ilp.get('status')}: may depend on time", file=sys.stderr)
    text = json.dumps(results, indent=0, sort_keys=True) + "\n"
    out.write_text(text)
    errors = sum(1 for r in results.values() if "error" in r)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    print(
        f"{len(results)} cases ({errors} errors) in {time.perf_counter() - started:.1f} s: "
        f"{args.out} sha256 {digest}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

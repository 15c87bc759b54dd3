"""How long reading and validating pipeplan's files takes: profiles, plans and topologies.

Three files, each decoded once (:mod:`planner.datafile`, strict JSON/YAML) and then read
into pipeplan's types ``REPEATS`` times (best kept):

* ``profile``: a Llama-405B-shaped profile, 126 layers at 3 microbatch sizes with
  tensor-parallel entries (degrees 2, 4 and 8, each with and without sequence
  parallelism: 6 shards per layer and size), built from :func:`planner.cost.synthetic_profile`
  (1.4 MB of JSON);
* ``plan``: a plan with a big schedule, 32 stages x 1,024 microbatches of 1F1B (196,608
  actions), read with its schedule parsed and validated, as ``Plan.load`` does;
* ``topology``: ``topology cluster --preset dgx-h100 --nodes 16`` (128 GPUs, written with
  the ``hosts`` shorthand), its routes tabulated (the larger part of its time).

Times are wall seconds for one read (best of ``REPEATS``) and its CPU seconds; ``decode_s``
is the JSON/YAML decoding alone, before reading.

Run::

    .venv/bin/python bench/read_speed.py          # table + bench/results/read_speed.json
    .venv/bin/python bench/read_speed.py --quick  # one repeat
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.cost import synthetic_profile
from planner.datafile import decode_json, decode_yaml
from planner.plan import StageSpec, plan_from_dict, plan_from_simulation
from planner.plan_parts import FileRef
from planner.profile.schema import LayerTiming, profile_from_dict
from planner.profile.sharding import (
    PHASES,
    TIMING_NAMES,
    Collective,
    ShardParams,
    ShardTiming,
    TensorParallelInfo,
    shard_key,
)
from planner.simulate import simulate
from planner.topology.cluster import cluster_dict, cluster_yaml
from planner.topology.load import topology_from_dict

REPEATS = 5
LAYERS = 126
SIZES = (1, 2, 4)
DEGREES = (2, 4, 8)


def _shard(timing: LayerTiming, degree: int, sp: bool) -> ShardTiming:
    """One rank's shard: the layer's times over ``degree``, Megatron's collectives."""
    out = timing.output_bytes
    ops = ("reduce_scatter", "all_gather") if sp else ("all_reduce",)
    return ShardTiming(
        *(getattr(timing, name) / degree for name in TIMING_NAMES),
        output_bytes=out // degree if sp else out,
        saved_bytes=timing.saved_bytes // degree,
        collectives=tuple(Collective(op, out, phase) for phase in PHASES for op in ops),
    )


def profile_data() -> dict[str, Any]:
    """The profile described in the module docstring, as its JSON object.

    Example::

        len(profile_data()["layers"])   # 126
    """
    base = synthetic_profile(LAYERS, output_bytes=1 << 24, saved_bytes=1 << 26)
    for layer in base.layers:
        layer.sharded = {
            shard_key(t): ShardParams(
                layer.param_count // t, layer.param_bytes // t, layer.optimizer_state_bytes // t
            )
            for t in DEGREES
        }
    timings = base.measurements[0].layers
    for timing in timings:
        timing.sharded = {
            shard_key(t, sequence_parallel=sp): _shard(timing, t, sp)
            for t in DEGREES
            for sp in (False, True)
        }
    sizes = [dataclasses.replace(base.measurements[0], microbatch_size=size) for size in SIZES]
    profile = dataclasses.replace(
        base, measurements=sizes, tensor_parallel=TensorParallelInfo(DEGREES, True, "tp_plan")
    )
    return profile.to_dict()


def plan_data() -> dict[str, Any]:
    """A 32-stage, 1,024-microbatch 1F1B plan as its JSON object.

    Example::

        plan_data()["num_microbatches"]   # 1024
    """
    profile = synthetic_profile(32)
    stages = [StageSpec(i, (i, i), [f"gpu{i}"]) for i in range(32)]
    result = simulate(profile, None, stages, "1f1b", 1024, events=False)
    ref = FileRef.in_memory(profile.to_dict())
    return plan_from_simulation(result, stages, profile=ref, topology=FileRef(None)).to_dict()


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat")
    args = parser.parse_args()
    repeats = 1 if args.quick else REPEATS
    texts = {
        "profile": json.dumps(profile_data(), indent=1),
        "plan": json.dumps(plan_data(), indent=1),
        "topology": cluster_yaml(cluster_dict("dgx-h100", 16), "dgx-h100"),
    }
    decoders: dict[str, Callable[[str], Any]] = {
        "profile": lambda text: decode_json(text, source="p.json"),
        "plan": lambda text: decode_json(text, source="plan.json"),
        "topology": lambda text: decode_yaml(text, source="t.yaml"),
    }
    readers: dict[str, Callable[[Any], Any]] = {
        "profile": lambda data: profile_from_dict(data, source="p.json"),
        "plan": lambda data: plan_from_dict(data, source="plan.json"),
        "topology": lambda data: topology_from_dict(data, "t.yaml"),
    }
    rows = []
    print(f"{'file':>9} {'MB':>6} {'decode s':>9} {'read s':>8} {'read cpu s':>10}")
    for name, text in texts.items():
        decode_s, _ = _best(lambda name=name, text=text: decoders[name](text), repeats)
        data = decoders[name](text)
        # Each read gets its own copy: a reader may keep (or change) what it is given.
        copies = [copy.deepcopy(data) for _ in range(repeats)]
        read_s, cpu_s = _best(lambda name=name, copies=copies: readers[name](copies.pop()), repeats)
        megabytes = len(text.encode()) / 1e6
        rows.append(
            {
                "file": name,
                "megabytes": round(megabytes, 2),
                "decode_s": round(decode_s, 4),
                "read_s": round(read_s, 4),
                "read_cpu_s": round(cpu_s, 4),
            }
        )
        print(f"{name:>9} {megabytes:>6.2f} {decode_s:>9.4f} {read_s:>8.4f} {cpu_s:>10.4f}")
    result = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "repeats": repeats,
        "quick": args.quick,
        "load_average": list(os.getloadavg()),
        "rows": rows,
    }
    path = Path(__file__).parent / "results" / "read_speed.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Partitioners of the field, called from their own packages, against pipeplan's reproductions.

For every bundled profile (``profiles/*.json``) and 2, 4 and 8 stages, with each layer's
cost = forward + backward ms at the smallest profiled microbatch size:

- DeepSpeed ``deepspeed.runtime.utils.partition_uniform`` and ``partition_balanced`` (the
  functions behind ``PipelineModule(partition_method="uniform" | "type:..."/"parameters")``)
  against ``planner.partition.baselines.deepspeed_partition_uniform`` / ``..._balanced``;
- torchgpipe ``torchgpipe.balance.balance_cost`` (what ``balance_by_time`` calls on the
  per-layer microseconds it measures) on the profile's microseconds, against
  ``planner.partition.baselines.block_partition``;
- and, on the MLP example (an ``nn.Sequential``), torchgpipe's ``balance_by_time`` itself,
  timing the real layers on this CPU with the profile's settings (its thread count, 1, and
  its smallest microbatch size), scored with the stored profile.

Each row: does the peer give the same split as ours, and the bottleneck (largest stage's ms)
of the peer's split against the best contiguous split (exact min-max DP, computed here).
A peer that is not installed (``pip install -e '.[bench]'``) gives one "not installed" row.

Run::

    .venv/bin/python bench/peers.py            # table + bench/results/peers.json
    .venv/bin/python bench/peers.py --quick    # 2 and 4 stages, no balance_by_time
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from planner.partition.baselines import (
    block_partition,
    deepspeed_partition_balanced,
    deepspeed_partition_uniform,
)
from planner.profile import Profile, load_profile

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "peers.json"


def _peer_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def layer_ms(profile: Profile) -> list[float]:
    """forward + backward ms per layer at the smallest profiled microbatch size."""
    m = min(profile.measurements, key=lambda x: x.microbatch_size)
    return [t.forward_ms + t.backward_ms for t in m.layers]


def bottleneck(costs: list[float], bounds: list[int]) -> float:
    """Largest stage sum for boundaries ``[0, b1, ..., n]``."""
    return max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))


def best_bottleneck(costs: list[float], k: int) -> float:
    """Exact min over contiguous k-splits of the largest stage sum (O(n^2 k) DP)."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            best[j][i] = min(max(best[j - 1][a], prefix[i] - prefix[a]) for a in range(j - 1, i))
    return best[k][n]


def _sizes_to_bounds(sizes: list[int]) -> list[int]:
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    return bounds


def _row(peer: str, ver: str | None, name: str, k: int, **kw: Any) -> dict[str, Any]:
    return {"peer": peer, "version": ver or "not installed", "profile": name, "stages": k, **kw}


def compare_profile(path: Path, stage_counts: list[int]) -> list[dict[str, Any]]:
    profile = load_profile(path)
    costs = layer_ms(profile)
    micros = [int(c * 1000) for c in costs]  # torchgpipe balances integer microseconds
    ds_ver, tg_ver = _peer_version("deepspeed"), _peer_version("torchgpipe")
    rows = []
    for k in stage_counts:
        if len(costs) < k:
            continue
        best = best_bottleneck(costs, k)
        cases: list[tuple[str, str | None, str, Any, list[int]]] = []
        if ds_ver:
            from deepspeed.runtime.utils import partition_balanced, partition_uniform

            cases.append(
                (
                    "DeepSpeed partition_uniform",
                    ds_ver,
                    "uniform",
                    partition_uniform(len(costs), k),
                    deepspeed_partition_uniform(len(costs), k),
                )
            )
            cases.append(
                (
                    "DeepSpeed partition_balanced",
                    ds_ver,
                    "balanced",
                    partition_balanced(costs, k),
                    deepspeed_partition_balanced(costs, k),
                )
            )
        if tg_ver:
            from torchgpipe.balance import balance_cost

            cases.append(
                (
                    "torchgpipe balance_cost (balance_by_time's core)",
                    tg_ver,
                    "block",
                    _sizes_to_bounds(balance_cost(micros, k)),
                    _sizes_to_bounds(block_partition(micros, k)),
                )
            )
        for peer, ver, _, call, ours in cases:  # call: the peer's boundaries
            theirs = [int(b) for b in call]
            rows.append(
                _row(
                    peer,
                    ver,
                    path.stem,
                    k,
                    same_as_pipeplan=theirs == ours,
                    peer_bottleneck_ms=round(bottleneck(costs, theirs), 3),
                    ours_bottleneck_ms=round(bottleneck(costs, ours), 3),
                    best_bottleneck_ms=round(best, 3),
                    peer_vs_best=round(bottleneck(costs, theirs) / best, 3),
                )
            )
    return rows


def balance_by_time_rows(stage_counts: list[int]) -> list[dict[str, Any]]:
    """torchgpipe's balance_by_time timing examples/mlp.py's layers on this CPU."""
    tg_ver = _peer_version("torchgpipe")
    if not tg_ver:
        return []
    import torch
    from torchgpipe.balance import balance_by_time

    sys.path.insert(0, str(ROOT / "examples"))
    import mlp  # examples/mlp.py: build_model() is an nn.Sequential

    profile = load_profile(ROOT / "profiles" / "mlp.json")
    costs = layer_ms(profile)
    # The same settings as the profile it is scored on: its thread count (the profiler pins
    # one thread) and its smallest microbatch size, which layer_ms reads.
    threads = profile.settings.threads or 1
    batch = min(m.microbatch_size for m in profile.measurements)
    rows = []
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        found = []
        for k in stage_counts:
            model = mlp.build_model()
            sample, _ = mlp.sample_batch(batch)
            found.append(
                (k, balance_by_time(k, model, sample, timeout=0.5, device=torch.device("cpu")))
            )
    finally:
        torch.set_num_threads(old_threads)
    for k, sizes in found:
        bounds = _sizes_to_bounds(list(sizes))
        best = best_bottleneck(costs, k)
        rows.append(
            _row(
                "torchgpipe balance_by_time (timed here)",
                tg_ver,
                "mlp",
                k,
                same_as_pipeplan=None,
                threads=threads,
                microbatch_size=batch,
                peer_bottleneck_ms=round(bottleneck(costs, bounds), 3),
                ours_bottleneck_ms=None,
                best_bottleneck_ms=round(best, 3),
                peer_vs_best=round(bottleneck(costs, bounds) / best, 3),
            )
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 and 4 stages, no balance_by_time")
    args = ap.parse_args()
    stage_counts = [2, 4] if args.quick else [2, 4, 8]
    rows: list[dict[str, Any]] = []
    for peer, dist_name in (("DeepSpeed", "deepspeed"), ("torchgpipe", "torchgpipe")):
        if _peer_version(dist_name) is None:
            rows.append(_row(peer, None, "-", 0, note="pip install -e '.[bench]' to compare"))
    # DeepSpeed announces its accelerator on import; keep the table readable.
    with contextlib.redirect_stdout(io.StringIO()):
        for path in sorted((ROOT / "profiles").glob("*.json")):
            rows.extend(compare_profile(path, stage_counts))
        if not args.quick:
            rows.extend(balance_by_time_rows([2, 4]))
    print(f"{'peer':<48} {'version':<14} {'profile':<16} {'k':>2} {'same':>5} {'peer/best':>9}")
    for r in rows:
        same = r.get("same_as_pipeplan")
        print(
            f"{r['peer']:<48} {r['version']:<14} {r['profile']:<16} {r['stages']:>2} "
            f"{'-' if same is None else str(same):>5} {r.get('peer_vs_best', '-')!s:>9}"
        )
    payload = {
        "benchmark": "peers",
        "note": (
            "Peers called from their own packages on the bundled profiles' forward + backward "
            "ms per layer; same_as_pipeplan compares with planner.partition.baselines; "
            "peer_vs_best = the peer split's largest stage / the best contiguous split's."
        ),
        "machine": f"{os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "peers": {
            "deepspeed": _peer_version("deepspeed"),
            "torchgpipe": _peer_version("torchgpipe"),
        },
        "rows": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

"""Clusters at scale without writing them by hand: DGX / HGX pods of N nodes.

``pipeplan topology cluster --preset dgx-h100 --nodes 16`` writes a topology file of 16 nodes
of 8 GPUs: inside each node an NVSwitch (every GPU's NVLink bandwidth, from the GPU catalog
``planner/data/gpus.yaml``), between nodes one NIC per GPU (the preset's, from the system's
datasheet) on one of two networks:

- ``rail`` (rail-optimised, as NVIDIA's SuperPODs are cabled): GPU *k* of every node on
  rail switch *k*, the rails joined by a spine with as many uplinks as nodes (non-blocking).
  Written with name ranges: one device entry and one NVSwitch link per node, one link entry
  per rail.
- ``fat-tree`` (non-blocking): every NIC on one switch, the ``hosts`` shorthand. Under the
  widest-bottleneck routing a non-blocking fat tree gives every pair the same bandwidth as
  one switch does; its tiers show only in latency, which the per-link latency covers.

Either way the file goes through the same reader and checks as a hand-written one
(``pipeplan topology check``). Device ``speed`` is relative to the profile's device: 1.0
for a profile of the preset's own GPU (``pipeplan profile --analytic --gpu h100-sxm``).

Example::

    data = cluster_dict("dgx-h100", 16, network="rail")
    topology = topology_from_dict(data, "<dgx-h100 x16>")    # 128 GPUs
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any

from planner.errors import InputError
from planner.gpus import gpu_spec
from planner.limits import MAX_TOPOLOGY_DEVICES
from planner.topology.graph import SCHEMA
from planner.units import format_bandwidth, parse_bandwidth

__all__ = [
    "MAX_NODES",
    "NETWORKS",
    "PRESETS",
    "ClusterPreset",
    "check_cluster",
    "cluster_dict",
    "cluster_yaml",
]

NETWORKS = ("rail", "fat-tree")
MAX_NODES = MAX_TOPOLOGY_DEVICES // 8
"""Nodes of 8 GPUs a topology may hold: :data:`planner.limits.MAX_TOPOLOGY_DEVICES` (8,192:
four times the 2,048 nodes of the largest published training run)."""


@dataclass(frozen=True)
class ClusterPreset:
    """One kind of node: its GPU (a catalog name), GPUs per node, NIC per GPU, source."""

    name: str
    gpu: str
    gpus_per_node: int
    nic: str  # per GPU and direction, e.g. "400 Gbit/s"
    source: str
    nvlink_latency: str = "1 us"
    network_latency: str = "2.5 us"


PRESETS: dict[str, ClusterPreset] = {
    p.name: p
    for p in (
        ClusterPreset(
            "dgx-a100",
            "a100-80gb-sxm",
            8,
            "200 Gbit/s",
            "NVIDIA DGX A100 datasheet: 8x A100 80GB SXM4 on 6 NVSwitches (600 GB/s per GPU, "
            "both directions); 8 single-port ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU",
        ),
        ClusterPreset(
            "dgx-h100",
            "h100-sxm",
            8,
            "400 Gbit/s",
            "NVIDIA DGX H100 datasheet and user guide: 8x H100 SXM5 80GB on 4 NVSwitches "
            "(900 GB/s per GPU, both directions); 8 ConnectX-7 400 Gb/s NDR InfiniBand ports "
            "for the compute fabric, one per GPU",
        ),
        ClusterPreset(
            "hgx-h200",
            "h200",
            8,
            "400 Gbit/s",
            "NVIDIA HGX H200 (nvidia.com/en-us/data-center/hgx/): 8x H200 SXM 141GB on "
            "NVSwitch (900 GB/s per GPU, both directions); one 400 Gb/s ConnectX-7 or "
            "BlueField-3 NIC per GPU, as in NVIDIA's HGX reference architecture",
        ),
        ClusterPreset(
            "dgx-b200",
            "b200",
            8,
            "400 Gbit/s",
            "NVIDIA DGX B200 datasheet: 8x B200 (1,440 GB) on 2 NVSwitches (14.4 TB/s "
            "aggregate, 1.8 TB/s per GPU both directions); 8 single-port ConnectX-7 "
            "400 Gb/s InfiniBand/Ethernet, one per GPU",
        ),
    )
}


def check_cluster(preset: str, nodes: object, network: str, speed: object) -> ClusterPreset:
    """The preset, after checking every argument (one InputError naming the flag).

    Example::

        check_cluster("dgx-h100", 16, "rail", 1.0).gpu    # 'h100-sxm'
    """
    if preset not in PRESETS:
        raise InputError(
            f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}", field="--preset"
        )
    most = MAX_TOPOLOGY_DEVICES // PRESETS[preset].gpus_per_node
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= most:
        raise InputError(
            f"expected a whole number of nodes from 1 to {most} ({MAX_TOPOLOGY_DEVICES:,} "
            f"GPUs, the most one topology holds), got {nodes!r}",
            field="--nodes",
        )
    if network not in NETWORKS:
        raise InputError(
            f"expected one of {', '.join(NETWORKS)}, got {network!r}", field="--network"
        )
    if (
        isinstance(speed, bool)
        or not isinstance(speed, int | float)
        or not (math.isfinite(speed) and speed > 0)
    ):
        raise InputError(f"expected a positive number, got {speed!r}", field="--speed")
    return PRESETS[preset]


def cluster_dict(
    preset: str, nodes: int, *, network: str = "rail", speed: float = 1.0
) -> dict[str, Any]:
    """The topology mapping (``pipeplan.topology/v1``) of ``nodes`` nodes of ``preset``.

    Example::

        cluster_dict("dgx-a100", 4, network="fat-tree")["hosts"]["count"]   # 4
    """
    spec = check_cluster(preset, nodes, network, speed)
    gpu = gpu_spec(spec.gpu)
    gibibytes = gpu.memory_bytes / 2**30
    device = {
        "memory": f"{gibibytes:g} GiB",
        "speed": float(speed),
        "kind": spec.gpu,
    }
    nvlink = {
        "bandwidth": format_bandwidth(gpu.interconnect_bytes_per_s),
        "latency": spec.nvlink_latency,
        "kind": "nvlink",
    }
    nic = {"bandwidth": spec.nic, "latency": spec.network_latency, "kind": "infiniband"}
    n = spec.gpus_per_node
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "name": f"{spec.name}-x{nodes}-{network}",
        "description": (
            f"{nodes} x {spec.name} ({nodes * n} {gpu.description}), NVSwitch inside, "
            f"{spec.nic} per GPU on a {network} network"
        ),
    }
    if network == "fat-tree":
        data["hosts"] = {
            "count": nodes,
            "name": "node",
            "devices": {"count": n, "name": "gpu", **device},
            "switch": {"name": "nvswitch", **nvlink},
            "network": {"name": "ib", "per": "device", **nic},
        }
        return data
    data["defaults"] = device
    data["devices"] = [
        {"name": f"node{i}.gpu{{0..{n - 1}}}", "host": f"node{i}"} for i in range(nodes)
    ]
    data["switches"] = [f"nvswitch{{0..{nodes - 1}}}", f"rail{{0..{n - 1}}}", "spine"]
    links: list[dict[str, Any]] = [
        {"between": [f"node{i}.gpu{{0..{n - 1}}}", f"nvswitch{i}"], **nvlink} for i in range(nodes)
    ]
    links += [{"between": [f"node{{0..{nodes - 1}}}.gpu{k}", f"rail{k}"], **nic} for k in range(n)]
    # Non-blocking: each rail has as many uplinks to the spine as it has nodes.
    links.append({"between": [f"rail{{0..{n - 1}}}", "spine"], **nic, "count": nodes})
    data["links"] = links
    parse_bandwidth(spec.nic, field="--preset")  # the preset's own figure is well formed
    return data


def cluster_yaml(data: dict[str, Any], preset: str) -> str:
    """``data`` (from :func:`cluster_dict`) as a topology file a person can read: the
    sources of its figures in a comment, top-level keys in block style, each device, link
    and host part on one line.

    Example::

        Path("t.yaml").write_text(cluster_yaml(cluster_dict("dgx-h100", 16), "dgx-h100"))
    """
    import yaml

    spec = PRESETS[preset]
    source = f"{spec.source}. GPU: {gpu_spec(spec.gpu).source}."

    def flow(value: Any) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 16)
        return text.split("\n...")[0].strip()  # a plain scalar ends its document with ...

    lines = [f"# {data['name']}: generated by `pipeplan topology cluster` (docs/topology.md)."]
    lines += [f"# {line}" for line in textwrap.wrap(f"Sources: {source}", 95)]
    for key, value in data.items():
        if isinstance(value, list) and key != "switches":
            lines.append(f"{key}:")
            lines += [f"  - {flow(item)}" for item in value]
        elif isinstance(value, dict) and key == "hosts":
            lines.append(f"{key}:")
            lines += [f"  {k}: {flow(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {flow(value)}")
    return "\n".join(lines) + "\n"

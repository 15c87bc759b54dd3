"""``pipeplan topology show|check|detect``: look at, validate and discover machine topologies.

Example::

    $ pipeplan topology show topologies/dgx1-v100.yaml --svg dgx1.svg
    $ pipeplan topology check topologies/two-node-ib.yaml
    $ pipeplan topology detect -o topologies/mine.yaml
    $ pipeplan topology detect --from-file tests/data/nvidia-smi/dgx-h100.txt
    $ pipeplan topology cluster --preset dgx-h100 --nodes 16 -o topologies/h100x16.yaml
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from planner import terminal
from planner.datafile import decode_yaml
from planner.errors import InputError
from planner.fileio import check_input_file
from planner.limits import (
    MAX_BANDWIDTH,
    MAX_BYTES,
    MAX_SPEED,
    MIN_BANDWIDTH,
    MIN_SPEED,
    check_int,
    check_name,
    check_number,
)
from planner.outputs import Outputs
from planner.terminal import printable
from planner.topology import Topology, load_topology
from planner.topology.load import topology_from_dict
from planner.units import format_bandwidth, format_bytes, format_time_ms, parse_bytes

__all__ = ["register", "topology_app"]

topology_app = typer.Typer(
    name="topology",
    help=(
        "Show, check, detect and generate machine topologies (devices, switches, links).\n\n"
        "Example: pipeplan topology show topologies/dgx1-v100.yaml"
    ),
    no_args_is_help=True,
)

_MATRIX_LIMIT = 24  # devices; larger matrices go to --json
# Devices up to which --json prints both matrices (4 million pairs, about 0.2 GB of JSON):
# a route per pair, so beyond this they are left out rather than computed for minutes.
_JSON_MATRIX_LIMIT = 2048


def _summary(topo: Topology) -> dict[str, Any]:
    spread = topo.bandwidth_range()  # linear in the links: no table of pairs
    return {
        "name": topo.name,
        "source": topo.source,
        "devices": len(topo.devices),
        "hosts": len(topo.hosts()),
        "switches": len(topo.switches),
        "links": topo.graph.number_of_edges(),
        "min_bandwidth_bytes_per_s": spread[0] if spread else None,
        "max_bandwidth_bytes_per_s": spread[1] if spread else None,
    }


def _details(topo: Topology) -> dict[str, Any]:
    names = topo.device_names()
    if len(names) > _JSON_MATRIX_LIMIT:
        return {
            **_summary(topo),
            "device_list": _device_list(topo),
            "order": names,
            "bandwidth_bytes_per_s": None,
            "latency_ms": None,
            "matrices_left_out": (
                f"{len(names):,} devices: the matrices are printed up to "
                f"{_JSON_MATRIX_LIMIT:,} (a route per device pair)"
            ),
            "normalized": topo.to_dict(),
        }
    bw = topo.bandwidth_matrix()
    lat = topo.latency_matrix()
    return {
        **_summary(topo),
        "device_list": _device_list(topo),
        "order": names,
        # JSON has no infinity: the diagonal (a device to itself) is null.
        "bandwidth_bytes_per_s": [
            [None if math.isinf(x) else float(x) for x in row] for row in bw.tolist()
        ],
        "latency_ms": lat.tolist(),
        "normalized": topo.to_dict(),
    }


def _device_list(topo: Topology) -> list[dict[str, Any]]:
    return [
        {
            "name": d.name,
            "memory_bytes": d.memory_bytes,
            "speed": d.speed,
            "host": d.host,
            "kind": d.kind,
        }
        for d in topo.devices
    ]


def _print_show(topo: Topology) -> None:
    from rich.table import Table
    from rich.text import Text

    console = terminal.console(highlight=True)  # names from the file: escaped, no markup
    s = _summary(topo)
    console.print(
        Text(printable(topo.name), style="bold"),
        f"({topo.source}): {s['devices']} devices on {s['hosts']} "
        f"host(s), {s['switches']} switches, {s['links']} links",
    )
    if topo.allreduce_efficiency != 1.0:
        console.print(f"all-reduce at {topo.allreduce_efficiency:g} of the ring model's bandwidth")
    table = Table(title="Devices")
    overheads = any(d.message_overhead_ms for d in topo.devices)
    columns = ("device", "kind", "host", "memory", "speed") + (
        ("message overhead",) if overheads else ()
    )
    for column in columns:
        left = column in ("device", "kind", "host")
        table.add_column(column, justify="left" if left else "right")
    for d in topo.devices:
        cells = [d.name, d.kind, d.host, format_bytes(d.memory_bytes), f"{d.speed:g}"]
        if overheads:
            cells.append(format_time_ms(d.message_overhead_ms))
        table.add_row(*cells)
    console.print(table)
    names = topo.device_names()
    if len(names) > _MATRIX_LIMIT:
        where = "use --json for all of it"
        if len(names) > _JSON_MATRIX_LIMIT:
            where = "ask for a pair with the Python API"
        console.print(f"(bandwidth matrix of {len(names)} devices left out; {where})")
        return
    matrix = Table(title="Bandwidth between devices, GB/s per direction (route bottleneck)")
    matrix.add_column("")
    for name in names:
        matrix.add_column(name, justify="right")
    for src in names:
        cells = []
        for dst in names:
            cells.append("-" if src == dst else f"{topo.bandwidth(src, dst) / 1e9:.4g}")
        matrix.add_row(src, *cells)
    console.print(matrix)


@topology_app.command("show")
def show(
    file: Path = typer.Argument(..., help="Topology YAML.", show_default=False),
    svg: Path | None = typer.Option(
        None, "--svg", help="Also draw the graph into this SVG file.", show_default=False
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print devices, bandwidth and latency matrices as JSON."
    ),
) -> None:
    """Print the devices, the device-to-device bandwidth matrix and, with --svg, a picture.

    Example: pipeplan topology show topologies/dgx1-v100.yaml --svg dgx1.svg
    """
    outs = Outputs([("the topology", check_input_file(file))])
    outs.file(svg, "--svg")
    topo = load_topology(file)
    if svg is not None:
        from planner.topology.svg import topology_svg  # lazy: not needed by `pipeplan --help`

        outs.write_text(svg, topology_svg(topo))
        outs.commit()
    if as_json:
        print(json.dumps(_details(topo), indent=1))
        return
    _print_show(topo)
    if svg is not None:
        print(f"wrote {svg}")


@topology_app.command("check")
def check(
    file: Path = typer.Argument(..., help="Topology YAML.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    normalized: bool = typer.Option(
        False, "--normalized", help="Print the normalised YAML (names expanded, units exact)."
    ),
) -> None:
    """Validate a topology file: exit 0 and a summary line if good, else one error line, exit 2.

    Example: pipeplan topology check topologies/two-node-ib.yaml
    """
    topo = load_topology(check_input_file(file))
    if normalized:
        print(topo.to_yaml(), end="")
        return
    s = _summary(topo)
    if as_json:
        print(json.dumps({"ok": True, **s}, indent=1))
        return
    spread = ""
    if s["min_bandwidth_bytes_per_s"] is not None:
        lo = format_bandwidth(s["min_bandwidth_bytes_per_s"])
        hi = format_bandwidth(s["max_bandwidth_bytes_per_s"])
        spread = f"; device-to-device bandwidth {lo} .. {hi}"
    print(
        f"ok: {file}: {topo.name!r}, {s['devices']} devices on {s['hosts']} host(s), "
        f"{s['switches']} switches, {s['links']} links{spread}"
    )


def _detect_flags(
    name: str, host: str, memory: str | None, speed: float, bandwidth: list[str]
) -> tuple[int | None, dict[str, float]]:
    """``topology detect``'s flags checked against the limits every topology is read with
    (docs/limits.md): the memory in bytes (None: from the GPU list) and the bandwidths."""
    from planner.topology.detect import parse_bandwidth_overrides

    check_name(name, field="--name")
    check_name(host, field="--host")
    check_number(speed, field="--speed", low=MIN_SPEED, high=MAX_SPEED)
    if not speed > 0:
        raise InputError(f"expected a positive number; got {speed}", field="--speed")
    memory_bytes = None
    if memory is not None:
        memory_bytes = parse_bytes(memory, field="--memory")
        check_int(memory_bytes, field="--memory", high=MAX_BYTES)
    overrides = parse_bandwidth_overrides(bandwidth)
    for kind, value in overrides.items():
        # NV is per NVLink: a pair of GPUs may have up to 18 of them.
        high = MAX_BANDWIDTH / 18 if kind == "NV" else MAX_BANDWIDTH
        check_number(value, field=f"--bandwidth {kind}", low=MIN_BANDWIDTH, high=high)
    return memory_bytes, overrides


@topology_app.command("detect")
def detect(
    from_file: list[Path] = typer.Option(
        [],
        "--from-file",
        help=(
            "Saved output of `nvidia-smi topo -m` and of `nvidia-smi --query-gpu=name,"
            "memory.total --format=csv` (one file holding both, or two files). "
            "Default: run nvidia-smi here."
        ),
        show_default=False,
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Write the topology YAML here (default: stdout).",
        show_default=False,
    ),
    name: str = typer.Option("detected", "--name", help="Topology name."),
    host: str = typer.Option("node0", "--host", help="Host name given to every GPU."),
    memory: str | None = typer.Option(
        None,
        "--memory",
        help="Memory per GPU, e.g. '80 GiB' (overrides the GPU list).",
        show_default=False,
    ),
    speed: float = typer.Option(
        1.0, "--speed", help="Speed of every GPU (1.0 = profiling device)."
    ),
    bandwidth: list[str] = typer.Option(
        [],
        "--bandwidth",
        help="Override a link kind's bandwidth, e.g. 'SYS=8 GB/s' or 'NV=25 GB/s' (per NVLink).",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the normalised topology as JSON."),
) -> None:
    """Build a topology from nvidia-smi (this machine's, or saved outputs via --from-file).

    Link kinds map to NCCL's default bandwidths (docs/topology.md): NV# = # NVLinks,
    PIX/PXB/PHB/NODE = the GPU's PCIe link, SYS = at most 10 GB/s between sockets.

    Example: pipeplan topology detect --from-file topo.txt --from-file gpus.csv -o mine.yaml
    """
    # lazy: `pipeplan --help` need not load the detector
    from planner.topology.detect import (
        detect_topology,
        run_nvidia_smi,
    )

    outs = Outputs([("--from-file", path) for path in from_file])
    outs.file(output, "-o")
    memory_bytes, overrides = _detect_flags(name, host, memory, speed, bandwidth)
    if from_file:
        texts = []
        for path in from_file:
            check_input_file(path, field="--from-file")
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                raise InputError("not a text file", file=str(path), field="--from-file") from None
        source = ", ".join(str(p) for p in from_file)
    else:
        texts, source = run_nvidia_smi(), "nvidia-smi"
    topo = detect_topology(
        texts,
        name=name,
        host=host,
        memory_bytes=memory_bytes,
        speed=speed,
        bandwidth=overrides,
        source=source,
    )
    if as_json:
        print(json.dumps(topo.to_dict(), indent=1))
    text = f"# Detected by `pipeplan topology detect` from {source}.\n" + topo.to_yaml()
    # What it writes, `topology check` and every command read back (a bug otherwise).
    topology_from_dict(decode_yaml(text, source="the detected topology"), "the detected topology")
    if output is not None:
        outs.write_text(output, text)
        outs.commit()
        if not as_json:
            print(
                f"wrote {output}: {len(topo.devices)} devices, {topo.graph.number_of_edges()} links"
            )
    elif not as_json:
        print(text, end="")


@topology_app.command("cluster")
def cluster(
    preset: str = typer.Option(
        ...,
        "--preset",
        help="The node: dgx-a100, dgx-h100, hgx-h200 or dgx-b200 (8 GPUs on NVSwitch, one "
        "NIC per GPU).",
        show_default=False,
    ),
    nodes: int = typer.Option(..., "--nodes", help="How many nodes.", show_default=False),
    network: str = typer.Option(
        "rail",
        "--network",
        help="rail (GPU k of every node on rail switch k, rails on a spine) or fat-tree "
        "(every NIC on one non-blocking switch).",
    ),
    speed: float = typer.Option(
        1.0, "--speed", help="Every GPU's speed relative to the profile's device."
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Write the topology YAML here (default: stdout).",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Generate a DGX / HGX cluster of N nodes as a topology file, checked as any other.

    Example: pipeplan topology cluster --preset dgx-h100 --nodes 16 -o topologies/h100x16.yaml
    """
    from planner.topology import topology_from_dict
    from planner.topology.cluster import check_cluster, cluster_dict, cluster_yaml

    check_cluster(preset, nodes, network, speed)  # before anything is built or written
    outs = Outputs([])
    outs.file(output, "-o")
    data = cluster_dict(preset, nodes, network=network, speed=speed)
    text = cluster_yaml(data, preset)
    import yaml

    topo = topology_from_dict(yaml.safe_load(text), str(output or "<cluster>"))
    if output is None and not as_json:
        print(text, end="")
        return
    if output is not None:
        outs.write_text(output, text)
        outs.commit()
    s = _summary(topo)
    if as_json:
        print(json.dumps({"ok": True, "output": None if output is None else str(output), **s}))
        return
    print(
        f"wrote {output}: {topo.name!r}, {s['devices']} devices on {s['hosts']} hosts, "
        f"{s['switches']} switches, {s['links']} links"
    )


def register(app: typer.Typer) -> None:
    """Add ``pipeplan topology ...`` to the main app."""
    app.add_typer(topology_app, name="topology")

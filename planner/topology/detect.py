"""Build a topology from ``nvidia-smi topo -m`` and ``nvidia-smi --query-gpu=name,memory.total``.

The matrix names the best connection between every pair of GPUs (``NV#``, ``PIX``, ``PXB``,
``PHB``, ``NODE``, ``SYS``; old drivers print ``SOC`` for ``SYS``). Each kind maps to a
documented default bandwidth and latency (see :data:`PCIE_KINDS`, :func:`nvlink_per_link` and
docs/topology.md); a pair joined by ``NV#`` gets ``#`` NVLinks, every other pair one link of
its PCIe kind. When every GPU shows the same ``NV#`` to every other GPU and that is more links
than a GPU of its kind has for direct peers, the GPUs hang off an NVSwitch, which becomes a
switch vertex. NIC rows and columns are ignored: ``detect`` describes one host.

Example::

    text = Path("tests/data/nvidia-smi/dgx-h100.txt").read_text()
    topo = detect_topology([text])
    topo.route("gpu0", "gpu7")     # ['gpu0', 'nvswitch0', 'gpu7']
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from planner.errors import InputError
from planner.limits import MAX_LINK_COUNT
from planner.topology import Device, Topology
from planner.units import parse_bandwidth, parse_bytes

__all__ = [
    "GpuInfo",
    "PCIE_KINDS",
    "detect_topology",
    "gpu_kind",
    "nvlink_per_link",
    "parse_gpu_query",
    "parse_topo_matrix",
    "pcie_bandwidth",
    "run_nvidia_smi",
]

# Defaults follow NCCL's own topology model (src/graph/topo.h), i.e. the bandwidths NCCL
# assumes when it plans rings: PCI_BW 12 GB/s per Gen3 x16 link (doubling per generation, as
# NCCL's dumps show PCI[24.0] on Gen4), SKL_QPI_BW 10 GB/s between sockets, and SM*_NVLINK_BW
# per NVLink. Latencies are rough per-pair figures that grow with the distance in the tree.
PCIE_KINDS: dict[str, tuple[str, float]] = {
    # kind: (description, latency in ms)
    "PIX": ("at most one PCIe bridge", 0.002),
    "PXB": ("several PCIe bridges, no host bridge", 0.0025),
    "PHB": ("through a PCIe host bridge (the CPU)", 0.003),
    "NODE": ("between host bridges of one NUMA node", 0.004),
    "SYS": ("across the socket interconnect (QPI/UPI)", 0.006),
}
NVLINK_LATENCY_MS = 0.0015
SOCKET_BW = 10e9  # NCCL SKL_QPI_BW
_ALIASES = {"SOC": "SYS"}

# (name pattern, NVLink GB/s per link per direction, NVLinks per GPU, PCIe generation)
_GPU_TABLE: list[tuple[str, float, int, int]] = [
    (r"P100", 18.0, 4, 3),
    (r"V100|TITAN V", 20.0, 6, 3),
    (r"A100|A800", 20.0, 12, 4),
    (r"H100|H800|H200|H20|GH200", 20.6, 18, 5),
    (r"B100|B200|GB200|B300", 40.1, 18, 5),
    (r"A40|A30|A10|A6000|RTX 30|A5000|A4000", 12.0, 4, 4),
    (r"T4|P40|P4\b|K80|M60|M40|RTX 20|TITAN RTX|Quadro RTX|GTX", 0.0, 0, 3),
    (r"RTX 50|RTX PRO 6000", 0.0, 0, 5),
]


@dataclass(frozen=True)
class GpuInfo:
    """One line of ``nvidia-smi --query-gpu=name,memory.total --format=csv``."""

    name: str
    memory_bytes: int


def _gpu_row(name: str) -> tuple[float, int, int]:
    for pattern, per_link, links, gen in _GPU_TABLE:
        if re.search(pattern, name):
            return per_link, links, gen
    return 20.0, 18, 4


def nvlink_per_link(gpu_name: str) -> float:
    """Bytes/s per direction of one NVLink of this GPU kind (NCCL's figures).

    Example::

        nvlink_per_link("NVIDIA H100 80GB HBM3")   # 20.6e9
    """
    per_link = _gpu_row(gpu_name)[0]
    return (per_link or 20.0) * 1e9


def pcie_bandwidth(gpu_name: str) -> float:
    """Bytes/s per direction of the GPU's x16 PCIe link: 12 GB/s at Gen3, doubling per gen.

    Example::

        pcie_bandwidth("Tesla V100-SXM2-16GB")   # 12e9
    """
    gen = _gpu_row(gpu_name)[2]
    return 12e9 * 2 ** (gen - 3)


def gpu_kind(name: str) -> str:
    """Short GPU kind from the marketing name.

    Example::

        gpu_kind("NVIDIA A100-SXM4-80GB")   # 'A100'
        gpu_kind("NVIDIA GeForce RTX 4090")  # 'RTX 4090'
    """
    text = re.sub(r"^(NVIDIA\s+)?(Tesla\s+|GeForce\s+)?", "", name.strip())
    text = text.split("-")[0]
    words = [w for w in text.split() if not re.fullmatch(r"\d+GB|HBM\w*|PCIe|SXM\d*|NVL", w)]
    return " ".join(words) or name.strip()


def _lines(text: str) -> list[str]:
    return [line.rstrip("\n") for line in text.splitlines() if not line.lstrip().startswith("#")]


def parse_topo_matrix(text: str, *, source: str = "nvidia-smi topo -m") -> list[list[str]]:
    """The GPU-by-GPU part of a ``nvidia-smi topo -m`` matrix (``X`` on the diagonal).

    Example::

        parse_topo_matrix(text)[0][1]   # 'NV12'
    """
    lines = _lines(text)
    header_at = next(
        (k for k, line in enumerate(lines) if line.split()[:1] == ["GPU0"] and line[:1].isspace()),
        None,
    )
    if header_at is None:
        raise InputError(
            "no topology matrix found; expected the output of `nvidia-smi topo -m` "
            "(a header line listing GPU0 GPU1 ...)",
            file=source,
        )
    columns = []
    for token in lines[header_at].split():
        if token in ("CPU", "NUMA", "GPU"):  # 'CPU Affinity', 'NUMA Affinity', 'GPU NUMA ID'
            break
        columns.append(token)
    gpus = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    if gpus != [f"GPU{i}" for i in range(len(gpus))] or columns[: len(gpus)] != gpus:
        raise InputError(f"unexpected matrix header {columns!r}", file=source)
    rows: dict[str, list[str]] = {}
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or tokens[0].startswith("Legend"):
            if rows:
                break
            continue
        if tokens[0] in gpus:
            cells = tokens[1 : 1 + len(gpus)]
            if len(cells) != len(gpus):
                raise InputError(
                    f"row {tokens[0]} has {len(cells)} cells; expected {len(gpus)}", file=source
                )
            rows[tokens[0]] = [_ALIASES.get(c, c) for c in cells]
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise InputError(f"matrix row {missing[0]} is missing", file=source)
    matrix = [rows[g] for g in gpus]
    for i, row in enumerate(matrix):
        for j, cell in enumerate(row):
            known = cell == "X" if i == j else (cell in PCIE_KINDS or _nv_count(cell) > 0)
            if not known:
                raise InputError(
                    f"unknown link kind {cell[:16]!r} between GPU{i} and GPU{j}; expected "
                    "X on the diagonal and NV#, PIX, PXB, PHB, NODE, SYS (or SOC) elsewhere",
                    file=source,
                )
            if cell != matrix[j][i]:
                raise InputError(
                    f"matrix is not symmetric: GPU{i}-GPU{j} is {cell} but GPU{j}-GPU{i} is "
                    f"{matrix[j][i]}",
                    file=source,
                )
    return matrix


def _nv_count(cell: str) -> int:
    """``NV#``'s number of NVLinks; 0 for another cell, or for more than
    :data:`MAX_LINK_COUNT` links (refused as an unknown kind; never a long integer read)."""
    match = re.fullmatch(r"NV(\d{1,5})", cell)
    count = int(match.group(1)) if match else 0
    return count if count <= MAX_LINK_COUNT else 0


def parse_gpu_query(text: str, *, source: str = "nvidia-smi --query-gpu") -> list[GpuInfo]:
    """GPUs from ``nvidia-smi --query-gpu=name,memory.total --format=csv`` (header optional).

    Example::

        parse_gpu_query("name, memory.total [MiB]\\nNVIDIA H100 80GB HBM3, 81559 MiB\\n")
    """
    gpus = []
    for line in _lines(text):
        if "," not in line or line.strip().startswith("name"):
            continue
        name, _, memory = line.rpartition(",")
        memory = memory.strip()
        if not re.fullmatch(r"\d+(\.\d+)?\s*[KMGT]i?B", memory):
            continue
        gpus.append(GpuInfo(name.strip(), parse_bytes(memory, file=source, field="memory.total")))
    return gpus


def _split_sources(texts: Sequence[str]) -> tuple[str, str]:
    """Find the matrix and the GPU list among the given texts (either may hold both)."""
    matrix = next((t for t in texts if re.search(r"^\s+GPU0\b", t, re.M)), "")
    query = next((t for t in texts if parse_gpu_query(t)), "")
    return matrix, query


def detect_topology(
    texts: Sequence[str],
    *,
    name: str = "detected",
    host: str = "node0",
    memory_bytes: int | None = None,
    speed: float = 1.0,
    bandwidth: Mapping[str, float] | None = None,
    source: str = "nvidia-smi",
) -> Topology:
    """Build a :class:`Topology` from saved ``nvidia-smi`` outputs.

    ``texts`` holds the ``topo -m`` output and (optionally, in the same or another text) the
    ``--query-gpu=name,memory.total --format=csv`` output. Without the latter, ``memory_bytes``
    must be given. ``bandwidth`` overrides defaults per kind (bytes/s): ``NV`` (per NVLink),
    ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``.

    Example::

        detect_topology([topo_text, query_text], bandwidth={"SYS": 8e9})
    """
    matrix_text, query_text = _split_sources(texts)
    if not matrix_text:
        raise InputError(
            "no `nvidia-smi topo -m` matrix found; expected a header line listing GPU0 GPU1 ...",
            file=source,
        )
    matrix = parse_topo_matrix(matrix_text, source=source)
    n = len(matrix)
    gpus = parse_gpu_query(query_text, source=source) if query_text else []
    if gpus and len(gpus) != n:
        raise InputError(f"the GPU list names {len(gpus)} GPUs but the matrix has {n}", file=source)
    if not gpus:
        if memory_bytes is None:
            raise InputError(
                "no GPU memory sizes: give the output of `nvidia-smi "
                "--query-gpu=name,memory.total --format=csv` too, or --memory",
                file=source,
            )
        gpus = [GpuInfo("", memory_bytes) for _ in range(n)]
    elif memory_bytes is not None:
        gpus = [GpuInfo(g.name, memory_bytes) for g in gpus]
    overrides = dict(bandwidth or {})
    unknown = set(overrides) - {"NV", *PCIE_KINDS}
    if unknown:
        raise InputError(
            f"unknown link kind {sorted(unknown)[0]!r}; expected NV, PIX, PXB, PHB, NODE or SYS",
            file=source,
            field="--bandwidth",
        )
    devices = [
        Device(f"gpu{i}", g.memory_bytes, speed, host, gpu_kind(g.name) if g.name else "")
        for i, g in enumerate(gpus)
    ]
    graph = nx.Graph()
    for d in devices:
        graph.add_node(d.name)
    first_name = gpus[0].name
    per_link = overrides.get("NV", nvlink_per_link(first_name))
    counts = {_nv_count(matrix[i][j]) for i in range(n) for j in range(n) if i != j}
    links_per_gpu = _gpu_row(first_name)[1] or 18
    k = max(counts) if counts else 0
    switched = n > 2 and counts == {k} and k > 0 and k * (n - 1) > links_per_gpu
    if switched:
        # Every GPU reaches every other through all its k links: an NVSwitch fabric.
        graph.add_node("nvswitch0", kind="nvswitch")
        for d in devices:
            graph.add_edge(
                d.name,
                "nvswitch0",
                bandwidth=k * per_link,
                count=k,
                latency_ms=NVLINK_LATENCY_MS / 2,
                kind="nvlink",
            )
    for i in range(n):
        for j in range(i + 1, n):
            cell = matrix[i][j]
            count = _nv_count(cell)
            if count and switched:
                continue
            if count:
                bw, lat, kind, links = count * per_link, NVLINK_LATENCY_MS, "nvlink", count
            else:
                pcie = overrides.get(cell, pcie_bandwidth(gpus[i].name or first_name))
                if cell == "SYS" and "SYS" not in overrides:
                    pcie = min(pcie, SOCKET_BW)
                bw, lat, kind, links = pcie, PCIE_KINDS[cell][1], cell.lower(), 1
            graph.add_edge(
                devices[i].name,
                devices[j].name,
                bandwidth=bw,
                count=links,
                latency_ms=lat,
                kind=kind,
            )
    return Topology(name, graph, devices, source=source)


def run_nvidia_smi() -> list[str]:
    """Run ``nvidia-smi topo -m`` and the GPU query on this machine; their outputs.

    Example::

        detect_topology(run_nvidia_smi())
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise InputError(
            "nvidia-smi not found on this machine; run `pipeplan topology detect` where the "
            "GPUs are, or pass saved outputs with --from-file",
            field="nvidia-smi",
        )
    outputs = []
    for args in (["topo", "-m"], ["--query-gpu=name,memory.total", "--format=csv"]):
        try:
            done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InputError(f"could not run nvidia-smi {' '.join(args)}: {exc}") from None
        if done.returncode != 0:
            first = (done.stderr or done.stdout).strip().splitlines()[:1]
            raise InputError(
                f"nvidia-smi {' '.join(args)} failed ({done.returncode}): "
                f"{first[0] if first else 'no output'}"
            )
        outputs.append(done.stdout)
    return outputs


def parse_bandwidth_overrides(values: Sequence[str]) -> dict[str, float]:
    """``["SYS=8 GB/s", "NV=25GB/s"]`` -> ``{"SYS": 8e9, "NV": 25e9}`` for ``--bandwidth``.

    Example::

        parse_bandwidth_overrides(["PIX=24 GB/s"])
    """
    out = {}
    for value in values:
        kind, sep, amount = value.partition("=")
        if not sep:
            raise InputError(
                f"expected KIND=BANDWIDTH such as 'SYS=8 GB/s'; got {value!r}", field="--bandwidth"
            )
        out[kind.strip().upper()] = parse_bandwidth(amount.strip(), field=f"--bandwidth {kind}")
    return out

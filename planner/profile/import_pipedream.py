"""Read PipeDream's profile format (``graph.txt``) into a :class:`~planner.profile.Profile`.

PipeDream (msr-fiddle/pipedream, MIT licence) stores a profiled model as a DAG, one node per
line and then one edge per line::

    node4 -- Embedding(32320, 1024, padding_idx=0) -- forward_compute_time=0.073, \
backward_compute_time=6.949, activation_size=6291456.0, parameter_size=132382720.000
    \tnode1 -- node4

Times are milliseconds for one whole minibatch, sizes are bytes; ``activation_size`` may be
a list (``[6291456.0; 131072.0]``) when a node has several outputs. Partitioned graphs written
by PipeDream's optimizer add `` -- stage_id=N`` to node lines; that is kept too.

The conversion keeps every node and edge: layers follow a deterministic topological order
(Kahn's algorithm, ties broken by node number) and ``meta["pipedream"]["nodes"][i]`` holds the
original line's data for layer ``i``. See docs/import.md for the choices made where PipeDream
records less than our format (the backward split, optimizer state, the microbatch size).

Example::

    profile = import_pipedream("graph.txt", microbatch_size=128)
    profile.save("profiles/pipedream-vgg16.json")
"""

from __future__ import annotations

import heapq
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.fileio import sha256_file
from planner.limits import (
    MAX_BYTES,
    MAX_MICROBATCH_SIZE,
    MAX_NAME_CHARS,
    MAX_TIME_MS,
    check_int,
    check_name,
)
from planner.optimizers import STATE_FACTORS, check_optimizer
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.terminal import is_printable

__all__ = [
    "KNOWN_PROFILES",
    "PipeDreamNode",
    "PipeDreamGraph",
    "import_pipedream",
    "parse_pipedream",
    "topological_order",
]

DEFAULT_DEVICE = "unknown: published PipeDream profile"

# Optimizer state per parameter byte (fp32 state for fp32 parameters).

# Profiles published in the PipeDream repository whose minibatch size we could establish, by
# the SHA-256 of the file. vgg16: profiler/image_classification/README.md runs `-b 128`, and
# the Input node's activation_size, 77070336 = 128 x 3x224x224 x 4 bytes, agrees. gnmt: the
# translation README shows --batch-size 64, but the file's LSTM hidden states are
# 131072 = 32 x 1024 x 4 bytes (and the fp32 parameter sizes rule out fp16 tensors), so the
# file was measured at 32 sequences per minibatch.
KNOWN_PROFILES: dict[str, tuple[str, int, str]] = {
    "3e914ff5290644c6b1c871002d278e57fcc486c22ac07283480b7779f28e5b08": (
        "vgg16",
        128,
        "PipeDream profiler/image_classification README (-b 128); input node 128x3x224x224 fp32",
    ),
    "2c5b8415ed45b34b7530d051023de388a7e0dbc02cec38f9e43610f29211dc5a": (
        "gnmt",
        32,
        "LSTM hidden-state activation sizes (131072 B = 32 x 1024 x fp32) in the file",
    ),
}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_NODE_LINE = re.compile(
    r"^(?P<id>\S+) -- (?P<desc>.*) -- (?P<meta>forward_compute_time=.*?)"
    r"(?: -- stage_id=(?P<stage>\d+))?\s*$"
)
_METADATA = re.compile(
    rf"^forward_compute_time=(?P<fwd>{_NUMBER}),\s*backward_compute_time=(?P<bwd>{_NUMBER}),\s*"
    rf"activation_size=(?P<act>{_NUMBER}|\[\s*{_NUMBER}(?:\s*;\s*{_NUMBER})*\s*\]),\s*"
    rf"parameter_size=(?P<param>{_NUMBER})$"
)
_EDGE_LINE = re.compile(r"^(?P<src>\S+) -- (?P<dst>\S+)$")
_NODE_FORMAT = (
    "'nodeN -- <description> -- forward_compute_time=<ms>, backward_compute_time=<ms>, "
    "activation_size=<bytes or [b1; b2; ...]>, parameter_size=<bytes>'"
)


@dataclass
class PipeDreamNode:
    """One node line of a PipeDream graph, exactly as written."""

    node_id: str
    description: str
    forward_compute_time: float
    backward_compute_time: float
    activation_size: float | list[float]
    parameter_size: float
    line: int
    stage_id: int | None = None

    @property
    def activation_bytes(self) -> int:
        """All outputs together, as PipeDream's own ``Node.from_str`` sums a list."""
        sizes = self.activation_size
        total = sum(sizes) if isinstance(sizes, list) else sizes
        return int(round(total))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.node_id,
            "description": self.description,
            "forward_compute_time": self.forward_compute_time,
            "backward_compute_time": self.backward_compute_time,
            "activation_size": self.activation_size,
            "parameter_size": self.parameter_size,
            "line": self.line,
        }
        if self.stage_id is not None:
            out["stage_id"] = self.stage_id
        return out


@dataclass
class PipeDreamGraph:
    """A parsed ``graph.txt``: nodes in file order and edges ``(src, dst)`` in file order."""

    nodes: list[PipeDreamNode]
    edges: list[tuple[str, str]]
    source: str


def parse_pipedream(path: str | os.PathLike[str]) -> PipeDreamGraph:
    """Parse a PipeDream ``graph.txt``; any problem is an InputError naming the line.

    Example::

        graph = parse_pipedream("profiles/vgg16/graph.txt")
        len(graph.nodes), len(graph.edges)
    """
    source = str(path)
    file = Path(path)
    if not file.exists():
        raise InputError("file does not exist", file=source)
    if not file.is_file():
        raise InputError("is not a file; expected a PipeDream graph.txt", file=source)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text; expected a PipeDream graph.txt", file=source) from None
    nodes: list[PipeDreamNode] = []
    edges: list[tuple[str, str, int]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        if not nodes and _NODE_LINE.match(line.strip()) is None:
            # Not (yet) a PipeDream graph: the file may be anything (a key file, a config),
            # so the message names the line and what was expected, never its content.
            raise InputError(
                f"not a PipeDream graph.txt: expected the first line to be a node line "
                f"{_NODE_FORMAT} (the line is not shown)",
                file=source,
                field=f"line {number}",
            )
        if line[0].isspace():  # PipeDream writes edges as "\tnodeA -- nodeB"
            edges.append(_parse_edge(line.strip(), number, source))
        else:
            nodes.append(_parse_node(line.strip(), number, source))
    if not nodes:
        raise InputError(f"no node lines found; expected lines like {_NODE_FORMAT}", file=source)
    declared: dict[str, PipeDreamNode] = {}
    for node in nodes:
        if node.node_id in declared:
            first = declared[node.node_id].line
            raise InputError(
                f"node {node.node_id!r} is declared again (first on line {first}); "
                "expected each node id once",
                file=source,
                field=f"line {node.line}",
            )
        declared[node.node_id] = node
    for src, dst, number in edges:
        for end in (src, dst):
            if end not in declared:
                raise InputError(
                    f"edge names {end!r}, which no node line declares; expected an edge "
                    "between two declared nodes",
                    file=source,
                    field=f"line {number}",
                )
    return PipeDreamGraph(nodes, [(s, d) for s, d, _ in edges], source)


def _parse_node(line: str, number: int, source: str) -> PipeDreamNode:
    where = f"line {number}"
    match = _NODE_LINE.match(line)
    if match is None:
        raise InputError(
            f"expected a node line {_NODE_FORMAT} or a tab-indented edge 'nodeA -- nodeB', "
            f"got {_clip(line)!r}",
            file=source,
            field=where,
        )
    meta = _METADATA.match(match["meta"].strip())
    if meta is None:
        raise InputError(
            f"expected 'forward_compute_time=<ms>, backward_compute_time=<ms>, "
            f"activation_size=<bytes or [b1; b2; ...]>, parameter_size=<bytes>' after the "
            f"description, got {_clip(match['meta'])!r}",
            file=source,
            field=where,
        )
    act_text = meta["act"]
    activation: float | list[float]
    if act_text.startswith("["):
        activation = [float(x) for x in act_text.strip("[] ").split(";")]
    else:
        activation = float(act_text)
    node = PipeDreamNode(
        node_id=match["id"],
        description=match["desc"],
        forward_compute_time=float(meta["fwd"]),
        backward_compute_time=float(meta["bwd"]),
        activation_size=activation,
        parameter_size=float(meta["param"]),
        line=number,
        stage_id=int(match["stage"][:7]) if match["stage"] is not None else None,
    )
    values = [node.forward_compute_time, node.backward_compute_time, node.parameter_size]
    values += activation if isinstance(activation, list) else [activation]
    if any(v < 0 for v in values):
        raise InputError(
            f"expected non-negative times and sizes, got {_clip(match['meta'])!r}",
            file=source,
            field=where,
        )
    _check_limits(node, match, source, where)
    return node


def _check_limits(node: PipeDreamNode, match: re.Match[str], source: str, where: str) -> None:
    """Times up to :data:`MAX_TIME_MS`, sizes up to :data:`MAX_BYTES` (a total over a
    list too), a stage id of at most 6 digits, an id and description without control
    characters: what the profile reader would refuse, refused with the line."""
    act = node.activation_size
    total = sum(act) if isinstance(act, list) else act
    times = (node.forward_compute_time, node.backward_compute_time)
    if not all(t <= MAX_TIME_MS for t in times) or max(total, node.parameter_size) > MAX_BYTES:
        raise InputError(
            f"expected times up to {MAX_TIME_MS:g} ms and sizes up to 2**60 bytes (1 EiB), "
            f"got {_clip(match['meta'])!r}",
            file=source,
            field=where,
        )
    if match["stage"] is not None and len(match["stage"]) > 6:
        raise InputError("expected a stage_id of at most 6 digits", file=source, field=where)
    for text in (node.node_id, node.description):
        if len(text) > MAX_NAME_CHARS or not is_printable(text):
            raise InputError(
                f"expected a node id and description of at most {MAX_NAME_CHARS} printable "
                "characters (no control characters)",
                file=source,
                field=where,
            )


def _parse_edge(line: str, number: int, source: str) -> tuple[str, str, int]:
    match = _EDGE_LINE.match(line)
    if match is None:
        raise InputError(
            f"expected a tab-indented edge 'nodeA -- nodeB', got {_clip(line)!r}",
            file=source,
            field=f"line {number}",
        )
    return match["src"], match["dst"], number


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _id_key(node_id: str) -> tuple[str, int, str]:
    # "node10" after "node9": compare the trailing number as a number.
    match = re.match(r"^(.*?)(\d+)$", node_id)
    if match is None:
        return (node_id, -1, node_id)
    return (match[1], int(match[2]), node_id)


def topological_order(graph: PipeDreamGraph) -> list[str]:
    """Kahn's algorithm, always taking the ready node with the smallest number.

    A cycle is an InputError that names the nodes on it.

    Example::

        order = topological_order(parse_pipedream("graph.txt"))   # ["node1", "node2", ...]
    """
    ids = [n.node_id for n in graph.nodes]
    successors: dict[str, list[str]] = {i: [] for i in ids}
    indegree = dict.fromkeys(ids, 0)
    for src, dst in set(graph.edges):
        successors[src].append(dst)
        indegree[dst] += 1
    ready = [_id_key(i) for i in ids if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        node = heapq.heappop(ready)[2]
        order.append(node)
        for succ in successors[node]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                heapq.heappush(ready, _id_key(succ))
    if len(order) < len(ids):
        cycle = _find_cycle({i for i in ids if indegree[i] > 0}, successors)
        raise InputError(
            f"the graph has a cycle ({' -> '.join(cycle)}); expected a DAG",
            file=graph.source,
            field="edges",
        )
    return order


def _find_cycle(left: set[str], successors: dict[str, list[str]]) -> list[str]:
    # Each node Kahn's algorithm could not order still has an unordered predecessor, so
    # walking predecessors inside `left` must come back to a node already on the walk.
    predecessors: dict[str, list[str]] = {n: [] for n in left}
    for src in left:
        for dst in successors[src]:
            if dst in left:
                predecessors[dst].append(src)
    node = min(left, key=_id_key)
    walk, seen = [node], {node: 0}
    while True:
        node = min(predecessors[node], key=_id_key)
        if node in seen:
            cycle = [*walk[seen[node] :], node]
            return cycle[::-1]
        seen[node] = len(walk)
        walk.append(node)


def _short_name(node: PipeDreamNode, limit: int = 48) -> str:
    """``node7:Conv2d(64, 128, ...)``: the class and as many leading arguments as fit."""
    desc = " ".join(node.description.split())
    head, paren, rest = desc.partition("(")
    if len(desc) <= limit or not paren or not rest.endswith(")"):
        short = desc if len(desc) <= limit else desc[: limit - 3] + "..."
        return f"{node.node_id}:{short}"
    if "): " in rest:  # a nested module's repr: its children say little in a name
        return f"{node.node_id}:{head}(...)"
    kept: list[str] = []
    for arg in _top_level_args(rest[:-1]):
        if len(head) + len(", ".join([*kept, arg])) + 7 > limit:
            break
        kept.append(arg)
    return f"{node.node_id}:{head}({', '.join([*kept, '...'])})"


def _top_level_args(text: str) -> list[str]:
    args, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    args.append(text[start:].strip())
    return args


def _split_backward(node: PipeDreamNode) -> tuple[float, float]:
    # PipeDream times backward as a whole. With no parameters there is no weight gradient,
    # so all of it is input gradient; otherwise it is split evenly (documented in import.md).
    total = node.backward_compute_time
    if node.parameter_size == 0:
        return total, 0.0
    return total / 2, total / 2


def import_pipedream(
    path: str | os.PathLike[str],
    *,
    microbatch_size: int | None = None,
    optimizer: str = "adam",
    device_name: str = DEFAULT_DEVICE,
    model: str | None = None,
) -> Profile:
    """Convert a PipeDream ``graph.txt`` into a :class:`Profile` (nothing is written).

    ``microbatch_size`` is the minibatch size the file was measured at (nothing is rescaled);
    by default it is taken from :data:`KNOWN_PROFILES` for the files published with
    PipeDream, else 1. ``optimizer`` picks the optimizer state per parameter byte
    (:data:`planner.optimizers.STATE_FACTORS`).

    Example::

        profile = import_pipedream("shared/data/pipedream/gnmt/graph.txt")
        profile.measurements[0].microbatch_size    # 32
    """
    check_optimizer(optimizer, field="--optimizer")
    if microbatch_size is not None and microbatch_size <= 0:
        raise InputError(
            f"expected a positive integer, got {microbatch_size}", field="--microbatch-size"
        )
    if microbatch_size is not None:
        check_int(microbatch_size, field="--microbatch-size", high=MAX_MICROBATCH_SIZE)
    check_name(device_name, field="--device-name")
    if model is not None:
        check_name(model, field="--model")
    graph = parse_pipedream(path)
    order = topological_order(graph)
    sha = sha256_file(path)
    known = KNOWN_PROFILES.get(sha)
    if microbatch_size is not None:
        size, size_source = microbatch_size, "given with --microbatch-size"
    elif known is not None:
        size, size_source = known[1], known[2]
    else:
        size, size_source = 1, "unknown; default 1 (pass --microbatch-size)"
    name = model or (known[0] if known else None) or Path(path).resolve().parent.name or "model"

    by_id = {n.node_id: n for n in graph.nodes}
    index = {node_id: i for i, node_id in enumerate(order)}
    nodes = [by_id[i] for i in order]
    factor = STATE_FACTORS[optimizer]
    layers = []
    timings = []
    for node in nodes:
        param_bytes = int(round(node.parameter_size))
        layers.append(
            Layer(
                name=_short_name(node),
                param_count=int(round(param_bytes / 4)),  # PipeDream profiles are fp32
                param_bytes=param_bytes,
                optimizer_state_bytes=factor * param_bytes,
            )
        )
        bwd_input, bwd_weight = _split_backward(node)
        timings.append(
            LayerTiming(
                forward_ms=node.forward_compute_time,
                backward_ms=node.backward_compute_time,
                backward_input_ms=bwd_input,
                backward_weight_ms=bwd_weight,
                output_bytes=node.activation_bytes,
                saved_bytes=node.activation_bytes,  # what PipeDream stashes per minibatch
            )
        )
    edges = sorted({(index[s], index[d]) for s, d in graph.edges})
    inputs = [i for i, n in enumerate(nodes) if n.description.startswith("Input")]
    input_bytes = sum(nodes[i].activation_bytes for i in inputs)
    meta: dict[str, Any] = {
        "origin": f"imported from PipeDream profile {path} (msr-fiddle/pipedream graph.txt)",
        "pipedream": {
            "file": str(path),
            "sha256": sha,
            "microbatch_size_source": size_source,
            "backward_split": "parameterless layers: all input gradient; others: half/half",
            "param_count": "parameter_size / 4 (fp32)",
            "input_layers": inputs,
            "nodes": [n.to_dict() for n in nodes],
            "edges": [list(e) for e in graph.edges],
        },
    }
    return Profile(
        model=name,
        layers=layers,
        measurements=[Measurement(size, input_bytes, timings)],
        edges=edges,
        source_sha256=None,
        device=device_name,
        dtype="float32",
        torch_version="unknown",
        optimizer=optimizer,
        meta=meta,
    )

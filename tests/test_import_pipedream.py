"""`pipeplan import pipedream`: PipeDream's published profiles converted without loss."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner.cli import main
from planner.errors import InputError
from planner.profile import load_profile
from planner.profile.import_pipedream import import_pipedream, parse_pipedream

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared/data/pipedream"
MODELS = ["vgg16", "gnmt"]

pytestmark = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"PipeDream's published profiles are not at {SHARED}"
)


def _graph(model: str) -> Path:
    return SHARED / model / "graph.txt"


def _raw_lines(path: Path) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """A deliberately naive reading of the file, independent of the importer's regexes."""
    nodes: dict[str, list[str]] = {}
    edges = []
    for line in path.read_text().splitlines():
        if line.startswith("\t"):
            a, b = line.strip().split(" -- ")
            edges.append((a, b))
        elif line.strip():
            parts = line.split(" -- ")
            nodes[parts[0]] = [" -- ".join(parts[1:-1]), parts[-1]]
    return nodes, edges


def _numbers(metadata: str) -> dict[str, list[float]]:
    out = {}
    for key, value in re.findall(r"(\w+)=(\[[^\]]*\]|[^,]+)", metadata):
        out[key] = [float(x) for x in value.strip("[]").split(";")]
    return out


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.mark.parametrize("model", MODELS)
def test_every_node_edge_time_and_size_is_kept(model: str) -> None:
    profile = import_pipedream(_graph(model))
    nodes, edges = _raw_lines(_graph(model))
    meta_nodes = profile.meta["pipedream"]["nodes"]
    assert profile.num_layers == len(nodes) == len(meta_nodes)
    index = {}
    timings = profile.measurements[0].layers
    for i, (layer, timing, meta) in enumerate(
        zip(profile.layers, timings, meta_nodes, strict=True)
    ):
        node_id = meta["id"]
        index[node_id] = i
        description, metadata = nodes[node_id]
        values = _numbers(metadata)
        assert layer.name.startswith(f"{node_id}:")
        assert meta["description"] == description
        assert timing.forward_ms == values["forward_compute_time"][0]
        assert timing.backward_ms == values["backward_compute_time"][0]
        assert timing.backward_input_ms + timing.backward_weight_ms == timing.backward_ms
        assert timing.output_bytes == timing.saved_bytes == sum(values["activation_size"])
        assert layer.param_bytes == values["parameter_size"][0]
        assert layer.param_count * 4 == layer.param_bytes
        assert layer.optimizer_state_bytes == 2 * layer.param_bytes  # adam by default
        sizes = meta["activation_size"]
        assert (sizes if isinstance(sizes, list) else [sizes]) == values["activation_size"]
    assert sorted(profile.edge_list()) == sorted({(index[a], index[b]) for a, b in edges})
    assert [tuple(e) for e in profile.meta["pipedream"]["edges"]] == edges
    assert all(i < j for i, j in profile.edge_list())  # a topological order


def test_vgg16_matches_known_facts() -> None:
    profile = import_pipedream(_graph("vgg16"))
    # VGG-16 has 138,357,544 parameters; PipeDream stored them as fp32 bytes.
    assert sum(layer.param_count for layer in profile.layers) == 138_357_544
    # The file lists nodes out of order; Kahn's algorithm with node-number ties restores it.
    assert [layer.name.split(":")[0] for layer in profile.layers] == [
        f"node{i}" for i in range(1, 42)
    ]
    m = profile.measurements[0]
    assert m.microbatch_size == 128
    assert m.input_bytes == 128 * 3 * 224 * 224 * 4
    assert profile.model == "vgg16"
    assert profile.device == "unknown: published PipeDream profile"


def test_gnmt_dag_and_list_activations() -> None:
    profile = import_pipedream(_graph("gnmt"))
    names = [layer.name for layer in profile.layers]
    assert names[:5] == [
        "node1:Input0",
        "node2:Input1",
        "node3:Input2",
        "node4:Embedding(32320, 1024, padding_idx=0)",
        "node5:EmuBidirLSTM(...)",
    ]
    lstm = names.index("node7:LSTM(2048, 1024)")
    assert profile.measurements[0].layers[lstm].output_bytes == 6291456 + 131072 + 131072
    assert profile.measurements[0].microbatch_size == 32
    assert not profile.is_chain
    assert profile.meta["pipedream"]["input_layers"] == [0, 1, 2]
    # Parameterless layers put all backward into the input gradient.
    dropout = names.index("node6:Dropout(p=0.2)")
    t = profile.measurements[0].layers[dropout]
    assert (t.backward_input_ms, t.backward_weight_ms) == (t.backward_ms, 0.0)


def test_options_override_defaults(tmp_path: Path) -> None:
    profile = import_pipedream(
        _graph("gnmt"), microbatch_size=64, optimizer="sgd", device_name="V100", model="x"
    )
    assert profile.measurements[0].microbatch_size == 64
    assert all(layer.optimizer_state_bytes == 0 for layer in profile.layers)
    assert (profile.device, profile.model, profile.optimizer) == ("V100", "x", "sgd")
    copy = tmp_path / "mine" / "graph.txt"
    copy.parent.mkdir()
    copy.write_text(_graph("vgg16").read_text() + "\n")  # another file: size unknown
    unknown = import_pipedream(copy)
    assert unknown.measurements[0].microbatch_size == 1
    assert "unknown" in unknown.meta["pipedream"]["microbatch_size_source"]
    assert unknown.model == "mine"


@pytest.mark.parametrize("model", MODELS)
def test_committed_profiles_are_what_the_command_writes(model: str, tmp_path: Path) -> None:
    committed = load_profile(REPO / "profiles" / f"pipedream-{model}.json").to_dict()
    fresh = import_pipedream(_graph(model)).to_dict()
    for data in (committed, fresh):
        del data["meta"]["origin"], data["meta"]["pipedream"]["file"]
    assert committed == fresh


def test_cli_writes_a_loadable_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "gnmt.json"
    code, out, _ = _run(
        ["import", "pipedream", str(_graph("gnmt")), "-o", str(target), "--json"], capsys
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["layers"] == 48 and summary["edges"] == 58
    assert load_profile(target).num_layers == 48


def _bad(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "graph.txt"
    path.write_text(text)
    return path


GOOD = (
    "node1 -- Input -- forward_compute_time=1.0, backward_compute_time=0.0, "
    "activation_size=4.0, parameter_size=0.0"
)
NEXT = (
    "node2 -- Linear(2, 2) -- forward_compute_time=1.0, backward_compute_time=2.0, "
    "activation_size=[4.0; 8.0], parameter_size=24.0"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"{GOOD}\n{NEXT}\nnode3 -- Foo -- forward_compute_time=1.0\n",
            r"line 3: expected 'forward_compute_time",
        ),
        (f"{GOOD}\nthis is not a node\n", r"line 2: expected a node line"),
        (
            f"{GOOD}\n{NEXT}\n\tnode1 -- node9\n",
            r"line 3: edge names 'node9', which no node line declares",
        ),
        (
            f"{GOOD}\n{NEXT}\n\tnode1 -- node2\n\tnode2 -- node1\n",
            r"edges: the graph has a cycle \(node1 -> node2 -> node1\)",
        ),
        (f"{GOOD}\n{GOOD}\n", r"line 2: node 'node1' is declared again \(first on line 1\)"),
        (f"{GOOD}\n\tnode1 - node1\n", r"line 2: expected a tab-indented edge"),
        ("\n\n", r"no node lines found"),
        (GOOD.replace("4.0", "-4.0"), r"line 1: expected non-negative"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    graph = _bad(tmp_path, text)
    target = tmp_path / "out.json"
    code, out, err = _run(["import", "pipedream", str(graph), "-o", str(target)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(graph) in err
    assert re.search(expected, err), err
    assert not target.exists() and list(tmp_path.iterdir()) == [graph]


def test_missing_file_and_missing_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        ["import", "pipedream", str(tmp_path / "nope.txt"), "-o", str(tmp_path / "o.json")], capsys
    )
    assert code == 2 and "nope.txt: file does not exist" in err
    code, _, err = _run(
        ["import", "pipedream", str(_graph("vgg16")), "-o", str(tmp_path / "no" / "o.json")], capsys
    )
    assert code == 2 and "does not exist" in err and "-o" in err


def test_valid_small_graph_round_trips(tmp_path: Path) -> None:
    graph = _bad(tmp_path, f"{NEXT}\n{GOOD}\n\tnode1 -- node2\n")
    parsed = parse_pipedream(graph)
    assert [n.node_id for n in parsed.nodes] == ["node2", "node1"]
    profile = import_pipedream(graph, microbatch_size=4)
    assert [layer.name for layer in profile.layers] == ["node1:Input", "node2:Linear(2, 2)"]
    t = profile.measurements[0].layers[1]
    assert (t.backward_input_ms, t.backward_weight_ms, t.output_bytes) == (1.0, 1.0, 12)
    assert profile.layers[1].param_count == 6
    with pytest.raises(InputError, match="--optimizer"):
        import_pipedream(graph, optimizer="lamb")

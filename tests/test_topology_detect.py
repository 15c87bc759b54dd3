"""``topology detect``: real ``nvidia-smi topo -m`` outputs of several machine kinds."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.cli import main
from planner.errors import InputError
from planner.topology import Topology, load_topology, topology_from_dict
from planner.topology.detect import (
    detect_topology,
    gpu_kind,
    nvlink_per_link,
    parse_gpu_query,
    parse_topo_matrix,
    pcie_bandwidth,
)

DATA = Path(__file__).resolve().parent / "data" / "nvidia-smi"
GB = 1e9


def _detect(fixture: str, **kw: Any) -> Topology:
    texts = [(DATA / fixture).read_text()]
    csv = (DATA / fixture).with_suffix(".csv")
    if csv.exists():
        texts.append(csv.read_text())
    return detect_topology(texts, source=fixture, **kw)


def test_every_fixture_names_its_source() -> None:
    for path in DATA.glob("*.txt"):
        assert "https://github.com/" in path.read_text().split("\n\n")[0], path.name
    assert (DATA / "README.md").is_file()


def test_dgx_h100_nv18_becomes_an_nvswitch() -> None:
    topo = _detect("dgx-h100.txt")
    assert topo.switches == ["nvswitch0"]
    assert topo.device("gpu0").kind == "H100"
    assert topo.device("gpu0").memory_bytes == 81559 * 2**20
    for u, v in itertools.combinations(topo.device_names(), 2):
        assert topo.route(u, v) == [u, "nvswitch0", v]
        assert topo.bandwidth(u, v) == pytest.approx(18 * 20.6 * GB)


def test_dgx_a100_nv12_ignores_nic_columns() -> None:
    topo = _detect("dgx-a100.txt")
    assert len(topo.devices) == 8 and topo.switches == ["nvswitch0"]
    assert topo.device("gpu7").memory_bytes == 40960 * 2**20
    assert topo.bandwidth("gpu0", "gpu7") == pytest.approx(12 * 20 * GB)


def test_dgx1_keeps_the_uneven_direct_links() -> None:
    topo = _detect("dgx1-v100.txt")
    assert topo.switches == []  # 6 links per V100 cannot reach 7 peers: direct links
    assert topo.link_bandwidth("gpu0", "gpu3") == 2 * 20 * GB
    assert topo.link_bandwidth("gpu0", "gpu1") == 20 * GB
    assert topo.graph.edges["gpu0", "gpu5"]["kind"] == "sys"
    assert topo.link_bandwidth("gpu0", "gpu5") == 10 * GB  # SYS: NCCL's QPI figure
    # Same structure as the hand-written preset under the relay-anywhere rule: NV2 ring,
    # non-neighbours via NVLink.
    path = Path(__file__).resolve().parent.parent / "topologies/dgx1-v100.yaml"
    preset = topology_from_dict({**yaml.safe_load(path.read_text()), "relay": "all"}, str(path))
    for u, v in itertools.combinations(topo.device_names(), 2):
        assert topo.route(u, v) == preset.route(u, v)


def test_pcie_box_with_pix_pxb_sys_needs_memory() -> None:
    with pytest.raises(InputError, match="--memory"):
        _detect("pcie-pix-pxb-sys.txt")
    topo = _detect("pcie-pix-pxb-sys.txt", memory_bytes=12 * 2**30)
    assert topo.graph.edges["gpu0", "gpu1"]["kind"] == "pix"
    assert topo.graph.edges["gpu0", "gpu2"]["kind"] == "pxb"
    assert topo.graph.edges["gpu0", "gpu4"]["kind"] == "sys"
    # Unknown GPU: PCIe Gen4 default 24 GB/s; PIX and PXB equal in bandwidth, PXB slower.
    assert topo.bandwidth("gpu0", "gpu1") == topo.bandwidth("gpu0", "gpu2") == 24 * GB
    assert topo.latency_ms("gpu0", "gpu1") < topo.latency_ms("gpu0", "gpu2")
    assert topo.bandwidth("gpu0", "gpu4") == 10 * GB


def test_old_pcie_box_with_phb() -> None:
    topo = _detect("pcie-pix-phb-sys.txt")
    assert topo.device("gpu0").kind == "P100"
    assert topo.graph.edges["gpu0", "gpu2"]["kind"] == "phb"
    assert topo.bandwidth("gpu0", "gpu1") == 12 * GB  # Gen3 x16, NCCL's PCI_BW


def test_two_socket_node_and_sys_with_separate_gpu_list() -> None:
    topo = _detect("two-socket-node-sys.txt")
    assert [d.kind for d in topo.devices] == ["RTX 4090"] * 2 + ["RTX 3090"] * 3
    assert topo.graph.edges["gpu1", "gpu3"]["kind"] == "node"
    assert topo.graph.edges["gpu1", "gpu2"]["kind"] == "phb"
    assert topo.latency_ms("gpu1", "gpu2") < topo.latency_ms("gpu1", "gpu3")
    assert topo.bandwidth("gpu0", "gpu1") == 10 * GB


def test_overrides_and_names() -> None:
    topo = _detect(
        "dgx1-v100.txt", bandwidth={"NV": 25 * GB, "SYS": 8 * GB}, name="mine", host="box3"
    )
    assert topo.name == "mine" and topo.device("gpu4").host == "box3"
    assert topo.link_bandwidth("gpu0", "gpu3") == 50 * GB
    assert topo.link_bandwidth("gpu0", "gpu5") == 8 * GB
    with pytest.raises(InputError, match="unknown link kind 'QPI'"):
        _detect("dgx1-v100.txt", bandwidth={"QPI": 1.0})


def test_parsers_reject_broken_matrices() -> None:
    text = (DATA / "dgx1-v100.txt").read_text()
    with pytest.raises(InputError, match="not symmetric"):
        parse_topo_matrix(text.replace("GPU0\t X \tNV1", "GPU0\t X \tNV2", 1))
    with pytest.raises(InputError, match="unknown link kind 'ZZZ'"):
        parse_topo_matrix(text.replace("GPU0\t X \tNV1", "GPU0\t X \tZZZ", 1))
    with pytest.raises(InputError, match="no topology matrix"):
        parse_topo_matrix("hello\n")
    with pytest.raises(InputError, match="names 3 GPUs but the matrix has 8"):
        detect_topology([text.split("$ nvidia-smi --query")[0], "a, 1 MiB\nb, 1 MiB\nc, 1 MiB\n"])


def test_small_helpers() -> None:
    assert gpu_kind("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_kind("Tesla V100-SXM2-16GB") == "V100"
    assert gpu_kind("NVIDIA A100-SXM4-80GB") == "A100"
    assert gpu_kind("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert nvlink_per_link("Tesla P100-SXM2-16GB") == 18 * GB
    assert pcie_bandwidth("Tesla V100-PCIE-32GB") == 12 * GB
    assert pcie_bandwidth("NVIDIA H100 PCIe") == 48 * GB
    gpus = parse_gpu_query("name, memory.total [MiB]\nNVIDIA L4, 23034 MiB\n")
    assert [(g.name, g.memory_bytes) for g in gpus] == [("NVIDIA L4", 23034 * 2**20)]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_cli_detect_writes_a_loadable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "dgx.yaml"
    code, out, _ = _run(
        ["topology", "detect", "--from-file", str(DATA / "dgx-a100.txt"), "-o", str(target)],
        capsys,
    )
    assert code == 0 and f"wrote {target}" in out
    topo = load_topology(target)
    assert topo.name == "detected" and len(topo.devices) == 8
    # --json prints the same topology.
    code, out, _ = _run(
        ["topology", "detect", "--from-file", str(DATA / "dgx-a100.txt"), "--json"], capsys
    )
    assert code == 0
    assert topology_from_dict(json.loads(out)).to_dict() == topo.to_dict()


def test_cli_detect_two_files_and_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(
        [
            "topology", "detect",
            "--from-file", str(DATA / "two-socket-node-sys.txt"),
            "--from-file", str(DATA / "two-socket-node-sys.csv"),
            "--bandwidth", "SYS=6 GB/s", "--memory", "20 GiB", "--speed", "0.5",
            "--name", "ws",
        ],
        capsys,
    )  # fmt: skip
    assert code == 0
    data = yaml.safe_load(out)
    assert data["name"] == "ws"
    assert data["devices"][0]["memory"] == "20 GiB" and data["devices"][0]["speed"] == 0.5
    assert {"between": ["gpu0", "gpu1"], "bandwidth": "6 GB/s"}.items() <= data["links"][0].items()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-file", "nope.txt"], "nope.txt: --from-file: file does not exist"),
        (["--from-file", "{pcie}"], "--memory"),
        (["--from-file", "{h100}", "--bandwidth", "SYS"], "KIND=BANDWIDTH"),
        (["--from-file", "{h100}", "--bandwidth", "SYS=8 GB"], "unknown unit"),
        (
            ["--from-file", "{h100}", "--bandwidth", "SYS=0 GB/s"],
            "--bandwidth SYS: expected a finite number from 1",
        ),
        (["--from-file", "{h100}", "--memory", "80"], "--memory: expected a size with a unit"),
        (["--from-file", "{h100}", "--speed", "0"], "--speed"),
        (["--from-file", "{h100}", "-o", "/nonexistent/dir/t.yaml"], "does not exist"),
        ([], "nvidia-smi"),
    ],
)
def test_cli_detect_errors(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi on this machine anyway
    args = [a.format(pcie=DATA / "pcie-pix-pxb-sys.txt", h100=DATA / "dgx-h100.txt") for a in args]
    code, out, err = _run(["topology", "detect", *args], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err

"""`pipeplan topology cluster` (issue 21): DGX / HGX pods of N nodes, rail or fat-tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.errors import InputError
from planner.gpus import gpu_spec
from planner.topology import load_topology, topology_from_dict
from planner.topology.cluster import PRESETS, cluster_dict, cluster_yaml


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("network", ["rail", "fat-tree"])
def test_every_preset_reads_back_as_its_datasheet_says(preset: str, network: str) -> None:
    data = cluster_dict(preset, 3, network=network)
    topo = topology_from_dict(yaml.safe_load(cluster_yaml(data, preset)), "<t>")
    spec = PRESETS[preset]
    gpu = gpu_spec(spec.gpu)
    assert len(topo.devices) == 24 and len(topo.hosts()) == 3
    assert {d.memory_bytes for d in topo.devices} == {gpu.memory_bytes}
    assert {d.kind for d in topo.devices} == {spec.gpu}
    names = topo.device_names()
    nic = {"200 Gbit/s": 25e9, "400 Gbit/s": 50e9}[spec.nic]
    assert topo.bandwidth(names[0], names[7]) == pytest.approx(gpu.interconnect_bytes_per_s)
    assert topo.bandwidth(names[0], names[8]) == pytest.approx(nic)  # the next node
    assert topo.bandwidth(names[3], names[22]) == pytest.approx(nic)  # another rail
    assert topo.latency_ms(names[0], names[1]) == pytest.approx(0.002)  # NVSwitch: 2 x 1 us


def test_rail_traffic_stays_on_its_rail() -> None:
    topo = topology_from_dict(cluster_dict("dgx-h100", 4), "<t>")
    assert topo.route("node0.gpu3", "node2.gpu3") == ["node0.gpu3", "rail3", "node2.gpu3"]
    # The spine has as many uplinks per rail as there are nodes: non-blocking.
    assert topo.link_bandwidth("rail0", "spine") == pytest.approx(4 * 50e9)


def test_a_1024_gpu_cluster_builds_in_seconds() -> None:
    topo = topology_from_dict(cluster_dict("dgx-h100", 128), "<t>")
    assert len(topo.devices) == 1024
    assert topo.bandwidth("node0.gpu0", "node127.gpu7") == pytest.approx(50e9)


def test_cli_writes_a_file_that_topology_check_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "h100x16.yaml"
    code, stdout, stderr = _run(
        ["topology", "cluster", "--preset", "dgx-h100", "--nodes", "16", "-o", str(out)], capsys
    )
    assert code == 0, stderr
    assert "128 devices on 16 hosts" in stdout
    assert out.read_text().startswith("# dgx-h100-x16-rail")
    code, stdout, _ = _run(["topology", "check", str(out), "--json"], capsys)
    assert code == 0 and json.loads(stdout)["devices"] == 128
    assert len(load_topology(out).devices) == 128
    code, stdout, _ = _run(
        ["topology", "cluster", "--preset", "hgx-h200", "--nodes", "2", "--network", "fat-tree"],
        capsys,
    )
    assert code == 0 and "hosts:" in stdout and "141 GiB" in stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--preset", "dgx-h900", "--nodes", "2"], "--preset"),
        (["--preset", "dgx-h100", "--nodes", "0"], "--nodes"),
        (["--preset", "dgx-h100", "--nodes", "100000"], "--nodes"),
        (["--preset", "dgx-h100", "--nodes", "2", "--network", "torus"], "--network"),
        (["--preset", "dgx-h100", "--nodes", "2", "--speed", "-1"], "--speed"),
        (["--preset", "dgx-h100", "--nodes", "2", "-o", "missing/t.yaml"], "-o"),
    ],
)
def test_cli_bad_arguments_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    code, stdout, stderr = _run(["topology", "cluster", *args], capsys)
    assert code == 2 and not stdout
    assert len(stderr.strip().splitlines()) == 1 and field in stderr


def test_check_cluster_names_the_presets() -> None:
    with pytest.raises(InputError, match="dgx-a100, dgx-h100, hgx-h200, dgx-b200"):
        cluster_dict("nope", 1)

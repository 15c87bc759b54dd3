"""A tensor-parallel plan through the command line: `simulate --stages` with '+' groups,
`--sequence-parallel` and `--sharding` write it, `show` draws it (one Gantt row per group,
one trace track per device); `run` trains it (tests/test_runtime_tensor_parallel.py) and
`export` writes it (tests/test_export.py)."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from planner.cli import main
from planner.cost import synthetic_profile, synthetic_tensor_parallel
from planner.plan import Plan

TOPOLOGY = """\
schema: pipeplan.topology/v1
name: eight
devices:
  - {name: "gpu{0..7}", memory: 1 GiB, speed: 1.0}
switches: [sw]
links:
  - {between: ["gpu{0..7}", sw], bandwidth: 10 GB/s, latency: 1 us}
"""
STAGES = "0-3:gpu0+gpu1,gpu2+gpu3;4-7:gpu4+gpu5,gpu6+gpu7"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture
def plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    prof, topo, plan = tmp_path / "prof.json", tmp_path / "eight.yaml", tmp_path / "plan.json"
    synthetic_tensor_parallel(synthetic_profile(8, output_bytes=10**6), (2,)).save(prof)
    topo.write_text(TOPOLOGY)
    code, out, err = _run(
        capsys,
        "simulate",
        "--profile",
        str(prof),
        "--topology",
        str(topo),
        "--stages",
        STAGES,
        "--sequence-parallel",
        "--sharding",
        "zero1",
        "-m",
        "4",
        "-o",
        str(plan),
    )
    assert code == 0, err
    assert "gpu0+gpu1, gpu2+gpu3" in out and "TP2, SP, zero1" in out
    return plan


def test_a_tensor_parallel_plan_is_written_and_shown(
    plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(plan.read_text())
    first = data["stages"][0]
    assert (first["tensor_parallel"], first["sequence_parallel"], first["sharding"]) == (
        2,
        True,
        "zero1",
    )
    assert sorted(data["schedule"]["devices"]) == [f"gpu{i}" for i in range(8)]
    assert sorted(data["predicted"]["memory_bytes"]) == [f"gpu{i}" for i in range(8)]
    assert Plan.load(plan).to_dict() == data  # read and written back unchanged
    svg, trace = tmp_path / "g.svg", tmp_path / "t.json"
    code, out, err = _run(capsys, "show", str(plan), "--svg", str(svg), "--trace", str(trace))
    assert code == 0, err
    gantt = [line.split()[0] for line in out.splitlines() if line.startswith("gpu")]
    assert "gpu0+gpu1" in gantt and "gpu6+gpu7" in gantt  # one row per group
    assert f"Iteration: {data['predicted']['iteration_ms']:.3f} ms" in out
    texts = {t.text for t in ElementTree.fromstring(svg.read_text()).iter() if t.text}
    assert {"gpu0+gpu1", "gpu2+gpu3", "gpu4+gpu5", "gpu6+gpu7"} <= texts
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {f"gpu{i}" for i in range(8)} <= tracks and "gpu0+gpu1 -> gpu4+gpu5" in tracks
    forwards = [e for e in events if e.get("name") == "F0.0"]
    assert len(forwards) == 2  # on gpu0 and gpu1, the same times
    assert forwards[0]["ts"] == forwards[1]["ts"] and forwards[0]["tid"] != forwards[1]["tid"]


def test_a_member_list_that_is_not_its_leaders_mirror_is_refused(
    plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(plan.read_text())
    data["schedule"]["devices"]["gpu1"].reverse()
    plan.write_text(json.dumps(data))
    code, _, err = _run(capsys, "show", str(plan))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "schedule.devices.gpu1[0]" in err and "mirror of its group leader" in err


def test_a_plan_of_mixed_degrees_is_written_and_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof, topo, plan = tmp_path / "prof.json", tmp_path / "eight.yaml", tmp_path / "plan.json"
    synthetic_tensor_parallel(synthetic_profile(8, output_bytes=10**6), (2,)).save(prof)
    topo.write_text(TOPOLOGY)
    common = ["--profile", str(prof), "--topology", str(topo), "-m", "4"]
    mixed = "0-3:gpu0+gpu1,gpu2+gpu3;4-7:gpu4,gpu5"
    code, out, err = _run(capsys, "simulate", *common, "--stages", mixed, "-o", str(plan))
    assert code == 0, err
    data = json.loads(plan.read_text())
    assert [s.get("tensor_parallel", 1) for s in data["stages"]] == [2, 1]
    gpu5 = data["schedule"]["devices"]["gpu5"]
    assert "SEND_B1.1->gpu2" in gpu5 and "SEND_B1.1->gpu3" in gpu5
    assert not any(a.startswith("SEND_F") for a in data["schedule"]["devices"]["gpu1"])
    assert Plan.load(plan).to_dict() == data
    trace = tmp_path / "t.json"
    code, out, err = _run(capsys, "show", str(plan), "--trace", str(trace))
    assert code == 0, err
    assert f"Iteration: {data['predicted']['iteration_ms']:.3f} ms" in out
    gantt = [line.split()[0] for line in out.splitlines() if line.startswith("gpu")]
    assert gantt == ["gpu0+gpu1", "gpu2+gpu3", "gpu4", "gpu5"]
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"gpu0+gpu1 -> gpu4", "gpu4 -> gpu0+gpu1"} <= tracks
    sp_plan = tmp_path / "sp.json"  # resharded along the sequence: gpu4 joins two halves
    code, _, err = _run(
        capsys, "simulate", *common, "--stages", "0-3:gpu0+gpu1;4-7:gpu4", "--sequence-parallel",
        "-o", str(sp_plan),
    )  # fmt: skip
    assert code == 0, err
    gpu4 = json.loads(sp_plan.read_text())["schedule"]["devices"]["gpu4"]
    assert gpu4[:2] == ["RECV_F1.0<-gpu0", "RECV_F1.0<-gpu1"]
    code, out, err = _run(capsys, "show", str(sp_plan))
    assert code == 0, err

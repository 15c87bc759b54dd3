"""`pipeplan simulate` and `pipeplan show`: tables, pictures, trace, and refusals."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from planner.cli import main
from planner.cost import synthetic_profile

TOPOLOGY = """\
schema: pipeplan.topology/v1
name: four
devices:
  - {name: "gpu{0..3}", memory: 1 GiB, speed: 1.0}
switches: [sw]
links:
  - {between: ["gpu{0..3}", sw], bandwidth: 10 GB/s, latency: 1 us}
"""


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    prof = tmp_path / "prof.json"
    synthetic_profile(8, output_bytes=10**6).save(prof)
    topo = tmp_path / "four.yaml"
    topo.write_text(TOPOLOGY)
    return prof, topo


def test_simulate_writes_a_plan_that_show_draws(
    inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof, topo = inputs
    plan = tmp_path / "plan.json"
    code, out, err = _run(
        capsys,
        "simulate",
        "--profile",
        str(prof),
        "--topology",
        str(topo),
        "--stages",
        "0-1:gpu0;2-3:gpu1;4-5:gpu2;6-7:gpu3",
        "--schedule",
        "zb",
        "--microbatches",
        "8",
        "-o",
        str(plan),
    )
    assert code == 0, err
    assert "Iteration:" in out and "gpu3" in out
    data = json.loads(plan.read_text())
    assert data["solver"]["method"] == "manual"
    assert data["schedule"]["name"] == "zb"

    svg, html, trace = tmp_path / "g.svg", tmp_path / "g.html", tmp_path / "t.json"
    code, out, err = _run(
        capsys,
        "show",
        str(plan),
        "--svg",
        str(svg),
        "--html",
        str(html),
        "--trace",
        str(trace),
        "--width",
        "60",
    )
    assert code == 0, err
    it = data["predicted"]["iteration_ms"]
    assert f"Iteration: {it:.3f} ms" in out if it < 100 else f"Iteration: {it:.1f} ms" in out
    # The SVG parses, has one labelled row per device and W boxes drawn striped.
    root = ElementTree.fromstring(svg.read_text())
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert {"gpu0", "gpu1", "gpu2", "gpu3"} <= set(texts)
    assert svg.read_text().count('fill="url(#wstripe)"') >= 8 * 4
    assert "<svg" in html.read_text() and "<table>" in html.read_text()
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"F0.0", "I3.7", "W3.7"} <= names
    assert any(e.get("ph") == "C" for e in events)  # memory counters

    code, out, _ = _run(capsys, "show", str(plan), "--json")
    shown = json.loads(out)
    assert shown["iteration_ms"] == pytest.approx(data["predicted"]["iteration_ms"])


def test_show_refuses_a_plan_whose_profile_changed(
    inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof, topo = inputs
    plan = tmp_path / "plan.json"
    code, _, err = _run(
        capsys,
        "simulate",
        "--profile",
        str(prof),
        "--topology",
        str(topo),
        "--stages",
        "0-3:gpu0;4-7:gpu1",
        "-o",
        str(plan),
        "--json",
    )
    assert code == 0, err
    synthetic_profile(8, forward_ms=2.0).save(prof)
    code, out, err = _run(capsys, "show", str(plan))
    assert code == 2
    assert err.count("\n") == 1 and "changed since this plan was made" in err
    assert "profile.sha256" in err


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ("0-2:gpu0;4-7:gpu1", "gap: layers 3..3"),
        ("0-4:gpu0;4-7:gpu1", "overlap: layers 4..4"),
        ("0-3:gpu0;4-7:gpu9", "unknown device 'gpu9'"),
        ("0-3:gpu0;4-7:gpu0", "device 'gpu0' is also in stage 0"),
    ],
)
def test_simulate_bad_partitions_exit_2_with_one_line(
    inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str], stages: str, message: str
) -> None:
    prof, topo = inputs
    code, out, err = _run(
        capsys, "simulate", "--profile", str(prof), "--topology", str(topo), "--stages", stages
    )
    assert code == 2
    assert err.count("\n") == 1 and message in err
    assert "Traceback" not in err


def test_simulate_json_without_topology_and_a_stages_file(
    tmp_path: Path, inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    prof, _ = inputs
    stages = tmp_path / "stages.yaml"
    stages.write_text("- {layers: [0, 3], devices: [a]}\n- {layers: [4, 7], devices: [b, c]}\n")
    code, out, err = _run(
        capsys,
        "simulate",
        "--profile",
        str(prof),
        "--stages",
        str(stages),
        "--schedule",
        "gpipe",
        "--microbatches",
        "4",
        "--recompute",
        "1",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["stages"][1]["recompute"] is True
    assert set(data["memory_bytes"]) == {"a", "b", "c"}
    # By hand (1 ms forward, 2 ms backward per layer, free communication): a forwards
    # 0-16; b and c (microbatches 0, 2 and 1, 3) forward by 16 and 20 and recompute in
    # their 12 ms backwards, b: 16-28, 28-40, c: 20-32, 32-44; a's 8 ms backwards wait
    # for them: 28-36, 36-44, 44-52, 52-60.
    assert data["iteration_ms"] == pytest.approx(60.0)


def test_show_refuses_a_schedule_that_deadlocks(
    inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof, topo = inputs
    plan = tmp_path / "plan.json"
    _run(
        capsys,
        "simulate",
        "--profile",
        str(prof),
        "--topology",
        str(topo),
        "--stages",
        "0-3:gpu0;4-7:gpu1",
        "--microbatches",
        "2",
        "-o",
        str(plan),
        "--json",
    )
    data = json.loads(plan.read_text())
    ops = data["schedule"]["devices"]["gpu1"]
    # gpu1 now waits for microbatch 1 before microbatch 0 arrives... and gpu0 waits for
    # gpu1's gradient before sending microbatch 1.
    data["schedule"]["devices"]["gpu0"] = [
        "F0.0",
        "SEND_F0.0->gpu1",
        "RECV_B0.0<-gpu1",
        "B0.0",
        "F0.1",
        "SEND_F0.1->gpu1",
        "RECV_B0.1<-gpu1",
        "B0.1",
        "STEP0",
    ]
    data["schedule"]["devices"]["gpu1"] = [
        op.replace(".0", ".X").replace(".1", ".0").replace(".X", ".1") for op in ops
    ]
    plan.write_text(json.dumps(data))
    code, _, err = _run(capsys, "show", str(plan))
    assert code == 2
    assert "deadlocks" in err and err.count("\n") == 1


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("simulate", "show"):  # in-process: test_simulate_help_example_runs runs -m
        code, out, err = _run(capsys, verb, "--help")
        assert code == 0, err
        assert re.search(r"Example: pipeplan " + verb, out)


@pytest.mark.parametrize("schedule", ["interleaved", "2bw", "optimized", "gpipe"])
def test_every_schedule_round_trips_through_a_plan(
    inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], schedule: str
) -> None:
    prof, topo = inputs
    plan = tmp_path / "plan.json"
    stages = (
        "0-1:gpu0;2-3:gpu1;4-5:gpu0;6-7:gpu1"
        if schedule == "interleaved"
        else ("0-3:gpu0,gpu1;4-5:gpu2;6-7:gpu3")
    )
    code, out, err = _run(
        capsys,
        "simulate",
        "--profile",
        str(prof),
        "--topology",
        str(topo),
        "--stages",
        stages,
        "--schedule",
        schedule,
        "--microbatches",
        "8",
        "-o",
        str(plan),
        "--json",
    )
    assert code == 0, err
    simulated = json.loads(out)
    code, out, err = _run(capsys, "show", str(plan), "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] == pytest.approx(simulated["iteration_ms"])


def test_simulate_rejects_a_hand_written_schedule_that_deadlocks(
    inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof, _ = inputs
    sched = tmp_path / "sched.yaml"
    sched.write_text(
        "name: mine\n"
        "devices:\n"
        "  a: [F0.0, SEND_F0.0->b, RECV_B0.0<-b, B0.0, F0.1, SEND_F0.1->b, RECV_B0.1<-b, B0.1,"
        " STEP0]\n"
        "  b: [RECV_F1.1<-a, F1.1, B1.1, SEND_B1.1->a, RECV_F1.0<-a, F1.0, B1.0, SEND_B1.0->a,"
        " STEP1]\n"
    )
    args = ["simulate", "--profile", str(prof), "--stages", "0-3:a;4-7:b", "-m", "2"]
    code, _, err = _run(capsys, *args, "--schedule", str(sched))
    assert code == 2
    assert "deadlocks: a waits at RECV_B0.0<-b, b waits at RECV_F1.1<-a" in err
    # The same lists in a working order simulate fine.
    sched.write_text(
        sched.read_text()
        .replace("RECV_F1.1<-a, F1.1, B1.1, SEND_B1.1->a, ", "")
        .replace("SEND_B1.0->a,", "SEND_B1.0->a, RECV_F1.1<-a, F1.1, B1.1, SEND_B1.1->a,")
    )
    code, out, err = _run(capsys, *args, "--schedule", str(sched), "--json")
    assert code == 0, err
    assert json.loads(out)["schedule"] == "mine"


def _mlp_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, dict]:
    root = Path(__file__).resolve().parents[1]
    prof = tmp_path / "mlp.json"
    prof.write_bytes((root / "profiles" / "mlp.json").read_bytes())
    plan = tmp_path / "plan.json"
    stages = "0-2:gpu0;3-5:gpu1"
    args = ["--profile", str(prof), "--stages", stages, "-b", "32", "-m", "6"]
    code, _, err = _run(capsys, "simulate", *args, "--schedule", "zb", "-o", str(plan))
    assert code == 0, err
    return prof, plan, json.loads(plan.read_text())


def test_simulate_evaluates_an_existing_plan_and_flags_override_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof, plan, data = _mlp_plan(tmp_path, capsys)
    code, out, err = _run(capsys, "simulate", "--plan", str(plan), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["schedule"] == "zb" and got["stages"] == data["stages"]
    assert got["iteration_ms"] == pytest.approx(data["predicted"]["iteration_ms"])
    assert got["lower_bound_ms"] == pytest.approx(data["predicted"]["lower_bound_ms"])
    code, out, err = _run(capsys, "simulate", "--plan", str(plan), "--schedule", "gpipe", "--json")
    assert code == 0, err
    assert json.loads(out)["schedule"] == "gpipe"
    assert json.loads(out)["iteration_ms"] > got["iteration_ms"]
    code, out, err = _run(capsys, "simulate", "--plan", str(plan), "-m", "3", "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] < got["iteration_ms"]  # half the microbatches
    code, out, err = _run(capsys, "simulate", "--plan", str(plan), "-b", "8", "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] < got["iteration_ms"]  # smaller microbatches

    prof.write_text(prof.read_text() + " ")
    code, out, err = _run(capsys, "simulate", "--plan", str(plan))
    assert code == 2 and "sha256" in err and err.count("\n") == 1


def test_a_plan_as_schedule_keeps_its_microbatch_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof, plan, data = _mlp_plan(tmp_path, capsys)
    args = ["simulate", "--profile", str(prof), "--stages", "0-2:gpu0;3-5:gpu1"]
    code, out, err = _run(capsys, *args, "--schedule", str(plan), "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] == pytest.approx(data["predicted"]["iteration_ms"])


def test_simulate_needs_a_partition_or_a_plan(
    inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "simulate", "--profile", str(inputs[0]))
    assert code == 2 and "--stages" in err and err.count("\n") == 1


def test_simulate_help_example_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "planner.cli", "simulate", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "400", "PATH": ""},
    ).stdout
    examples = re.findall(r"Example: (pipeplan simulate --profile .*?)\s*│?$", out, re.M)
    assert examples
    monkeypatch.chdir(root)
    for example in examples:
        code, _, err = _run(capsys, *shlex.split(example)[1:], "--json")
        assert code == 0, (example, err)

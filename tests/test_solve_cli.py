"""``pipeplan solve`` on the command line: output file, --json, one-line errors, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_dp import random_profile

from planner.cli import main
from planner.plan import Plan
from planner.profile import Layer, LayerTiming, Measurement, Profile

ROOT = Path(__file__).resolve().parents[1]
NVLINK = str(ROOT / "topologies" / "nvlink.yaml")


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    path = tmp_path / "prof.json"
    random_profile(8, 2, sizes=(2, 4)).save(path)
    return path


def test_writes_plan_and_prints_summary(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "plan.json"
    code, out, err = _run(
        [
            "solve",
            "--profile",
            str(profile_path),
            "--topology",
            NVLINK,
            "--global-batch",
            "32",
            "--time-limit",
            "5",
            "-o",
            str(out_path),
        ],
        capsys,
    )
    assert code == 0, err
    plan = Plan.load(out_path)
    assert plan.microbatch_size * plan.num_microbatches == 32
    for word in (
        "Predicted iteration",
        "Lower bound",
        "Memory per device",
        "Peers at their best",
        "search alone",
        "DeepSpeed",
        "uniform (peer default)",
    ):
        assert word in out
    assert plan.profile.path == str(profile_path) and len(plan.profile.sha256 or "") == 64
    names = {b.name for b in plan.baselines}
    assert names >= {"DeepSpeed", "torchgpipe", "Megatron-LM", "PipeDream", "data parallel"}
    assert names >= {"uniform (peer default)", "parameter-balanced (peer default)"}


def test_json_output(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "p.json"
    code, out, _ = _run(
        [
            "solve",
            "--profile",
            str(profile_path),
            "--topology",
            NVLINK,
            "--microbatches",
            "8",
            "--schedule",
            "gpipe",
            "--json",
            "-o",
            str(out_path),
        ],
        capsys,
    )
    assert code == 0
    data = json.loads(out)
    assert data["schedule"]["name"] == "gpipe" and data["num_microbatches"] == 8
    assert data == json.loads(out_path.read_text())


def _too_big(path: Path) -> None:
    layers = [Layer(f"huge{i}", 2**34, 2**36, 2**37) for i in range(3)]
    timings = [LayerTiming(1.0, 2.0, 1.0, 1.0, 2**20, 2**20) for _ in range(3)]
    Profile("huge", layers, [Measurement(1, 2**20, timings)]).save(path)


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--global-batch", "7"], "--global-batch: global batch 7 is not divisible"),
        (["--time-limit", "0"], "--time-limit: expected a positive number of seconds"),
        (["--time-limit", "-3"], "--time-limit: expected a positive number of seconds"),
        (["--schedule", "warp"], "unknown schedule 'warp'"),
        (["--microbatches", "0"], "--microbatches: expected a positive integer"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path,
    profile_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    pattern: str,
) -> None:
    out_path = tmp_path / "plan.json"
    code, _, err = _run(
        [
            "solve",
            "--profile",
            str(profile_path),
            "--topology",
            NVLINK,
            "-o",
            str(out_path),
            *extra,
        ],
        capsys,
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and pattern in err
    assert not out_path.exists()


def test_infeasible_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "huge.json"
    _too_big(prof)
    code, _, err = _run(
        ["solve", "--profile", str(prof), "--topology", NVLINK, "-o", str(tmp_path / "x.json")],
        capsys,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "alone needs" in err and "huge" in err and "Traceback" not in err


def test_zero_devices_is_rejected(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = tmp_path / "empty.yaml"
    topo.write_text("schema: pipeplan.topology/v1\nname: empty\ndevices: []\nlinks: []\n")
    code, _, err = _run(
        [
            "solve",
            "--profile",
            str(profile_path),
            "--topology",
            str(topo),
            "-o",
            str(tmp_path / "x.json"),
        ],
        capsys,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "device" in err


def test_missing_output_folder_fails_before_solving(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        [
            "solve",
            "--profile",
            str(profile_path),
            "--topology",
            NVLINK,
            "-o",
            str(tmp_path / "nope" / "plan.json"),
        ],
        capsys,
    )
    assert code == 2 and "does not exist" in err


def test_lower_bound_is_the_one_simulate_and_show_report(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "plan.json"
    args = ["solve", "--profile", str(profile_path), "--topology", NVLINK, "--global-batch", "32"]
    code, out, err = _run([*args, "--time-limit", "5", "-o", str(out_path)], capsys)
    assert code == 0, err
    pred = Plan.load(out_path).predicted
    assert pred is not None and pred.global_lower_bound_ms is not None
    assert "Global lower bound" in out
    assert pred.global_lower_bound_ms <= pred.lower_bound_ms <= pred.iteration_ms
    for verb in (["show", str(out_path)], ["simulate", "--plan", str(out_path)]):
        code, out, err = _run([*verb, "--json"], capsys)
        assert code == 0, err
        assert json.loads(out)["lower_bound_ms"] == pytest.approx(pred.lower_bound_ms)


def test_a_plan_written_elsewhere_finds_its_files_from_any_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative inputs are named relative to the plan's folder when -o writes it elsewhere,
    so show (and run, export) find them from any current folder."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "plans" / "plan.json"
    out.parent.mkdir()
    args = ["solve", "--profile", "profiles/mlp.json", "--topology", "topologies/cpu.yaml"]
    code, _, err = _run([*args, "-o", str(out)], capsys)
    assert code == 0, err
    plan = Plan.load(out)
    assert plan.profile.path is not None and not Path(plan.profile.path).is_absolute()
    assert (out.parent / plan.profile.path).resolve() == ROOT / "profiles" / "mlp.json"
    monkeypatch.chdir(tmp_path)
    code, shown, err = _run(["show", str(out)], capsys)
    assert code == 0, err
    assert "microbatches" in shown
    # In the current folder the path stays as typed.
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mlp.json").write_bytes((ROOT / "profiles" / "mlp.json").read_bytes())
    args = [
        "solve",
        "--profile",
        "profiles/mlp.json",
        "--topology",
        str(ROOT / "topologies/cpu.yaml"),
    ]
    code, _, err = _run([*args, "-o", "here.json"], capsys)
    assert code == 0, err
    assert Plan.load(tmp_path / "here.json").profile.path == "profiles/mlp.json"

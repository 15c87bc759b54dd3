"""Bad input anywhere is one line on stderr naming the file/flag/field, exit 2, nothing run.

Regression tests for QA findings: option ranges (show, run, simulate), JSON booleans and
non-finite numbers in plans and profiles, and messages that name the right file or flag.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from planner.cli import main
from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.fileio import check_output_path
from planner.plan import Plan, plan_from_dict
from planner.profile.schema import profile_from_dict
from planner.topology import topology_from_dict

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _refused(args: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """Runs ``args``; asserts exit 2 and one stderr line containing every needle."""
    code, _, err = _run(args, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A small simulated plan (with its profile beside it)."""
    synthetic_profile(4).save(tmp_path / "p.json")
    out = tmp_path / "plan.json"
    code, _, err = _run(
        ["simulate", "--profile", str(tmp_path / "p.json"), "--stages", "0-1:a;2-3:b"]
        + ["-m", "4", "-o", str(out), "--no-gantt", "--json"],
        capsys,
    )
    assert code == 0, err
    return out


@pytest.mark.parametrize("width", ["-5", "0", "19"])
def test_show_refuses_a_too_narrow_gantt(
    plan_file: Path, width: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["show", str(plan_file), f"--width={width}"], capsys, "--width", "at least 20")


def test_show_draws_at_the_minimum_width(
    plan_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["show", str(plan_file), "--width", "20"], capsys)
    assert code == 0, err
    assert "0 ms" in out


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "inf"], "--timeout"),
        (["--lr", "-1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--threads", "0"], "--threads"),
        (["--steps", "0"], "--steps"),
        (["--warmup", "-1"], "--warmup"),
    ],
)
def test_run_refuses_bad_options_before_anything_starts(
    plan_file: Path, args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = plan_file.parent / "trace.json"
    _refused(
        ["run", str(plan_file), "--model", str(ROOT / "examples" / "mlp.py"), "--trace", str(trace)]
        + args,
        capsys,
        flag,
    )
    assert not trace.exists()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"lr": math.nan}, "lr"),
        ({"threads": 0}, "threads"),
        ({"steps": 0}, "steps"),
        ({"warmup": -1}, "warmup"),
    ],
)
def test_run_plan_api_refuses_bad_options(
    plan_file: Path, kwargs: dict[str, Any], field: str
) -> None:
    from planner.runtime.runner import run_plan

    with pytest.raises(InputError) as info:
        run_plan(plan_file, ROOT / "examples" / "mlp.py", **kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--step-ms", "-5"], ("--step-ms", ">= 0")),
        (["--step-ms", "nan"], ("--step-ms", "finite")),
        (["--virtual-stages", "0"], ("--virtual-stages", ">= 1")),
        (["--schedule", "missing.json"], ("--schedule", "'missing.json' does not exist")),
        (["--schedule", "sub/missing"], ("--schedule", "does not exist")),
        (["--schedule", "bogus"], ("--schedule", "unknown schedule 'bogus'")),
    ],
)
def test_simulate_refuses_bad_options_and_writes_nothing(
    tmp_path: Path, args: list[str], needles: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    synthetic_profile(4).save(tmp_path / "p.json")
    out = tmp_path / "plan.json"
    _refused(
        ["simulate", "--profile", str(tmp_path / "p.json"), "--stages", "0-1:a;2-3:b"]
        + ["-o", str(out), "--no-gantt", *args],
        capsys,
        *needles,
    )
    assert not out.exists()


def test_interleaved_with_microbatches_not_a_multiple_of_the_depth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/schedules.md: with v > 1 the generator needs m a multiple of p ...
    synthetic_profile(4).save(tmp_path / "p.json")
    base = ["simulate", "--profile", str(tmp_path / "p.json"), "--schedule", "interleaved"]
    _refused([*base, "--stages", "0:a;1:b;2:a;3:b", "-m", "3"], capsys, "multiple")
    # ... and with v = 1 it is plain 1F1B, so any m works.
    code, _, err = _run([*base, "--stages", "0-1:a;2-3:b", "-m", "3", "--no-gantt"], capsys)
    assert code == 0, err


def _plan_data(plan_file: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(plan_file.read_text())
    return data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["stages"][0].update(recompute="false"), "stages[0].recompute"),
        (lambda d: d["stages"][0].update(recompute=0), "stages[0].recompute"),
        (lambda d: d["stages"][1].update(id=True), "stages[1].id"),
        (lambda d: d["stages"][0].update(layers=[-1, 1]), "stages[0].layers"),
        (lambda d: d["stages"][0].update(devices=[""]), "stages[0].devices"),
        (lambda d: d.update(microbatch_size="4"), "microbatch_size"),
        (lambda d: d.update(num_microbatches=-4), "num_microbatches"),
        (lambda d: d["predicted"].update(iteration_ms=math.nan), "predicted.iteration_ms"),
        (lambda d: d["baselines"].append({"iteration_ms": math.inf}), "baselines[0].iteration_ms"),
    ],
)
def test_plan_loader_requires_the_right_types(plan_file: Path, change: Any, field: str) -> None:
    data = _plan_data(plan_file)
    data.setdefault("baselines", [])
    change(data)
    with pytest.raises(InputError) as info:
        plan_from_dict(data, source="plan.json")
    assert info.value.field == field and info.value.file == "plan.json"


def test_a_string_recompute_in_a_plan_file_is_refused_by_show(
    plan_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _plan_data(plan_file)
    data["stages"][0]["recompute"] = "false"
    plan_file.write_text(json.dumps(data))
    _refused(["show", str(plan_file)], capsys, str(plan_file), "stages[0].recompute", "boolean")


def test_a_boolean_recompute_still_loads(plan_file: Path) -> None:
    data = _plan_data(plan_file)
    data["stages"][1]["recompute"] = True
    assert plan_from_dict(data).stages[1].recompute is True


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_profile_refuses_non_finite_numbers(value: float, tmp_path: Path) -> None:
    data = synthetic_profile(3).to_dict()
    data["measurements"][0]["layers"][1]["forward_ms"] = value
    with pytest.raises(InputError) as info:
        profile_from_dict(data, source="p.json")
    assert info.value.field == "measurements[0].layers[1].forward_ms"
    # Python's json writes and reads the NaN literal: the CLI must still refuse it cleanly.
    (tmp_path / "p.json").write_text(json.dumps(data))
    from planner.profile import load_profile

    with pytest.raises(InputError, match="finite"):
        load_profile(tmp_path / "p.json")


def test_profile_refuses_non_finite_spread_and_optimizer_time() -> None:
    data = synthetic_profile(2).to_dict()
    data["measurements"][0]["layers"][0]["spread"] = {"forward_ms": [1.0, math.nan]}
    with pytest.raises(InputError, match="spread.forward_ms"):
        profile_from_dict(data)
    data = synthetic_profile(2).to_dict()
    data["layers"][0]["optimizer_ms"] = math.inf
    with pytest.raises(InputError, match=r"layers\[0\].optimizer_ms"):
        profile_from_dict(data)


@pytest.mark.parametrize(
    ("device", "link", "field"),
    [
        ({"speed": math.nan}, {}, "devices[0].speed"),
        ({"speed": math.inf}, {}, "devices[0].speed"),
        ({"memory": "1e999 GB"}, {}, "devices[0].memory"),
        ({"memory": math.nan}, {}, "devices[0].memory"),
        ({}, {"bandwidth": "1e999 GB/s"}, "links[0].bandwidth"),
        ({}, {"bandwidth": "nan GB/s"}, "links[0].bandwidth"),
        ({}, {"latency": "1e999 s"}, "links[0].latency"),
    ],
)
def test_topology_refuses_non_finite_numbers(
    device: dict[str, Any], link: dict[str, Any], field: str
) -> None:
    data = {
        "devices": [{"name": "a", "memory": "1 GiB", **device}, {"name": "b", "memory": "1 GiB"}],
        "links": [{"between": ["a", "b"], "bandwidth": "1 GB/s", "latency": "1 us", **link}],
    }
    with pytest.raises(InputError) as info:
        topology_from_dict(data, source="t.yaml")
    assert info.value.field == field


@pytest.mark.parametrize("kind", ["profile", "plan"])
def test_a_profile_or_plan_given_as_topology_says_what_it_is(
    plan_file: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = plan_file.parent / ("p.json" if kind == "profile" else "plan.json")
    _refused(
        ["simulate", "--profile", str(plan_file.parent / "p.json"), "--topology", str(wrong)]
        + ["--stages", "0-1:a;2-3:b"],
        capsys,
        str(wrong),
        f"this is a pipeplan {kind}",
        "expected a topology YAML",
    )


def test_an_untraceable_model_is_named_in_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = MODELS / "untraceable.py"
    _refused(
        ["profile", str(model), "-b", "1", "-o", str(tmp_path / "u.json")]
        + ["--repeat", "1", "--warmup", "0", "--min-time", "0"],
        capsys,
        str(model),
        "could not capture forward()",
    )
    assert not (tmp_path / "u.json").exists()


def test_output_path_errors_name_the_flag_only_when_given(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "plan.json"
    with pytest.raises(InputError) as info:
        check_output_path(missing)
    assert info.value.field is None and " -o" not in info.value.one_line()
    with pytest.raises(InputError) as info:
        check_output_path(missing, field="--svg")
    assert info.value.field == "--svg"


def test_plan_save_to_a_missing_folder_does_not_mention_a_cli_flag(plan_file: Path) -> None:
    plan = Plan.load(plan_file)
    target = plan_file.parent / "no-such-folder" / "plan.json"
    with pytest.raises(InputError) as info:
        plan.save(target)
    # The API has no CLI flag: the message names the path only.
    assert info.value.field is None and " -o" not in info.value.one_line()
    assert info.value.one_line().startswith(str(target))


def test_cli_output_errors_still_name_their_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    synthetic_profile(4).save(tmp_path / "p.json")
    _refused(
        ["simulate", "--profile", str(tmp_path / "p.json"), "--stages", "0-1:a;2-3:b"]
        + ["-o", str(tmp_path / "nope" / "plan.json")],
        capsys,
        ": -o:",
        "does not exist",
    )


def test_a_bad_partition_names_the_flag_the_file_or_the_plan_it_came_from(
    plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The partition is checked where the flag is not known; the line names it all the same
    (hostile pass: `stages[1].devices: ...` alone before)."""
    base = ["simulate", "--profile", str(tmp_path / "p.json"), "-m", "4", "--no-gantt"]
    line = _refused([*base, "--stages", "0-1:a;2-3:a"], capsys, "stages[1].devices")
    assert line.startswith("pipeplan: error: --stages: ")
    stages_file = tmp_path / "st.yaml"
    stages_file.write_text("- {layers: [0, 1], devices: [a]}\n- {layers: [3, 3], devices: [b]}\n")
    _refused([*base, "--stages", str(stages_file)], capsys, f"{stages_file}: stages[1].layers")
    data = json.loads(plan_file.read_text())
    data["stages"][1]["devices"] = ["a"]
    bad_plan = tmp_path / "bad-plan.json"
    bad_plan.write_text(json.dumps(data))
    _refused(["simulate", "--plan", str(bad_plan), "--no-gantt"], capsys, str(bad_plan))

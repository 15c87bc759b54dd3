"""The one stage type: frozen and hashable, replicas as tensor-parallel groups (parsed and
written, refused by everything that cannot simulate or run them yet)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.plan import FileRef, Plan, plan_from_simulation
from planner.schedule import build_schedule
from planner.shape import PlanShape
from planner.simulate import simulate, simulate_shape
from planner.stages import (
    StageSpec,
    as_stages,
    parse_stages,
    refuse_tensor_parallel,
    stages_from_data,
    validate_stages,
)

TP_TEXT = "0-1:gpu0+gpu1,gpu2+gpu3;2-3:gpu4+gpu5"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0), capsys.readouterr().err


def test_a_stage_is_frozen_hashable_and_keeps_its_devices_as_a_tuple() -> None:
    stage = StageSpec(0, [0, 3], ["gpu0", "gpu1"])  # type: ignore[arg-type]
    assert stage.devices == ("gpu0", "gpu1") and stage.layers == (0, 3)
    assert stage == StageSpec(0, (0, 3), ("gpu0", "gpu1"))
    assert {stage: 1}[StageSpec(0, (0, 3), ("gpu0", "gpu1"))] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        stage.recompute = True  # type: ignore[misc]
    assert stage.with_recompute(True).recompute and not stage.recompute
    assert stage.with_recompute(False) is stage
    assert StageSpec(0, (0, 0), "gpu0").devices == ("gpu0",)  # type: ignore[arg-type]
    assert stage.replicas == 2 and stage.replica_groups == (("gpu0",), ("gpu1",))
    assert [stage.replica(k) for k in range(3)] == ["gpu0", "gpu1", "gpu0"]


def test_plus_joins_a_tensor_parallel_group() -> None:
    first, second = parse_stages(TP_TEXT, recompute=[1])
    assert first.devices == ("gpu0", "gpu1", "gpu2", "gpu3")
    assert first.tensor_parallel == 2 and first.replicas == 2
    assert first.replica_groups == (("gpu0", "gpu1"), ("gpu2", "gpu3"))
    assert second.replica_groups == (("gpu4", "gpu5"),) and second.recompute
    with pytest.raises(InputError, match="groups of one size"):
        parse_stages("0-1:gpu0+gpu1,gpu2")
    with pytest.raises(InputError, match="at least one device"):
        parse_stages("0-1:gpu0,+")


def test_tensor_parallel_is_written_only_where_it_is_not_one() -> None:
    plain = parse_stages("0-1:gpu0,gpu1")[0].to_dict()
    assert list(plain) == ["id", "layers", "devices", "recompute"]
    grouped = [s.to_dict() for s in parse_stages(TP_TEXT)]
    assert grouped[0]["tensor_parallel"] == 2 and grouped[0]["devices"] == [
        "gpu0",
        "gpu1",
        "gpu2",
        "gpu3",
    ]
    assert stages_from_data(grouped) == parse_stages(TP_TEXT)
    assert as_stages(grouped) == parse_stages(TP_TEXT)
    for bad in (0, 3, True, "2"):
        with pytest.raises(InputError) as info:
            stages_from_data([{**grouped[0], "tensor_parallel": bad}], source="s.json")
        assert info.value.field == "stages[0].tensor_parallel" and info.value.file == "s.json"


def test_tensor_parallelism_is_refused_with_one_line_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stages = parse_stages(TP_TEXT)
    with pytest.raises(InputError, match="tensor parallelism is not supported yet") as info:
        validate_stages(stages, 4, None)
    assert info.value.field == "stages[0].tensor_parallel"
    assert "gpu0+gpu1,gpu2+gpu3" in str(info.value)
    with pytest.raises(InputError, match="not supported yet"):
        refuse_tensor_parallel(stages[1])
    refuse_tensor_parallel(parse_stages("0:a,b")[0])  # one device per replica: fine
    profile = synthetic_profile(4)
    with pytest.raises(InputError, match="not supported yet"):
        simulate(profile, None, stages, "1f1b", 4)
    profile.save(tmp_path / "p.json")
    base = ["simulate", "--profile", str(tmp_path / "p.json"), "-m", "4", "--no-gantt"]
    code, err = _run([*base, "--stages", TP_TEXT], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "tensor parallelism is not supported yet" in err and "Traceback" not in err
    # A plan file that names a group: read, then refused by the same check, naming the file.
    plan = tmp_path / "plan.json"
    code, err = _run([*base, "--stages", "0-1:gpu0,gpu1;2-3:gpu2", "-o", str(plan)], capsys)
    assert code == 0, err
    data = json.loads(plan.read_text())
    data["stages"][1]["devices"] = ["gpu2", "gpu3"]
    data["stages"][1]["tensor_parallel"] = 2
    plan.write_text(json.dumps(data))
    with pytest.raises(InputError, match="not supported yet") as info:
        Plan.load(plan)
    assert info.value.file == str(plan) and info.value.field == "stages[1].tensor_parallel"
    code, err = _run(["show", str(plan)], capsys)
    assert code == 2 and "tensor parallelism is not supported yet" in err, err


def test_schedules_are_not_built_for_tensor_parallel_stages() -> None:
    with pytest.raises(InputError, match="tensor parallelism is not supported yet"):
        build_schedule("1f1b", parse_stages(TP_TEXT), 4)


def test_a_plan_shape_is_hashable_and_a_plan_exposes_its_own(tmp_path: Path) -> None:
    stages = parse_stages("0-1:gpu0,gpu1;2-3:gpu2")
    shape = PlanShape(stages, "1f1b", 2, 4)  # type: ignore[arg-type]
    assert shape.stages == tuple(stages) and shape.samples == 8 and shape.devices_used == 3
    assert {shape: 1}[PlanShape(tuple(parse_stages("0-1:gpu0,gpu1;2-3:gpu2")), "1f1b", 2, 4)]
    marked = shape.with_recompute([False, True])
    assert [s.recompute for s in marked.stages] == [False, True] and marked != shape
    profile = synthetic_profile(4, microbatch_size=2)
    result = simulate_shape(profile, None, shape)
    assert result.iteration_ms == simulate(profile, None, stages, "1f1b", 4, 2).iteration_ms
    plan = plan_from_simulation(
        result, stages, profile=FileRef.in_memory({}), topology=FileRef(None)
    )
    assert plan.shape == shape

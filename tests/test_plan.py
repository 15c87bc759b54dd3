"""The plan format: typed parts, round trip (today's plans and older versions'), validation
naming the field, unknown keys, the --stages shorthand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.fileio import sha256_file
from planner.plan import (
    Baseline,
    FileRef,
    Plan,
    Prediction,
    SolverInfo,
    parse_stages,
    plan_from_dict,
    plan_from_simulation,
    stages_from_data,
    validate_stages,
)
from planner.records import read_record
from planner.schedule import Schedule, build_schedule
from planner.simulate import simulate
from planner.topology import uniform_topology

DATA = Path(__file__).resolve().parent / "data" / "plans"


def _plan(tmp_path: Path) -> Plan:
    prof = synthetic_profile(4)
    prof_path = tmp_path / "p.json"
    prof.save(prof_path)
    stages = parse_stages("0-1:gpu0;2-3:gpu1")
    result = simulate(prof, None, stages, "1f1b", 4)
    return plan_from_simulation(
        result, stages, profile=FileRef.of_file(prof_path), topology=FileRef(None)
    )


def test_round_trip(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    out = tmp_path / "plan.json"
    plan.save(out)
    again = Plan.load(out)
    assert again.to_dict() == plan.to_dict()
    data = json.loads(out.read_text())
    assert data["schema"] == "pipeplan.plan/v1"
    assert data["solver"]["method"] == "manual"
    assert data["schedule"]["devices"]["gpu0"][:2] == ["F0.0", "SEND_F0.0->gpu1"]
    for key in (
        "iteration_ms",
        "samples_per_s",
        "bubble_fraction",
        "lower_bound_ms",
        "memory_bytes",
        "memory_limit_bytes",
    ):
        assert key in data["predicted"]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(schema="x"), "schema"),
        (lambda d: d.update(num_microbatches=0), "num_microbatches"),
        (lambda d: d["stages"][1].update(layers=[1, 3]), "stages[1].layers"),
        (lambda d: d["stages"][0].update(devices="gpu0"), None),  # a single name is accepted
        (lambda d: d["stages"][0].update(devices=[3]), "stages[0].devices"),
        (lambda d: d.update(profile="p.json"), "profile"),
        (lambda d: d["profile"].update(sha256=12), "profile.sha256"),
        (lambda d: d.update(schedule=[]), "schedule"),
        (lambda d: d["schedule"].update(flush="false"), "schedule.flush"),
        (lambda d: d["schedule"].update(num_microbatches=8), "schedule.num_microbatches"),
        (lambda d: d["schedule"]["devices"]["gpu0"].pop(0), "schedule.devices.gpu0[0]"),
        (lambda d: d["schedule"]["devices"]["gpu1"].reverse(), "schedule.devices.gpu1"),
        (lambda d: d["predicted"].pop("memory_bytes"), "predicted.memory_bytes"),
        (lambda d: d["predicted"].update(iteration_ms="1"), "predicted.iteration_ms"),
        (lambda d: d["predicted"]["memory_bytes"].update(gpu0=1.5), "predicted.memory_bytes"),
        (lambda d: d["predicted"].update(staleness=["1"]), "predicted.staleness"),
        (lambda d: d["solver"].pop("gap"), "solver.gap"),
        (lambda d: d["solver"].update(ilp={"status": "x"}), "solver.ilp.gap"),
        (
            lambda d: d.update(baselines=[{"name": "u", "feasible": True}]),
            "baselines[0].iteration_ms",
        ),
        (
            lambda d: d.update(baselines=[{"name": "u", "iteration_ms": 1, "feasible": 1}]),
            "baselines[0].feasible",
        ),
    ],
)
def test_bad_plans_name_the_field(tmp_path: Path, mutate, field: str | None) -> None:  # type: ignore[no-untyped-def]
    data = _plan(tmp_path).to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    if field is None:
        Plan.load(path)
        return
    with pytest.raises(InputError) as info:
        Plan.load(path)
    assert field in info.value.one_line()
    assert "bad.json" in info.value.one_line()


def test_parse_stages_shorthand() -> None:
    stages = parse_stages("0-3:gpu0,gpu1; 4-7:gpu2;8:gpu3", recompute=[1])
    assert [s.layers for s in stages] == [(0, 3), (4, 7), (8, 8)]
    assert stages[0].devices == ("gpu0", "gpu1")
    assert [s.recompute for s in stages] == [False, True, False]
    assert stages[0].replica(3) == "gpu1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected stages"),
        ("0-3", "at least one device"),
        ("a-b:gpu0", "FIRST-LAST"),
        ("0-3:", "at least one device"),
    ],
)
def test_parse_stages_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_stages(text)
    with pytest.raises(InputError, match="stage 5 does not exist"):
        parse_stages("0:a", recompute=[5])


def test_validate_stages_with_a_topology() -> None:
    topo = uniform_topology(2)
    validate_stages(parse_stages("0-1:gpu0;2-3:gpu1"), 4, topo)
    with pytest.raises(
        InputError, match=r"unknown device 'gpu7'; the topology has \['gpu0', 'gpu1'\]"
    ):
        validate_stages(parse_stages("0-1:gpu0;2-3:gpu7"), 4, topo)
    validate_stages(parse_stages("0:gpu0;1:gpu1;2:gpu0;3:gpu1"), 4, topo, allow_shared_devices=True)


def test_stages_from_data_checks_ids() -> None:
    with pytest.raises(InputError, match="stage ids 0, 1, 2"):
        stages_from_data([{"id": 1, "layers": [0, 1], "devices": ["a"]}])


def test_parts_are_typed_and_the_schedule_parsed_once(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert isinstance(loaded.schedule, Schedule) and loaded.schedule.name == "1f1b"
    assert [str(a) for a in loaded.schedule.devices["gpu0"][:2]] == ["F0.0", "SEND_F0.0->gpu1"]
    assert isinstance(loaded.predicted, Prediction) and isinstance(loaded.solver, SolverInfo)
    assert loaded.solver == SolverInfo.manual() and loaded.baselines == []
    assert loaded.profile == FileRef(str(tmp_path / "p.json"), plan.profile.sha256)
    assert loaded.topology == FileRef(None)
    assert loaded.predicted == plan.predicted


def test_prediction_holds_the_simulators_numbers_exactly(tmp_path: Path) -> None:
    """One rule for solve and simulate -o: unrounded numbers, maps in device-name order."""
    prof = synthetic_profile(6)
    stages = parse_stages("0-1:gpu10;2-3:gpu2;4-5:gpu1")
    result = simulate(prof, uniform_topology(11), stages, "2bw", 5, step_ms=0.3)
    pred = Prediction.from_result(result)
    assert pred.iteration_ms == result.iteration_ms  # bit for bit
    assert pred.lower_bound_ms == result.lower_bound_ms
    assert pred.samples_per_s == 5 * result.microbatch_size / result.iteration_ms * 1e3
    assert list(pred.memory_bytes) == ["gpu1", "gpu10", "gpu2"] == list(pred.busy_ms or {})
    assert pred.memory_bytes == result.memory_bytes
    assert pred.staleness == [1, 1, 1] and pred.step_ms == result.step_ms
    assert pred.global_lower_bound_ms is None and "plan_lower_bound_ms" not in pred.to_dict()
    solver = Prediction.from_result(result, global_lower_bound_ms=1.0)
    assert solver.plan_lower_bound_ms == solver.lower_bound_ms == pred.lower_bound_ms
    no_step = Prediction.from_result(simulate(prof, None, stages, "1f1b", 5, step_ms=0.0))
    assert no_step.step_ms is None and "step_ms" not in no_step.to_dict()
    assert read_record(Prediction, pred.to_dict(), file=None) == pred


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.stem)
def test_plans_written_by_older_versions_load_and_round_trip(path: Path) -> None:
    plan = Plan.load(path)
    assert plan.to_dict() == json.loads(path.read_text())
    assert json.dumps(plan.to_dict(), indent=1) + "\n" == path.read_text()  # key order too
    assert plan.predicted is not None and plan.predicted.iteration_ms > 0
    assert plan.solver is not None and plan.schedule.num_microbatches == plan.num_microbatches


def test_older_plans_keep_their_own_fields() -> None:
    first = Plan.load(DATA / "3d8a9d0-solve-gpt-hetero.json")
    assert first.baselines and all(b.kind is None and not b.tuned for b in first.baselines)
    assert first.predicted is not None and first.predicted.plan_lower_bound_ms is not None
    assert first.predicted.global_lower_bound_ms is None and first.predicted.busy_ms is None
    assert first.solver is not None and first.solver.ilp is not None
    assert first.solver.without_peers is None
    peers = Plan.load(DATA / "60aa428-solve-gpt-hetero.json")
    assert peers.solver is not None and peers.solver.without_peers is not None
    tuned = [b for b in peers.baselines if b.tuned]
    assert tuned and all(b.configuration and b.depth for b in tuned if b.feasible)
    stepped = Plan.load(DATA / "e94aee5-simulate-mlp-zb-step.json")
    assert stepped.step_ms == 0.5 and stepped.schedule.meta == {}
    assert stepped.to_dict()["schedule"]["meta"] == {"step_ms": 0.5}
    assert stepped.predicted is not None
    assert stepped.predicted.step_ms and stepped.solver == SolverInfo.manual()


def test_unknown_keys_are_kept_in_reports_and_refused_where_they_decide_what_runs(
    tmp_path: Path,
) -> None:
    data = _plan(tmp_path).to_dict()
    data["profile"]["mtime"] = 12
    data["predicted"]["energy_j"] = 3.5
    data["solver"]["machine"] = "ci"
    data["baselines"] = [{"name": "u", "iteration_ms": None, "feasible": False, "why": "x"}]
    plan = plan_from_dict(data, source="plan.json")
    assert plan.profile.extra == {"mtime": 12}
    assert plan.predicted is not None and plan.predicted.extra == {"energy_j": 3.5}
    assert plan.baselines == [Baseline("u", None, False, extra={"why": "x"})]
    plan.save(tmp_path / "kept.json")
    assert json.loads((tmp_path / "kept.json").read_text()) == data
    for where, key in (("", "tensor_parallel"), ("stages", "tp_groups"), ("schedule", "zb")):
        bad = json.loads(json.dumps(data))
        target = bad if not where else bad[where][0] if where == "stages" else bad[where]
        target[key] = 2
        with pytest.raises(InputError) as info:
            plan_from_dict(bad, source="plan.json")
        field = key if not where else f"stages[0].{key}" if where == "stages" else f"{where}.{key}"
        assert info.value.field == field and info.value.file == "plan.json"
        assert info.value.message.startswith("unknown field; expected one of ")


def test_missing_optional_fields_are_fine(tmp_path: Path) -> None:
    data = _plan(tmp_path).to_dict()
    for key in ("busy_ms", "staleness", "step_ms"):
        data["predicted"].pop(key, None)
    for key in ("num_stages", "num_microbatches", "virtual_stages", "flush"):
        data["schedule"].pop(key)
    data["topology"] = {}  # no topology: no path
    data.pop("baselines")
    plan = plan_from_dict(data)
    assert plan.predicted is not None and plan.predicted.busy_ms is None
    assert plan.schedule.num_microbatches == 4 and plan.topology.path is None
    data["predicted"], data["solver"] = {}, {}
    bare = plan_from_dict(data)
    assert bare.predicted is None and bare.solver is None
    assert bare.to_dict()["predicted"] == {} == bare.to_dict()["solver"]


def test_a_plans_parts_in_their_file_form_read_as_the_typed_parts(tmp_path: Path) -> None:
    """``Plan(...)`` takes typed parts only; the parts' file form (dicts, as the plan JSON
    holds them) is read by ``plan_from_dict`` with the checks of a plan file, into the plan
    built from typed parts."""
    typed = _plan(tmp_path)
    stages = parse_stages("0-1:gpu0;2-3:gpu1")
    result = simulate(synthetic_profile(4), None, stages, "1f1b", 4)
    path = str(tmp_path / "p.json")
    data = {
        "schema": "pipeplan.plan/v1",
        "profile": {"path": path, "sha256": sha256_file(path)},
        "topology": {"path": None, "sha256": None},
        "microbatch_size": result.microbatch_size,
        "num_microbatches": result.num_microbatches,
        "stages": [s.to_dict() for s in stages],
        "schedule": result.schedule.to_dict(),
        "predicted": result.predicted(),
        "solver": {"method": "manual", "status": "given", "seconds": 0.0, "gap": None},
    }
    legacy = plan_from_dict(data)
    assert isinstance(legacy.predicted, Prediction) and isinstance(legacy.schedule, Schedule)
    assert legacy.profile == typed.profile and legacy.solver == typed.solver
    assert legacy.schedule.to_dict() == typed.schedule.to_dict()
    assert typed.predicted is not None and legacy.predicted is not None
    assert legacy.predicted.iteration_ms == pytest.approx(typed.predicted.iteration_ms, abs=1e-6)
    with pytest.raises(InputError, match="predicted.samples_per_s"):
        plan_from_dict({**data, "predicted": {"iteration_ms": 1.0}})


def test_a_plan_built_in_memory_is_checked_as_a_file_is() -> None:
    """``Plan(...)`` takes a Schedule object as it is; ``validate`` (which ``run_plan``
    calls on such a plan before anything starts) refuses what ``Plan.load`` would."""
    from planner.runtime import run_plan

    stages = parse_stages("0-1:gpu0;2-3:gpu1")
    wrong_m = build_schedule("1f1b", stages, 2)
    plan = Plan(FileRef("<memory>", ""), FileRef(None), 2, 4, stages, wrong_m)
    for check in (plan.validate, lambda: run_plan(plan, "never-loaded.py")):
        with pytest.raises(InputError) as info:
            check()
        assert info.value.field == "schedule.num_microbatches"

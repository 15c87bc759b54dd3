"""``pipeplan export``: plans as torch.distributed.pipelining and torchtitan configurations.

The exported schedules are read back with torch's own parser and validator, and run with
torch's ``_PipelineScheduleRuntime`` on two CPU processes (gloo) through the exported
``train_pipeline.py``: losses and parameters equal ``pipeplan run`` of the same plan and
single-process training. Refusals are one line, exit 2.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from families import SYNCHRONOUS, partition
from test_runtime import hard_timeout_after
from torch.distributed.pipelining.schedules import (
    _Action,
    _add_send_recv,
    _simulate_comms_compute,
    _validate_schedule,
)

from planner.cli import main
from planner.errors import InputError
from planner.export import export_plan, stale_files
from planner.export.actions import torch_cell, torch_layout
from planner.export.split import layer_modules, titan_module
from planner.fileio import sha256_file
from planner.plan import FileRef, Plan, StageSpec, parse_stages
from planner.runtime import run_plan
from planner.runtime.launch import free_port, worker_env
from planner.runtime.reference import train_single_process
from planner.schedule import Action, Schedule, build_schedule, family

ROOT = Path(__file__).resolve().parents[1]
HARD_TIMEOUT_S = 150


@pytest.fixture(autouse=True)
def hard_timeout() -> Iterator[None]:
    with hard_timeout_after(HARD_TIMEOUT_S):
        yield


def make_plan(
    tmp: Path,
    example: str,
    stages: str,
    schedule: str,
    m: int,
    mbs: int,
    *,
    recompute: tuple[int, ...] = (),
    profile: Path | None = None,
) -> Path:
    """A plan over a bundled example's profile, saved under ``tmp``."""
    prof = profile or ROOT / "profiles" / f"{example}.json"
    specs = parse_stages(stages, recompute=list(recompute))
    plan = Plan(
        profile=FileRef(str(prof), sha256_file(prof)),
        topology=FileRef(None, ""),
        microbatch_size=mbs,
        num_microbatches=m,
        stages=specs,
        schedule=build_schedule(schedule, specs, m),
    )
    path = tmp / f"{example}-{schedule}.json"
    plan.save(path)
    return path


# --- the action mapping, checked with torch's own parser and validator ---------------------


def parse_rows(rows: list[list[str]]) -> dict[int, list[_Action | None]]:
    """CSV rows as torch's ``_load_csv`` reads them."""
    return {r: [_Action.from_str(c) for c in row] for r, row in enumerate(rows)}


def test_cells_are_torch_actions() -> None:
    for text, cell in [
        ("F0.3", "0F3"),
        ("B1.3", "1B3"),
        ("I1.3", "1I3"),
        ("W1.3", "1W3"),
        ("SEND_F0.3->gpu1", "0SEND_F3"),
        ("RECV_F1.3<-gpu0", "1RECV_F3"),
        ("SEND_B1.3->gpu0", "1SEND_B3"),
        ("RECV_B0.3<-gpu1", "0RECV_B3"),
    ]:
        assert torch_cell(Action.parse(text)) == cell
        parsed = _Action.from_str(cell)
        assert (parsed.stage_index, parsed.microbatch_index, str(parsed)) == (
            int(cell[0]),
            int(cell[-1]),
            cell,
        )
    assert torch_cell(Action.parse("STEP0")) is None
    assert torch_cell(Action.parse("ALLREDUCE0")) is None
    assert torch_cell(Action.parse("F0.5"), replicas=2) == "0F2"


def _layouts() -> list[tuple[str, str, int]]:
    """Every synchronous family (what export takes) on a few partitions it can run."""
    cases = []
    for name in SYNCHRONOUS:
        if family(name).interleaved:
            cases.append((name, partition(name, ["0", "1", "2-3", "4-5"], ["a", "b"]), 4))
            continue
        for stages, m in (("0-1:a;2-3:b;4-5:c", 4), ("0-1:a;2-3:b;4-5:c", 6), ("0-2:a;3-5:b", 5)):
            cases.append((name, stages, m))
    return cases


@pytest.mark.parametrize(("schedule", "stages", "m"), _layouts())
def test_layout_passes_torch_validation(schedule: str, stages: str, m: int) -> None:
    specs = parse_stages(stages)
    sched = build_schedule(schedule, specs, m)
    layout = torch_layout(specs, sched)
    assert layout.dp_degree == 1 and layout.microbatches_per_replica == m
    compute = parse_rows(layout.compute_rows[0])
    mapping = _validate_schedule(compute, layout.pp_degree, len(specs), m)
    assert [mapping[s] for s in range(len(specs))] == layout.stage_to_rank
    comms = parse_rows(layout.rows[0])
    # torch's own lowering of the compute-only rows (torchtitan's path) finds an order
    lowered = _add_send_recv(dict(compute), lambda s: mapping[s], len(specs))  # type: ignore[arg-type]
    assert sum(len(v) for v in lowered.values()) == sum(len(v) for v in comms.values())
    # torch's simulator of a compute+comms schedule: every action runs, none deadlocks
    done = _simulate_comms_compute(comms, lambda s: layout.stage_to_rank[s], len(specs))
    assert sum(len(v) for v in comms.values()) <= sum(len(v) for v in done.values())
    # the order is the plan's: compute cells in the plan's device order
    for dev, acts in sched.devices.items():
        r = layout.stage_to_rank[next(a.stage for a in acts)]
        want = [torch_cell(a) for a in acts if a.is_compute]
        assert layout.compute_rows[0][r] == want, dev


def test_uniform_replicas_are_a_data_parallel_dimension() -> None:
    specs = parse_stages("0-2:a0,a1;3-5:b0,b1")
    sched = build_schedule("1f1b", specs, 8)
    layout = torch_layout(specs, sched)
    assert (layout.pp_degree, layout.dp_degree, layout.microbatches_per_replica) == (2, 2, 4)
    for j in range(2):
        _validate_schedule(parse_rows(layout.compute_rows[j]), 2, 2, 4)
    uneven = parse_stages("0-2:a0,a1;3-5:b0")
    with pytest.raises(InputError, match="heterogeneous replica counts"):
        torch_layout(uneven, build_schedule("1f1b", uneven, 4))


def test_tensor_parallel_groups_are_a_mesh_dimension() -> None:
    """TP2 x DP2 x PP2: every member of a group runs its leader's row; ranks are numbered
    in torchtitan's (pp, dp, tp) order; FSDP stages gain torch's UNSHARD, REDUCE_GRAD and
    RESHARD cells around their compute; a member with another order is refused."""
    specs = [
        replace(s, sharding="fsdp" if s.id == 1 else "zero1")
        for s in parse_stages("0-2:a0+a1,a2+a3;3-5:b0+b1,b2+b3")
    ]
    sched = build_schedule("1f1b", specs, 4)
    layout = torch_layout(specs, sched)
    assert (layout.pp_degree, layout.dp_degree, layout.tp_degree, layout.world_size) == (
        2, 2, 2, 8,
    )  # fmt: skip
    assert layout.devices == [[["a0", "a1"], ["a2", "a3"]], [["b0", "b1"], ["b2", "b3"]]]
    assert [layout.coordinates(r) for r in (0, 1, 2, 5)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1),
    ]  # fmt: skip
    assert all(layout.rank(*layout.coordinates(r)) == r for r in range(8))
    for j in range(2):
        _validate_schedule(parse_rows(layout.compute_rows[j]), 2, 2, 2)
    row = layout.rows[0][1]  # stage 1 (fsdp): gathered once, reduced after its last backward
    assert row[:3] == ["1RECV_F0", "1UNSHARD", "1F0"] and row[-3:-1] == ["1REDUCE_GRAD", "1RESHARD"]
    assert all(_Action.from_str(c) is not None for c in row)
    assert not any("UNSHARD" in c for c in layout.rows[0][0])  # zero1: no FSDP cells
    swapped = dict(sched.devices)
    swapped["a1"] = [*swapped["a1"][1:2], swapped["a1"][0], *swapped["a1"][2:]]
    reordered = Schedule("1f1b", 2, 4, swapped)
    with pytest.raises(InputError, match="device a1 runs another order of actions than a0"):
        torch_layout(specs, reordered)


def test_names_from_layer_names() -> None:
    assert layer_modules("norm+output") == ["norm", "output"]
    assert layer_modules("layer7") == []
    assert layer_modules("a+...+z") is None
    assert layer_modules("blocks.1#2") == ["blocks.1"]
    assert titan_module("layers.3.attention") == "layers.3"
    assert titan_module("embed.tok") == "embed"


# --- files, CLI and refusals -----------------------------------------------------------------


def test_export_torch_files(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 2)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(plan), "--to", "torch", "-o", str(out), "--model", "examples/gpt.py"])
    assert exit_.value.code == 0
    cfg = json.loads((out / "pipeline.json").read_text())
    assert cfg["split_points"] == ["blocks.2"]
    assert [s["modules"] for s in cfg["stages"]] == [
        ["embed", "blocks.0", "blocks.1"],
        ["blocks.2", "blocks.3", "head"],
    ]
    assert (cfg["pp_degree"], cfg["microbatch_size"], cfg["num_microbatches"]) == (2, 2, 4)
    rows = (out / "schedule.csv").read_text().splitlines()
    assert rows[0].split(",")[:4] == ["0F0", "0SEND_F0", "0F1", "0SEND_F1"]
    assert rows[1].split(",")[:4] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]
    assert (out / "train_pipeline.py").is_file()


def test_export_torchtitan_toml(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "gpt", "0-1:cpu0;2-3:cpu1;4:cpu0;5:cpu1", "interleaved", 4, 2)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    result = export_plan(plan, "torchtitan", tmp_path / "titan")
    data = tomllib.loads((result.out_dir / "torchtitan.toml").read_text())
    par = data["parallelism"]
    assert par["pipeline_parallel_degree"] == 2
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 2
    assert par["module_fqns_per_model_part"] == [
        ["embed", "blocks.0"],
        ["blocks.1", "blocks.2"],
        ["blocks.3"],
        ["head"],
    ]
    assert data["training"]["local_batch_size"] == 8
    assert data["training"]["mixed_precision_param"] == "float32"  # fp32 as planned
    rows = Path(par["pipeline_parallel_schedule_csv"]).read_text().splitlines()
    assert all("SEND" not in r and "RECV" not in r for r in rows)  # torchtitan lowers comms
    assert rows[0].startswith("0F0,0F1,")
    assert not any("earlier export" in note for note in result.notes)
    # the torch export into the same folder names torchtitan's files left there
    again = export_plan(plan, "torch", tmp_path / "titan")
    assert again.notes[-1] == (
        f"{tmp_path / 'titan'} also holds torchtitan.toml, torchtitan_config.py from an earlier "
        "export (not part of this one): remove them"
    )


def test_stale_files_are_an_earlier_exports_names_not_written_now(tmp_path: Path) -> None:
    """What this export wrote is not named, however its path is spelled; an earlier
    export's per-replica schedules, single schedule and torchtitan files are; other files,
    folders and files in subfolders are not."""
    written = [
        "schedule-dp0.csv",
        "schedule-dp1.csv",
        "schedule_compute-dp0.csv",
        "schedule_compute-dp1.csv",
        "pipeline.json",
        "train_pipeline.py",
    ]
    stale = [
        "schedule-dp2.csv",
        "schedule_compute-dp2.csv",
        "schedule.csv",
        "torchtitan.toml",
        "torchtitan_config.py",
    ]
    unrelated = ["notes.txt", "schedule-dp2.csv.bak", "my-schedule.csv", "pipeline.yaml"]
    for name in written + stale + unrelated:
        (tmp_path / name).write_text("x")
    (tmp_path / "schedule-dp3.csv").mkdir()  # a folder, not a file
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "schedule-dp4.csv").write_text("x")  # not in the folder itself
    spelled = [tmp_path / "old" / ".." / n for n in written[:2]] + [
        tmp_path / n for n in written[2:]
    ]
    assert stale_files(tmp_path, spelled) == sorted(tmp_path / n for n in stale)
    assert stale_files(tmp_path / "old", []) == [tmp_path / "old" / "schedule-dp4.csv"]


def test_an_export_with_fewer_replicas_names_the_replicas_left(tmp_path: Path) -> None:
    """DP3 exported (the command line), then DP2 into the same folder: the note names the
    third replica's two schedules, and nothing this export wrote."""
    three = make_plan(tmp_path, "mlp", "0-2:cpu0,cpu2,cpu4;3-5:cpu1,cpu3,cpu5", "1f1b", 6, 8)
    (tmp_path / "two").mkdir()
    two = make_plan(tmp_path / "two", "mlp", "0-2:cpu0,cpu2;3-5:cpu1,cpu3", "1f1b", 4, 8)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(three), "--to", "torch", "-o", str(out)])
    assert exit_.value.code == 0
    assert (out / "schedule-dp2.csv").is_file()
    result = export_plan(two, "torch", out)
    assert result.dp_degree == 2
    assert result.notes[-1] == (
        f"{out} also holds schedule-dp2.csv, schedule_compute-dp2.csv from an earlier "
        "export (not part of this one): remove them"
    )


@pytest.mark.parametrize(
    ("stages", "schedule", "recompute", "match"),
    [
        ("0-2:cpu0;3-5:cpu1", "2bw", (), "2bw"),
        ("0-2:cpu0;3-5:cpu1", "zb", (0,), "recompute"),
        ("0-2:cpu0,cpu2;3-5:cpu1", "1f1b", (), "heterogeneous replica counts"),
        ("0-1:cpu0;2:cpu1;3-5:cpu2", "1f1b", (), "calls no module"),
    ],
)
def test_refusals_are_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stages: str,
    schedule: str,
    recompute: tuple[int, ...],
    match: str,
) -> None:
    example = "cnn" if "calls no module" in match else "mlp"
    plan = make_plan(tmp_path, example, stages, schedule, 4, 2, recompute=recompute)
    if "calls no module" in match:  # a layer that calls no module: rename one in a profile copy
        prof = json.loads((ROOT / "profiles" / "cnn.json").read_text())
        prof["layers"][2]["name"] = "layer2"
        path = tmp_path / "renamed.json"
        path.write_text(json.dumps(prof))
        plan = make_plan(tmp_path, example, stages, schedule, 4, 2, profile=path)
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(plan), "--to", "torch", "-o", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and match in err and len(err.strip().splitlines()) == 1


def test_tied_fp16_pipedream_and_bad_input_refused(tmp_path: Path) -> None:
    base = json.loads((ROOT / "profiles" / "mlp.json").read_text())
    tie = {"name": "0.linear.weight", "layers": [0, 5], "param_count": 1, "param_bytes": 4}
    tied = dict(base, tied_parameters=[tie])
    for name, data, match in [
        ("tied", tied, "tied across stages"),
        ("fp16", dict(base, precision="fp16"), "precision fp16"),
    ]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        plan = make_plan(tmp_path, "mlp", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 2, profile=path)
        with pytest.raises(InputError, match=match):
            export_plan(plan, "torch", tmp_path / name)
    vgg = make_plan(tmp_path, "pipedream-vgg16", "0-20:g0;21-40:g1", "1f1b", 4, 1)
    with pytest.raises(InputError, match="imported from PipeDream"):
        export_plan(vgg, "torch", tmp_path / "vgg")
    recomputed = make_plan(tmp_path, "mlp", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 2, recompute=(1,))
    with pytest.raises(InputError, match="activation checkpointing is one setting"):
        export_plan(recomputed, "torchtitan", tmp_path / "r")
    ok = make_plan(tmp_path, "mlp", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 2)
    with pytest.raises(InputError, match="unknown target"):
        export_plan(ok, "deepspeed", tmp_path / "d")
    with pytest.raises(InputError, match="does not exist"):
        export_plan(tmp_path / "nope.json", "torch")
    with pytest.raises(InputError, match="not the one profiled"):
        export_plan(ok, "torch", tmp_path / "m", model=ROOT / "examples" / "gpt.py")


# --- the exported schedule trains exactly like pipeplan run and one process -----------------


def run_exported(out: Path, world: int, steps: int, *extra: str) -> dict[str, torch.Tensor]:
    """Start ``train_pipeline.py`` as torchrun would (RANK, WORLD_SIZE, MASTER_*)."""
    port = free_port()
    prefix = out / "params"
    procs = []
    for rank in range(world):
        env = dict(
            worker_env(),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        cmd = [sys.executable, str(out / "train_pipeline.py"), "--steps", str(steps)]
        cmd += ["--optimizer", "momentum", "--lr", "0.05", "--save-params", str(prefix), *extra]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p in procs:  # every rank's errors: the first to fail may not be the first rank
        assert p.returncode == 0, "\n".join(err.decode()[-3000:] for _, err in outputs)
    losses = [
        float(line.split()[-1])
        for stdout, _ in outputs
        for line in stdout.decode().splitlines()
        if line.startswith("step ")
    ]
    held = [  # rank R (...): holds L of W parameter elements, optimizer state for S
        [int(w.strip(":,()")) for w in line.split() if w.strip(":,()").isdigit()]
        for stdout, _ in outputs
        for line in stdout.decode().splitlines()
        if line.startswith("rank ")
    ]
    params: dict[str, torch.Tensor] = {}
    for f in sorted(glob.glob(f"{prefix}.rank*.pt")):
        params.update(torch.load(f))
    params["__losses__"] = torch.tensor(losses, dtype=torch.float64)
    params["__held__"] = torch.tensor(sorted(held))  # rank, pp, dp, tp, local, whole, state
    return params


def check_same(
    got: dict[str, torch.Tensor], losses: list[float], params: dict[str, torch.Tensor]
) -> None:
    assert got["__losses__"].tolist() == pytest.approx(losses, rel=1e-5, abs=1e-7)
    assert set(got) - {"__losses__", "__held__"} == set(params)
    for name, value in params.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("example", "stages", "schedule", "m", "mbs", "options"),
    [
        # compute-only rows, torch adding the communication: what torchtitan loads
        ("mlp", "0-2:cpu0;3-5:cpu1", "gpipe", 4, 8, ("--csv", "compute")),
        ("gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 1, ()),  # stage 0 recomputed
        ("mlp", "0:cpu0;1-2:cpu1;3:cpu0;4-5:cpu1", "interleaved", 4, 8, ()),
        ("mlp", "0-3:cpu0;4-5:cpu1", "zb", 3, 8, ("--split", "torch")),  # torch's pipeline()
    ],
)
def test_exported_schedule_trains_like_pipeplan_run(
    tmp_path: Path,
    example: str,
    stages: str,
    schedule: str,
    m: int,
    mbs: int,
    options: tuple[str, ...],
) -> None:
    """Profiled microbatch sizes (run compares with the profile's prediction)."""
    steps = 2
    recompute = (0,) if example == "gpt" else ()
    plan = make_plan(tmp_path, example, stages, schedule, m, mbs, recompute=recompute)
    model = ROOT / "examples" / f"{example}.py"
    result = export_plan(plan, "torch", tmp_path / "out", model=model)
    cfg = json.loads((result.out_dir / "pipeline.json").read_text())
    assert [s["recompute"] for s in cfg["stages"]] == [
        s.id in recompute for s in Plan.load(plan).stages
    ]
    got = run_exported(result.out_dir, result.world_size, steps, *options)
    batch = mbs * m
    ref = train_single_process(model, steps=steps, batch_size=batch, optimizer="momentum", lr=0.05)
    check_same(got, ref.losses, ref.parameters)
    report = run_plan(
        plan, model, steps=steps, warmup=0, timeout_s=60, threads=1, optimizer="momentum",
        lr=0.05, return_params=True,
    )  # fmt: skip
    assert report.parameters is not None
    check_same(got, report.losses, report.parameters)
    initial = train_single_process(model, steps=0, batch_size=mbs * m).parameters
    assert all(not torch.equal(initial[n], got[n]) for n in initial)  # it trained


def test_bf16_each_layer_checkpointed_exports_and_trains_like_pipeplan_run(
    tmp_path: Path,
) -> None:
    """bf16 (autocast around each stage's forward and the loss, as pipeplan run trains)
    with every layer under its own checkpoint (recompute_layers): the exported script
    equals pipeplan run, and differs from fp32 training (autocast is really on)."""
    base = json.loads((ROOT / "profiles" / "gpt.json").read_text())
    bf16 = tmp_path / "gpt-bf16.json"
    bf16.write_text(json.dumps(dict(base, precision="bf16")))
    model = ROOT / "examples" / "gpt.py"
    path = make_plan(
        tmp_path, "gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 1, recompute=(0, 1), profile=bf16
    )
    plan = Plan.load(path)
    replace(plan, stages=[st.with_recompute(True, layers=True) for st in plan.stages]).save(path)
    result = export_plan(path, "torch", tmp_path / "out", model=model)
    cfg = json.loads((result.out_dir / "pipeline.json").read_text())
    assert cfg["precision"] == "bf16"
    assert [s["recompute_layers"] for s in cfg["stages"]] == [True, True]
    got = run_exported(result.out_dir, result.world_size, 2)
    report = run_plan(
        path, model, steps=2, warmup=0, timeout_s=60, threads=1, optimizer="momentum",
        lr=0.05, return_params=True,
    )  # fmt: skip
    assert report.parameters is not None
    check_same(got, report.losses, report.parameters)
    fp32 = train_single_process(model, steps=2, batch_size=4, optimizer="momentum", lr=0.05)
    assert got["__losses__"].tolist() != pytest.approx(fp32.losses, rel=1e-5, abs=1e-7)
    with pytest.raises(InputError, match="torchtitan's mixed precision"):
        export_plan(path, "torchtitan", tmp_path / "titan")


def test_torchtitan_checkpoints_every_block_when_every_stage_checkpoints_each_layer(
    tmp_path: Path,
) -> None:
    path = make_plan(tmp_path, "gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 1, recompute=(0, 1))
    plan = Plan.load(path)
    replace(plan, stages=[st.with_recompute(True, layers=True) for st in plan.stages]).save(path)
    toml = export_plan(path, "torchtitan", tmp_path / "titan").out_dir / "torchtitan.toml"
    assert 'mode = "full"' in toml.read_text()
    plan.save(path)  # one checkpoint per stage
    with pytest.raises(InputError, match="stage 0 checkpoints as a whole"):
        export_plan(path, "torchtitan", tmp_path / "titan2")
    half = replace(
        plan,
        stages=[
            plan.stages[0].with_recompute(True, layers=True),
            plan.stages[1].with_recompute(False),
        ],
    )
    half.save(path)
    with pytest.raises(InputError, match="stage 1 recomputes nothing"):
        export_plan(path, "torchtitan", tmp_path / "titan3")


def test_replicated_stages_train_as_a_data_parallel_dimension(tmp_path: Path) -> None:
    """Every stage on two replicas: two pipelines of two ranks, gradients summed over the
    data-parallel group (the plan's ALLREDUCE), the same as one process."""
    plan = make_plan(tmp_path, "mlp", "0-2:cpu0,cpu2;3-5:cpu1,cpu3", "1f1b", 4, 8)
    model = ROOT / "examples" / "mlp.py"
    result = export_plan(plan, "torch", tmp_path / "out", model=model)
    assert (result.pp_degree, result.dp_degree) == (2, 2)
    got = run_exported(result.out_dir, result.world_size, 2)
    ref = train_single_process(model, steps=2, batch_size=32, optimizer="momentum", lr=0.05)
    check_same(got, ref.losses, ref.parameters)


def renamed_profile(tmp: Path, names: dict[int, str]) -> Path:
    """A copy of the gpt profile with some layers renamed."""
    prof = json.loads((ROOT / "profiles" / "gpt.json").read_text())
    for i, name in names.items():
        prof["layers"][i]["name"] = name
    path = tmp / "gpt-renamed.json"
    path.write_text(json.dumps(prof))
    return path


def test_torchtitan_refuses_what_its_splitter_cannot_keep(tmp_path: Path) -> None:
    shared = renamed_profile(tmp_path, {0: "embed.tok", 1: "embed.pos"})
    plan = make_plan(tmp_path, "gpt", "0:cpu0;1-5:cpu1", "1f1b", 4, 1, profile=shared)
    with pytest.raises(InputError, match="module 'embed' would belong to stages 0 and 1"):
        export_plan(plan, "torchtitan", tmp_path / "t1")
    export_plan(plan, "torch", tmp_path / "t2")  # torch's split points need no module lists
    cfg = json.loads((tmp_path / "t2" / "pipeline.json").read_text())
    assert cfg["split_points"] == ["embed.pos"]
    abbreviated = renamed_profile(tmp_path, {3: "blocks.2+...+blocks.9"})
    plan = make_plan(tmp_path, "gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 1, profile=abbreviated)
    with pytest.raises(InputError, match="abbreviate their modules"):
        export_plan(plan, "torchtitan", tmp_path / "t3")
    cfg = json.loads(
        (export_plan(plan, "torch", tmp_path / "t4").out_dir / "pipeline.json").read_text()
    )
    assert cfg["split_points"] == ["blocks.2"] and cfg["stages"][1]["modules"] is None


def test_a_hugging_face_llama_exports_to_torchtitan_under_its_llama3_names(
    tmp_path: Path,
) -> None:
    """transformers nests the layers under ``model``; torchtitan's Llama 3 keeps them at the
    top (its Llama3StateDictAdapter maps the weights the same way): the plan's stages are
    written with torchtitan's names, the rotary embedding (no module there) left out."""
    names = {0: "model.embed_tokens+model.rotary_emb", 5: "model.norm+lm_head"}
    names.update({i: f"model.layers.{i - 1}" for i in range(1, 5)})
    llama = renamed_profile(tmp_path, names)
    plan = make_plan(tmp_path, "gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 1, profile=llama)
    toml = (export_plan(plan, "torchtitan", tmp_path / "t").out_dir / "torchtitan.toml").read_text()
    parts = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "output"]]
    assert f"module_fqns_per_model_part = {json.dumps(parts)}" in toml
    assert "torchtitan's llama3 names them" in toml
    # Another nesting (GPT-2's transformer.h.N) has no such names: refused as before.
    gpt2 = renamed_profile(
        tmp_path, {1: "transformer.h.0", 2: "transformer.h.1", 0: "transformer.wte"}
    )
    plan = make_plan(tmp_path, "gpt", "0-1:cpu0;2-5:cpu1", "1f1b", 4, 1, profile=gpt2)
    with pytest.raises(InputError, match="module 'transformer' would belong"):
        export_plan(plan, "torchtitan", tmp_path / "t2")


def test_hugging_face_model_exports_and_trains_like_one_process(tmp_path: Path) -> None:
    """A Hugging Face model's last stage returns a ModelOutput, which torch's PipelineStage
    does not take: the exported stage gives its ``.logits`` (what the loss reads)."""
    pytest.importorskip("transformers")
    from planner.profile.measure import profile_model

    model = ROOT / "examples" / "hf_llama.py"
    prof = tmp_path / "hf_llama.json"
    profile_model(model, [2], repeat=1, warmup=0, min_time_s=0, optimizer="momentum").save(prof)
    plan = make_plan(tmp_path, "hf_llama", "0-2:cpu0;3-6:cpu1", "1f1b", 2, 2, profile=prof)
    result = export_plan(plan, "torch", tmp_path / "out", model=model)
    got = run_exported(result.out_dir, result.world_size, 2)
    ref = train_single_process(model, steps=2, batch_size=4, optimizer="momentum", lr=0.05)
    check_same(got, ref.losses, ref.parameters)


@pytest.fixture(scope="module")
def cat_skip_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from planner.profile.measure import profile_model

    path = tmp_path_factory.mktemp("cat") / "cat_skip.json"
    profile_model(CAT_SKIP, [2], repeat=1, warmup=0, min_time_s=0, optimizer="momentum").save(path)
    return path


CAT_SKIP = ROOT / "tests" / "models" / "cat_skip.py"


@pytest.mark.parametrize(
    ("stages", "schedule", "recompute"),
    [
        # No GPipe case: the exported script runs every family through the same
        # _PipelineScheduleRuntime and stage code, rows in another order; GPipe's full
        # backward over a cat's slice is the interleaved case's cuts 0|1 and 2|3.
        ("0-3:cpu0;4-5:cpu1", "1f1b", ()),
        ("0-2:cpu0;3-5:cpu1", "1f1b", (1,)),  # recomputed: checkpoint's backward
        ("0:cpu0;1-2:cpu1;3:cpu0;4-5:cpu1", "interleaved", ()),
        ("0-4:cpu0;5:cpu1", "zb", ()),
    ],
)
def test_gradients_crossing_a_cut_as_slices_train_like_one_process(
    tmp_path: Path, cat_skip_profile: Path, stages: str, schedule: str, recompute: tuple[int, ...]
) -> None:
    """Every stage input is used through torch.cat or a view, so its gradient is a strided
    slice; torch's PipelineStage sent it as it was and the previous stage allocated its
    receive buffer with those strides: gloo refused ("input tensor has to be contiguous")
    on every pipelined plan of such a model, which pipeplan run trained exactly."""
    m, mbs = 4, 2
    plan = make_plan(
        tmp_path, "cat_skip", stages, schedule, m, mbs, recompute=recompute,
        profile=cat_skip_profile,
    )  # fmt: skip
    result = export_plan(plan, "torch", tmp_path / "out", model=CAT_SKIP)
    got = run_exported(result.out_dir, result.world_size, 2)
    ref = train_single_process(CAT_SKIP, steps=2, batch_size=m * mbs, optimizer="momentum", lr=0.05)
    check_same(got, ref.losses, ref.parameters)
    if schedule == "interleaved":  # ... and equal to pipeplan run of the same plan
        report = run_plan(
            plan, CAT_SKIP, steps=2, warmup=0, timeout_s=60, threads=1, optimizer="momentum",
            lr=0.05, return_params=True,
        )  # fmt: skip
        assert report.parameters is not None
        check_same(got, report.losses, report.parameters)


# --- tensor, sequence and sharded data parallelism ---------------------------------------------


@pytest.mark.parametrize(
    ("example", "stages", "schedule", "sequence_parallel", "sharding"),
    [
        ("gpt", "0-2:cpu0+cpu1;3-5:cpu2+cpu3", "1f1b", True, ()),  # TP2 x PP2, SP
        # PP2 x DP2, two stages a rank: ZeRO-1 on one rank, FSDP on the other
        ("mlp", "0:a,c;1-2:b,d;3:a,c;4-5:b,d", "interleaved", False, ("zero1", "fsdp")),
    ],
)
def test_parallel_plans_train_like_one_process(
    tmp_path: Path,
    example: str,
    stages: str,
    schedule: str,
    sequence_parallel: bool,
    sharding: tuple[str, ...],
) -> None:
    """Each rank builds its tensor-parallel shard with the profiler's build_shard on the
    mesh's tp dimension, and each stage's replicas sum their gradients, or shard the
    optimizer (ZeRO-1) or everything (torch's fully_shard) over its dp dimension: losses
    and every parameter element (``full_tensor()``) equal to one process."""
    m, mbs, steps = 4, 2, 2
    specs = [
        replace(s, sequence_parallel=sequence_parallel, sharding=sharding[s.id % len(sharding)])
        if sharding
        else replace(s, sequence_parallel=sequence_parallel)
        for s in parse_stages(stages)
    ]
    path = make_plan(tmp_path, example, stages, schedule, m, mbs)
    plan = Plan.load(path)
    plan = replace(plan, stages=specs, schedule=build_schedule(schedule, specs, m))
    plan.save(path)
    model = ROOT / "examples" / f"{example}.py"
    result = export_plan(path, "torch", tmp_path / "out", model=model)
    cfg = json.loads((result.out_dir / "pipeline.json").read_text())
    assert cfg["mesh"]["dim_names"] == ["pp", "dp", "tp"]
    assert cfg["mesh"]["shape"] == [result.pp_degree, result.dp_degree, result.tp_degree]
    assert [s["sharding"] for s in cfg["stages"]] == [s.sharding for s in specs]
    got = run_exported(result.out_dir, result.world_size, steps)
    ref = train_single_process(
        model, steps=steps, batch_size=m * mbs, optimizer="momentum", lr=0.05
    )
    check_same(got, ref.losses, ref.parameters)
    check_held(got["__held__"].tolist(), specs)


def check_held(held: list[list[int]], specs: list[StageSpec]) -> None:
    """Each rank's line ``holds L of W parameter elements, optimizer state for S``: a
    tensor-parallel or FSDP stage holds less than its whole, a ZeRO-1 stage's replicas
    split its optimizer state (one stage per pipeline rank here)."""
    zero_state: dict[tuple[int, int], int] = {}
    for _, pp, _, tp, local, whole, state in held:
        spec = specs[pp]
        sharded = spec.tensor_parallel > 1 or spec.sharding == "fsdp"
        assert local < whole if sharded else local == whole
        if spec.sharding == "zero1":
            assert 0 < state < local
            zero_state[(pp, tp)] = zero_state.get((pp, tp), 0) + state
            assert zero_state[(pp, tp)] <= local
        else:
            assert state == local
    for (pp, tp), total in zero_state.items():  # every element's state on one replica
        assert total == next(h[4] for h in held if (h[1], h[3]) == (pp, tp))


def test_tensor_parallel_plan_the_model_cannot_split_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/gpt.py has 4 heads: a group of 8 cannot split them; refused before any
    file is written, with one line naming the model file."""
    devices = "+".join(f"cpu{i}" for i in range(8))
    path = make_plan(tmp_path, "gpt", "0-5:cpu0", "1f1b", 2, 1)
    plan = Plan.load(path)
    specs = parse_stages(f"0-5:{devices}")
    replace(plan, stages=specs, schedule=build_schedule("1f1b", specs, 2)).save(path)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(path), "--to", "torch", "-o", str(out), "--model", "examples/gpt.py"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "stages[0].tensor_parallel" in err and "4 attention heads" in err and "gpt.py" in err
    assert not out.exists()
    export_plan(path, "torch", out)  # without --model nothing checks the model: the script will


def parallel_plan(
    tmp: Path, stages: str, sequence_parallel: bool, sharding: tuple[str, ...]
) -> Path:
    """A 1f1b plan over the gpt profile with the stages' parallel settings."""
    specs = [
        replace(s, sequence_parallel=sequence_parallel, sharding=sharding[s.id % len(sharding)])
        for s in parse_stages(stages)
    ]
    path = make_plan(tmp, "gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 1)
    plan = Plan.load(path)
    replace(plan, stages=specs, schedule=build_schedule("1f1b", specs, 4)).save(path)
    return path


@pytest.mark.parametrize("target", ["torch", "torchtitan"])
def test_a_plan_of_mixed_degrees_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """Stages of different tensor-parallel degrees (issue #22) run under `pipeplan run`;
    the exported scripts build one DeviceMesh of pp x dp x tp, so export refuses them."""
    path = parallel_plan(tmp_path, "0-2:cpu0+cpu1;3-5:cpu2", False, ("none",))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(path), "--to", target, "-o", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{path}: stages" in err and "stage 0: 2, stage 1: 1" in err
    assert "one DeviceMesh of pp x dp x tp" in err and not out.exists()


def test_torchtitan_tensor_parallel_and_fsdp_fields(tmp_path: Path) -> None:
    """TP2 x PP2 x DP2 with sequence parallelism and FSDP: torchtitan's degrees, read back;
    what torchtitan cannot express is refused with one line naming the stage's field."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    tp_dp = "0-2:cpu0+cpu1,cpu4+cpu5;3-5:cpu2+cpu3,cpu6+cpu7"
    plan = parallel_plan(tmp_path, tp_dp, True, ("fsdp",))
    result = export_plan(plan, "torchtitan", tmp_path / "titan")
    par = tomllib.loads((result.out_dir / "torchtitan.toml").read_text())["parallelism"]
    assert (par["pipeline_parallel_degree"], par["tensor_parallel_degree"]) == (2, 2)
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 2)
    assert result.world_size == 8
    for stages, sp, sharding, match in [
        (tp_dp, True, ("zero1",), r"stages\[0\].sharding: torchtitan has no ZeRO-1"),
        (tp_dp, True, ("fsdp", "none"), r"stages\[1\]: stage 1 has .* one setting"),
        ("0-2:cpu0,cpu2;3-5:cpu1,cpu3", False, ("none",), "DDP has not supported"),
    ]:
        with pytest.raises(InputError, match=match) as refused:
            export_plan(parallel_plan(tmp_path, stages, sp, sharding), "torchtitan", tmp_path / "x")
        assert "\n" not in str(refused.value)
    assert not (tmp_path / "x").exists()


def test_torchtitan_tensor_parallel_without_sequence_parallel_is_03_only(tmp_path: Path) -> None:
    """torchtitan 0.2.x has sequence parallelism on with every TP degree; 0.3's
    ``enable_sequence_parallel`` turns it off: only ``torchtitan_config.py`` is written, and
    the note says why."""
    from planner.export.source import load_export_source
    from planner.export.torchtitan import titan_fields, titan_toml

    plan = parallel_plan(
        tmp_path, "0-2:cpu0+cpu1,cpu4+cpu5;3-5:cpu2+cpu3,cpu6+cpu7", False, ("fsdp",)
    )
    result = export_plan(plan, "torchtitan", tmp_path / "titan")
    assert not (result.out_dir / "torchtitan.toml").exists()
    par, _ = _titan_python_fields(result.out_dir / "torchtitan_config.py")
    assert (par["tensor_parallel_degree"], par["enable_sequence_parallel"]) == (2, False)
    assert any("no torchtitan.toml" in note for note in result.notes)
    with pytest.raises(InputError, match=r"stages\[0\].sequence_parallel: torchtitan 0.2.x"):
        titan_toml(titan_fields(load_export_source(plan), csv_path="x.csv"))


def _titan_python_fields(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ParallelismConfig keywords and the other assignments of torchtitan_config.py."""
    import ast

    tree = ast.parse(path.read_text())
    par: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ParallelismConfig":
            par = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            target = ast.unparse(node.targets[0])
            if target.startswith("config.") and target != "config.parallelism":
                other[target] = ast.unparse(node.value)
    return par, other


def test_torchtitan_03_config_says_what_the_toml_says(tmp_path: Path) -> None:
    """torchtitan 0.3's Python config (torchtitan_config.py) sets the same degrees, order,
    modules and batch as the 0.2.x TOML beside it, and what 0.3 adds (no CUDA graphs under
    pipelining, sequence parallelism spelled out)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    tp_dp = "0-2:cpu0+cpu1,cpu4+cpu5;3-5:cpu2+cpu3,cpu6+cpu7"
    for plan in (
        parallel_plan(tmp_path, tp_dp, True, ("fsdp",)),
        make_plan(tmp_path, "gpt", "0-1:cpu0;2-3:cpu1;4:cpu0;5:cpu1", "interleaved", 4, 2),
    ):
        out = export_plan(plan, "torchtitan", tmp_path / f"t-{Path(plan).stem}").out_dir
        toml = tomllib.loads((out / "torchtitan.toml").read_text())
        par, other = _titan_python_fields(out / "torchtitan_config.py")
        # The TP plan has sequence parallelism; the other has no TP, and no SP either.
        assert par.pop("enable_sequence_parallel") is (
            toml["parallelism"]["tensor_parallel_degree"] > 1
        )
        assert par == toml["parallelism"]
        assert other == {
            "config.training.local_batch_size": str(toml["training"]["local_batch_size"]),
            "config.training.mixed_precision_param": repr(
                toml["training"]["mixed_precision_param"]
            ),
            "config.training.disable_cuda_graphs": "True",
            "config.activation_checkpoint": "None",
        }


def test_torchtitan_03_loads_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torchtitan 0.3 is installed: its own ConfigManager loads the exported config
    (``--module torchtitan_config --config pipeplan``) with the plan's fields, with and
    without sequence parallelism."""
    pytest.importorskip("torchtitan.config.manager")
    from torchtitan.config.manager import ConfigManager

    monkeypatch.chdir(tmp_path)
    for sp in (True, False):
        plan = parallel_plan(
            tmp_path, "0-2:cpu0+cpu1,cpu4+cpu5;3-5:cpu2+cpu3,cpu6+cpu7", sp, ("fsdp",)
        )
        out = export_plan(plan, "torchtitan", tmp_path / f"titan-{sp}").out_dir
        monkeypatch.syspath_prepend(str(out))
        monkeypatch.delitem(sys.modules, "torchtitan_config", raising=False)
        config = ConfigManager().parse_args(
            ["--module", "torchtitan_config", "--config", "pipeplan"]
        )
        par = config.parallelism
        assert (par.pipeline_parallel_degree, par.tensor_parallel_degree) == (2, 2)
        assert par.enable_sequence_parallel is sp
        assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (1, 2)
        parts = [["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "head"]]
        assert par.module_fqns_per_model_part == parts
        assert config.training.local_batch_size == 2 and config.activation_checkpoint is None
        assert config.training.mixed_precision_param == "float32"  # as planned, not bf16 FSDP
        sys.path.remove(str(out))


def test_torchtitan_files_stay_valid_whatever_the_paths_hold(tmp_path: Path) -> None:
    """A plan or folder name with quotes, backslashes (a Windows path's ``\\N``) or a newline
    is written escaped: the Python config parses and the TOML loads."""
    import ast

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    plan = make_plan(tmp_path, "gpt", "0-2:cpu0;3-5:cpu1", "1f1b", 4, 1)
    odd = Path(plan).with_name('tq"""\nx = 1\\N.json')
    odd.write_text(Path(plan).read_text())
    out = export_plan(odd, "torchtitan", tmp_path / 'b\\N q"""q').out_dir
    ast.parse((out / "torchtitan_config.py").read_text())
    tomllib.loads((out / "torchtitan.toml").read_text())

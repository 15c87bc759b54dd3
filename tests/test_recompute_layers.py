"""Recompute in two units: the whole stage under one activation checkpoint, or each layer
under its own (``recompute_layers``: Megatron-LM's full recompute, torchtitan's per-block
checkpointing). Memory by hand, the solver's choice, the plan's field, and runs equal to
one process in both units."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_runtime import TINY, check_same, make_plan, reference

from planner.cost import (
    stage_activation_bytes,
    stage_memory_bytes,
    stage_rebuilt_bytes,
    synthetic_profile,
)
from planner.errors import InputError
from planner.plan import Plan, parse_stages
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.runtime import run_plan
from planner.schedule import build_schedule
from planner.simulate import simulate
from planner.solve.memory import recompute_units
from planner.stages import stages_from_data


def _hand_profile() -> Profile:
    """Six layers: outputs 7, 14, ... 42 bytes, saved 10, 20, ... 60, input 5."""
    params = [100, 200, 300, 400, 500, 600]
    layers = [Layer(f"l{i}", p // 4, p, 2 * p) for i, p in enumerate(params)]
    timings = [LayerTiming(1.0, 2.0, 1.0, 1.0, 7 * (i + 1), 10 * (i + 1)) for i in range(6)]
    return Profile("hand", layers, [Measurement(1, 5, timings)])


def test_memory_of_both_units_by_hand() -> None:
    prof = _hand_profile()
    # Stage 1 = layers 2-3 (weights 700: static 2800), 2 microbatches in flight under 1F1B.
    whole = parse_stages("0-1:a;2-3:b;4-5:c", recompute=[1])
    each = [st.with_recompute(st.recompute, layers=True) for st in whole]
    assert each[1].recompute_layers and not each[0].recompute_layers  # only where recomputed
    # One checkpoint: stash the stage input (layer 1's output, 14); rebuild all (30 + 40).
    assert stage_activation_bytes(prof, 2, 3, 1, recompute=True) == 14
    assert stage_rebuilt_bytes(prof, 2, 3, 1) == 70
    # Each layer: stash every layer's input (14 + 21); rebuild the largest layer (40).
    assert stage_activation_bytes(prof, 2, 3, 1, recompute=True, each_layer=True) == 35
    assert stage_rebuilt_bytes(prof, 2, 3, 1, each_layer=True) == 40
    assert stage_memory_bytes(prof, 2, 3, 1, 2, recompute=True) == 2800 + 2 * 14 + 70
    layered = stage_memory_bytes(prof, 2, 3, 1, 2, recompute=True, recompute_layers=True)
    assert layered == 2800 + 2 * 35 + 40
    # The simulator's event-by-event peak agrees with both, and the time is the same.
    a = simulate(prof, None, whole, "1f1b", 6)
    b = simulate(prof, None, each, "1f1b", 6)
    assert (a.memory_bytes["b"], b.memory_bytes["b"]) == (2800 + 2 * 14 + 70, layered)
    assert a.iteration_ms == b.iteration_ms
    # Here one checkpoint peaks lower (the layers save little beyond their outputs).
    assert not recompute_units(prof, whole, "1f1b", 1, 6)[1].recompute_layers


def test_the_solver_checkpoints_each_layer_where_layers_save_much_more_than_they_pass_on() -> None:
    # Transformer-like: a block saves ~30x what it hands on; 8 layers in one stage, 4 held.
    block = synthetic_profile(8, output_bytes=100, saved_bytes=3000)
    stages = parse_stages("0-7:a", recompute=[0])
    chosen = recompute_units(block, stages, "gpipe", 1, 4)[0]
    assert chosen.recompute and chosen.recompute_layers
    # 4 x 8 inputs + one layer (3000) against 4 x 1 input + all eight layers (24000).
    each = stage_memory_bytes(block, 0, 7, 1, 4, recompute=True, recompute_layers=True)
    whole = stage_memory_bytes(block, 0, 7, 1, 4, recompute=True)
    assert each < whole
    # MLP-like: saves little more than it passes on: one checkpoint per stage is smaller.
    flat = synthetic_profile(8, output_bytes=100, saved_bytes=150)
    assert not recompute_units(flat, stages, "gpipe", 1, 4)[0].recompute_layers
    # Without recompute nothing changes.
    assert (
        recompute_units(block, parse_stages("0-7:a"), "gpipe", 1, 4)[0] == parse_stages("0-7:a")[0]
    )


def test_the_field_round_trips_and_needs_recompute() -> None:
    data = [{"layers": [0, 3], "devices": ["a"], "recompute": True, "recompute_layers": True}]
    (stage,) = stages_from_data(data, source="s.json")
    assert stage.recompute_layers and stage.to_dict()["recompute_layers"] is True
    plain = stages_from_data([{"layers": [0, 3], "devices": ["a"], "recompute": True}])[0]
    assert "recompute_layers" not in plain.to_dict()  # older plans read and write unchanged
    bad = [{"layers": [0, 3], "devices": ["a"], "recompute_layers": True}]
    with pytest.raises(InputError, match="expected recompute: true") as err:
        stages_from_data(bad, source="s.json")
    assert err.value.field == "stages[0].recompute_layers"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.py"
    path.write_text(TINY)
    return path


def _each_layer(plan: Plan) -> Plan:
    stages = [st.with_recompute(st.recompute, layers=True) for st in plan.stages]
    schedule = build_schedule(plan.schedule.name, stages, plan.num_microbatches)
    return dataclasses.replace(plan, stages=stages, schedule=schedule)


@pytest.mark.parametrize(
    ("schedule", "two_bw"),
    [("1f1b", False), ("2bw", True)],  # 2bw: each layer rebuilt with its iteration's weights
)
def test_each_layer_checkpointed_trains_like_one_process(
    tiny: Path, schedule: str, two_bw: bool
) -> None:
    plan = _each_layer(make_plan("0-2:cpu0;3-4:cpu1", schedule, 4, 2, recompute=(0, 1)))
    assert all(st.recompute_layers for st in plan.stages)
    report = run_plan(
        plan, tiny, steps=3, warmup=0, timeout_s=60, optimizer="momentum", lr=0.05,
        return_params=True,
    )  # fmt: skip
    losses, params = reference(tiny, 3, 8, "momentum", 0.05, two_bw=two_bw)
    check_same(report, losses, params)


def test_the_stage_module_checkpoints_each_layer_on_its_own() -> None:
    """What the runtime's module keeps per microbatch: with one checkpoint, the stage input
    only; with one per layer, each layer's input (the checkpoints' saved tensors)."""
    from torch import nn

    from planner.profile.split import Stage

    layers = [nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(3)]
    stage = Stage([_Tuple(m) for m in layers], 0, 2, False)
    x = torch.randn(2, 4, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        plain = stage(x)
    n_plain = len(saved)
    saved.clear()
    stage.checkpoint_layers = True
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = stage(x)
    assert len(saved) < n_plain  # the layers' own activations are not kept
    torch.testing.assert_close(out[0], plain[0])
    out[0].sum().backward()
    assert x.grad is not None


class _Tuple(torch.nn.Module):
    """A layer of a split Stage: takes and returns tuples."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.inner(xs[0]),)


def test_plan_json_keeps_the_unit(tmp_path: Path) -> None:
    plan = _each_layer(make_plan("0-2:cpu0;3-4:cpu1", "1f1b", 4, 2, recompute=(1,)))
    path = tmp_path / "plan.json"
    plan.save(path)
    stages = json.loads(path.read_text())["stages"]
    assert [s.get("recompute_layers", False) for s in stages] == [False, True]
    assert [st.recompute_layers for st in Plan.load(path).stages] == [False, True]


def test_simulate_recompute_layers_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.cli import main

    gpt = str(Path(__file__).resolve().parents[1] / "profiles" / "gpt.json")
    base = ["simulate", "--profile", gpt, "--stages", "0-2:a;3-5:b", "--no-gantt"]
    with pytest.raises(SystemExit) as done:
        main([*base, "--recompute-layers"])
    assert done.value.code == 2
    assert (
        "--recompute-layers: says how the --recompute stages checkpoint" in capsys.readouterr().err
    )
    out = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as done:
        main([*base, "--recompute", "1", "--recompute-layers", "-o", str(out)])
    assert done.value.code in (0, None)
    stages = Plan.load(out).stages
    assert [(s.recompute, s.recompute_layers) for s in stages] == [(False, False), (True, True)]
    # Naming a stage that recomputes already keeps its unit; --recompute-layers alone turns
    # the plan's recomputing stages to each layer.
    again = tmp_path / "again.json"
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--plan", str(out), "--recompute", "0,1", "--no-gantt", "-o", str(again)])
    assert done.value.code in (0, None)
    stages = Plan.load(again).stages
    assert [(s.recompute, s.recompute_layers) for s in stages] == [(True, False), (True, True)]
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--plan", str(again), "--recompute-layers", "--no-gantt", "-o", str(out)])
    assert done.value.code in (0, None)
    assert all(s.recompute_layers for s in Plan.load(out).stages)


def _batchnorm_buffers(recompute: str) -> list[torch.Tensor]:
    """A BatchNorm stage after two microbatches' forward and backward under ``recompute``
    (``none``, ``stage``: the runtime's one checkpoint, ``layers``: the split's per layer,
    ``export``: train_pipeline.py's Recompute): its running statistics."""
    from planner.export.train_pipeline import Recompute
    from planner.profile.split import split_model
    from planner.runtime.stage import StageRuntime

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 8)
    )
    stage = split_model(net, 1).stage(0, 2)  # not the last layer: outputs a tuple
    stage.checkpoint_layers = recompute == "layers"
    module = Recompute(stage) if recompute == "export" else stage
    runtime = StageRuntime(
        module, stage_id=1, is_last=False, recompute=recompute == "stage",
        num_microbatches=2, loss=None,
    )  # fmt: skip
    xs = [torch.randn(4, 6) for _ in range(2)]
    outs = [runtime.forward(k, [x]) for k, x in enumerate(xs)]
    for k, out in enumerate(outs):
        runtime.backward(k, [torch.ones_like(out[0])])
    norm = net[1]
    return [norm.running_mean, norm.running_var, norm.num_batches_tracked]


@pytest.mark.parametrize("recompute", ["stage", "layers", "export"])
def test_recompute_updates_batchnorm_statistics_once_per_microbatch(recompute: str) -> None:
    """A plain checkpoint's rebuild runs BatchNorm's forward again and updates its running
    statistics twice; pipeplan's recompute (whole stage, each layer, the export) leaves
    them as without recompute."""
    want = _batchnorm_buffers("none")
    got = _batchnorm_buffers(recompute)
    assert int(got[2]) == 2
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_a_shared_memo_gives_the_units_worked_out_afresh() -> None:
    """recompute_units with one memo over many shapes (as a search shares it: stages met
    under other flags, schedules, microbatch counts and replicas) gives, stage by stage,
    what it gives without one; each layer and the whole stage both chosen somewhere."""
    import itertools
    import random

    profiles = [
        synthetic_profile(8, output_bytes=100, saved_bytes=3000),
        synthetic_profile(8, output_bytes=100, saved_bytes=150),
        _hand_profile(),
    ]
    rng = random.Random(7)
    chosen = set()
    for prof in profiles:
        memo: dict = {}
        n = prof.num_layers
        for _ in range(60):
            cuts = sorted(rng.sample(range(1, n), rng.randint(0, 3)))
            bounds = list(zip([0, *cuts], [c - 1 for c in cuts] + [n - 1], strict=True))
            spec = ";".join(f"{a}-{b}:d{k}a,d{k}b" for k, (a, b) in enumerate(bounds))
            flags = [rng.random() < 0.7 for _ in bounds]
            stages = parse_stages(spec, recompute=[k for k, f in enumerate(flags) if f])
            for sched, m in itertools.product(("1f1b", "gpipe", "2bw"), (2, 4, 8)):
                fresh = recompute_units(prof, stages, sched, 1, m)
                assert recompute_units(prof, stages, sched, 1, m, memo=memo) == fresh
                chosen |= {st.recompute_layers for st in fresh if st.recompute}
        assert memo
    assert chosen == {True, False}

"""Layers timed inside whole passes (planner.profile.pass_timing), on CPU.

The pass code is the one CUDA runs with CUDA events; here its clock is a CPU clock, or a
clock that counts marks, which shows exactly where the marks fall.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from planner.allocator import keep_freed_memory
from planner.errors import InputError
from planner.profile import load_model_file, load_profile, profile_model
from planner.profile.measure import check_timing
from planner.profile.pass_timing import (
    LayerMemory,
    ModelPasses,
    WallClock,
    intervals_ms,
    medians,
    pass_ratio,
    resolve_marks,
    time_calls,
)
from planner.profile.split import capture_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "models"


class CountingClock:
    """A clock that ticks once per mark: 1 ms between consecutive marks, so an interval
    says how many marks fell inside it."""

    name = "counting"

    def __init__(self) -> None:
        self.ticks = 0

    def mark(self) -> int:
        self.ticks += 1
        return self.ticks

    def sync(self) -> None:
        return None

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(end - start)


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """One thread, as the profiler pins it: the thread's CPU time is then all the work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _passes(path: Path, size: int, clock: Any, split_at: str | None = None) -> ModelPasses:
    keep_freed_memory()  # as the profiler does: no page faults inside timed passes
    user = load_model_file(path)
    torch.manual_seed(0)
    model = user.build()
    model.train()
    inputs, targets = user.batch(size)
    split = capture_model(model, inputs, split_at)
    return ModelPasses(
        split.layers, split.flat_inputs(inputs), lambda out: user.loss(out, targets), clock=clock
    )


def test_closed_forms() -> None:
    assert intervals_ms(WallClock(), [0.0, 0.001, 0.003]) == pytest.approx([1.0, 2.0])
    assert resolve_marks([0.0, None, 2.0, None, 3.0]) == [0.0, 2.0, 2.0, 3.0, 3.0]
    assert medians([[1.0, 5.0], [3.0, 4.0], [2.0, 6.0]]) == [2.0, 5.0]
    assert pass_ratio([1.0, 2.0, 1.1], 4.0) == pytest.approx(1.025)
    assert pass_ratio([1.0], 0.0) is None
    with pytest.raises(ValueError, match="last mark"):
        resolve_marks([0.0, None])
    order: list[int] = []
    assert time_calls([lambda: order.append(1), lambda: order.append(2)], CountingClock()) == [
        1.0,
        1.0,
    ]
    assert order == [1, 2]


def test_every_cut_is_marked_once_in_order_on_a_chain() -> None:
    """On a chain (the GPT example) each layer's forward interval holds exactly one mark
    step and so does each backward: every cut's hook fired, once, from the last to the
    first. The whole pass has one mark at each end of the forward and the backward."""
    passes = _passes(ROOT / "examples" / "gpt.py", 1, CountingClock())
    n = len(passes.layers)
    sample = passes.sample()
    assert sample.forward_ms == [1.0] * n
    assert sample.backward_ms == [1.0] * n
    assert sample.backward_input_ms == [1.0] * n and sample.backward_weight_ms == [1.0] * n
    assert sample.whole_forward_ms == 1.0 and sample.whole_backward_ms == 1.0


def test_values_used_again_later_keep_the_backward_whole() -> None:
    """skip.py carries a value from the first layer to the last: its cut completes out of
    order, its mark is dropped, and the layers' backward still adds up to the pass."""
    passes = _passes(MODELS / "skip.py", 2, CountingClock())
    n = len(passes.layers)
    sample = passes.sample()
    assert sample.forward_ms == [1.0] * n
    assert all(ms >= 0 for ms in sample.backward_ms)
    assert sum(sample.backward_ms) == n  # n - 1 cut marks at most, plus start and end


def _grads(passes: ModelPasses) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in passes.all_params]  # type: ignore[union-attr]


@pytest.mark.parametrize("model", ["skip.py", "gpt"])
def test_the_chain_halves_give_the_gradients_of_the_whole_backward(model: str) -> None:
    """The zero-bubble chain hands each layer's input gradients to the layer before it as
    the runtime's stages do: its I and W leave the same parameter gradients as one
    backward of the whole graph."""
    path = ROOT / "examples" / "gpt.py" if model == "gpt" else MODELS / model
    passes = _passes(path, 2, WallClock())
    passes.zero_grads()
    passes.graph_pass()
    whole = _grads(passes)
    passes.zero_grads()
    passes.chain_halves()  # the first call also finds where torch's split works
    passes.zero_grads()
    passes.chain_halves()
    halves = _grads(passes)
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, halves, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class ScriptedMemory:
    """Allocator counters read back from a script (as a CUDA allocator would report
    them), to check the arithmetic of ModelPasses.memory in closed form."""

    def __init__(self, allocated: list[int], peaks: list[int]):
        self.allocated_values = iter(allocated)
        self.peak_values = iter(peaks)
        self.resets = 0

    def allocated(self) -> int:
        return next(self.allocated_values)

    def peak(self) -> int:
        return next(self.peak_values)

    def reset_peak(self) -> None:
        self.resets += 1


def test_memory_arithmetic_in_closed_form() -> None:
    """Three layers (bench/heavy_half_model.py cut in 4, read as: start, after each layer). held =
    level differences; forward workspace = peak - level after the layer; backward
    workspace = that layer's backward peak - start - what the layers up to it hold."""
    passes = _passes(ROOT / "bench" / "heavy_half_model.py", 1, WallClock())
    assert len(passes.layers) == 4
    # allocated(): start, then after each of the 4 forwards.
    levels = [100, 110, 130, 160, 200]
    # peak(): after each forward (4), then at cut 2, cut 1, cut 0 (backward of layers 3,
    # 2, 1), then after the call (layer 0).
    peaks = [115, 150, 160, 230, 260, 190, 170, 150]
    got = passes.memory(ScriptedMemory(levels, peaks))
    held = [10, 20, 30, 40]
    forward_ws = [115 - 110, 150 - 130, 160 - 160, 230 - 200]
    backward_ws = [150 - 100 - 10, 170 - 100 - 30, 190 - 100 - 60, 260 - 100 - 100]
    assert got == [
        LayerMemory(h, max(0, f, b)) for h, f, b in zip(held, forward_ws, backward_ws, strict=True)
    ]


def test_profile_with_pass_timing_on_cpu(tmp_path: Path) -> None:
    profile = profile_model(
        MODELS / "skip.py", [1, 2], repeat=2, warmup=1, min_time_s=0, timing="pass"
    )
    assert profile.settings.timing == "pass" and profile.settings.clock == "thread_time"
    for m in profile.measurements:
        assert m.pass_forward_ms and m.pass_backward_ms
        ratios = m.pass_ratios()
        assert ratios is not None and all(r > 0 for r in ratios)
        assert all(t.forward_ms > 0 and t.spread for t in m.layers)
    path = tmp_path / "p.json"
    profile.save(path)
    raw = json.loads(path.read_text())
    assert "pass_forward_ms" in raw["measurements"][0]
    assert load_profile(path).to_dict() == profile.to_dict()
    # The CPU default is unchanged: layer timing, no whole-pass fields.
    default = profile_model(MODELS / "skip.py", [1], repeat=1, warmup=0, min_time_s=0)
    assert default.settings.timing == "layer"
    assert default.measurements[0].pass_forward_ms is None
    assert "pass_forward_ms" not in default.to_dict()["measurements"][0]


def test_timing_choice_is_checked() -> None:
    assert check_timing(None, "cuda") == "pass" and check_timing(None, "cpu") == "layer"
    assert check_timing("pass", "cpu") == "pass"
    with pytest.raises(InputError, match="--timing"):
        check_timing("event")
    with pytest.raises(InputError, match="--timing"):
        profile_model(MODELS / "skip.py", [1], repeat=1, warmup=0, min_time_s=0, timing="both")


def test_profile_command_takes_timing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.cli import main

    target = tmp_path / "p.json"
    args = ["profile", str(MODELS / "skip.py"), "-b", "1", "-o", str(target), "-q"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--repeat", "2", "--warmup", "1", "--min-time", "0", "--timing", "pass"])
    assert info.value.code in (0, None)
    assert load_profile(target).settings.timing == "pass"
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main([*args, "--timing", "events"])
    _, err = capsys.readouterr()
    assert info.value.code == 2
    assert "--timing" in err and "pass, layer" in err and len(err.strip().splitlines()) == 1


def test_pass_check_names_sizes_off_by_more_than_two_percent() -> None:
    from planner.commands.profile import pass_check_lines
    from planner.cost import synthetic_profile

    profile = synthetic_profile(4, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0)
    assert pass_check_lines(profile) == []  # layer timing: nothing to check
    m = profile.measurements[0]
    m.pass_forward_ms, m.pass_backward_ms = 4.0, 8.1  # 1.000 and 0.988
    assert pass_check_lines(profile) == []
    m.pass_forward_ms = 3.9  # the layers: 1.026x the whole forward
    (line,) = pass_check_lines(profile)
    assert line.startswith("microbatch size 1: the layers add up to 1.026x the whole forward")


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("measurement", "pass_forward_ms", -1.0),
        ("measurement", "pass_backward_ms", "fast"),
        ("layer", "optimizer_workspace_bytes", -5),
    ],
)
def test_new_profile_fields_are_validated(tmp_path: Path, where: str, key: str, value: Any) -> None:
    from planner.cost import synthetic_profile

    raw = synthetic_profile(2).to_dict()
    target = raw["measurements"][0] if where == "measurement" else raw["layers"][1]
    target[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InputError, match=key) as info:
        load_profile(path)
    assert str(path) in str(info.value)


def test_new_profile_fields_round_trip(tmp_path: Path) -> None:
    from planner.cost import synthetic_profile

    profile = synthetic_profile(2)
    profile.layers[0].optimizer_workspace_bytes = 4096
    profile.measurements[0].pass_forward_ms = 2.5
    profile.measurements[0].pass_backward_ms = 4.0
    path = tmp_path / "p.json"
    profile.save(path)
    again = load_profile(path)
    assert again.layers[0].optimizer_workspace_bytes == 4096
    assert again.layers[1].optimizer_workspace_bytes == 0
    assert again.measurements[0].pass_ratios() == (2 / 2.5, 4 / 4.0)
    assert again.to_dict() == profile.to_dict()

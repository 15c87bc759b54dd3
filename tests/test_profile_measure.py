"""What the profiler measures: parameter, output and saved bytes, optimizer state, time ratios."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.errors import InputError
from planner.profile import (
    Profile,
    load_model_file,
    measure_layer,
    parse_microbatch_sizes,
    profile_model,
)
from planner.profile.split import split_model

MODELS = Path(__file__).resolve().parent / "models"
SKIP = MODELS / "skip.py"


@pytest.fixture(scope="module")
def skip_profile() -> Profile:
    return profile_model(SKIP, [1, 3], repeat=2, warmup=1, min_time_s=0, optimizer="adam")


def test_parameter_bytes_sum_to_the_model(skip_profile: Profile) -> None:
    model = load_model_file(SKIP).build()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(layer.param_bytes for layer in skip_profile.layers) == total
    assert sum(layer.param_count for layer in skip_profile.layers) == sum(
        p.numel() for p in model.parameters()
    )


def test_output_bytes_are_the_tensors_crossing_each_cut(skip_profile: Profile) -> None:
    user = load_model_file(SKIP)
    model = user.build()
    split = split_model(model, num_inputs=2)
    for m in skip_profile.measurements:
        inputs, _ = user.batch(m.microbatch_size)
        assert m.input_bytes == sum(x.numel() * x.element_size() for x in inputs)
        with torch.no_grad():
            for i, timing in enumerate(m.layers):
                out = split.stage(0, i)(*inputs)
                tensors = out if isinstance(out, tuple) else (out,)
                assert timing.output_bytes == sum(t.numel() * t.element_size() for t in tensors)


def test_saved_bytes_are_positive_for_layers_with_weights(skip_profile: Profile) -> None:
    for m in skip_profile.measurements:
        for layer, timing in zip(skip_profile.layers, m.layers, strict=True):
            assert layer.param_bytes > 0
            assert timing.saved_bytes > 0
    # Activations grow with the microbatch; parameters are not activations.
    small, large = skip_profile.measurements
    assert all(
        b.saved_bytes > a.saved_bytes for a, b in zip(small.layers, large.layers, strict=True)
    )


def test_times_are_medians_in_the_file_and_means_for_the_planner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each time is written as the median of its timed runs (the profile format), their mean
    without spikes beside it under ``mean``, their quartiles under ``spread``; the planner
    reads the mean (a slow run counts, as in a training step; a run preempted to ten times
    its median does not), before and after a save."""
    import json
    import statistics

    from planner.profile import load_profile, measure
    from planner.profile.means import spike_free_mean

    seen: list[dict[str, list[float]]] = []
    real = measure._timing

    def keep(samples: dict[str, list[float]], *facts: int) -> measure.LayerTiming:
        samples["forward_ms"][-1] = 10 * statistics.median(samples["forward_ms"])  # a spike
        seen.append({k: list(v) for k, v in samples.items()})
        return real(samples, *facts)

    monkeypatch.setattr(measure, "_timing", keep)
    profile = profile_model(SKIP, [1, 3], repeat=4, warmup=0, min_time_s=0)
    profile.save(tmp_path / "p.json")
    written = json.loads((tmp_path / "p.json").read_text())
    read = load_profile(tmp_path / "p.json")
    timings = [t for m in profile.measurements for t in m.layers]
    files = [t for m in written["measurements"] for t in m["layers"]]
    reads = [t for m in read.measurements for t in m.layers]
    assert len(seen) == len(timings) == len(files)
    for samples, t, f, r in zip(seen, timings, files, reads, strict=True):
        for name in ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms"):
            runs = samples[name]
            assert len(runs) == 4
            assert getattr(t, name) == getattr(r, name) == f["mean"][name]
            assert f["mean"][name] == pytest.approx(spike_free_mean(runs), abs=1e-4)
            if name == "forward_ms":  # the spike is left out; the other runs all count
                assert f["mean"][name] == pytest.approx(statistics.fmean(runs[:-1]), abs=1e-4)
            assert f[name] == pytest.approx(statistics.median(runs), abs=1e-4)
            low, high = f["spread"][name]
            # the quartiles, rounded to 0.1 us as every stored time, around the median
            assert min(runs) - 1e-4 <= low <= f[name] <= high <= max(runs) + 1e-4
        assert t.forward_ms > 0 and t.backward_ms > 0


def test_first_layer_has_no_input_half_for_integer_inputs() -> None:
    # Token ids need no gradient: the first layer's backward is all weight half.
    profile = profile_model(
        Path(__file__).resolve().parent.parent / "examples" / "gpt.py",
        [1],
        repeat=1,
        warmup=0,
        min_time_s=0,
        split_at="blocks.0",
    )
    first = profile.measurements[0].layers[0]
    assert profile.layers[0].name == "embed"
    assert first.backward_input_ms == 0 and first.backward_weight_ms > 0


@pytest.mark.parametrize("optimizer", ["adam", "momentum", "sgd"])
def test_optimizer_state_bytes_match_torch_optimizers(optimizer: str) -> None:
    profile = profile_model(SKIP, [1], repeat=1, warmup=0, min_time_s=0, optimizer=optimizer)
    model = load_model_file(SKIP).build()
    opt: torch.optim.Optimizer
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters())
    elif optimizer == "momentum":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    # Per-parameter state tensors, except Adam's scalar step counters.
    state = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for key, t in s.items()
        if isinstance(t, torch.Tensor) and key != "step"
    )
    assert sum(layer.optimizer_state_bytes for layer in profile.layers) == state


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1,2,4", [1, 2, 4]), ("8, 2,2", [2, 8]), ([3, 1], [1, 3]), ("16", [16])],
)
def test_microbatch_sizes_parse(text: str | list[int], expected: list[int]) -> None:
    assert parse_microbatch_sizes(text) == expected


@pytest.mark.parametrize("text", ["0", "1,0", "-2", "two", "1.5", "", "1,,2"])
def test_bad_microbatch_sizes_are_rejected(text: str) -> None:
    with pytest.raises(InputError, match="-b"):
        parse_microbatch_sizes(text)


def test_threads_are_restored_after_profiling() -> None:
    before = torch.get_num_threads()
    profile = profile_model(SKIP, [1], repeat=1, warmup=0, min_time_s=0, threads=1)
    assert torch.get_num_threads() == before
    assert profile.settings.threads == 1
    assert profile.device == "cpu" and profile.meta["host"]["cpu_count"]


def test_a_layer_whose_outputs_are_views_is_measured() -> None:
    # The zero-bubble input half detaches outputs in place; views must not break it.
    class Views(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.fc(x).transpose(0, 1), x[:, :2]

    timing, outputs = measure_layer(Views(), (torch.randn(3, 4),), repeat=2, warmup=1)
    assert timing.output_bytes == 4 * (12 + 6)
    assert timing.saved_bytes > 0
    assert timing.backward_input_ms > 0 and timing.backward_weight_ms > 0
    assert [tuple(t.shape) for t in outputs] == [(4, 3), (3, 2)]
    assert not any(t.requires_grad for t in outputs)


def test_a_layer_with_an_unused_parameter_is_measured() -> None:
    class Unused(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.spare = torch.nn.Linear(4, 4)  # never called

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.fc(x),)

    timing, _ = measure_layer(Unused(), (torch.randn(3, 4),), repeat=2, warmup=1)
    assert timing.backward_ms > 0 and timing.backward_weight_ms > 0


def test_timed_runs_go_round_robin_over_layers_and_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run r of every (layer, size) comes before run r + 1 of any: a slow spell of the
    machine then falls on a few runs of each size, not on all runs of one."""
    from planner.profile import measure

    calls: list[tuple[int, int]] = []  # (microbatch size, layer) of each timed or warm-up run
    real_once = measure._Runner.once

    def once(self: measure._Runner) -> tuple[float, float, float, float]:
        calls.append((self.leaves[0].shape[0], id(self.layer)))
        return real_once(self)

    monkeypatch.setattr(measure._Runner, "once", once)
    profile = profile_model(SKIP, [1, 3], repeat=3, warmup=1, min_time_s=0)
    runners = 2 * profile.num_layers
    assert len(calls) == (1 + 3) * runners
    rounds = [calls[r * runners : (r + 1) * runners] for r in range(4)]
    assert all(sorted(r) == sorted(rounds[0]) for r in rounds)  # each round covers everything
    assert {size for size, _ in rounds[0]} == {1, 3}


def test_min_time_adds_whole_rounds_until_it_has_passed() -> None:
    """``min_time_s`` goes on past ``repeat``, a whole round at a time, until the timed rounds
    have lasted that long; ``meta`` records the rounds; 0 times exactly ``repeat``."""
    import time

    start = time.perf_counter()
    profile = profile_model(SKIP, [1, 3], repeat=2, warmup=0, min_time_s=0.3)
    assert time.perf_counter() - start >= 0.6  # the layers' rounds, then the optimizer's
    assert profile.meta["rounds"] > 2 and profile.meta["min_time_s"] == 0.3
    exact = profile_model(SKIP, [1], repeat=2, warmup=0, min_time_s=0)
    assert exact.meta["rounds"] == 2


def test_backward_adds_into_the_parameters_grad_as_training_does() -> None:
    """The runtime accumulates a step's microbatch gradients in ``.grad``; the profile's
    backward must pay for that addition too: every timed (and warm-up) whole backward and
    weight half adds one gradient to the parameters' ``.grad``."""
    import copy

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    reference = copy.deepcopy(layer)
    x = torch.randn(2, 4)
    torch.autograd.backward(reference(x), torch.full((2, 3), 0.5))  # the profiler's out-grad
    measure_layer(layer, (x,), repeat=3, warmup=1)
    # (1 warm-up + 3 timed runs) x (whole backward + weight half)
    assert layer.weight.grad is not None and reference.weight.grad is not None
    torch.testing.assert_close(layer.weight.grad, 8 * reference.weight.grad)


def test_spike_free_mean_leaves_out_spikes_and_keeps_slow_spells() -> None:
    from planner.profile.means import SPIKE, spike_free_mean

    assert spike_free_mean([1.0, 1.1, 1.2, 9.0]) == pytest.approx(1.1)
    assert spike_free_mean([1.0, 1.0, 1.4, 1.5]) == pytest.approx(1.225)  # a slow spell
    assert spike_free_mean([1.0, 1.0, SPIKE]) == pytest.approx((2 + SPIKE) / 3)  # at the edge
    assert spike_free_mean([0.0, 0.0, 0.0]) == 0.0  # a layer without an input half

"""The optimizer step in the profile: measured per layer, stored, read back, optional."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from planner.errors import InputError
from planner.profile import Profile, load_profile, profile_model
from planner.profile.loader import load_model_file
from planner.profile.measure import _prepare, _Runner, _Settings, _time_optimizer
from planner.profile.schema import profile_from_dict

MODEL = """
import torch
from torch import nn


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 4), nn.Linear(4, 4))


def sample_batch(batch_size):
    torch.manual_seed(1)
    return (torch.randn(batch_size, 1024),), torch.randn(batch_size, 4)
"""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, Path]:
    path = tmp_path_factory.mktemp("opt") / "model.py"
    path.write_text(MODEL)
    return profile_model(path, [2, 4], repeat=3, warmup=1, min_time_s=0, optimizer="adam"), path


def test_step_is_positive_for_layers_with_parameters_under_adam(
    profiled: tuple[Profile, Path],
) -> None:
    profile, _ = profiled
    steps = {layer.name: layer.optimizer_ms for layer in profile.layers}
    assert steps["1"] == 0.0  # ReLU: nothing to step
    assert steps["0"] > 0 and steps["2"] > 0 and steps["3"] > 0
    # A million weights cost more to update than twenty.
    assert steps["0"] > steps["3"]


def test_step_round_trips_through_the_file(profiled: tuple[Profile, Path], tmp_path: Path) -> None:
    profile, _ = profiled
    out = tmp_path / "p.json"
    profile.save(out)
    raw = json.loads(out.read_text())
    assert "optimizer_ms" in raw["layers"][0] and "optimizer_ms" not in raw["layers"][1]
    again = load_profile(out)
    assert [layer.optimizer_ms for layer in again.layers] == [
        layer.optimizer_ms for layer in profile.layers
    ]
    assert again.to_dict() == profile.to_dict()


def test_profiling_leaves_the_weights_as_they_were(profiled: tuple[Profile, Path]) -> None:
    # The steps are timed on the real parameters and then undone.
    _, path = profiled
    user = load_model_file(path)
    split, model = _prepare(user, 2, _Settings(torch.device("cpu"), 1, 0), None, "auto")
    before = [p.detach().clone() for p in model.parameters()]
    (x,), y = user.batch(2)
    runners, values = [], (x,)
    for k, layer in enumerate(split.layers):
        last = k == split.num_layers - 1
        loss = (lambda out: user.loss(out, y)) if last else None
        run = _Runner.for_layer(layer, values, loss, _Settings(torch.device("cpu"), 2, 1))
        out, _, _ = run.inspect()
        values = tuple(t.detach() for t in (out if isinstance(out, tuple) else (out,)))
        runners.append(run)
    steps = _time_optimizer(runners, "adam", _Settings(torch.device("cpu"), 2, 1))
    assert steps[0] > 0 and steps[1] == 0.0
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b) and p.grad is None


def _old_profile() -> dict:
    return {
        "schema": "pipeplan.profile/v1",
        "model": "old",
        "layers": [{"name": "a", "param_count": 1, "param_bytes": 4, "optimizer_state_bytes": 8}],
        "measurements": [
            {
                "microbatch_size": 1,
                "layers": [
                    {
                        "forward_ms": 1.0,
                        "backward_ms": 2.0,
                        "backward_input_ms": 1.0,
                        "backward_weight_ms": 1.0,
                        "output_bytes": 4,
                        "saved_bytes": 4,
                    }
                ],
            }
        ],
    }


def test_profiles_without_the_field_still_load_with_zero() -> None:
    profile = profile_from_dict(_old_profile())
    assert profile.layers[0].optimizer_ms == 0.0
    assert "optimizer_ms" not in profile.to_dict()["layers"][0]


def test_a_negative_step_is_rejected_with_its_field() -> None:
    data = _old_profile()
    data["layers"][0]["optimizer_ms"] = -1
    with pytest.raises(InputError, match=r"layers\[0\]\.optimizer_ms"):
        profile_from_dict(data, source="p.json")


def test_bundled_profiles_carry_the_step() -> None:
    root = Path(__file__).resolve().parent.parent / "profiles"
    for name in ("gpt", "mlp", "cnn"):
        profile = load_profile(root / f"{name}.json")
        assert all(layer.optimizer_ms > 0 for layer in profile.layers if layer.param_count), name

"""Capture with torch.export beside torch.fx: same layers, same numbers, keyword inputs,
model outputs as objects, and the automatic choice between the two."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from planner.errors import InputError
from planner.profile.export_graph import has_dropout
from planner.profile.loader import load_model_file
from planner.profile.split import capture_model, discover_split_points, retarget_device

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("example", ["gpt", "cnn", "mlp"])
def test_export_cuts_the_examples_like_fx_and_computes_the_same(example: str) -> None:
    """Same layer names, outputs, gradients and (BatchNorm) buffer updates either way."""
    user = load_model_file(ROOT / "examples" / f"{example}.py")
    torch.manual_seed(0)
    a = user.build().train()
    torch.manual_seed(0)
    b = user.build().train()
    x, y = user.batch(2)
    by_fx = capture_model(a, x, capture="fx")
    by_export = capture_model(b, x, capture="export")
    assert by_fx.capture == "fx" and by_export.capture == "export"
    assert by_export.names == by_fx.names
    assert by_export.batch_size == 2 and by_fx.batch_size is None
    before = [t.clone() for t in b.buffers()]
    user.loss(by_fx(*x), y).backward()
    user.loss(by_export(*x), y).backward()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=0, atol=0)
    for ba, bb in zip(a.buffers(), b.buffers(), strict=True):
        torch.testing.assert_close(ba, bb, rtol=0, atol=0)
    if example == "cnn":  # the running statistics really moved, in both captures
        stats = [t for t, t0 in zip(b.buffers(), before, strict=True) if not torch.equal(t, t0)]
        assert stats


def test_export_layers_share_the_models_parameters_under_their_own_names() -> None:
    user = load_model_file(ROOT / "examples" / "gpt.py")
    model = user.build()
    x, _ = user.batch(2)
    split = capture_model(model, x, capture="export")
    own = {id(p): n for n, p in model.named_parameters()}
    for layer in split.layers:
        for name, p in layer.named_parameters():
            assert id(p) in own and name.endswith(own[id(p)])


class _Keyword(nn.Module):
    """Keyword inputs and a dict output with logits: what a Hugging Face model looks like."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 10)

    def forward(self, input_ids: torch.Tensor, scale: torch.Tensor | None = None) -> dict:
        h = self.embed(input_ids)
        if scale is not None:  # a Python branch on an argument: taken at capture
            h = h * scale
        for block in self.blocks:
            h = torch.relu(block(h)) + h
        return {"logits": self.head(h)}


def test_keyword_inputs_are_taken_in_forward_order_and_outputs_rebuilt() -> None:
    model = _Keyword()
    ids = torch.randint(0, 10, (2, 5))
    scale = torch.full((2, 5, 1), 0.5)
    split = capture_model(model, {"scale": scale, "input_ids": ids})
    assert split.capture == "export"
    assert split.input_names == ("input_ids", "scale")
    assert split.names == ["embed", "blocks.0", "blocks.1", "blocks.2", "head"]
    out = split(*split.flat_inputs({"input_ids": ids, "scale": scale}))
    assert isinstance(out, dict) and set(out) == {"logits"}
    torch.testing.assert_close(out["logits"], model(ids, scale)["logits"], rtol=0, atol=0)
    with pytest.raises(InputError, match="keyword inputs"):
        split.flat_inputs({"input_ids": ids})


class _Branchy(nn.Module):
    """A top-level branch on a tensor's value: torch.fx cannot trace it, export can."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:  # shape branches: fx fails, export specialises
            x = x * 2
        for block in self.blocks:
            x = block(x)
        return x


def test_auto_falls_back_to_export_when_fx_cannot_trace() -> None:
    model = _Branchy()
    x = torch.randn(3, 4)
    split = capture_model(model, (x,))
    assert split.capture == "export"
    torch.testing.assert_close(split(x), model(x), rtol=0, atol=0)
    with pytest.raises(InputError, match="torch.fx"):
        capture_model(model, (x,), capture="fx")


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        if x.sum() > 0:  # a branch on a value: no capture can take it
            x = -x
        return x


def test_a_value_branch_is_refused_with_its_line() -> None:
    with pytest.raises(InputError) as info:
        capture_model(_DataDependent(), (torch.randn(2, 4),), source="model.py")
    text = info.value.one_line()
    assert text.startswith("model.py: build_model: torch.export could not capture")
    assert "test_capture.py:" in text and "--split-at" in text
    assert "\n" not in text


def test_has_dropout_reads_modules_and_attributes() -> None:
    assert not has_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)))
    assert has_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    quiet = nn.Linear(2, 2)
    quiet.layerdrop = 0.2  # type: ignore[assignment]
    assert has_dropout(quiet)


def test_encoder_decoder_stacks_are_both_split_points() -> None:
    class EncDec(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
            self.decoder = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
            self.head = nn.Linear(8, 2)

    points = discover_split_points(EncDec())
    assert points == [f"encoder.{i}" for i in range(3)] + [f"decoder.{i}" for i in range(4)]


def test_retarget_device_rewrites_device_constants() -> None:
    model = _Branchy()
    split = capture_model(model, (torch.randn(3, 4),), capture="export")
    stage = split.stage(0, split.num_layers - 1)
    retarget_device(stage, "meta")
    devices = [
        n.kwargs["device"]
        for sub in stage.modules()
        if isinstance(sub, torch.fx.GraphModule)
        for n in sub.graph.nodes
        if isinstance(n.kwargs.get("device"), torch.device)
    ]
    assert all(d == torch.device("meta") for d in devices)

"""Layer discovery and the split model: what the profiler measures and the runtime runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from planner.errors import InputError
from planner.profile.split import discover_split_points, split_model, tensor_bytes

ROOT = Path(__file__).resolve().parent.parent


def _load(relative: str) -> ModuleType:
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"test_split_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model_and_inputs(relative: str, batch: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    module = _load(relative)
    model = module.build_model().eval()
    inputs, _ = module.sample_batch(batch)
    return model, inputs if isinstance(inputs, tuple) else (inputs,)


def test_gpt_layers_are_embedding_then_blocks_then_head() -> None:
    gpt = _load("examples/gpt.py")
    for n_layer in (gpt.N_LAYER, 3, 2):  # 2 blocks: fewer than a block's MLP has children
        model = gpt.GPT(n_layer=n_layer)
        assert not isinstance(model, nn.Sequential)
        split = split_model(model, num_inputs=1)
        assert split.names == ["embed", *[f"blocks.{i}" for i in range(n_layer)], "head"]


@pytest.mark.parametrize(
    "relative", ["examples/gpt.py", "examples/cnn.py", "examples/mlp.py", "tests/models/skip.py"]
)
def test_split_model_computes_what_the_model_computes(relative: str) -> None:
    model, inputs = _model_and_inputs(relative)
    split = split_model(model, num_inputs=len(inputs))
    with torch.no_grad():
        expected = model(*inputs)
        assert torch.equal(split(*inputs), expected)
        # Any two-stage cut gives the same result, feeding stage 2 exactly stage 1's outputs.
        for cut in range(split.num_layers - 1):
            middle = split.stage(0, cut)(*inputs)
            assert isinstance(middle, tuple)
            assert len(middle) == len(split.cut_names[cut + 1])
            assert torch.equal(split.stage(cut + 1, split.num_layers - 1)(*middle), expected)


def test_values_used_later_are_carried_across_cuts() -> None:
    model, inputs = _model_and_inputs("tests/models/skip.py", batch=3)
    split = split_model(model, num_inputs=2)
    assert split.names == ["inp", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "out"]
    # Between blocks: the sigmoid gate (used by every block), the skip (used after the last
    # block) and the running hidden state all cross; the skip is dropped after it is used.
    assert [len(c) for c in split.cut_names] == [2, 2, 3, 3, 3, 2, 1]
    with torch.no_grad():
        crossing = split.stage(0, 1)(*inputs)
    batch, width = inputs[0].shape
    assert [tuple(t.shape) for t in crossing] == [(batch, 1), (batch, width), (batch, width)]
    assert tensor_bytes(crossing) == 4 * batch * (1 + 2 * width)


def test_gpt_mask_crosses_every_cut_between_blocks() -> None:
    gpt = _load("examples/gpt.py")
    split = split_model(gpt.GPT(n_layer=2), num_inputs=1)
    tokens, _ = gpt.sample_batch(1)
    with torch.no_grad():
        values = split.stage(0, 0)(tokens)
    assert len(values) == 2
    assert any(t.dtype == torch.bool and t.shape == (gpt.SEQ_LEN, gpt.SEQ_LEN) for t in values)


def test_layers_share_parameters_with_the_model() -> None:
    model, inputs = _model_and_inputs("examples/cnn.py")
    split = split_model(model, num_inputs=1)
    model_params = {id(p) for p in model.parameters()}
    layer_params = [id(p) for ps in split.layer_parameters() for p in ps]
    assert len(layer_params) == len(set(layer_params))
    assert set(layer_params) == model_params


def test_nested_sequentials_are_flattened() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)), nn.Tanh())
    assert discover_split_points(model) == ["0", "1.0", "1.1", "2"]
    split = split_model(model, num_inputs=1)
    x = torch.randn(5, 3)
    assert torch.equal(split(x), model(x))


def test_split_at_glob_chooses_boundaries() -> None:
    gpt = _load("examples/gpt.py")
    model = gpt.GPT(n_layer=4)
    split = split_model(model, num_inputs=1, split_at="blocks.0, blocks.2")
    # A layer runs up to the next boundary; code after the last one is one more layer.
    assert split.names == ["embed", "blocks.0+blocks.1", "blocks.2", "blocks.3+head"]
    tokens, _ = gpt.sample_batch(1)
    with torch.no_grad():
        assert torch.equal(split(tokens), model(tokens))
    # Of a module and its children only the outermost match counts.
    assert discover_split_points(model, "blocks.*") == [f"blocks.{i}" for i in range(4)]


def test_split_at_that_matches_nothing_is_an_input_error() -> None:
    gpt = _load("examples/gpt.py")
    with pytest.raises(InputError, match=r"--split-at.*'decoder\.\*' matches no module"):
        split_model(gpt.GPT(n_layer=1), num_inputs=1, split_at="decoder.*")


def test_defaulted_forward_arguments_stay_constant() -> None:
    class WithOption(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x if extra is None else x + extra

    model = WithOption()
    split = split_model(model, num_inputs=1)
    x = torch.randn(2, 4)
    assert split.names == ["layers.0", "layers.1", "layers.2"]
    assert torch.equal(split(x), model(x))


def test_untraceable_forward_is_an_input_error() -> None:
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # control flow on a value: not capturable as one graph
                x = self.layers[0](x)
            return self.layers[1](x)

    with pytest.raises(InputError, match="could not capture forward"):
        split_model(DataDependent(), num_inputs=1)


def test_a_model_without_submodules_is_one_layer() -> None:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x @ self.weight)

    model = Bare()
    split = split_model(model, num_inputs=1)
    assert split.num_layers == 1
    assert [p is model.weight for p in split.layer_parameters()[0]] == [True]
    x = torch.randn(3, 4)
    assert torch.equal(split(x), model(x))

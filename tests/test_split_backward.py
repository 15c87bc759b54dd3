"""Zero bubble's split backward (``I`` now, ``W`` later) equals one whole backward, also for
stages whose weights are shared or feed an output directly.

In one process, on the stage modules ``pipeplan run`` builds: two microbatches forward, then
their input halves, then their weight halves (zb's order: another microbatch's ``I`` runs
between a microbatch's ``I`` and its ``W``), against whole backwards of the same microbatches.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from planner.profile.split import capture_model
from planner.runtime.split_backward import depends_on, input_half, merged_groups, weight_half
from planner.runtime.stage import StageRuntime

MODELS = Path(__file__).parent / "models"


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grads(model: nn.Module, inputs: Any, first: int, last: int, split: bool, order: str) -> Any:
    """Parameter and input gradients of layers ``first..last`` over two microbatches."""
    cut = capture_model(model, inputs)
    values = cut.flat_inputs(inputs)
    with torch.no_grad():
        values = cut.stage(0, first - 1)(*values)
    module = cut.stage(first, last)
    stage = StageRuntime(
        module, stage_id=1, is_last=False, recompute=False, num_microbatches=2, loss=None
    )
    outs = [stage.forward(k, values) for k in range(2)]
    torch.manual_seed(1)
    sent = [
        [torch.randn_like(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else None
         for v in out]
        for out in outs
    ]  # fmt: skip
    if not split:
        back = [stage.backward(k, sent[k]) for k in range(2)]
    elif order == "I I W W":
        back = [stage.backward_input(k, sent[k]) for k in range(2)]
        for k in range(2):
            stage.backward_weight(k)
    else:
        back = []
        for k in range(2):
            back.append(stage.backward_input(k, sent[k]))
            stage.backward_weight(k)
    params = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return params, [[g.clone() for g in gs] for gs in back]


CASES = [
    ("repeated_block.py", 1, 4),  # one block every layer calls, twice each (ALBERT)
    ("shared_table.py", 1, 4),  # one table every layer reads (DeBERTa-v2's rel_embeddings)
    ("shared_table.py", 2, 5),
    ("position_bias.py", 1, 2),  # an output from a weight alone, a view (T5's position bias)
    ("position_bias.py", 1, 4),
    ("skip.py", 2, 3),  # inputs handed on untouched (DeBERTa-v2's relative embeddings)
]


@pytest.mark.parametrize(("name", "first", "last"), CASES)
@pytest.mark.parametrize("order", ["I I W W", "I W I W"])
def test_split_backward_equals_the_whole_one(name: str, first: int, last: int, order: str) -> None:
    user = _load(MODELS / name)
    x, _ = user.sample_batch(2)
    inputs = x if isinstance(x, tuple) else (x,)
    whole, whole_in = _grads(user.build_model(), inputs, first, last, False, order)
    split, split_in = _grads(user.build_model(), inputs, first, last, True, order)
    assert set(split) == set(whole) and whole
    for n, g in whole.items():
        torch.testing.assert_close(split[n], g, rtol=1e-5, atol=1e-6)
    for a, b in zip(split_in, whole_in, strict=True):
        for ga, gb in zip(a, b, strict=True):
            torch.testing.assert_close(ga, gb, rtol=0, atol=0)


def test_t5_decoder_stage_under_zero_bubble() -> None:
    """T5's decoder position bias, made in its first block and read by the others: torch's
    grouping put a parameter in two groups in some runs (its gradient counted twice), and
    the bias handed on to the next stage reached no weight."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from hf_zoo import build_model_for, sample_batch_for

    inputs, _ = sample_batch_for("t5", 2)
    whole, _ = _grads(build_model_for("t5").train(), inputs, 3, 5, False, "")
    for _ in range(3):  # torch's grouping depends on set order
        split, _ = _grads(build_model_for("t5").train(), inputs, 3, 5, True, "I I W W")
        for n, g in whole.items():
            torch.testing.assert_close(split[n], g, rtol=1e-5, atol=1e-5)


def test_depends_on_and_merged_groups() -> None:
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    both = (w * 2).sum() + x.sum()
    assert depends_on([x * w, w * 2, both, x, w], [x]) == [True, False, True, True, False]
    a, b, c = object(), object(), object()
    groups = [
        {"params": {1}, "intermediates": [a], "grads": [(torch.ones(1),)]},
        {"params": {1, 2}, "intermediates": [a, b], "grads": [(torch.ones(1),), None]},
        {"params": {3}, "intermediates": [b]},  # no gradient reached it; shares node b
        {"params": {4}, "intermediates": [c], "grads": [(torch.ones(1),)]},  # shares nothing
    ]
    one, apart = merged_groups(groups)
    assert one["params"] == {1, 2, 3} and one["intermediates"] == [a]
    assert apart["params"] == {4} and apart["intermediates"] == [c]
    assert merged_groups([{"params": {1}, "intermediates": [a]}]) == []


def test_weight_half_leaves_the_input_half_s_work_alone() -> None:
    """Two blocks' weight half backpropagates from each block's own nodes to its own
    weights: their groups stay apart, so the gradient of the second block does not run
    through the first again (which one group of both would do, and discard)."""
    torch.manual_seed(0)
    blocks = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
    x = torch.randn(2, 4, requires_grad=True)
    half = input_half([blocks(x)], [torch.ones(2, 4)], [x], list(blocks.parameters()))
    assert len(half.groups) == 2
    weight_half(list(blocks.parameters()), half)
    whole = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
    whole.load_state_dict(blocks.state_dict())
    for p in whole.parameters():
        p.grad = None
    whole(x.detach()).backward(torch.ones(2, 4))
    for p, q in zip(blocks.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


def test_weight_half_hands_each_group_its_own_parameters(monkeypatch: Any) -> None:
    """Each of torch's weight calls gets its group's parameters only, so a stage's weight
    half maps each parameter once (torch makes a view of every parameter it is handed: the
    stage's whole list per group was groups x parameters of them, W 13% slower than
    torch's own on a Llama stage)."""
    import torch.distributed.pipelining._backward as backward

    handed: list[int] = []
    real = backward.stage_backward_weight

    def counting(weights: Any, groups: Any, retain_graph: bool = False) -> Any:
        weights = list(weights)
        handed.append(len(weights))
        return real(iter(weights), groups, retain_graph=retain_graph)

    monkeypatch.setattr(backward, "stage_backward_weight", counting)
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(6)])
    params = list(blocks.parameters())
    x = torch.randn(2, 4, requires_grad=True)
    half = input_half([blocks(x)], [torch.ones(2, 4)], [x], params)
    weight_half(params, half)
    assert len(handed) == len(half.groups) == 6
    assert sum(handed) == len(params) == 12
    assert all(p.grad is not None for p in params)

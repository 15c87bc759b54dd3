"""Zero bubble's split backward of one stage: ``I`` (input gradients) now, ``W`` later.

Built on torch.distributed.pipelining's ``stage_backward_input`` / ``stage_backward_weight``
(the split the profiler times), with what a stage whose weights are shared or feed its
outputs directly needs to train exactly as one whole backward does:

* groups that share a parameter or a node run as **one** parameter group: torch groups
  the parameters by the nodes where their gradients meet the input-dependent graph, but
  merges a parameter whose nodes straddle two groups already formed into both (which two
  depends on set order), so that parameter's gradient would be counted twice, and the
  first group's call frees the graph the second still needs ("backward through the graph
  a second time"; a block every layer calls, as ALBERT's; a table every layer reads, as
  DeBERTa-v2's ``rel_embeddings``; T5's position bias). One group holding every such
  parameter and node, each node's gradient held at what the input half saw (torch's
  clamp), computes each parameter's gradient once, in one call; groups that share
  nothing stay apart (as fast as torch's own);
* outputs that do not depend on the stage's inputs (T5's position bias, made from a weight
  and handed on to the next stage) stay out of torch's input half: its groups start at
  nodes that depend on the inputs, so the gradient arriving on such an output would reach
  no weight. The weight half backpropagates it. (An input handed on untouched, as
  DeBERTa-v2's relative embeddings are, does depend on the inputs: its gradient is part
  of the input half's);
* an output that is a view (a slice of a larger tensor) goes to torch through a copy, as
  torch detaches the outputs in place when the input half is done.

Example::

    half = input_half(roots, root_grads, inputs, params)   # I: inputs' .grad set
    weight_half(params, half)                               # W: parameters' .grad
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["WeightHalf", "depends_on", "input_half", "merged_groups", "weight_half"]


@dataclass
class WeightHalf:
    """What ``W`` needs from ``I``: torch's parameter groups, and the outputs that depend
    on no input with their gradients."""

    groups: list[dict[str, Any]]
    weight_roots: list[torch.Tensor] = field(default_factory=list)
    weight_grads: list[torch.Tensor | None] = field(default_factory=list)


def _node(t: torch.Tensor) -> Any:
    """The autograd node a tensor's gradient enters (its accumulator for a leaf)."""
    if t.grad_fn is not None:
        return t.grad_fn
    return t.view_as(t).grad_fn.next_functions[0][0]  # type: ignore[union-attr]


def depends_on(roots: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[bool]:
    """For each root, whether its graph reaches one of ``inputs`` (leaves).

    Example::

        depends_on([x * w, w * 2, x], [x])   # [True, False, True]
    """
    targets = {_node(t) for t in inputs}
    dead: set[Any] = set()  # nodes searched through without reaching an input
    out: list[bool] = []
    for root in roots:
        start = _node(root) if root.requires_grad else None  # a leaf: its accumulator
        found, seen, stack = False, set(), [start] if start is not None else []
        while stack:  # depth first, stopping at the first input found (deep models)
            node = stack.pop()
            if node in targets:
                found = True
                break
            if node in seen or node in dead:
                continue
            seen.add(node)
            stack.extend(fn for fn, _ in node.next_functions if fn is not None)
        if not found:
            dead |= seen
        out.append(found)
    return out


def input_half(
    roots: Sequence[torch.Tensor],
    root_grads: Sequence[torch.Tensor | None] | None,
    inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
) -> WeightHalf:
    """``I``: the gradients of ``inputs`` (into their ``.grad``) from ``roots`` (the loss
    when ``root_grads`` is None); returns what :func:`weight_half` needs.

    Example::

        half = input_half(outputs, grads_from_next_stage, stage_inputs, stage_params)
    """
    from torch.distributed.pipelining._backward import stage_backward_input

    grads: list[torch.Tensor | None] = (
        [None] * len(roots) if root_grads is None else list(root_grads)
    )
    linked = depends_on(roots, inputs)
    half = WeightHalf([])
    through: list[torch.Tensor] = []
    through_grads: list[torch.Tensor | None] = []
    for root, grad, on_inputs in zip(roots, grads, linked, strict=True):
        if on_inputs:
            through.append(root.clone() if root._base is not None else root)
            through_grads.append(grad)
        elif grad is not None or root.numel() == 1:  # no gradient arrived: nothing to add
            half.weight_roots.append(root)
            half.weight_grads.append(grad)
    if through:
        _, groups = stage_backward_input(
            through,
            None if root_grads is None else through_grads,  # type: ignore[arg-type]
            list(inputs),
            iter(params),  # type: ignore[arg-type]
        )
        half.groups = merged_groups(groups)
    return half


def merged_groups(groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """torch's parameter groups, those that share a parameter or a node merged into one:
    every parameter, every node where a gradient was captured (once each, with that
    gradient); groups where no gradient was captured are dropped. Groups that share
    nothing stay apart: a group's weight half then backpropagates from its own nodes to
    its own parameters only, while one group of everything would also push each gradient
    through the nodes of the groups before it (the input half's work again, discarded by
    the clamp on those nodes): 2.5x the weight half's time on a GPT stage.

    Example::

        merged_groups(groups)   # [{"params": {...}, "intermediates": [...], "grads": [...]}, ...]
    """
    parent = list(range(len(groups)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Any, int] = {}
    for i, group in enumerate(groups):
        for key in [*group["params"], *group["intermediates"]]:
            j = owner.setdefault(key, i)
            parent[root(i)] = root(j)
    merged: dict[int, dict[str, Any]] = {}
    seen: set[Any] = set()
    for i, group in enumerate(groups):
        into = merged.setdefault(root(i), {"params": set(), "intermediates": [], "grads": []})
        into["params"] |= group["params"]
        captured = group.get("grads")
        if captured is None:  # no gradient reached this group's nodes
            continue
        for node, grad in zip(group["intermediates"], captured, strict=True):
            if grad is not None and node not in seen:
                seen.add(node)
                into["intermediates"].append(node)
                into["grads"].append(grad)
    return [g for g in merged.values() if g["intermediates"]]


def weight_half(params: Sequence[torch.Tensor], half: WeightHalf) -> None:
    """``W``: the parameters' gradients (added to their ``.grad``), then the graph is freed.

    Example::

        weight_half(stage_params, half)
    """
    from torch.distributed.pipelining._backward import stage_backward_weight

    # Each call is handed its own group's parameters: torch maps every parameter it is
    # given to its gradient accumulator (a view per parameter), so the stage's whole list
    # per group cost groups x parameters views (W 13% slower than torch's on a Llama stage).
    owner = {_node(p): p for p in params}
    last = len(half.groups) - 1
    for k, group in enumerate(half.groups):
        # Groups share no node; the outputs' backward below may pass the same weight-side
        # nodes. Each group's graph is freed as it goes (memory), the last's unless needed.
        retain = bool(half.weight_roots) or k < last
        own = [owner[node] for node in group["params"]]
        stage_backward_weight(iter(own), [group], retain_graph=retain)  # type: ignore[arg-type]
    if half.weight_roots:
        torch.autograd.backward(half.weight_roots, half.weight_grads)

"""Splitting a model into an ordered list of layers, and building pipeline stages from them.

The profiler measures these layers one by one and the runtime runs a contiguous range of them
as one stage, so what was profiled is exactly what runs. Every layer is a
:class:`torch.fx.GraphModule` that shares its submodules (and so its parameters) with the
original model; it takes the values that cross the cut before it and returns the values that
cross the cut after it. A value produced early and used late (an attention mask, a residual
that skips blocks) crosses every cut in between, so it is carried through the layers between.
The last layer returns what the model returns.

Layers are found from *split points*, module qualified names:

- an ``nn.Sequential`` model: its children, nested Sequentials flattened;
- any other model: by default the children of its largest ``nn.ModuleList``/``nn.Sequential``
  (most parameters, then most children, then the first), or the modules that the globs of
  ``--split-at`` (``fnmatch``, such as ``blocks.*``) match.

The model's ``forward`` is captured with ``torch.fx`` symbolic tracing, every module that
contains no split point treated as a leaf. Each call of a split point starts a layer (code that
follows it up to the next call belongs to it); code before the first call is one more layer,
and code after the last call another.

Example::

    split = split_model(model, num_inputs=1)              # GPT: embed, blocks.0..N-1, head
    stage = split.stage(1, 2)                             # blocks.0 and blocks.1 as one module
    values = split.stage(0, 0)(tokens)                    # (mask, hidden): the cut after embed
    logits = split.stage(1, split.num_layers - 1)(*values)
"""

from __future__ import annotations

import fnmatch
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from planner.errors import InputError

__all__ = ["SplitModel", "Stage", "discover_split_points", "split_model", "tensor_bytes"]


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in ``value`` (nested tuples, lists and dicts are searched).

    Example::

        tensor_bytes((torch.zeros(2, 3), 4, [torch.zeros(5, dtype=torch.int8)]))  # 24 + 5
    """
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 0


def discover_split_points(model: nn.Module, split_at: str | None = None) -> list[str]:
    """Qualified names of the modules that start a layer, in definition order.

    ``split_at`` is a comma-separated list of ``fnmatch`` globs over module names; of a module
    and its descendants only the outermost match counts. Without it, the children of an
    ``nn.Sequential`` model (flattened), else the children of the container holding the most
    parameters.

    Example::

        discover_split_points(gpt)                 # ['blocks.0', 'blocks.1', ...]
        discover_split_points(gpt, "blocks.*,head")
    """
    names = [name for name, _ in model.named_modules() if name]
    if split_at is not None:
        patterns = [p.strip() for p in split_at.split(",") if p.strip()]
        if not patterns:
            raise InputError("expected one or more module-name globs", field="--split-at")
        matched = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        outer = [n for n in matched if not any(n.startswith(m + ".") for m in matched)]
        if not outer:
            sample = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise InputError(
                f"{split_at!r} matches no module; module names are: {sample}",
                field="--split-at",
            )
        return outer
    if isinstance(model, nn.Sequential):
        return _flatten_sequential(model, "")
    containers = [
        (name, mod)
        for name, mod in model.named_modules()
        if name and isinstance(mod, nn.ModuleList | nn.Sequential) and len(mod) > 0
    ]
    if containers:
        # Largest by parameters: the stack of blocks, not a small Sequential inside a block.
        def size(item: tuple[str, nn.Module]) -> tuple[int, int]:
            return sum(p.numel() for p in item[1].parameters()), len(list(item[1].children()))

        name, largest = max(containers, key=size)  # max keeps the first of equals
        return [f"{name}.{child}" for child, _ in largest.named_children()]
    # No container: the top-level children, so a plain custom model still gets layers.
    return [name for name, _ in model.named_children()]


def _flatten_sequential(seq: nn.Sequential, prefix: str) -> list[str]:
    out: list[str] = []
    for child_name, child in seq.named_children():
        name = f"{prefix}{child_name}"
        if isinstance(child, nn.Sequential):
            out.extend(_flatten_sequential(child, name + "."))
        else:
            out.append(name)
    return out


class _Tracer(fx.Tracer):
    """Traces only what it must: modules without a split point inside stay leaves."""

    proxy_buffer_attributes = True

    def __init__(self, split_points: Sequence[str]):
        super().__init__()
        self.split_points = set(split_points)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        name = module_qualified_name
        if name in self.split_points:
            return True
        return not any(p.startswith(name + ".") for p in self.split_points) if name else False


@dataclass
class _Plan:
    """Which layer each traced node belongs to, and what crosses each cut."""

    layer_of: dict[fx.Node, int]
    cuts: list[list[fx.Node]]  # cuts[c]: values entering layer c (cuts[L]: unused)
    names: list[str]


class SplitModel:
    """A model cut into layers; see the module docstring.

    Attributes: ``model`` (the original, sharing parameters with the layers), ``layers``
    (one GraphModule per layer), ``names``, ``split_points``, ``num_inputs``, and
    ``cut_names[c]``: the traced names of the values entering layer ``c``.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: list[fx.GraphModule],
        names: list[str],
        split_points: list[str],
        num_inputs: int,
        cut_names: list[list[str]],
    ):
        self.model = model
        self.layers = layers
        self.names = names
        self.split_points = split_points
        self.num_inputs = num_inputs
        self.cut_names = cut_names

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def stage(self, first: int, last: int) -> Stage:
        """Layers ``first..last`` (inclusive) as one module.

        Example::

            stage = split.stage(0, 2)
            outputs = stage(*inputs)      # a tuple of cut values, or the model's output
        """
        if not 0 <= first <= last < self.num_layers:
            raise InputError(
                f"expected 0 <= first <= last < {self.num_layers}, got [{first}, {last}]",
                field="layers",
            )
        return Stage(self.layers[first : last + 1], first, last, last == self.num_layers - 1)

    def layer_parameters(self) -> list[list[nn.Parameter]]:
        """Each layer's parameters; a parameter shared by layers belongs to the first one.

        Example::

            sizes = [sum(p.numel() for p in ps) for ps in split.layer_parameters()]
        """
        seen: set[int] = set()
        out: list[list[nn.Parameter]] = []
        for layer in self.layers:
            own = [p for p in layer.parameters() if id(p) not in seen]
            seen.update(id(p) for p in own)
            out.append(own)
        return out

    def __call__(self, *inputs: Any) -> Any:
        """Run every layer in order: the same result as the original model."""
        return self.stage(0, self.num_layers - 1)(*inputs)


class Stage(nn.Module):
    """A contiguous range of layers; takes the cut before ``first``, returns the cut after
    ``last`` as a tuple (or the model's output when ``last`` is the final layer).

    Example::

        hidden = split.stage(0, 1)(tokens)
    """

    def __init__(self, layers: Sequence[nn.Module], first: int, last: int, is_last: bool):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.first = first
        self.last = last
        self.is_last = is_last

    def forward(self, *inputs: Any) -> Any:
        values: Any = inputs
        for layer in self.layers:  # each returns the tuple the next one takes
            values = layer(*values)
        return values


def split_model(
    model: nn.Module,
    num_inputs: int,
    split_at: str | None = None,
    *,
    source: str | os.PathLike[str] | None = None,
) -> SplitModel:
    """Capture ``model``'s forward and cut it into layers (see the module docstring).

    ``num_inputs`` is how many positional inputs the model is called with; later parameters
    of ``forward`` keep their defaults. ``source`` (the model.py) is named in errors.

    Example::

        split = split_model(build_model(), num_inputs=1, split_at="blocks.*")
        split.names    # ['embed', 'blocks.0', ..., 'head']
    """
    try:
        points = discover_split_points(model, split_at)
        graph = _trace(model, points, num_inputs)
        plan = _plan(graph, points)
    except InputError as exc:
        if exc.file is None and source is not None:
            raise InputError(exc.message, file=str(source), field=exc.field) from None
        raise
    layers = [
        _build_layer(model, graph, plan, k, k == len(plan.names) - 1)
        for k in range(len(plan.names))
    ]
    cut_names = [[n.name for n in cut] for cut in plan.cuts]
    return SplitModel(model, layers, plan.names, points, num_inputs, cut_names)


def _trace(model: nn.Module, points: Sequence[str], num_inputs: int) -> fx.Graph:
    concrete: dict[str, Any] = {}
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    for p in params[num_inputs:]:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            if p.default is inspect.Parameter.empty:
                raise InputError(
                    f"forward() needs argument {p.name!r} but sample_batch gives "
                    f"{num_inputs} input(s)",
                    field="sample_batch",
                )
            concrete[p.name] = p.default
    try:
        graph = _Tracer(points).trace(model, concrete_args=concrete or None)
    except Exception as exc:  # any tracing failure is a property of the user's model
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise InputError(
            f"could not capture forward() as a graph with torch.fx ({type(exc).__name__}: "
            f"{first_line}); make the top-level forward free of data-dependent control flow, "
            "or choose other boundaries with --split-at",
            field="build_model",
        ) from None
    _drop_concrete_placeholders(graph, num_inputs)
    return graph


def _drop_concrete_placeholders(graph: fx.Graph, num_inputs: int) -> None:
    # Arguments fixed to their defaults become constants so they never cross a cut.
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in placeholders[num_inputs:]:
        value = node.args[0] if node.args else None

        def constant(n: fx.Node, node: fx.Node = node, value: Any = value) -> Any:
            return value if n is node else n

        for user in list(node.users):
            if user.op == "call_function" and "assert" in getattr(user.target, "__name__", ""):
                graph.erase_node(user)
                continue
            user.args = fx.node.map_arg(user.args, constant)
            user.kwargs = fx.node.map_arg(user.kwargs, constant)
        graph.erase_node(node)


def _plan(graph: fx.Graph, points: Sequence[str]) -> _Plan:
    nodes = list(graph.nodes)
    point_set = set(points)
    calls = [i for i, n in enumerate(nodes) if n.op == "call_module" and n.target in point_set]
    if not calls and not points:  # a model without submodules: one layer, the whole model
        calls = [len(nodes)]
    elif not calls:
        raise InputError(
            f"forward() never calls the split points ({', '.join(points[:4])}...)",
            field="--split-at",
        )
    call_set, last_call = set(calls), calls[-1]
    layer_of: dict[fx.Node, int] = {}
    members: list[list[fx.Node]] = [[]]  # layer 0 is the code before the first split point
    in_tail = False
    for i, node in enumerate(nodes):
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if i in call_set:
            members.append([])
        elif i > last_call and not in_tail:  # code after the last split point: one more layer
            members.append([])
            in_tail = True
        members[-1].append(node)
    # Drop empty layers (no code before the first split point, say) and renumber.
    members = [m for m in members if m]
    if not members:
        raise InputError("forward() computes nothing to profile", field="build_model")
    for k, group in enumerate(members):
        for node in group:
            layer_of[node] = k
    num_layers = len(members)
    names = _unique([_layer_name(group, k) for k, group in enumerate(members)])
    cuts = _cuts(nodes, layer_of, num_layers)
    return _Plan(layer_of=layer_of, cuts=cuts, names=names)


def _layer_name(group: list[fx.Node], k: int) -> str:
    # Named after the modules it calls, so names match --split-at globs and the model's code.
    targets = list(dict.fromkeys(str(n.target) for n in group if n.op == "call_module"))
    if not targets:
        return f"layer{k}"
    if len(targets) > 3:
        return f"{targets[0]}+...+{targets[-1]}"
    return "+".join(targets)


def _unique(names: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    out = []
    for name in names:
        counts[name] = counts.get(name, 0) + 1
        out.append(name if counts[name] == 1 else f"{name}#{counts[name]}")
    return out


def _cuts(
    nodes: list[fx.Node], layer_of: dict[fx.Node, int], num_layers: int
) -> list[list[fx.Node]]:
    """``cuts[c]``: values defined before layer ``c`` and used at or after it, in graph order.

    Model inputs are defined at layer -1 and all enter layer 0; the output node uses its
    values at layer ``num_layers``. Attributes (get_attr) never cross: each layer that uses
    one reads it from the shared module itself.
    """
    cuts: list[list[fx.Node]] = [[] for _ in range(num_layers + 1)]
    for node in nodes:
        if node.op in ("get_attr", "output"):
            continue
        defined = -1 if node.op == "placeholder" else layer_of[node]
        used = [num_layers if u.op == "output" else layer_of[u] for u in node.users]
        last_use = max(used, default=defined)
        if node.op == "placeholder":
            last_use = max(last_use, 0)
        for c in range(defined + 1, last_use + 1):
            cuts[c].append(node)
    return cuts


def _build_layer(
    model: nn.Module, graph: fx.Graph, plan: _Plan, k: int, is_last: bool
) -> fx.GraphModule:
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in plan.cuts[k]:
        env[node] = new.placeholder(node.name)

    def lookup(n: fx.Node) -> fx.Node:
        if n not in env:
            if n.op != "get_attr":  # pragma: no cover - the cut analysis guarantees this
                raise AssertionError(f"value {n.name} is not available in layer {k}")
            env[n] = new.get_attr(str(n.target))
        return env[n]

    for node in graph.nodes:
        if plan.layer_of.get(node) == k:
            env[node] = new.node_copy(node, lookup)
    if is_last:
        output = next(n for n in graph.nodes if n.op == "output")
        new.output(fx.node.map_arg(output.args[0], lookup))
    else:
        new.output(tuple(lookup(n) for n in plan.cuts[k + 1]))
    new.lint()
    layer = fx.GraphModule(model, new, class_name=f"Layer{k}")
    return layer

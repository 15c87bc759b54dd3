"""Layers that compute exactly the same thing: the repeated blocks of a transformer.

A 126-block model has two or three distinct layers; counting each distinct one once and
reusing its counts for its twins is what keeps an analytic profile of a 405B model within
seconds. Two layers are twins when their graphs are the same operations in the same order
on the same arguments, their parameters, buffers and constants have the same shapes,
dtypes and ``requires_grad``, every module a graph calls is the same (class, the plain
attributes its ``forward`` may read -- ``n_head``, ``eps`` --, parameters, buffers and
children, recursively), and the values entering them have the same shapes, strides and
dtypes. Anything the signature cannot see (a Python callable stored on a module, say) makes
the layer unique rather than risk a wrong count.

Example::

    sig = layer_signature(split.layers[1], values)
    sig == layer_signature(split.layers[2], values)    # True for two identical blocks
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import fx, nn

__all__ = ["layer_signature", "values_signature"]

_PLAIN = (bool, int, float, str, type(None))


def layer_signature(layer: nn.Module, values: Sequence[Any]) -> Hashable | None:
    """A hashable summary of what ``layer`` computes on ``values`` (None: not comparable).

    Example::

        layer_signature(split.layers[3], cut_values)
    """
    try:
        graph = _graph_of(layer)
        if graph is None:
            return None
        return (_value_signature(list(values)), _graph_signature(graph, _root_of(layer)))
    except _Unique:
        return None


def values_signature(values: Sequence[Any]) -> Hashable | None:
    """The shapes, strides and dtypes of the values entering a layer (None: not comparable).

    Example::

        values_signature((mask, hidden))
    """
    try:
        return _value_signature(list(values))
    except _Unique:
        return None


class _Unique(Exception):
    """Something the signature cannot compare: the layer is counted on its own."""


def _graph_of(layer: nn.Module) -> fx.Graph | None:
    module = getattr(layer, "graph_module", layer)  # an exported model's last layer
    return module.graph if isinstance(module, fx.GraphModule) else None


def _root_of(layer: nn.Module) -> nn.Module:
    return getattr(layer, "graph_module", layer)


def _graph_signature(graph: fx.Graph, root: nn.Module) -> tuple[Any, ...]:
    index: dict[fx.Node, int] = {}
    out: list[Any] = []
    for k, node in enumerate(graph.nodes):
        index[node] = k
        if node.op == "get_attr":
            target = _attribute(root, str(node.target))
            out.append(("get_attr", _object_signature(target)))
        elif node.op == "call_module":
            out.append(("call_module", _module_signature(root.get_submodule(str(node.target)))))
        elif node.op in ("placeholder", "output"):
            out.append((node.op,))
        else:
            out.append((node.op, _target(node.target)))
        out.append(_args_signature((node.args, node.kwargs), index))
    return tuple(out)


def _attribute(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def _target(target: Any) -> str:
    if isinstance(target, str):
        return target
    name = getattr(target, "name", None)
    if callable(name):  # an OpOverload: aten::mm.default
        return f"{name()}.{getattr(target, '_overloadname', '')}"
    module = getattr(target, "__module__", "")
    qualname = getattr(target, "__qualname__", None)
    if qualname is None:
        raise _Unique
    return f"{module}.{qualname}"


def _args_signature(value: Any, index: dict[fx.Node, int]) -> Any:
    if isinstance(value, fx.Node):
        return ("node", index[value])
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(_args_signature(v, index) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _args_signature(v, index)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", value.start, value.stop, value.step)
    if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return str(value)
    if isinstance(value, _PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise _Unique
    raise _Unique


def _object_signature(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return _tensor_signature(obj)
    if isinstance(obj, fx.GraphModule):
        return ("graph", _graph_signature(obj.graph, obj))
    if isinstance(obj, nn.Module):
        return _module_signature(obj)
    raise _Unique


def _tensor_signature(t: torch.Tensor) -> tuple[Any, ...]:
    return (
        "tensor",
        tuple(int(s) for s in t.shape),
        tuple(int(s) for s in t.stride()),
        str(t.dtype),
        bool(t.requires_grad),
        isinstance(t, nn.Parameter),
    )


def _module_signature(module: nn.Module) -> tuple[Any, ...]:
    plain: list[tuple[Any, ...]] = []
    for key, value in sorted(vars(module).items()):
        if key.startswith("_") or key == "training":
            continue
        if isinstance(value, _PLAIN) or (
            isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)
        ):
            plain.append((key, value))
        elif isinstance(value, nn.Module | torch.Tensor):
            continue  # children, parameters and buffers are compared below
        elif callable(value):
            raise _Unique  # a stored function (an activation chosen at build time, say)
        else:
            plain.append((key, type(value).__qualname__, repr(value)))
    if isinstance(module, fx.GraphModule):
        plain.append(("graph", _graph_signature(module.graph, module)))
    return (
        type(module).__module__,
        type(module).__qualname__,
        tuple(plain),
        tuple((k, _tensor_signature(p)) for k, p in module._parameters.items() if p is not None),
        tuple((k, _tensor_signature(b)) for k, b in module._buffers.items() if b is not None),
        tuple((k, _module_signature(c)) for k, c in module._modules.items() if c is not None),
    )


def _value_signature(values: list[Any]) -> Any:
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(_tensor_signature(v))
        elif isinstance(v, _PLAIN):
            out.append((type(v).__name__, v))
        else:
            raise _Unique
    return tuple(out)

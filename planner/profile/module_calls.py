"""Module calls in an exported graph: the operations of chosen modules put back as one call.

torch.export records the aten operations every module ran, inlined, with the shapes of the
capture baked in. A module whose behaviour is changed *after* the capture (tensor
parallelism: ``parallelize_module`` swaps its parameters for shards and hooks its forward
to issue the collectives) must run as itself instead. torch.export keeps what that needs:
with ``preserve_module_call_signature`` it records, for each named module, which graph
values entered its call (as the module's ``(args, kwargs)``) and which left it.
:func:`call_modules` replaces each such call's operations by one ``call_module`` node with
those arguments, so the layer built from the graph calls the module object itself, hooks
and all, exactly as a torch.fx capture calls its leaf modules. The layers, their names, their
split points and the values crossing their cuts stay those of the plain capture: the new
node carries the module stack of the operations it replaces.

Example::

    program = torch.export.export(model, (), kwargs, strict=False,
                                  preserve_module_call_signature=("model.layers.0",))
    captured = ...  # export_graph's plain graph over the model's attributes
    call_modules(captured.graph, captured.attributes, model, program.module_call_graph,
                 ["model.layers.0"])
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from torch import fx, nn
from torch.utils import _pytree

from planner.errors import InputError

__all__ = ["call_modules", "flat_outputs"]


def flat_outputs(value: Any) -> list[Any]:
    """A module's output as the flat list torch.export recorded (``getitem`` picks one).

    Example::

        flat_outputs((x, {"a": y}))   # [x, y]
    """
    return list(_pytree.tree_flatten(value)[0])


def call_modules(
    graph: fx.Graph,
    attributes: dict[str, Any],
    model: nn.Module,
    module_call_graph: Sequence[Any],
    names: Sequence[str],
) -> None:
    """Replace the inlined operations of each module in ``names`` by a call of the module.

    ``module_call_graph`` is the exported program's (export with
    ``preserve_module_call_signature=names``); ``attributes`` (the layers' root) gains each
    module. One line (:class:`InputError`) where a module runs more than once, or its
    values are used other than through its outputs.

    Example::

        call_modules(graph, attributes, model, program.module_call_graph, ["lm_head"])
    """
    signatures = {e.fqn: e.signature for e in module_call_graph}
    renamed: dict[str, fx.Node] = {}  # outputs of modules already replaced: their new nodes
    for name in names:
        signature = signatures.get(name)
        if signature is None:
            raise InputError(
                f"torch.export kept no call signature of module {name!r}", field="build_model"
            )
        _replace(graph, name, signature, renamed)
        attributes[name] = model.get_submodule(name)
    for node in list(graph.nodes):  # parameters only the replaced operations read
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    graph.lint()


def _replace(graph: fx.Graph, name: str, signature: Any, renamed: dict[str, fx.Node]) -> None:
    from torch.export.graph_signature import ConstantArgument, TensorArgument

    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    inside = [n for n in nodes if n.op == "call_function" and _runs_in(n, name)]
    if not inside:
        raise InputError(f"module {name!r} runs no operation in forward()", field="build_model")
    inside += [n for n in nodes if _writes_back(n, inside)]
    by_name = {n.name: n for n in nodes} | renamed
    flat_in: list[Any] = []
    for arg in signature.inputs:
        if isinstance(arg, TensorArgument) and arg.name in by_name:
            flat_in.append(by_name[arg.name])
        elif isinstance(arg, ConstantArgument):
            flat_in.append(arg.value)
        else:
            raise InputError(
                f"module {name!r} takes an input torch.export cannot name ({arg}); it cannot "
                "be called as a module in the captured graph",
                field="build_model",
            )
    outputs = [by_name[a.name] for a in signature.outputs if isinstance(a, TensorArgument)]
    if len(outputs) != len(signature.outputs):
        raise InputError(
            f"module {name!r} returns a value that is not a tensor", field="build_model"
        )
    args, kwargs = _pytree.tree_unflatten(flat_in, signature.in_spec)
    first = min(inside, key=order.__getitem__)
    late = [n for n in flat_in if isinstance(n, fx.Node) and order[n] > order[first]]
    if late:
        raise InputError(
            f"module {name!r} reads {late[0].name} before it is computed", field="build_model"
        )
    stack = _stack_until(first, name)
    with graph.inserting_before(first):
        call = graph.call_module(name, tuple(args), dict(kwargs))
        new = [call]
        if signature.out_spec.is_leaf():
            results = [call]
        else:
            flat = graph.call_function(flat_outputs, (call,))
            results = [
                graph.call_function(operator.getitem, (flat, i)) for i in range(len(outputs))
            ]
            new += [flat, *results]
    for node in new:
        node.meta["nn_module_stack"] = dict(stack)
    members = set(inside)
    for old, result in zip(outputs, results, strict=True):
        renamed[old.name] = result
        for user in list(old.users):
            if user not in members:
                user.replace_input_with(old, result)
    for node in inside:
        stray = [u for u in node.users if u not in members]
        if stray:
            raise InputError(
                f"forward() uses a value computed inside module {name!r} ({node.name}) that "
                "the module does not return",
                field="build_model",
            )
    for node in sorted(inside, key=order.__getitem__, reverse=True):
        graph.erase_node(node)


def _runs_in(node: fx.Node, name: str) -> bool:
    """Whether ``node`` ran inside a call of module ``name`` (a second call refused)."""
    stack = node.meta.get("nn_module_stack") or {}
    for value in stack.values():
        path = value[0] if isinstance(value, tuple) else str(value)
        if path == name:
            return True
        if path.startswith(name + "@"):
            raise InputError(
                f"module {name!r} is called more than once in forward(); it cannot be "
                "split across a tensor-parallel group here",
                field="build_model",
            )
    return False


def _writes_back(node: fx.Node, inside: list[fx.Node]) -> bool:
    """A buffer write-back (export_graph's ``copy_``) of a value computed inside."""
    import torch

    if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default:
        return False
    return len(node.args) > 1 and node.args[1] in inside


def _stack_until(node: fx.Node, name: str) -> dict[str, Any]:
    """``node``'s module stack, outermost first, up to and including module ``name``."""
    out: dict[str, Any] = {}
    for key, value in (node.meta.get("nn_module_stack") or {}).items():
        out[key] = value
        path = value[0] if isinstance(value, tuple) else str(value)
        if path == name:
            break
    return out

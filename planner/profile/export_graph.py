"""Capturing a model's forward with ``torch.export`` (non-strict), as a graph the splitter cuts.

torch.fx symbolic tracing stops at the first Python branch on a traced value, which most
Hugging Face models take at their top level (masks, position ids, caches). ``torch.export``
in non-strict mode runs the real Python code on fake tensors of the sample batch's shapes,
so such branches are simply taken, and records the ATen operations that ran, each with the
module stack it ran in (``node.meta["nn_module_stack"]``). That is what torch.distributed.
pipelining's ``pipeline()`` builds on too.

The exported program lifts parameters, buffers and constants to inputs; here they become
``get_attr`` nodes again, named with the model's own parameter names (the first name of a
tied parameter, as ``model.named_parameters()`` gives it), so each layer built from the
graph shares the very ``nn.Parameter`` objects of the model and the runtime, ``return_params``
and checkpoints see the usual names. Buffers the forward updates (BatchNorm's running
statistics) are written back in place right where the new value is computed.

The graph is specialised to the sample's shapes: a graph captured at microbatch size 4 runs
only microbatches of 4 (the splitter captures once per size).

Example::

    captured = export_graph(model, {"input_ids": ids, "attention_mask": mask})
    captured.input_names      # ('input_ids', 'attention_mask'): the graph's placeholders
    captured.attributes       # 'transformer.wte.weight' -> the model's Parameter, ...
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from planner.errors import InputError

__all__ = [
    "ExportedGraph",
    "call_for_training",
    "export_graph",
    "has_dropout",
    "module_path",
    "ordered_kwargs",
]


@dataclass
class ExportedGraph:
    """An exported forward as a plain fx graph over the model's own attributes.

    ``graph`` takes the model's tensor inputs as placeholders (``input_names``, in that
    order) and returns the flat tuple of its outputs; ``out_spec`` rebuilds the model's
    output structure (a tensor, a tuple, a ``ModelOutput``) from that tuple. ``attributes``
    maps every ``get_attr`` target to its object (parameters and buffers of the model,
    lifted constants, the subgraphs of higher-order operations). ``in_eval_mode``: the
    training-mode export stopped on a random branch of a model without dropout, and the
    graph was captured in eval mode (:func:`has_dropout`).
    """

    graph: fx.Graph
    attributes: dict[str, Any]
    input_names: tuple[str, ...]
    out_spec: Any  # torch.utils._pytree.TreeSpec
    in_eval_mode: bool = False  # captured in eval mode: the model has no dropout (see below)


def ordered_kwargs(model: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword inputs in the order of ``forward``'s parameters (unknown names last).

    Example::

        ordered_kwargs(bert, {"attention_mask": m, "input_ids": i})  # input_ids first
    """
    try:
        order = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        order = []
    rank = {name: i for i, name in enumerate(order)}
    keys = sorted(inputs, key=lambda k: (rank.get(k, len(order)), list(inputs).index(k)))
    return {k: inputs[k] for k in keys}


def _training_kwargs(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    # A Hugging Face model returns its key/value cache unless told not to; training never
    # reads it, and torch.export cannot return the cache object.
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return kwargs
    if "use_cache" in params and "use_cache" not in kwargs:
        return {**kwargs, "use_cache": False}
    return kwargs


def call_for_training(model: nn.Module, inputs: tuple[Any, ...] | Mapping[str, Any]) -> Any:
    """Call ``model`` on positional or keyword inputs as the export captured it.

    Example::

        logits = call_for_training(model, {"input_ids": ids}).logits
    """
    if isinstance(inputs, Mapping):
        return model(**_training_kwargs(model, ordered_kwargs(model, inputs)))
    return model(*inputs)


def export_graph(
    model: nn.Module,
    inputs: tuple[Any, ...] | Mapping[str, Any],
    *,
    dynamic_batch: bool = False,
    module_calls: Sequence[str] = (),
) -> ExportedGraph:
    """Export ``model``'s forward on ``inputs`` (non-strict) and re-attach its attributes.

    Raises :class:`InputError` naming the construct that stopped the export (a
    data-dependent branch, with its file and line where torch says it). ``dynamic_batch``:
    the first dimension of every tensor input is exported as one symbolic size, so the
    graph runs at any microbatch size (torch raises where the model specialises on it).
    ``module_calls``: modules whose operations become one call of the module itself
    (:mod:`planner.profile.module_calls`; the tensor-parallel shards run through them).

    Example::

        captured = export_graph(gpt2, {"input_ids": torch.randint(0, 100, (2, 16))})
    """
    if isinstance(inputs, Mapping):
        args: tuple[Any, ...] = ()
        kwargs = _training_kwargs(model, ordered_kwargs(model, inputs))
    else:
        args, kwargs = tuple(inputs), {}
    dynamic = _batch_dims(args, kwargs) if dynamic_batch else None
    keep = tuple(module_calls)
    try:
        with _quiet_torch_logs():
            program = torch.export.export(
                model,
                args,
                kwargs,
                strict=False,
                dynamic_shapes=dynamic,
                preserve_module_call_signature=keep,
            )
        in_eval_mode = False
    except Exception as first:  # any export failure is a property of the user's model
        program = _export_without_dropout(model, args, kwargs, first, keep)
        if program is None:
            raise InputError(_why_not(first), field="build_model") from None
        in_eval_mode = True
    captured = _rebuild(model, program, in_eval_mode=in_eval_mode)
    if keep:
        from planner.profile.module_calls import call_modules

        call_modules(captured.graph, captured.attributes, model, program.module_call_graph, keep)
    return captured


def _batch_dims(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``dynamic_shapes`` with dimension 0 of every tensor input one symbolic batch size."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)

    def spec(value: Any) -> Any:
        return {0: batch} if isinstance(value, torch.Tensor) and value.dim() else None

    if kwargs:
        return {key: spec(value) for key, value in kwargs.items()}
    return tuple(spec(value) for value in args)


def _export_without_dropout(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    first: BaseException,
    keep: tuple[str, ...] = (),
) -> Any:
    """A second try in eval mode, for a model whose training-mode forward branches on a
    random draw (OPT's ``if torch.rand([]) < self.layerdrop``) but has no dropout at all:
    then eval mode computes the same values. None where that does not hold or fails too."""
    if "data-dependent" not in str(first) and "DataDependent" not in type(first).__name__:
        return None
    if has_dropout(model):
        return None
    model.eval()
    try:
        with _quiet_torch_logs():
            return torch.export.export(
                model, args, kwargs, strict=False, preserve_module_call_signature=keep
            )
    except Exception:
        return None
    finally:
        model.train()


def has_dropout(model: nn.Module) -> bool:
    """Whether any module drops anything in training: an ``nn.Dropout``-style ``p`` above 0,
    or a float attribute (or config entry) whose name says drop (``layerdrop``,
    ``attention_dropout``, ``resid_pdrop``) above 0.

    Example::

        has_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)))   # False
    """
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
        config = getattr(module, "config", None)
        entries = dict(vars(module))
        if config is not None and hasattr(config, "to_dict"):
            entries.update(config.to_dict())
        for name, value in entries.items():
            droppy = "drop" in name.lower()
            if droppy and isinstance(value, float) and not isinstance(value, bool) and value > 0:
                return True
    return False


class _quiet_torch_logs:
    """torch.export logs warnings and prints the partial graph to stderr when it stops;
    pipeplan says one line instead."""

    def __enter__(self) -> None:
        import contextlib
        import io
        import logging

        names = ["torch"] + [n for n in logging.root.manager.loggerDict if n.startswith("torch.")]
        self.levels = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
        for logger, _ in self.levels:
            logger.setLevel(logging.ERROR + 10)
        self.redirect = contextlib.redirect_stderr(io.StringIO())
        self.redirect.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.redirect.__exit__(*exc)
        for logger, level in self.levels:
            logger.setLevel(level)


def _why_not(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    where = _user_frame(text)
    head = text.split(". ")[0][:240]
    return (
        f"torch.export could not capture forward() ({type(exc).__name__}: {head})"
        + (f" at {where}" if where else "")
        + "; make that branch independent of tensor values, or choose other boundaries "
        "with --split-at"
    )


def _user_frame(text: str) -> str | None:
    # torch's data-dependent errors quote the user frame as 'File "x.py", line N'.
    import re

    frames = re.findall(r'File "([^"]+)", line (\d+)', text)
    frames = [(f, n) for f, n in frames if "/torch/" not in f]
    if not frames:
        return None
    file, line = frames[-1]
    return f"{file}:{line}"


def _rebuild(model: nn.Module, program: Any, *, in_eval_mode: bool = False) -> ExportedGraph:
    from torch.export.graph_signature import InputKind, OutputKind

    signature = program.graph_signature
    canonical = _canonical_names(model)
    attributes: dict[str, Any] = {}
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    specs = {s.arg.name: s for s in signature.input_specs if hasattr(s.arg, "name")}
    input_names: list[str] = []
    mutated = {
        s.arg.name: s.target
        for s in signature.output_specs
        if s.kind == OutputKind.BUFFER_MUTATION and s.target is not None
    }
    for node in program.graph.nodes:
        if node.op == "placeholder":
            spec = specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                if isinstance(spec.arg, torch.export.graph_signature.ConstantArgument):
                    env[node] = spec.arg.value  # a non-tensor input: a constant of the graph
                    continue
                input_names.append(node.name)
                env[node] = graph.placeholder(node.name)
                env[node].meta = dict(node.meta)
                continue
            target = _attribute(model, program, spec, canonical, attributes)
            env[node] = graph.get_attr(target)
            continue
        if node.op == "get_attr":  # subgraphs of higher-order operations, constants
            attributes[str(node.target)] = _resolve(program.graph_module, str(node.target))
            env[node] = graph.get_attr(str(node.target))
            continue
        if node.op == "output":
            outputs = node.args[0]
            user = [
                env[value] if isinstance(value, fx.Node) else value
                for value, spec in zip(outputs, signature.output_specs, strict=True)
                if spec.kind == OutputKind.USER_OUTPUT
            ]
            for spec in signature.output_specs:
                if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.BUFFER_MUTATION):
                    raise InputError(
                        f"forward() mutates its inputs ({spec.kind.name}); pipeplan can "
                        "only run models whose forward changes nothing but buffers",
                        field="build_model",
                    )
            graph.output(tuple(user))
            continue
        if node.target in _DTYPE_ASSERTIONS:
            # export checks the dtype a `.to()` saw at capture (fp32); under the profile's
            # autocast the same value is bf16 there and the check would fail, not the code.
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
        written = mutated.get(node.name)
        if written is not None:  # write the buffer back where its new value is made
            buffer = graph.get_attr(canonical.get(id(model.get_buffer(written)), written))
            graph.call_function(torch.ops.aten.copy_.default, (buffer, env[node]))
    graph.lint()
    out_spec = program.call_spec.out_spec
    return ExportedGraph(graph, attributes, tuple(input_names), out_spec, in_eval_mode)


_DTYPE_ASSERTIONS = (torch.ops.aten._assert_tensor_metadata.default,)


def _canonical_names(model: nn.Module) -> dict[int, str]:
    """id of every parameter and buffer -> its first name, as ``named_parameters`` gives."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    for name, b in model.named_buffers():
        names.setdefault(id(b), name)
    return names


def _attribute(
    model: nn.Module,
    program: Any,
    spec: Any,
    canonical: dict[int, str],
    attributes: dict[str, Any],
) -> str:
    """The get_attr target for a lifted input, its object recorded in ``attributes``."""
    from torch.export.graph_signature import InputKind

    target = str(spec.target)
    if spec.kind == InputKind.PARAMETER:
        obj: Any = model.get_parameter(target)
    elif spec.kind == InputKind.BUFFER:
        obj = model.get_buffer(target)
    elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
        obj = program.constants[target]
        name = "pipeplan_constant." + target.replace(".", "_")
        attributes[name] = obj
        return name
    else:  # pragma: no cover - token inputs appear only with side-effecting custom ops
        raise InputError(f"forward() uses {spec.kind.name} inputs", field="build_model")
    name = canonical.get(id(obj), target)
    attributes[name] = obj
    return name


def _resolve(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def module_path(node: fx.Node) -> list[str]:
    """The qualified names of the modules ``node`` ran in, outermost first.

    Example::

        module_path(node)   # ['transformer', 'transformer.h.0', 'transformer.h.0.attn']
    """
    stack = node.meta.get("nn_module_stack") or {}
    out: list[str] = []
    for value in stack.values():
        path = value[0] if isinstance(value, tuple) else str(value)
        path = path.split("@")[0]  # a module called again: 'blocks.0@1'
        if path.startswith("_empty_nn_module_stack"):  # torch's placeholder for none
            continue
        if path and path not in out:
            out.append(path)
    return out

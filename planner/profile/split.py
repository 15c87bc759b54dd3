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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from planner.errors import InputError
from planner.profile.export_graph import call_for_training, export_graph, module_path

__all__ = [
    "CAPTURES",
    "OutputLayer",
    "SplitModel",
    "Stage",
    "capture_model",
    "checkpoint_once",
    "discover_split_points",
    "hugging_face_split_points",
    "retarget_device",
    "split_model",
    "tensor_bytes",
]

CAPTURES = ("auto", "fx", "export")
"""How a forward is captured: ``auto`` tries torch.fx, then torch.export."""


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
    declared = hugging_face_split_points(model)
    if declared:
        return declared
    stacks = _block_stacks(model)
    if stacks:
        return [f"{name}.{child}" for name, mod in stacks for child, _ in mod.named_children()]
    # No container: the top-level children, so a plain custom model still gets layers.
    return [name for name, _ in model.named_children()]


def hugging_face_split_points(model: nn.Module) -> list[str]:
    """Split points from a Hugging Face model's own pipeline plan (``_pp_plan``), if any.

    transformers declares, for the Llama family and others, the modules a pipeline cuts
    between: the embedding, each decoder layer, the final norm and the head. A ModuleList
    entry stands for its children. The outermost module that declares a plan is used, so a
    user's wrapper around the model works too.

    Example::

        hugging_face_split_points(LlamaForCausalLM(config))
        # ['model.embed_tokens', 'model.layers.0', ..., 'model.norm', 'lm_head']
    """
    for prefix, module in model.named_modules():
        plan = getattr(module, "_pp_plan", None)
        if not isinstance(plan, dict) or not plan:
            continue
        points: list[str] = []
        base = f"{prefix}." if prefix else ""
        for key in plan:
            try:
                target = module.get_submodule(key)
            except AttributeError:
                return []  # a plan naming modules this model lacks: not to be trusted
            if isinstance(target, nn.ModuleList):
                points += [f"{base}{key}.{child}" for child, _ in target.named_children()]
            else:
                points.append(f"{base}{key}")
        order = {name: i for i, (name, _) in enumerate(model.named_modules())}
        return sorted(points, key=lambda n: order.get(n, len(order)))
    return []


def _block_stacks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The containers of blocks: the largest ``ModuleList``/``Sequential`` by parameters,
    and any other one, not nested in it, at least half its size (an encoder-decoder's two
    stacks), in definition order."""
    containers = [
        (name, mod)
        for name, mod in model.named_modules()
        if name and isinstance(mod, nn.ModuleList | nn.Sequential) and len(mod) > 0
    ]
    if not containers:
        return []

    # Largest by parameters: the stack of blocks, not a small Sequential inside a block.
    def size(item: tuple[str, nn.Module]) -> tuple[int, int]:
        return sum(p.numel() for p in item[1].parameters()), len(list(item[1].children()))

    largest = max(containers, key=size)  # max keeps the first of equals
    chosen = [largest]
    for item in containers:
        nested = any(
            item[0].startswith(c[0] + ".") or c[0].startswith(item[0] + ".") for c in chosen
        )
        big = 2 * size(item)[0] >= size(largest)[0] and len(item[1]) >= 2
        if item is not largest and not nested and big:
            chosen.append(item)
    order = {name: i for i, (name, _) in enumerate(containers)}
    return sorted(chosen, key=lambda item: order[item[0]])


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
    (one module per layer), ``names``, ``split_points``, ``num_inputs``, and
    ``cut_names[c]``: the traced names of the values entering layer ``c``. ``capture`` says
    how the graph was captured (``"fx"``, ``"export"``, or ``"export-eval"``: exported in
    eval mode because the model has no dropout and branches on a random draw in training);
    ``input_names`` are the keyword inputs the first layer takes positionally, in order
    (empty for positional inputs);
    ``batch_size`` is the microbatch size an exported graph is specialised to (None: any).
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[nn.Module],
        names: list[str],
        split_points: list[str],
        num_inputs: int,
        cut_names: list[list[str]],
        *,
        capture: str = "fx",
        input_names: tuple[str, ...] = (),
        batch_size: int | None = None,
    ):
        self.model = model
        self.layers = list(layers)
        self.names = names
        self.split_points = split_points
        self.num_inputs = num_inputs
        self.cut_names = cut_names
        self.capture = capture
        self.input_names = input_names
        self.batch_size = batch_size

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def flat_inputs(self, inputs: Any) -> tuple[Any, ...]:
        """The first layer's positional inputs from ``sample_batch``'s inputs.

        Example::

            split.flat_inputs({"input_ids": ids, "attention_mask": mask})  # (ids, mask)
        """
        if isinstance(inputs, Mapping):
            missing = [k for k in self.input_names if k not in inputs]
            if missing or len(inputs) != len(self.input_names):
                raise InputError(
                    f"expected the keyword inputs {list(self.input_names)} the model was "
                    f"captured with, got {list(inputs)}",
                    field="sample_batch",
                )
            return tuple(inputs[k] for k in self.input_names)
        return tuple(inputs)

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


class OutputLayer(nn.Module):
    """The last layer of an exported graph: rebuilds the model's own output structure (a
    ``ModelOutput``, a tuple) from the graph's flat outputs.

    Example::

        out = split.layers[-1](*values)     # e.g. CausalLMOutput(logits=...)
    """

    def __init__(self, graph_module: fx.GraphModule, out_spec: Any):
        super().__init__()
        self.graph_module = graph_module
        self.out_spec = out_spec

    def forward(self, *inputs: Any) -> Any:
        from torch.utils import _pytree

        return _pytree.tree_unflatten(list(self.graph_module(*inputs)), self.out_spec)


def checkpoint_once(fn: Callable[..., Any], module: nn.Module, *args: Any) -> Any:
    """``torch.utils.checkpoint`` (non-reentrant) of ``fn(*args)``, whose recomputation in
    the backward leaves ``module``'s running statistics (BatchNorm's ``running_mean``,
    ``running_var``, ``num_batches_tracked``) as they were: updated once per microbatch,
    by its forward, as without recompute (a plain checkpoint updates them twice). In
    training mode a BatchNorm normalises with the batch's statistics, so the rebuilt
    values are the same either way.

    Example::

        out = checkpoint_once(layer, layer, x)
    """
    import contextlib

    from torch.utils.checkpoint import checkpoint

    norms = [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats
    ]
    if not norms:
        return checkpoint(fn, *args, use_reentrant=False)

    @contextlib.contextmanager
    def statistics_kept() -> Any:
        saved = [
            (b, b.clone())
            for m in norms
            for b in (m.running_mean, m.running_var, m.num_batches_tracked)
            if b is not None
        ]
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, value in saved:
                    buffer.copy_(value)

    return checkpoint(
        fn,
        *args,
        use_reentrant=False,
        context_fn=lambda: (contextlib.nullcontext(), statistics_kept()),
    )


class Stage(nn.Module):
    """A contiguous range of layers; takes the cut before ``first``, returns the cut after
    ``last`` as a tuple (or the model's output when ``last`` is the final layer).

    ``checkpoint_layers`` (a plan stage's ``recompute_layers``): each layer runs under its
    own non-reentrant activation checkpoint, so only the layers' inputs stay alive until
    the backward rebuilds one layer at a time.

    Example::

        hidden = split.stage(0, 1)(tokens)
    """

    def __init__(self, layers: Sequence[nn.Module], first: int, last: int, is_last: bool):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.first = first
        self.last = last
        self.is_last = is_last
        self.checkpoint_layers = False

    def forward(self, *inputs: Any) -> Any:
        values: Any = inputs
        for layer in self.layers:  # each returns the tuple the next one takes
            if self.checkpoint_layers:
                values = checkpoint_once(layer, layer, *values)
            else:
                values = layer(*values)
        return values


def split_model(
    model: nn.Module,
    num_inputs: int,
    split_at: str | None = None,
    *,
    source: str | os.PathLike[str] | None = None,
) -> SplitModel:
    """Capture ``model``'s forward with torch.fx and cut it into layers (module docstring).

    ``num_inputs`` is how many positional inputs the model is called with; later parameters
    of ``forward`` keep their defaults. ``source`` (the model.py) is named in errors.
    :func:`capture_model` chooses between torch.fx and torch.export.

    Example::

        split = split_model(build_model(), num_inputs=1, split_at="blocks.*")
        split.names    # ['embed', 'blocks.0', ..., 'head']
    """
    with _naming(source):
        points = discover_split_points(model, split_at)
        graph = _trace(model, points, num_inputs)
        plan = _plan(graph, _fx_run_key(points), _fx_leaf, bool(points))
    layers = [
        _build_layer(model, graph, plan, k, k == len(plan.names) - 1)
        for k in range(len(plan.names))
    ]
    cut_names = [[n.name for n in cut] for cut in plan.cuts]
    return SplitModel(model, layers, plan.names, points, num_inputs, cut_names)


def capture_model(
    model: nn.Module,
    inputs: tuple[Any, ...] | Mapping[str, Any],
    split_at: str | None = None,
    *,
    capture: str = "auto",
    source: str | os.PathLike[str] | None = None,
    dynamic_batch: bool = False,
    module_calls: Sequence[str] = (),
) -> SplitModel:
    """Capture ``model``'s forward on the sample ``inputs`` and cut it into layers.

    ``capture``: ``fx`` (symbolic tracing; positional inputs; the layers take any batch
    size), ``export`` (torch.export, non-strict; positional or keyword inputs; the layers
    are specialised to the sample's shapes), or ``auto``: fx for positional inputs when it
    traces and its layers reproduce the model's output on ``inputs``, else export.
    ``dynamic_batch`` exports the first dimension of the inputs as a symbolic size, so the
    exported layers take any batch size too (``batch_size`` None); the analytic profiler
    uses it to capture once for all its microbatch sizes. ``module_calls`` names modules an
    exported graph calls as modules instead of inlining their operations (torch.fx calls
    every leaf module so): the tensor-parallel profiler shards them after the capture.

    Example::

        split = capture_model(hf_gpt2, {"input_ids": ids})      # export
        split.capture, split.names[:2]    # ('export', ['transformer.wte+...', 'transformer.h.0'])
    """
    if capture == "export-eval":  # what a profile records; the same rule finds it again
        capture = "export"
    if capture not in CAPTURES:
        raise InputError(
            f"expected one of {', '.join(CAPTURES)}, got {capture!r}", field="--capture"
        )
    keyword = isinstance(inputs, Mapping)
    if capture == "fx" or (capture == "auto" and not keyword):
        if keyword:
            raise InputError(
                "torch.fx capture takes positional inputs only, and sample_batch returns "
                "keyword inputs; use --capture export (or auto)",
                file=None if source is None else str(source),
                field="--capture",
            )
        try:
            split = split_model(model, len(inputs), split_at, source=source)
            if capture == "fx" or _reproduces(model, split, inputs):
                return split
        except InputError:
            if capture == "fx":
                raise
    split = _export_split(model, inputs, split_at, source, dynamic_batch, module_calls)
    if split.capture == "export-eval" and not _reproduces(model, split, inputs):
        raise InputError(
            "torch.export stopped on a random branch in training mode, and the graph "
            "captured in eval mode does not reproduce the training-mode output",
            file=None if source is None else str(source),
            field="build_model",
        )
    return split


def _export_split(
    model: nn.Module,
    inputs: tuple[Any, ...] | Mapping[str, Any],
    split_at: str | None,
    source: str | os.PathLike[str] | None,
    dynamic_batch: bool = False,
    module_calls: Sequence[str] = (),
) -> SplitModel:
    with _naming(source):
        points = discover_split_points(model, split_at)
        captured = export_graph(
            model, inputs, dynamic_batch=dynamic_batch, module_calls=module_calls
        )
        plan = _plan(captured.graph, _export_run_key(points), _export_leaf(points), bool(points))
    last = len(plan.names) - 1
    layers: list[nn.Module] = [
        _build_layer(captured.attributes, captured.graph, plan, k, k == last)
        for k in range(len(plan.names))
    ]
    layers[last] = OutputLayer(layers[last], captured.out_spec)  # type: ignore[arg-type]
    capture = "export-eval" if captured.in_eval_mode else "export"
    cut_names = [[n.name for n in cut] for cut in plan.cuts]
    tensors = [v for v in (inputs.values() if isinstance(inputs, Mapping) else inputs)]
    batch = next((int(t.shape[0]) for t in tensors if isinstance(t, torch.Tensor) and t.dim()), 0)
    return SplitModel(
        model,
        layers,
        plan.names,
        points,
        len(captured.input_names),
        cut_names,
        capture=capture,
        input_names=captured.input_names if isinstance(inputs, Mapping) else (),
        batch_size=None if dynamic_batch else batch or None,
    )


class _naming:
    """Name the model file in an InputError raised inside, when it names none."""

    def __init__(self, source: str | os.PathLike[str] | None):
        self.source = source

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if isinstance(exc, InputError) and exc.file is None and self.source is not None:
            raise InputError(exc.message, file=str(self.source), field=exc.field) from None


def _reproduces(model: nn.Module, split: SplitModel, inputs: Any) -> bool:
    """Whether the split model gives the model's own output on ``inputs`` (same RNG seed,
    buffers restored afterwards): a traced graph that baked in a branch does not."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        with torch.no_grad():
            state = torch.random.get_rng_state()
            expected = call_for_training(model, inputs)
            torch.random.set_rng_state(state)
            got = split(*split.flat_inputs(inputs))
    except Exception:
        return False
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    return _same(expected, got)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return False
        if _without_values(a) or _without_values(b):  # meta or fake: the analytic profile
            return a.dtype == b.dtype
        return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and (a is b or a == b)


def _without_values(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return t.is_meta or is_fake(t)


def retarget_device(module: nn.Module, device: Any) -> None:
    """Point the device constants of exported layers in ``module`` at ``device``.

    An exported graph names the device it was captured on (``torch.arange(...,
    device='cpu')``); a stage moved to another device must create its tensors there.

    Example::

        stage = split.stage(0, 3).to("cuda:0"); retarget_device(stage, "cuda:0")
    """
    target = torch.device(device)
    for sub in module.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        changed = False
        for node in sub.graph.nodes:
            current = node.kwargs.get("device")
            if isinstance(current, torch.device) and current != target:
                node.update_kwarg("device", target)
                changed = True
        if changed:
            sub.recompile()


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


RunKey = Callable[[fx.Node], Any]
"""Which call of a split point a node belongs to (None: outside every split point)."""


def _fx_run_key(points: Sequence[str]) -> RunKey:
    # A traced graph calls each split point as one call_module node: each call is a run.
    point_set = set(points)

    def key(node: fx.Node) -> Any:
        return node if node.op == "call_module" and node.target in point_set else None

    return key


def _fx_leaf(node: fx.Node) -> str | None:
    return str(node.target) if node.op == "call_module" else None


def _export_leaf(points: Sequence[str]) -> Callable[[fx.Node], str | None]:
    """The module an exported node is named after: the outermost module of its stack that
    is a split point or holds none (what torch.fx would have kept as a leaf)."""
    point_set = set(points)
    prefixes = {p[:i] for p in points for i in range(len(p)) if p[i] == "."}

    def leaf(node: fx.Node) -> str | None:
        for name in module_path(node):
            if name in point_set or name not in prefixes:
                return name
        return None

    return leaf


def _export_run_key(points: Sequence[str]) -> RunKey:
    # Consecutive operations inside one split point are one call of it.
    leaf, point_set = _export_leaf(points), set(points)

    def key(node: fx.Node) -> Any:
        name = leaf(node)
        return name if name in point_set else None

    return key


def _plan(
    graph: fx.Graph,
    run_key: RunKey,
    leaf_of: Callable[[fx.Node], str | None],
    has_points: bool = True,
) -> _Plan:
    """Group the graph's nodes into layers: each run of a split point starts one; code
    after a run up to the next belongs to it; code before the first run is one more layer,
    and code after the last run another."""
    nodes = [n for n in graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    keys = [run_key(n) for n in nodes]
    starts = [i for i, k in enumerate(keys) if k is not None and (i == 0 or keys[i - 1] != k)]
    if not starts and not has_points:  # a model without submodules: one layer, the whole model
        starts = [len(nodes)]
    elif not starts:
        raise InputError("forward() never calls the split points", field="--split-at")
    last_run_end = max(i for i, k in enumerate(keys) if k is not None) if any(keys) else -1
    start_set = set(starts)
    members: list[list[fx.Node]] = [[]]  # layer 0 is the code before the first split point
    in_tail = False
    for i, node in enumerate(nodes):
        if i in start_set:
            members.append([])
        elif i > last_run_end and not in_tail and last_run_end >= 0:
            members.append([])  # code after the last split point: one more layer
            in_tail = True
        members[-1].append(node)
    # Drop empty layers (no code before the first split point, say) and renumber.
    members = [m for m in members if m]
    if len(members) > 1 and all(_is_size(n) for n in members[0]):
        # A graph exported with a symbolic batch size reads the inputs' sizes first: that
        # is no layer of its own, but the start of the first one.
        members = [members[0] + members[1], *members[2:]]
    if not members:
        raise InputError("forward() computes nothing to profile", field="build_model")
    layer_of = {node: k for k, group in enumerate(members) for node in group}
    names = _unique([_layer_name(group, k, leaf_of) for k, group in enumerate(members)])
    cuts = _cuts(list(graph.nodes), layer_of, len(members))
    return _Plan(layer_of=layer_of, cuts=cuts, names=names)


def _is_size(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt | torch.SymFloat | torch.SymBool)


def _layer_name(group: list[fx.Node], k: int, leaf_of: Callable[[fx.Node], str | None]) -> str:
    # Named after the modules it calls, so names match --split-at globs and the model's code.
    targets = list(dict.fromkeys(t for t in (leaf_of(n) for n in group) if t))
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
    root: nn.Module | dict[str, Any], graph: fx.Graph, plan: _Plan, k: int, is_last: bool
) -> fx.GraphModule:
    """Layer ``k`` as a GraphModule whose attributes are ``root``'s very objects."""
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
    return fx.GraphModule(root, new, class_name=f"Layer{k}")

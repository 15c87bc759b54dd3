"""Which weights split across a tensor-parallel group: a model's plan, read and checked.

A plan has the form of torch's ``parallelize_module`` plans: module name (or glob, one
``fnmatch`` pattern per dotted part, as torch matches them) -> parallel style. It comes from:

1. ``tp_plan()`` in model.py, if it returns one: torch's ``ParallelStyle`` objects
   (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``, ``PrepareModuleInput``,
   ...) or their names as strings (below). ``tp_plan(sequence_parallel=False)`` may take
   the flag and return the sequence-parallel plan when it is true; returning None leaves
   that setting to the model's own plan;
2. else a Hugging Face model's own plan (``model._tp_plan``: its class's entries with
   ``config.base_model_tp_plan`` under the base model's prefix), its transformers style
   names mapped onto torch's styles (:data:`STYLE_NAMES`). transformers declares no
   sequence-parallel form of it: sequence parallelism then needs ``tp_plan()``.

Modules the plan names nothing for are replicated on every rank of the group. Refused,
one line each (:class:`InputError`): a style pipeplan cannot run with torch's
``parallelize_module`` (transformers' packed and expert styles); a style on a module it does
not split (torch's column and row styles split ``nn.Linear`` and ``nn.Embedding``); a
degree that does not divide a split dimension, the attention heads or the key/value heads
(named in the model's config, or a module's ``n_head``/``num_heads``/... attribute); a
shared (tied) parameter in a module the plan touches; a planned module that holds the
modules the layers are cut between.

Example::

    plan = tensor_parallel_plan(user, model, sequence_parallel=False)
    plan.source, list(plan.styles)[:2]   # ('base_model_tp_plan', ['lm_head', ...])
    check_degree(plan, model, 4, split_points)
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.profile.loader import UserModel

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "STYLE_NAMES",
    "TensorParallelPlan",
    "check_degree",
    "hugging_face_plan",
    "layer_modules",
    "tensor_parallel_plan",
]

STYLE_NAMES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "colwise_gather_output",
    "rowwise_rep",
    "rowwise_split_input",
    "embedding_rowwise",
    "embedding_colwise",
    "sequence_parallel",
    "replicate",
)
"""Style names a plan may give as strings: torch's (``colwise``, ``rowwise``,
``sequence_parallel``) and transformers' that map onto torch's styles exactly: ``_rep`` and
``_gather_output`` gather the output (``output_layouts=Replicate()``), ``rowwise_rep`` and
``rowwise_split_input`` take a replicated input, ``embedding_rowwise`` is torch's
``RowwiseParallel`` on an embedding (vocabulary-parallel), ``embedding_colwise`` its
``ColwiseParallel`` gathering the output, ``replicate`` leaves the module whole."""


def _style(name: str) -> Any:
    """The torch style a string names (None for ``replicate``)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    factories: dict[str, Callable[[], Any]] = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_colwise": lambda: ColwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        ),
        "sequence_parallel": lambda: SequenceParallel(use_local_output=True),
        "replicate": lambda: None,
    }
    return factories[name]()


@dataclass(frozen=True)
class TensorParallelPlan:
    """A plan resolved on one model: ``styles`` maps each module's full name to its torch
    ``ParallelStyle`` (in the plan's order); ``source`` is ``"tp_plan"`` (model.py) or
    ``"base_model_tp_plan"`` (the Hugging Face model's own)."""

    source: str
    sequence_parallel: bool
    styles: dict[str, Any]


def tensor_parallel_plan(
    user: UserModel, model: nn.Module, *, sequence_parallel: bool = False
) -> TensorParallelPlan:
    """The plan for ``model`` (built by ``user``'s ``build_model``), globs resolved.

    Example::

        tensor_parallel_plan(load_model_file("examples/gpt.py"), gpt).styles["blocks.0.qkv"]
    """
    raw = user.tensor_parallel_plan(sequence_parallel)
    source = "tp_plan"
    if raw is None:
        raw, source = hugging_face_plan(model), "base_model_tp_plan"
        if not raw:
            raise InputError(
                "defines no tp_plan() and the model declares no tensor-parallel plan of its "
                "own (a Hugging Face base_model_tp_plan); nothing says which weights split "
                "(docs/profile.md#tensor-parallel-shards---tensor-parallel)",
                file=str(user.path),
                field="--tensor-parallel",
            )
        if sequence_parallel:
            raise InputError(
                "the Hugging Face plan (base_model_tp_plan) has no sequence-parallel form; "
                "give one from tp_plan(sequence_parallel) in model.py "
                "(docs/profile.md#tensor-parallel-shards---tensor-parallel)",
                file=str(user.path),
                field="--sequence-parallel",
            )
    if not isinstance(raw, dict):
        raise InputError(
            f"expected tp_plan() to return a dict of module name -> style, got "
            f"{type(raw).__name__}",
            file=str(user.path),
            field="tp_plan",
        )
    styles = _resolve(raw, model, strict=source == "tp_plan", file=str(user.path))
    return TensorParallelPlan(source, sequence_parallel, styles)


def hugging_face_plan(model: nn.Module) -> dict[str, str]:
    """A Hugging Face model's own plan, full module names as keys (empty if none): the
    outermost module's ``_tp_plan`` (transformers merges its class's entries and the
    config's ``base_model_tp_plan`` there), else its config's ``base_model_tp_plan`` under
    the base model's prefix.

    Example::

        hugging_face_plan(LlamaForCausalLM(config))["lm_head"]   # 'colwise_gather_output'
    """
    from torch import nn

    for prefix, module in model.named_modules():
        base = f"{prefix}." if prefix else ""
        plan = getattr(module, "_tp_plan", None)
        if isinstance(plan, dict) and plan:
            return {f"{base}{k}": v for k, v in plan.items()}
        config = getattr(module, "config", None)
        declared = getattr(config, "base_model_tp_plan", None)
        inner = getattr(module, "base_model", None)
        if isinstance(declared, dict) and declared and isinstance(inner, nn.Module):
            where = next((n for n, m in module.named_modules() if m is inner), "")
            where = f"{base}{where}." if where else base
            return {f"{where}{k}": v for k, v in declared.items()}
    return {}


def _resolve(raw: dict[Any, Any], model: nn.Module, *, strict: bool, file: str) -> dict[str, Any]:
    """Each entry's style as a torch object, on every module its pattern matches."""
    from torch.distributed.tensor.parallel import ParallelStyle

    names = [name for name, _ in model.named_modules()]
    styles: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise InputError(
                f"expected module names as keys, got {key!r}", file=file, field="tp_plan"
            )
        if isinstance(value, str):
            if value not in STYLE_NAMES:
                raise InputError(
                    f"{key}: style {value!r} has no torch parallelize_module style pipeplan "
                    f"can run (it runs {', '.join(STYLE_NAMES)}, or ParallelStyle objects "
                    "from tp_plan() in model.py)",
                    file=file,
                    field="tp_plan",
                )
            style = _style(value)
        elif isinstance(value, ParallelStyle):
            style = value
        else:
            raise InputError(
                f"{key}: expected a torch ParallelStyle or one of {', '.join(STYLE_NAMES)}, "
                f"got {type(value).__name__}",
                file=file,
                field="tp_plan",
            )
        matched = [n for n in names if _matches(n, key)]
        if not matched and strict:
            raise InputError(f"{key}: matches no module of the model", file=file, field="tp_plan")
        for name in matched:
            if name in styles:
                raise InputError(
                    f"{key}: module {name!r} already has a style from another entry",
                    file=file,
                    field="tp_plan",
                )
            if style is not None:
                styles[name] = style
    return styles


def _matches(name: str, pattern: str) -> bool:
    """torch's matching: one fnmatch pattern per dotted part (``layers.*.mlp``)."""
    if pattern == "":
        return name == ""
    parts, atoms = name.split("."), pattern.split(".")
    return len(parts) == len(atoms) and all(
        fnmatch.fnmatchcase(p, a) for p, a in zip(parts, atoms, strict=True)
    )


def layer_modules(plan: TensorParallelPlan, split_points: Sequence[str]) -> list[str]:
    """The modules a capture must call as modules so that the plan's hooks run: for each
    planned module, its outermost enclosing module that is a split point or holds none
    (what torch.fx keeps as a leaf), in model order.

    Example::

        layer_modules(plan, split_points)   # ['model.embed_tokens', 'model.layers.0', ...]
    """
    points = set(split_points)
    out: list[str] = []
    for name in plan.styles:
        leaf = _leaf(name, points)
        if leaf is None:
            raise InputError(
                f"{name or 'the model'}: the tensor-parallel plan gives a style to a module "
                "that holds the modules its layers are cut between; give styles to modules "
                "inside one layer",
                field="tp_plan",
            )
        if leaf not in out:
            out.append(leaf)
    return out


def _leaf(name: str, points: set[str]) -> str | None:
    parts = name.split(".") if name else []
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        holds = any(p.startswith(prefix + ".") for p in points)
        if prefix in points or not holds:
            return prefix
    return None


def check_degree(
    plan: TensorParallelPlan,
    model: nn.Module,
    degree: int,
    split_points: Sequence[str],
    *,
    file: str | None = None,
) -> None:
    """Refuse, in one line naming the layer, a degree the plan cannot split ``model`` by:
    a split dimension, the attention heads or the key/value heads it does not divide; a
    style torch cannot apply to its module; a tied parameter in a planned module.

    Example::

        check_degree(plan, model, 8, split.split_points, file="model.py")
    """
    points = set(split_points)
    modules = dict(model.named_modules())

    def fail(name: str, message: str) -> None:
        leaf = _leaf(name, points) or name
        where = f"layer {leaf}" + (f", module {name}" if name != leaf else "")
        raise InputError(f"{where}: {message}", file=file, field="--tensor-parallel")

    for name, style in plan.styles.items():
        problem = _split_problem(modules[name], style, degree)
        if problem:
            fail(name, problem)
    heads = _head_problem(plan, model, modules, degree)
    if heads:
        fail(*heads)
    tied = _tied_problem(plan, model)
    if tied:
        fail(*tied)


def _split_problem(module: nn.Module, style: Any, degree: int) -> str | None:
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if not isinstance(style, ColwiseParallel | RowwiseParallel):
        return None
    kind = "colwise" if isinstance(style, ColwiseParallel) else "rowwise"
    if isinstance(module, nn.Linear):
        dim, size = ("out_features", module.out_features)
        if kind == "rowwise":
            dim, size = ("in_features", module.in_features)
    elif isinstance(module, nn.Embedding):
        dim, size = ("embedding_dim", module.embedding_dim)
        if kind == "rowwise":
            dim, size = ("num_embeddings (vocabulary-parallel)", module.num_embeddings)
    else:
        return (
            f"torch's {kind} style splits nn.Linear and nn.Embedding only, and this is a "
            f"{type(module).__name__}"
        )
    if size % degree:
        return f"a tensor-parallel degree of {degree} does not divide its {dim} ({size}, {kind})"
    return None


_HEADS = ("num_attention_heads", "num_heads", "n_head", "n_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_kv_head")


def _head_problem(
    plan: TensorParallelPlan, model: nn.Module, modules: dict[str, nn.Module], degree: int
) -> tuple[str, str] | None:
    """The heads a degree does not divide: a module's own head counts (for the modules
    holding a column-split module) or the model config's, named with the first such layer."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    split = [n for n, s in plan.styles.items() if isinstance(s, ColwiseParallel)]
    if not split:
        return None
    holders: list[tuple[str, Any]] = []
    for name in split:
        parts = name.split(".")
        holders += [
            (".".join(parts[:i]), modules[".".join(parts[:i])]) for i in range(1, len(parts))
        ]
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    attention = [n for n in split if any(w in n for w in ("attn", "attention", "qkv", "k_proj"))]
    holders.append(((attention or split)[0], config))
    for name, holder in holders:
        for attrs, what in ((_HEADS, "attention heads"), (_KV_HEADS, "key/value heads")):
            for attr in attrs:
                count = getattr(holder, attr, None)
                if isinstance(count, int) and not isinstance(count, bool) and count % degree:
                    return name, (
                        f"a tensor-parallel degree of {degree} does not divide its {count} "
                        f"{what} ({attr})"
                    )
    return None


def _tied_problem(plan: TensorParallelPlan, model: nn.Module) -> tuple[str, str] | None:
    """A parameter shared by two modules, one of which the plan splits or replicates as a
    DTensor: torch would split one use and not the other."""
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput

    owners: dict[int, list[str]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for pname, p in module.named_parameters(recurse=False):
            full = f"{module_name}.{pname}" if module_name else pname
            owners.setdefault(id(p), []).append(full)
            owners[id(p)] = list(dict.fromkeys(owners[id(p)]))
    passive = (PrepareModuleInput, PrepareModuleOutput)
    touched = {n for n, s in plan.styles.items() if not isinstance(s, passive)}
    for names in owners.values():
        if len(names) < 2:
            continue
        for full in names:
            module_name = full.rpartition(".")[0]
            if module_name in touched:
                others = ", ".join(n for n in names if n != full)
                return module_name, (
                    f"its parameter {full} is tied to {others}, and tensor parallelism would "
                    "split one use and not the other (vocabulary-parallel tied embeddings are "
                    "refused: untie them, or leave these modules out of the plan)"
                )
    return None

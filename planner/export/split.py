"""Where a plan's stages start and which modules they hold, by module name.

A plan's stages are layer ranges over the profile's layers, and a profiled layer is named
after the modules it calls (``embed``, ``blocks.3``, ``norm+output``, ``a+...+z`` for more
than three, ``layer7`` for one that calls none; see ``planner.profile.split``). A stage
after the first starts where its first layer's first module is called: that name is its
*split point*, what ``torch.distributed.pipelining.pipeline(split_spec={name:
SplitPoint.BEGINNING})`` and torchtitan's ``pipeline_parallel_split_points`` take. The
modules a stage holds, reduced to what torchtitan can keep or drop (a top-level child, or
an entry of a top-level ``ModuleList``), are torchtitan's ``module_fqns_per_model_part``.

Example::

    splits = stage_splits(plan.stages, profile_layer_names)
    [s.starts_at for s in splits]      # [None, 'blocks.2']
    [s.modules for s in splits]        # [['embed', 'blocks.0', 'blocks.1'], ['blocks.2', ...]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import InputError
from planner.plan import StageSpec

__all__ = ["StageSplit", "layer_modules", "stage_splits", "titan_module"]


@dataclass(frozen=True)
class StageSplit:
    """One stage by name: its layers, the module it starts at (None for the first stage,
    or when its first layer calls no module) and the modules it holds (None when a layer's
    name abbreviates its modules)."""

    stage: int
    layers: tuple[int, int]
    layer_names: list[str]
    starts_at: str | None
    modules: list[str] | None


def layer_modules(name: str) -> list[str] | None:
    """The modules a profiled layer calls, from its name; None when the name abbreviates
    them (``a+...+z``); empty for a layer that calls none (``layer7``).

    Example::

        layer_modules("norm+output")   # ['norm', 'output']
        layer_modules("layer7")        # []
    """
    base = name.split("#", 1)[0]  # a repeated name gets '#2', '#3'
    parts = base.split("+")
    if "..." in parts:
        return None
    if len(parts) == 1 and base.startswith("layer") and base[5:].isdigit():
        return []
    return parts


def titan_module(name: str) -> str:
    """What torchtitan's splitter can keep or drop that holds module ``name``: the
    top-level child, or the entry of a top-level ModuleList/ModuleDict.

    Example::

        titan_module("layers.3.attention")   # 'layers.3'
        titan_module("tok_embeddings")       # 'tok_embeddings'
    """
    parts = name.split(".")
    if len(parts) >= 2 and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def stage_splits(
    stages: Sequence[StageSpec], layer_names: Sequence[str], *, source: str | None = None
) -> list[StageSplit]:
    """Name every stage's start and modules from the profile's layer names.

    Example::

        stage_splits(parse_stages("0-2:gpu0;3-5:gpu1"), ["embed", "blocks.0", ...])
    """
    last = max(s.last for s in stages)
    if last >= len(layer_names):
        raise InputError(
            f"the plan's stages cover layers 0..{last} but its profile has "
            f"{len(layer_names)} layers",
            file=source,
            field="stages",
        )
    out = []
    for stage in stages:
        names = list(layer_names[stage.first : stage.last + 1])
        found = [layer_modules(n) for n in names]
        modules: list[str] | None = None
        if all(f is not None for f in found):
            modules = list(dict.fromkeys(m for f in found for m in f or []))
        first = found[0]
        starts_at = first[0] if stage.id > 0 and first else None
        if stage.id > 0 and starts_at is None and names[0].split("+", 1)[0] != names[0]:
            starts_at = names[0].split("+", 1)[0]  # 'a+...+z' still names its first module
        out.append(StageSplit(stage.id, stage.layers, names, starts_at, modules))
    return out

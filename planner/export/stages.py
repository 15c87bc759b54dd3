"""Stage modules for torch.distributed.pipelining, cut the way pipeplan profiled the model.

An exported ``train_pipeline.py`` builds its ``PipelineStage`` objects from these modules
(``--split pipeplan``, its default): the very layers the profile measured and ``pipeplan
run`` executes, joined per stage. Every value a later stage needs is handed on from stage to
stage, so a stage only ever talks to its neighbours, which is all torch's multi-stage
runtime allows (``--split torch`` uses torch's own ``pipeline(split_spec=...)`` instead).

Example::

    cut = PipeplanStages.build(model, sample_inputs, [(0, 2), (3, 5)])
    module = cut.modules[1]                 # layers 3..5 as one nn.Module
    args = cut.example_inputs(1)            # what stage 1 receives, for PipelineStage
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.profile.split import SplitModel, capture_model

__all__ = ["PipeplanStages"]


@dataclass
class PipeplanStages:
    """The model cut into the plan's stages; ``modules[s]`` shares its parameters with
    the model."""

    split: SplitModel
    layers: list[tuple[int, int]]
    modules: list[nn.Module]
    sample_inputs: Any

    @classmethod
    def build(
        cls,
        model: nn.Module,
        sample_inputs: tuple[Any, ...] | Mapping[str, Any],
        layers: Sequence[Sequence[int]],
        *,
        split_at: str | None = None,
        capture: str = "auto",
    ) -> PipeplanStages:
        """Capture ``model`` on a sample microbatch and join its layers per stage.

        ``split_at`` and ``capture`` must be the profile's (``settings.split_at``,
        ``settings.capture_method``) so that the layers are the profiled ones.

        Example::

            PipeplanStages.build(model, (x,), [(0, 2), (3, 5)], capture="fx")
        """
        split = capture_model(model, sample_inputs, split_at, capture=capture)
        spans = [(int(a), int(b)) for a, b in layers]
        if spans[-1][1] != split.num_layers - 1:
            raise ValueError(
                f"the stages cover layers 0..{spans[-1][1]} but the model splits into "
                f"{split.num_layers} layers ({split.names[:3]}...); was the model profiled "
                "with other --split-at or --capture settings?"
            )
        modules: list[nn.Module] = [split.stage(a, b) for a, b in spans]
        return cls(split, spans, modules, sample_inputs)

    def flat_inputs(self, inputs: Any) -> tuple[Any, ...]:
        """The first stage's positional inputs from ``sample_batch``'s inputs.

        Example::

            schedule.step(*cut.flat_inputs(x))
        """
        return self.split.flat_inputs(inputs)

    def example_inputs(self, stage: int) -> tuple[Any, ...]:
        """What ``stage`` receives for the sample microbatch (``PipelineStage``'s
        ``input_args``): the earlier stages run here, without gradients.

        Example::

            PipelineStage(cut.modules[s], s, len(cut.modules), device,
                          input_args=cut.example_inputs(s))
        """
        values: Any = self.flat_inputs(self.sample_inputs)
        with torch.no_grad():
            for module in self.modules[:stage]:
                values = module(*values)
        # Standard strides: a sliced sample of one row may carry odd ones that torch's
        # metadata check would hold against the real microbatches.
        return tuple(
            v.new_empty(v.shape).copy_(v) if isinstance(v, torch.Tensor) else v for v in values
        )

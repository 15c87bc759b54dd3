"""Tied parameters: one parameter used by several layers (tied embeddings, shared weights).

GPT-2's ``lm_head.weight`` is ``wte.weight``; BERT's MLM decoder, T5 and every
``tie_word_embeddings`` model do the same. When the layers that use such a parameter land
on different pipeline stages, every stage holds (and trains) its own copy, so the profile
records the tie and the runtime sums the copies' gradients before each optimizer step.

A layer's ``param_bytes`` counts a tied parameter once, in the first layer that uses it
(:meth:`planner.profile.split.SplitModel.layer_parameters`); the cost model adds it to the
other stages that hold it.

Example::

    split = split_model(model, num_inputs=1)
    find_tied_parameters(split)
    # [TiedParameter(name='embed.weight', layers=(0, 5), param_count=4096, param_bytes=16384)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.profile.split import SplitModel

__all__ = ["TiedParameter", "find_tied_parameters"]


@dataclass(frozen=True)
class TiedParameter:
    """A parameter used by two or more layers.

    ``name`` is its canonical name (the first in ``model.named_parameters()``), ``layers``
    the layers that use it, in increasing order.

    Example::

        TiedParameter("embed.weight", (0, 5), param_count=4096, param_bytes=16384)
    """

    name: str
    layers: tuple[int, ...]
    param_count: int
    param_bytes: int

    @property
    def first_layer(self) -> int:
        """The layer whose ``param_bytes`` in the profile already counts the parameter."""
        return self.layers[0]

    def held_by(self, first: int, last: int) -> bool:
        """Whether the layer range ``first..last`` uses the parameter.

        Example::

            tie.held_by(4, 5)    # True for layers (0, 5)
        """
        return any(first <= layer <= last for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        """The profile's JSON form.

        Example::

            tie.to_dict()   # {'name': 'embed.weight', 'layers': [0, 5], ...}
        """
        return {
            "name": self.name,
            "layers": list(self.layers),
            "param_count": self.param_count,
            "param_bytes": self.param_bytes,
        }


def find_tied_parameters(split: SplitModel) -> list[TiedParameter]:
    """The parameters that two or more of ``split``'s layers use, found by identity.

    Ordered by canonical name order in ``split.model.named_parameters()``.

    Example::

        ties = find_tied_parameters(split_model(model, num_inputs=1))
        [(t.name, t.layers) for t in ties]       # [('embed.weight', (0, 5))]
    """
    users: dict[int, list[int]] = {}
    for index, layer in enumerate(split.layers):
        for p in layer.parameters():  # each parameter once per layer
            users.setdefault(id(p), []).append(index)
    ties = []
    for name, p in split.model.named_parameters():  # the first name of each parameter
        layers = users.get(id(p), [])
        if len(layers) >= 2:
            ties.append(
                TiedParameter(
                    name=name,
                    layers=tuple(sorted(layers)),
                    param_count=p.numel(),
                    param_bytes=p.numel() * p.element_size(),
                )
            )
    return ties

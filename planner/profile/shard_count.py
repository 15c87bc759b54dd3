"""Counted tensor-parallel shards: the analytic profile's entries for every degree.

For each degree and setting, the model built without weights (:mod:`planner.profile.
fake_model`) is sharded the way a run shards it (:func:`~planner.profile.tensor_parallel.
build_shard` on torch's fake process group) and every layer counted as the plain analytic
profile counts it (:func:`~planner.profile.layer_count.count_layer`), by a
:class:`~planner.profile.collective_log.ShardOpCounter`: the FLOPs, bytes and roofline time
of the operations one rank runs on its local shards, and the collectives it issues
(recorded, not timed: the simulator times them on the group's links). A 70B model gets its
TP 2/4/8 entries without any memory. Twin layers (the repeated blocks, sharded alike) are
counted once.

Example::

    counts = count_shards(user, profile, TensorParallelRequest((2, 4)), roofline,
                          precision="bf16", split_at=None, step_ms=lambda b: 0.0)
    counts[("tp2", 4)][1].forward.flops     # block 0's local FLOPs at microbatch size 4
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.precision import autocast as precision_autocast
from planner.profile.collective_log import ShardOpCounter, local_ops_only
from planner.profile.fake_group import fake_group
from planner.profile.layer_count import LayerCount, count_layer
from planner.profile.loader import UserModel
from planner.profile.roofline import OpCounter, Roofline
from planner.profile.schema import Profile
from planner.profile.sharding import Collective, ShardTiming, shard_key
from planner.profile.tensor_parallel import (
    Captured,
    Shard,
    TensorParallelRequest,
    capture_for_plan,
    shard_captured,
    shard_params,
)

__all__ = ["ShardCount", "count_shards"]


@dataclass(frozen=True)
class ShardCount:
    """One layer's shard counted at one microbatch size: the passes, and its collectives."""

    count: LayerCount
    collectives: tuple[Collective, ...]

    def timing(self) -> ShardTiming:
        """The profile's entry (times from the roofline; FLOPs stay here)."""
        count = self.count
        return ShardTiming(
            forward_ms=round(count.forward.ms, 6),
            backward_ms=round(count.backward.ms, 6),
            backward_input_ms=round(count.backward_input.ms, 6),
            backward_weight_ms=round(count.backward_weight.ms, 6),
            output_bytes=count.output_bytes,
            saved_bytes=count.saved_bytes,
            collectives=self.collectives,
        )


def count_shards(
    user: UserModel,
    profile: Profile,
    request: TensorParallelRequest,
    roofline: Roofline,
    *,
    precision: str,
    split_at: str | None,
    step_ms: Callable[[int], float],
    optimizer: str = "adam",
    dynamic_batch: bool = True,
    twins: dict[int, list[Hashable | None]] | None = None,
) -> dict[tuple[str, int], list[ShardCount]]:
    """Fill ``profile``'s ``sharded`` entries for every setting of ``request`` (module
    docstring); returns the counts by ``(key, microbatch size)``, one per layer.
    ``step_ms(param_bytes)`` is the optimizer step's time for a shard's parameters.
    ``twins``: per size, each unsharded layer's twin signature
    (:func:`~planner.profile.twins.layer_signature`, None: unique): two layers are counted
    once where those are equal and the plan splits them alike (None: every layer counted).

    Example::

        count_shards(user, profile, TensorParallelRequest((8,)), roofline, precision="bf16",
                     split_at=None, step_ms=lambda b: 8 * b / 3e12 * 1e3)
    """
    sizes = profile.microbatch_sizes
    out: dict[tuple[str, int], list[ShardCount]] = {}
    captured: dict[bool, tuple[Captured, Any, list[Any]]] = {}
    for degree, sp in request.settings():
        key = shard_key(degree, sequence_parallel=sp)
        if sp not in captured:  # one capture per plan serves every degree
            captured[sp] = _capture(user, profile, sp, split_at, dynamic_batch)
        plain_capture, mode, batches = captured[sp]
        with fake_group(degree, "cpu") as mesh:
            with mode:
                shard = shard_captured(plain_capture, mesh, degree, copy=True)
            counter = _ShardCounter(user, shard, mode, roofline, precision)
            for size, split, (inputs, targets) in zip(sizes, shard.splits, batches, strict=True):
                plain = (twins or {}).get(size) or [None] * split.num_layers
                out[(key, size)] = counter.count(split, inputs, targets, plain)
            if not sp:
                for layer, params in zip(
                    profile.layers, shard_params(shard.splits[0], optimizer), strict=True
                ):
                    ms = round(step_ms(params.param_bytes), 6)
                    layer.sharded[key] = replace(params, optimizer_ms=ms)
        for m in profile.measurements:
            for entry, counted in zip(m.layers, out[(key, m.microbatch_size)], strict=True):
                entry.sharded[key] = counted.timing()
    return out


def _capture(
    user: UserModel, profile: Profile, sp: bool, split_at: str | None, dynamic_batch: bool
) -> tuple[Captured, Any, list[Any]]:
    """The model built without weights and captured for its plan at every size, its fake
    mode and fake batches."""
    from planner.profile.fake_model import build_fake, fake_batch, fake_mode

    mode = fake_mode()
    model = build_fake(user, mode)
    batches = [fake_batch(user, size, mode) for size in profile.microbatch_sizes]
    with mode:
        captured = capture_for_plan(
            user,
            model,
            [inputs for inputs, _ in batches],
            sequence_parallel=sp,
            split_at=split_at,
            capture=profile.settings.capture_method,
            names=[layer.name for layer in profile.layers],
            dynamic_batch=dynamic_batch,
        )
    return captured, mode, batches


class _ShardCounter:
    """Counts the layers of one shard at each size, twins once: layers whose unsharded
    forms are twins (their inlined graphs compared, which a module call hides), that the
    plan splits alike and that get values of the same shapes."""

    def __init__(
        self, user: UserModel, shard: Shard, mode: Any, roofline: Roofline, precision: str
    ):
        self.user = user
        self.shard = shard
        self.mode = mode
        self.roofline = roofline
        self.precision = precision

    def count(
        self, split: Any, inputs: Any, targets: Any, plain: Sequence[Hashable | None]
    ) -> list[ShardCount]:
        from planner.profile.twins import values_signature

        cache: dict[Hashable, tuple[ShardCount, Any]] = {}
        counts = []
        with self.mode, local_ops_only():
            values: Any = split.flat_inputs(inputs)
            for k, layer in enumerate(split.layers):
                last = k == split.num_layers - 1
                inner = getattr(layer, "layer", layer)  # a SettledLayer's own layer
                signature = None
                entering = values_signature(values)
                if plain[k] is not None and entering is not None and not last:
                    signature = (plain[k], self._styles(inner), entering)
                if signature is not None and signature in cache:
                    counted, values = cache[signature]
                else:
                    counted, values = self._count(layer, values, targets if last else None)
                    if signature is not None:
                        cache[signature] = (counted, values)
                counts.append(counted)
        return counts

    def _count(self, layer: Any, values: Any, targets: Any) -> tuple[ShardCount, Any]:
        loss: Callable[[Any], Any] | None = None
        if targets is not None:
            loss = lambda out: self.user.loss(out, targets)  # noqa: E731
        made: dict[str, ShardOpCounter] = {}

        def counter(name: str) -> OpCounter:
            phase = "forward" if name == "forward" else "backward"
            made[name] = ShardOpCounter(self.roofline, phase=phase)
            return made[name]

        precision = self.precision
        count, outputs = count_layer(
            layer,
            values,
            self.roofline,
            autocast=lambda: precision_autocast("cpu", precision),
            loss=loss,
            counter=counter,
        )
        # the whole backward's, not the input half's again
        collectives = (*made["forward"].collectives, *made["backward"].collectives)
        return ShardCount(count, collectives), outputs

    def _styles(self, layer: Any) -> tuple[Any, ...]:
        """The plan's styles of the modules ``layer`` calls, by name inside each module."""
        from torch import fx

        module = getattr(layer, "graph_module", layer)
        if not isinstance(module, fx.GraphModule):
            return ()
        out = []
        for node in module.graph.nodes:
            if node.op != "call_module":
                continue
            target = str(node.target)
            for name, style in self.shard.plan.styles.items():
                if name == target or name.startswith(target + "."):
                    described = sorted((k, repr(v)) for k, v in vars(style).items())
                    out.append((name[len(target) :], type(style).__qualname__, tuple(described)))
        return tuple(out)

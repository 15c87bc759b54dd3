"""Stages: which layers run on which devices, and the one check that a partition is sound.

A :class:`StageSpec` is an inclusive layer range on one or more devices: its devices are
data-parallel replicas, each replica a tensor-parallel group of ``tensor_parallel`` devices
(the group's first device, its *leader*, stands for it in schedules: the other members run
the leader's actions, each with its own peer). A stage may also run sequence parallelism
(``sequence_parallel``, with groups of two or more) and shard its data parallelism
(``sharding``: ``"zero1"`` the optimizer state, ``"fsdp"`` parameters, gradients and
optimizer state, with two or more replicas). Partitions come as text
(``"0-3:gpu0,gpu1;4-7:gpu2"``; ``+`` joins one replica's group: ``"0-3:gpu0+gpu1"``), as
decoded JSON/YAML lists, or as objects; :func:`validate_stages` is the single check that a
partition covers the model's layers exactly once on known, distinct devices, in groups
that line up from stage to stage. Schedules, the simulator, the solver, the peers, the
runtime and plans all speak this type; it is frozen and hashable (the search keys its
caches by it).

Example::

    stages = parse_stages("0-3:gpu0,gpu1;4-7:gpu2")
    validate_stages(stages, num_layers=8, topology=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.limits import MAX_DEVICES, MAX_LAYERS, check_name

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "SHARDINGS",
    "STAGE_FIELDS",
    "StageSpec",
    "Piece",
    "as_stages",
    "boundary_pairs",
    "boundary_peers",
    "boundary_pieces",
    "parse_stages",
    "reshards",
    "stages_from_data",
    "validate_stages",
    "with_parallelism",
]

# The fields of a stage object (StageSpec.to_dict); any other is refused: a field this
# version does not know could change what runs.
STAGE_FIELDS = frozenset(
    {
        "id",
        "layers",
        "devices",
        "recompute",
        "recompute_layers",
        "tensor_parallel",
        "sequence_parallel",
        "sharding",
    }
)

SHARDINGS = ("none", "zero1", "fsdp")
"""Data-parallel sharding of a stage's replicas: none (each holds everything), ``zero1``
(optimizer state sharded: ZeRO stage 1) or ``fsdp`` (parameters, gradients and optimizer
state sharded: torch's ``fully_shard``)."""


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage: an inclusive layer range on one or more devices.

    ``devices`` are the stage's data-parallel replicas, replica-major: replica ``j`` is the
    tensor-parallel group ``devices[j * tensor_parallel : (j + 1) * tensor_parallel]``
    (:attr:`replica_groups`), led by its first device (:attr:`leaders`). Microbatch ``k``
    of the stage runs on replica ``k % replicas`` (PipeDream-style round robin).
    ``sequence_parallel`` and ``sharding`` as the module says; :func:`validate_stages`
    checks them. ``devices`` and ``layers`` given as lists are kept as tuples.

    ``recompute`` rebuilds the stage's activations in its backward; ``recompute_layers``
    says how: each layer under its own activation checkpoint (only the layers' inputs are
    kept, one layer is rebuilt at a time: Megatron-LM's full recompute, torchtitan's
    per-block checkpointing) rather than the whole stage under one (only the stage's input
    is kept, all of it rebuilt at once: torchgpipe's). The solver takes whichever peaks
    lower (:func:`planner.solve.memory.recompute_unit`).

    Example::

        StageSpec(0, (0, 3), ("gpu0", "gpu1")).replica(3)              # 'gpu1'
        StageSpec(0, (0, 3), ("a", "b", "c", "d"), tensor_parallel=2).replica_groups
        # (('a', 'b'), ('c', 'd'))
    """

    id: int
    layers: tuple[int, int]
    devices: tuple[str, ...]
    recompute: bool = False
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    sharding: str = "none"
    recompute_layers: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.devices, tuple):
            names = (self.devices,) if isinstance(self.devices, str) else tuple(self.devices)
            object.__setattr__(self, "devices", names)
        if not isinstance(self.layers, tuple):
            object.__setattr__(self, "layers", tuple(self.layers))

    @property
    def first(self) -> int:
        return self.layers[0]

    @property
    def last(self) -> int:
        return self.layers[1]

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: groups of ``tensor_parallel`` devices."""
        return len(self.devices) // self.tensor_parallel

    @property
    def replica_groups(self) -> tuple[tuple[str, ...], ...]:
        """Each replica's tensor-parallel group of devices, in replica order."""
        tp = self.tensor_parallel
        return tuple(self.devices[j * tp : (j + 1) * tp] for j in range(self.replicas))

    @property
    def leaders(self) -> tuple[str, ...]:
        """Each replica's first device, which stands for its group in schedules (the
        devices themselves without tensor parallelism)."""
        tp = self.tensor_parallel
        return self.devices if tp == 1 else self.devices[::tp]

    @property
    def is_plain(self) -> bool:
        """Neither tensor parallel nor sharded: every device holds and runs the whole stage."""
        return self.tensor_parallel == 1 and self.sharding == "none"

    def replica(self, microbatch: int) -> str:
        """The device that runs ``microbatch`` of this stage: its replica's leader (the
        replica's one device without tensor parallelism).

        Example::

            parse_stages("0:a+b,c+d")[0].replica(1)   # 'c'
        """
        tp = self.tensor_parallel
        if tp == 1:
            return self.devices[microbatch % len(self.devices)]
        return self.devices[(microbatch % (len(self.devices) // tp)) * tp]

    def with_recompute(self, recompute: bool, *, layers: bool = False) -> StageSpec:
        """This stage with ``recompute`` set, each layer checkpointed where ``layers``
        (itself where it already is).

        Example::

            StageSpec(0, (0, 3), ("a",)).with_recompute(True, layers=True).recompute_layers
        """
        layers = recompute and layers
        if self.recompute == recompute and self.recompute_layers == layers:
            return self
        return replace(self, recompute=recompute, recompute_layers=layers)

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's stage object; ``recompute_layers``, ``tensor_parallel``,
        ``sequence_parallel`` and ``sharding`` only where they are not the defaults (false,
        1, false, "none"), so plans
        without them read and write back byte for byte."""
        out: dict[str, Any] = {
            "id": self.id,
            "layers": [self.layers[0], self.layers[1]],
            "devices": list(self.devices),
            "recompute": self.recompute,
        }
        if self.recompute_layers:
            out["recompute_layers"] = True
        if self.tensor_parallel != 1:
            out["tensor_parallel"] = self.tensor_parallel
        if self.sequence_parallel:
            out["sequence_parallel"] = True
        if self.sharding != "none":
            out["sharding"] = self.sharding
        return out

    def describe(self) -> str:
        """The stage's devices as the text form writes them, with its options.

        Example::

            parse_stages("0-3:a+b,c+d")[0].describe()   # 'a+b,c+d'
        """
        text = ",".join("+".join(g) for g in self.replica_groups)
        extra = ["sequence parallel"] if self.sequence_parallel else []
        if self.sharding != "none":
            extra.append(self.sharding)
        return f"{text} ({', '.join(extra)})" if extra else text


def _boolean(item: dict[str, Any], key: str, source: str, where: str) -> bool:
    """A stage's true/false field (false when absent). A string "false" would otherwise be
    truthy and silently switch it on."""
    value = item.get(key, False)
    if not isinstance(value, bool):
        raise InputError(
            f"expected true or false (a JSON/YAML boolean), got {_clip(value)}",
            file=source,
            field=f"{where}.{key}",
        )
    return value


def stages_from_data(raw: Any, *, source: str = "<stages>") -> list[StageSpec]:
    """Stages from their JSON/YAML form (a list of ``{id?, layers, devices, recompute?}``).

    Example::

        stages_from_data([{"layers": [0, 3], "devices": ["gpu0"]}])
    """
    if not isinstance(raw, list) or not raw:
        raise InputError("expected a non-empty list of stages", file=source, field="stages")
    if len(raw) > MAX_LAYERS:
        raise InputError(
            f"{len(raw):,} stages; expected at most {MAX_LAYERS:,}", file=source, field="stages"
        )
    stages = []
    for i, item in enumerate(raw):
        where = f"stages[{i}]"
        if not isinstance(item, dict):
            raise InputError("expected an object", file=source, field=where)
        unknown = sorted(str(k) for k in item if k not in STAGE_FIELDS)
        if unknown:
            raise InputError(
                f"unknown field; expected one of {', '.join(sorted(STAGE_FIELDS))}",
                file=source,
                field=f"{where}.{unknown[0]}",
            )
        layers = item.get("layers")
        ok = isinstance(layers, list | tuple) and len(layers) == 2
        ok = ok and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_LAYERS
            for x in layers or ()
        )
        if not ok:
            raise InputError(
                f"expected [first, last] layer indices (integers from 0 to {MAX_LAYERS - 1:,}), "
                f"got {_clip(layers)}",
                file=source,
                field=f"{where}.layers",
            )
        devices = item.get("devices")
        if isinstance(devices, str):
            devices = [devices]
        if not isinstance(devices, list) or not all(isinstance(d, str) and d for d in devices):
            raise InputError(
                f"expected a list of device names, got {_clip(devices)}",
                file=source,
                field=f"{where}.devices",
            )
        _check_devices(devices, source, f"{where}.devices")
        sid = item.get("id", i)
        if isinstance(sid, bool) or not isinstance(sid, int) or sid != i:
            raise InputError(
                f"expected stage ids 0, 1, 2, ... in order; stage {i} has id {sid!r}",
                file=source,
                field=f"{where}.id",
            )
        recompute = _boolean(item, "recompute", source, where)
        recompute_layers = _boolean(item, "recompute_layers", source, where)
        tp = item.get("tensor_parallel", 1)
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or len(devices) % tp:
            raise InputError(
                f"expected a positive integer that divides the {len(devices)} devices, got {tp!r}",
                file=source,
                field=f"{where}.tensor_parallel",
            )
        sp = _boolean(item, "sequence_parallel", source, where)
        sharding = item.get("sharding", "none")
        if sharding not in SHARDINGS:
            raise InputError(
                f"expected one of {', '.join(SHARDINGS)}, got {_clip(sharding)}",
                file=source,
                field=f"{where}.sharding",
            )
        stage = StageSpec(
            id=i,
            layers=(layers[0], layers[1]),  # type: ignore[index]
            devices=tuple(devices),
            recompute=recompute,
            tensor_parallel=tp,
            sequence_parallel=sp,
            sharding=sharding,
            recompute_layers=recompute_layers,
        )
        _check_options(stage, source, where)
        stages.append(stage)
    return stages


def _check_options(stage: StageSpec, source: str | None, where: str) -> None:
    """Sequence parallelism only in groups of two or more; sharding only over two or more
    replicas; per-layer checkpoints only where the stage recomputes (one line naming the
    field)."""
    if stage.recompute_layers and not stage.recompute:
        raise InputError(
            "recompute_layers says how a recomputed stage checkpoints; expected recompute: "
            "true beside it",
            file=source,
            field=f"{where}.recompute_layers",
        )
    if stage.sequence_parallel and stage.tensor_parallel == 1:
        raise InputError(
            "sequence parallelism splits the sequence across a tensor-parallel group; "
            "expected tensor_parallel of 2 or more (devices joined by '+')",
            file=source,
            field=f"{where}.sequence_parallel",
        )
    if stage.sharding not in SHARDINGS:
        raise InputError(
            f"expected one of {', '.join(SHARDINGS)}, got {_clip(stage.sharding)}",
            file=source,
            field=f"{where}.sharding",
        )
    if stage.sharding != "none" and stage.replicas < 2:
        raise InputError(
            f"{stage.sharding} shards across data-parallel replicas; stage {stage.id} has "
            "one (give two or more replicas, separated by ',')",
            file=source,
            field=f"{where}.sharding",
        )


def _check_devices(devices: list[str], source: str | None, where: str) -> None:
    """At most :data:`MAX_DEVICES` names, each a printable name (no terminal escapes)."""
    if len(devices) > MAX_DEVICES:
        raise InputError(
            f"{len(devices):,} devices; expected at most {MAX_DEVICES:,}", file=source, field=where
        )
    for name in devices:
        check_name(name, file=source, field=where)


def _clip(value: Any) -> str:
    """A value as the JSON/YAML file spells it (``null``, ``true``), clipped to 80 characters."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_stages(text: str, *, recompute: Sequence[int] = ()) -> list[StageSpec]:
    """Parse the ``--stages`` shorthand ``"0-3:gpu0,gpu1;4-7:gpu2"``.

    Each ``;``-separated part is ``FIRST-LAST:REPLICA[,REPLICA...]`` (a single layer may be
    written ``5:gpu3``); a replica is a device, or a tensor-parallel group of devices joined
    by ``+`` (``gpu0+gpu1,gpu2+gpu3``: two replicas of two devices; every group of a stage
    the same size). ``recompute`` lists stage ids whose activations are recomputed.

    Example::

        parse_stages("0-3:gpu0,gpu1;4-7:gpu2", recompute=[1])
    """
    stages = []
    parts = [p.strip() for p in text.split(";") if p.strip()]
    if not parts:
        raise InputError("expected stages like '0-3:gpu0,gpu1;4-7:gpu2'", field="--stages")
    if len(parts) > MAX_LAYERS:
        raise InputError(
            f"{len(parts):,} stages; expected at most {MAX_LAYERS:,}", field="--stages"
        )
    for i, part in enumerate(parts):
        span, sep, devs = part.partition(":")
        first_s, dash, last_s = span.strip().partition("-")
        if not dash:
            last_s = first_s
        ok = all(s.strip().isdecimal() and len(s.strip()) <= 9 for s in (first_s, last_s))
        if not ok or max(int(first_s), int(last_s)) >= MAX_LAYERS:
            raise InputError(
                f"stage {i}: expected FIRST-LAST:DEVICES like '0-3:gpu0' (layers from 0 to "
                f"{MAX_LAYERS - 1:,}), got {_clip(part)}",
                field="--stages",
            )
        first, last = int(first_s), int(last_s)
        pieces = devs.split(",")
        if len(pieces) > 1 and pieces[-1].strip() == "":
            pieces.pop()  # one trailing ',' as in a list written by hand
        groups = [tuple(d.strip() for d in g.split("+")) for g in pieces] if devs.strip() else []
        if any(not d for g in groups for d in g):
            # "cpu0+" or "cpu0++cpu1" would silently be another tensor-parallel degree.
            raise InputError(
                f"stage {i}: a device name is empty (between ',' or '+'), got {_clip(part)}",
                field="--stages",
            )
        if not sep or not groups or not all(groups):
            raise InputError(
                f"stage {i}: expected at least one device after ':', got {_clip(part)}",
                field="--stages",
            )
        if len({len(g) for g in groups}) != 1:
            raise InputError(
                f"stage {i}: expected tensor-parallel groups of one size (joined by '+'), "
                f"got {_clip(part)}",
                field="--stages",
            )
        devices = [d for g in groups for d in g]
        _check_devices(devices, None, "--stages")
        stages.append(
            StageSpec(
                id=i,
                layers=(first, last),
                devices=tuple(devices),
                recompute=i in recompute,
                tensor_parallel=len(groups[0]),
            )
        )
    for sid in recompute:
        if not 0 <= sid < len(stages):
            raise InputError(
                f"stage {sid} does not exist (stages are 0..{len(stages) - 1})",
                field="--recompute",
            )
    return stages


def validate_stages(
    stages: Sequence[StageSpec],
    num_layers: int,
    topology: Topology | None,
    *,
    source: str | None = None,
    allow_shared_devices: bool = False,
) -> None:
    """Reject partitions with gaps, overlaps, unknown or repeated devices, or groups that
    do not line up.

    Stages must cover layers ``0..num_layers-1`` in order, each exactly once. With a
    topology every device must be one of its devices. A device may appear in several
    stages only with ``allow_shared_devices`` (interleaved schedules place ``v`` stages on
    each device), and then in the same tensor-parallel group in each. Neighbouring stages
    may differ in tensor-parallel degree (who sends what to whom: :func:`boundary_peers`,
    or :func:`boundary_pieces` with sequence parallelism on either side); the stages of
    groups of two or more use sequence parallelism all or none; sequence parallelism needs
    groups, sharding replicas.

    Example::

        validate_stages(parse_stages("0-3:gpu0;4-7:gpu1"), 8, topology)
    """

    def fail(where: str, message: str) -> None:
        raise InputError(message, file=source, field=where)

    if not stages:
        fail("stages", "expected at least one stage")
    expected = 0
    for i, stage in enumerate(stages):
        first, last = stage.layers
        where = f"stages[{i}]"
        if stage.id != i:
            fail(f"{where}.id", f"expected id {i}, got {stage.id}")
        if first > last:
            fail(f"{where}.layers", f"first layer {first} is after last layer {last}")
        if first > expected:
            fail(f"{where}.layers", f"gap: layers {expected}..{first - 1} belong to no stage")
        if first < expected:
            fail(
                f"{where}.layers",
                f"overlap: layers {first}..{min(last, expected - 1)} are already in an "
                "earlier stage",
            )
        expected = last + 1
        if not stage.devices:
            fail(f"{where}.devices", "expected at least one device")
        if len(set(stage.devices)) != len(stage.devices):
            fail(f"{where}.devices", f"a device is listed twice: {list(stage.devices)}")
        _check_options(stage, source, where)
    if expected < num_layers:
        fail(
            "stages",
            f"gap: layers {expected}..{num_layers - 1} belong to no stage "
            f"(the model has {num_layers} layers)",
        )
    if expected > num_layers:
        fail(
            f"stages[{len(stages) - 1}].layers",
            f"layer {expected - 1} does not exist (the model has layers 0..{num_layers - 1})",
        )
    if topology is not None:
        known = set(topology.device_names())
        for i, stage in enumerate(stages):
            for dev in stage.devices:
                if dev not in known:
                    fail(
                        f"stages[{i}].devices",
                        f"unknown device {dev!r}; the topology has {sorted(known)}",
                    )
    if not allow_shared_devices:
        owner: dict[str, int] = {}
        for i, stage in enumerate(stages):
            for dev in stage.devices:
                if dev in owner:
                    fail(
                        f"stages[{i}].devices",
                        f"device {dev!r} is also in stage {owner[dev]}; only the interleaved "
                        "schedule places several stages on one device",
                    )
                owner[dev] = i
    elif any(st.tensor_parallel > 1 for st in stages):
        _check_shared_groups(stages, fail)
    _check_sequence_parallel(stages, fail)


def _check_sequence_parallel(stages: Sequence[StageSpec], fail: Any) -> None:
    """Every stage of groups of two or more uses sequence parallelism, or none does (a
    run shards every group by one ``tp_plan``; a stage of degree 1 has none)."""
    grouped = [st for st in stages if st.tensor_parallel > 1]
    for st in grouped[1:]:
        if st.sequence_parallel != grouped[0].sequence_parallel:
            on, off = (st, grouped[0]) if st.sequence_parallel else (grouped[0], st)
            fail(
                f"stages[{st.id}].sequence_parallel",
                f"stage {on.id} ({_parallel_text(on)}) and stage {off.id} "
                f"({_parallel_text(off)}) differ in sequence parallelism; tensor-parallel "
                "stages use it all or none (a run shards every group by one tp_plan)",
            )


def _parallel_text(stage: StageSpec) -> str:
    sp = " with sequence parallelism" if stage.sequence_parallel else ""
    return f"tensor_parallel {stage.tensor_parallel}{sp}"


def boundary_peers(senders: Sequence[str], receivers: Sequence[str]) -> list[tuple[str, str]]:
    """The member-to-member transfers of one value between two tensor-parallel groups
    across a stage boundary, as ``(sender, receiver)`` pairs: receiver ``j`` takes it from
    sender ``j mod len(senders)`` (forward: the earlier stage sends its output; backward:
    the later stage sends the output's gradient). Equal sizes pair member ``i`` with member
    ``i``; of different sizes, the value is replicated over each group (no sequence
    parallelism), so every receiver gets the whole of it, and one sender may serve several.
    With sequence parallelism on either side: :func:`boundary_pieces`.

    Example::

        boundary_peers(("a", "b"), ("c",))   # [('a', 'c')]
        boundary_peers(("c",), ("a", "b"))   # [('c', 'a'), ('c', 'b')]
    """
    return [(senders[j % len(senders)], r) for j, r in enumerate(receivers)]


@dataclass(frozen=True)
class Piece:
    """One transfer of a resharded boundary (:func:`boundary_pieces`): ``sender`` hands
    ``receiver`` the sequence range ``[start, stop)`` (fractions of the whole sequence) of
    the values split along it, and, where ``first``, the values that are not split (the
    receiver's first piece carries them, so no receiver gets them twice)."""

    sender: str
    receiver: str
    start: Fraction
    stop: Fraction
    first: bool


def reshards(sender: StageSpec, receiver: StageSpec) -> bool:
    """Whether the values crossing from ``sender``'s groups to ``receiver``'s are laid out
    differently on the two sides: sequence parallelism on either side, and the degrees or
    the setting differ (then :func:`boundary_pieces` says who sends what).

    Example::

        reshards(*parse_stages("0:a+b;1:c"))   # False (no sequence parallelism)
    """
    layouts = {(st.tensor_parallel, st.sequence_parallel) for st in (sender, receiver)}
    return len(layouts) > 1 and (sender.sequence_parallel or receiver.sequence_parallel)


def boundary_pieces(
    senders: Sequence[str], receivers: Sequence[str], *, split: tuple[bool, bool]
) -> list[Piece]:
    """The transfers that reshard a value between two groups across a stage boundary:
    ``split`` says whether each side holds it split along the sequence (sequence
    parallelism: member ``i`` of ``t`` holds ``[i/t, (i+1)/t)``) or whole. Each receiver
    gets the range it needs from the senders holding it: from every sender its range
    overlaps where the senders split it, from sender ``j mod len(senders)`` alone where
    they hold it whole (as :func:`boundary_peers`); per receiver in sequence order.
    Backward, the gradients go the other way: the later group's members are the senders.

    Example::

        [(p.sender, p.receiver) for p in boundary_pieces(("a", "b"), ("c",),
                                                          split=(True, False))]
        # [('a', 'c'), ('b', 'c')]: c needs the whole sequence, a and b hold a half each
    """
    out: list[Piece] = []
    for j, r in enumerate(receivers):
        lo, hi = _held(j, len(receivers), split[1])
        if not split[0]:
            out.append(Piece(senders[j % len(senders)], r, lo, hi, True))
            continue
        for i, s in enumerate(senders):
            a, b = _held(i, len(senders), True)
            if max(a, lo) < min(b, hi):
                out.append(Piece(s, r, max(a, lo), min(b, hi), max(a, lo) == lo))
    return out


def boundary_pairs(
    senders: Sequence[str], receivers: Sequence[str], *, split: tuple[bool, bool]
) -> list[tuple[str, str]]:
    """The ``(sender, receiver)`` transfers of a boundary, per receiver in order:
    :func:`boundary_peers` where the two sides lay the values out alike or neither splits
    them, :func:`boundary_pieces`' otherwise.

    Example::

        boundary_pairs(("a", "b"), ("c",), split=(True, False))   # [('a', 'c'), ('b', 'c')]
    """
    if split[0] == split[1] and (not split[0] or len(senders) == len(receivers)):
        return boundary_peers(senders, receivers)
    return [(p.sender, p.receiver) for p in boundary_pieces(senders, receivers, split=split)]


def _held(place: int, size: int, split: bool) -> tuple[Fraction, Fraction]:
    """The sequence range member ``place`` of a group of ``size`` holds or needs."""
    if not split:
        return Fraction(0), Fraction(1)
    return Fraction(place, size), Fraction(place + 1, size)


def _check_shared_groups(stages: Sequence[StageSpec], fail: Any) -> None:
    """A device that holds several stages (interleaved) is in the same tensor-parallel
    group, at the same place, in each."""
    group_of: dict[str, tuple[tuple[str, ...], int]] = {}
    for i, stage in enumerate(stages):
        for group in stage.replica_groups:
            for dev in group:
                known = group_of.setdefault(dev, (group, i))
                if known[0] != group:
                    fail(
                        f"stages[{i}].devices",
                        f"device {dev!r} is in group {'+'.join(group)} here and in "
                        f"{'+'.join(known[0])} in stage {known[1]}; a device keeps its "
                        "tensor-parallel group (in the same order) in every stage it holds",
                    )


def with_parallelism(
    stages: Sequence[StageSpec], *, sequence_parallel: bool = False, sharding: str | None = None
) -> list[StageSpec]:
    """``stages`` with sequence parallelism on every tensor-parallel stage and ``sharding``
    on every replicated one (``simulate --sequence-parallel``, ``--sharding``; None keeps
    each stage's own); one line when no stage can take what is asked.

    Example::

        with_parallelism(parse_stages("0-3:a+b,c+d"), sequence_parallel=True, sharding="zero1")
    """
    if sharding is not None and sharding not in SHARDINGS:
        raise InputError(
            f"expected one of {', '.join(SHARDINGS)}, got {_clip(sharding)}", field="--sharding"
        )
    if sequence_parallel and not any(st.tensor_parallel > 1 for st in stages):
        raise InputError(
            "no stage is tensor parallel (join a replica's devices with '+', e.g. "
            "'0-3:gpu0+gpu1'), so there is no sequence to split",
            field="--sequence-parallel",
        )
    if sharding not in (None, "none") and not any(st.replicas > 1 for st in stages):
        raise InputError(
            f"no stage has data-parallel replicas (separate them with ',', e.g. "
            f"'0-3:gpu0,gpu1'), so {sharding} has nothing to shard across",
            field="--sharding",
        )
    out = []
    for st in stages:
        sp = st.sequence_parallel or (sequence_parallel and st.tensor_parallel > 1)
        shard = sharding if sharding is not None and st.replicas > 1 else st.sharding
        out.append(replace(st, sequence_parallel=sp, sharding=shard))
    return out


def as_stages(stages: Any) -> list[StageSpec]:
    """Stages in any form a user would write them, as a list of :class:`StageSpec`.

    Accepts StageSpecs, the ``--stages`` shorthand, the plan JSON's stage objects, or
    tuples ``(first, last, devices)`` / ``((first, last), devices)`` (``devices`` a name or
    a list of names; an optional last item is ``recompute``). Ids follow the list order
    where they are not given.

    Example::

        as_stages("0-2:gpu0;3-5:gpu1")
        as_stages([(0, 2, "gpu0"), (3, 5, ["gpu1", "gpu2"])])
        as_stages(json.load(open("plan.json"))["stages"])
    """
    objects = isinstance(stages, list | tuple) and stages
    if objects and all(isinstance(s, StageSpec) for s in stages):
        return list(stages)  # the solver's hot path: nothing to convert
    if isinstance(stages, str):
        return parse_stages(stages)
    if not isinstance(stages, list | tuple) or not stages:
        raise InputError(
            "expected a non-empty list of stages, or a string like '0-2:gpu0;3-5:gpu1'",
            field="stages",
        )
    if all(isinstance(s, dict) for s in stages):
        return stages_from_data(list(stages))
    return [_stage_from_item(i, item) for i, item in enumerate(stages)]


def _stage_from_item(index: int, item: Any) -> StageSpec:
    if isinstance(item, StageSpec):
        return item
    if isinstance(item, dict):
        return stages_from_data([item])[0]
    parts = list(item) if isinstance(item, list | tuple) else []
    if parts and isinstance(parts[0], list | tuple) and len(parts[0]) == 2:
        parts = [parts[0][0], parts[0][1], *parts[1:]]
    if len(parts) not in (3, 4):
        raise InputError(
            f"expected (first, last, devices[, recompute]) or ((first, last), devices), "
            f"got {item!r}",
            field=f"stages[{index}]",
        )
    first, last, devices = parts[0], parts[1], parts[2]
    names = [devices] if isinstance(devices, str) else list(devices)
    recompute = parts[3] if len(parts) == 4 else False
    ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (first, last))
    if not ok or not isinstance(recompute, bool) or not all(isinstance(d, str) for d in names):
        raise InputError(
            f"expected integer layers, device names and a boolean recompute, got {item!r}",
            field=f"stages[{index}]",
        )
    return StageSpec(index, (first, last), tuple(names), recompute)

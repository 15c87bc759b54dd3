"""Every limit on a number, size, count, range or nesting that a user can give, in one place.

Each limit is far above any real use (the docstring under each says which real use it is
measured against) and exists so that a hostile or mistyped value is refused with one line
*before* anything is allocated or computed from it: a 5000-digit integer, ``1e308`` bytes,
``gpu{0..99999999}`` or ``--microbatches 99999999999`` would otherwise end in a traceback,
a MemoryError after minutes, or ``Infinity`` in a JSON file. Results computed from values
inside these limits stay finite (a layer's time over the slowest speed is at most 1e15 ms,
a transfer of :data:`MAX_BYTES` over :data:`MIN_BANDWIDTH` about 1e21 ms; sums over every
layer, stage and microbatch stay below 1e32), so the JSON pipeplan writes is valid JSON.
docs/limits.md lists them for users.

Example::

    check_int(8, field="--microbatches", high=MAX_MICROBATCHES)          # 8
    check_number(1.5, field="devices[0].speed", low=MIN_SPEED, high=MAX_SPEED)
"""

from __future__ import annotations

import math

from planner.errors import InputError
from planner.terminal import is_printable

__all__ = [
    "MAX_ACTION_CHARS",
    "MAX_BANDWIDTH",
    "MAX_BYTES",
    "MAX_COLLECTIVES",
    "MAX_DEVICES",
    "MAX_FILE_BYTES",
    "MAX_GANTT_WIDTH",
    "MAX_GLOBAL_BATCH",
    "MAX_INT_DIGITS",
    "MAX_LAYERS",
    "MAX_LINKS",
    "MAX_LINK_COUNT",
    "MAX_MICROBATCHES",
    "MAX_MICROBATCH_SIZE",
    "MAX_NAME_CHARS",
    "MAX_NESTING",
    "MAX_MIN_TIME_S",
    "MAX_REPEATS",
    "MAX_RUN_STEPS",
    "MAX_SCHEDULE_OPS",
    "MAX_SPEED",
    "MAX_TENSOR_PARALLEL",
    "MAX_THREADS",
    "MAX_TIME_LIMIT_S",
    "MAX_TIME_MS",
    "MAX_TOPOLOGY_DEVICES",
    "MIN_BANDWIDTH",
    "MIN_SPEED",
    "check_int",
    "check_name",
    "check_number",
    "check_schedule_size",
    "short_repr",
]

MAX_MICROBATCHES = 100_000
"""Microbatches per iteration. Real pipelines use 4-8 per stage: Megatron-LM's 16,384-GPU
Llama 3 run (pipeline depth 16) had on the order of a hundred; GPipe's paper at most 32."""

MAX_MICROBATCH_SIZE = 1_000_000
"""Samples in one microbatch. Real ones hold 1 to a few thousand samples."""

MAX_GLOBAL_BATCH = 10**9
"""Samples per iteration (``--global-batch``). The largest published batches are a few
million samples (e.g. 4M-token batches of 2-8k-token sequences: 512-2048 sequences;
ImageNet in minutes: 64k-128k images)."""

MAX_SCHEDULE_OPS = 500_000
"""Stages x microbatches x virtual stages of one schedule: its compute actions, each of
which also gets sends, receives and memory events. A 128-stage pipeline of 1,024
microbatches has 131,072. The cost grows linearly: 6 stages x 99,999 microbatches (600,000)
took 15 s and 1.0 GB to simulate, 76 s and 2.0 GB to ``show`` on the development VM."""

MAX_DEVICES = 100_000
"""Names one ``{a..b}`` range or ``hosts`` entry may expand to, and devices named in a
plan, a schedule or ``--stages``. The largest published training run used 16,384 GPUs
(Llama 3 405B); the largest single clusters hold about 100,000 (xAI Colossus, 2024). A
topology holds at most :data:`MAX_TOPOLOGY_DEVICES`."""

MAX_TOPOLOGY_DEVICES = 65_536
"""Devices in one topology: four times the largest published training run (16,384 H100s,
Llama 3 405B). Routes are worked out per pair on first use, so loading costs what the links
cost: a 65,536-GPU rail-optimised cluster (8,201 switches, 131,080 links) passes ``topology
check`` in 3.5 s and 0.3 GB on the 2-core development VM, 16,384 GPUs in 1.0 s and
0.12 GB."""

MAX_LINKS = 200_000
"""Links in a topology after ranges expand. A 4,096-GPU cluster of 8-GPU hosts with an
NVLink mesh inside and a NIC per GPU has about 20,000; a full mesh of 633 devices already
has 200,000 (3 s and 0.25 GB to load on the development VM)."""

MAX_LINK_COUNT = 10_000
"""Parallel links in one ``count:`` (an H100 has 18 NVLinks)."""

MAX_TENSOR_PARALLEL = 1_024
"""Devices in one tensor-parallel group. Megatron-LM and Llama 3 use 8 (one NVLink domain);
an NVL72 rack holds 72."""

MAX_COLLECTIVES = 1_000
"""Collectives one layer's shard issues per microbatch (a Megatron block: 4, with sequence
parallelism 8)."""

MAX_LAYERS = 100_000
"""Layers of a profile (and so stage indices and layer ranges). The deepest real models
have about a thousand layers (ResNet-1001; a 128-block transformer cut per operator has a
few thousand)."""

MAX_BYTES = 2**60
"""Any size in bytes (memory, parameters, activations): 1 EiB. The largest GPU holds
288 GB; a 2-trillion-parameter model's fp32 weights are 8 TB."""

MAX_TIME_MS = 1e9
"""Any time in milliseconds (a layer's forward, a latency, ``--step-ms``): 11.6 days.
Real layers take microseconds to seconds."""

MIN_BANDWIDTH = 1.0
"""Slowest link, bytes per second (1 B/s). Real interconnects: 1 Gbit/s Ethernet
(1.25e8 B/s) and up."""

MAX_BANDWIDTH = 1e18
"""Fastest link, bytes per second (1 EB/s). NVLink 5 carries 900 GB/s per direction."""

MIN_SPEED = 1e-6
"""Slowest device ``speed`` (1.0 = the profiling device). Real devices differ by
at most a few hundred times (a CPU against an H100)."""

MAX_SPEED = 1e6
"""Fastest device ``speed``; see :data:`MIN_SPEED`."""

MAX_REPEATS = 10_000
"""Timed (``--repeat``) or untimed (``--warmup``) runs per layer when profiling; each timed
run's time is kept. Real profiles use 3 to 100. Also the most rounds ``--min-time`` adds."""

MAX_MIN_TIME_S = 3600.0
"""Longest ``profile --min-time`` (seconds the timed rounds last at least)."""

MAX_RUN_STEPS = 1_000_000
"""Training steps of ``pipeplan run`` (``--steps``, and ``--warmup`` before them): it checks a
plan against its prediction in a few steps; train for longer with ``export``."""

MAX_THREADS = 4_096
"""CPU threads (``--threads``). The largest two-socket servers have 512 hardware threads."""

MAX_TIME_LIMIT_S = 1e7
"""``solve --time-limit``, seconds (116 days). CBC solves pipeplan's programs in seconds
to minutes."""

MAX_GANTT_WIDTH = 10_000
"""Columns of the terminal Gantt chart (``--width``). Wide terminals have a few hundred."""

MAX_NAME_CHARS = 1_024
"""Characters in a name (device, switch, host, layer, model, schedule). Hugging Face
module paths such as ``model.layers.31.self_attn.q_proj`` have about 40."""

MAX_ACTION_CHARS = MAX_NAME_CHARS + 64
"""Characters of one schedule action (``SEND_F12.345->gpu7``): a peer name and numbers."""

MAX_INT_DIGITS = 30
"""Digits of an integer in a profile, plan, topology or stages file. The largest integer
within these limits, :data:`MAX_BYTES`, has 19; Python refuses to read more than 4,300."""

MAX_NESTING = 64
"""Nesting depth of a JSON or YAML file. pipeplan's own files nest at most 6 deep."""

MAX_FILE_BYTES = 256 * 2**20
"""Size of a profile, plan, topology, stages or schedule file read whole (256 MiB).
A profile of 1,000 layers at 10 microbatch sizes is about 5 MB; a plan at
:data:`MAX_SCHEDULE_OPS` about 60 MB."""


def check_int(
    value: object,
    *,
    field: str,
    low: int = 1,
    high: int,
    file: str | None = None,
) -> int:
    """``value`` if it is an integer in ``low..high``, else one InputError naming the field
    and the range (a float with an integral value, as JSON may write it, counts).

    Example::

        check_int(8, field="--microbatches", high=MAX_MICROBATCHES)   # 8
    """
    number = value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value) if abs(value) <= 2.0**63 else value
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        raise InputError(
            f"expected an integer from {low:,} to {high:,}, got {short_repr(value)}",
            file=file,
            field=field,
        )
    return number


def check_number(
    value: object,
    *,
    field: str,
    low: float = 0.0,
    high: float,
    file: str | None = None,
    unit: str = "",
) -> float:
    """``value`` as a float if it is a finite number in ``low..high``, else one InputError.

    Example::

        check_number(2.5, field="--step-ms", high=MAX_TIME_MS, unit=" ms")   # 2.5
    """
    number = None
    if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
        number = float(value) if abs(value) < 1e300 else math.inf  # a huge int: no overflow
    if number is None or not (math.isfinite(number) and low <= number <= high):
        raise InputError(
            f"expected a finite number from {low:g}{unit} to {high:g}{unit}, "
            f"got {short_repr(value)}",
            file=file,
            field=field,
        )
    return number


def check_name(value: object, *, field: str | None, file: str | None = None) -> str:
    """``value`` if it is a name: a non-empty string of at most :data:`MAX_NAME_CHARS`
    characters with no control, format or separator character (a terminal escape, a bidi
    override, a newline); else one InputError naming the field.

    Example::

        check_name("gpu0", field="devices[0].name")   # 'gpu0'
    """
    if not isinstance(value, str) or not value.strip():
        raise InputError(
            f"expected a non-empty name, got {short_repr(value)}", file=file, field=field
        )
    if len(value) > MAX_NAME_CHARS:
        raise InputError(
            f"a name of {len(value):,} characters; expected at most {MAX_NAME_CHARS:,}",
            file=file,
            field=field,
        )
    if not is_printable(value):
        raise InputError(
            f"expected a name without control characters (terminal escapes, newlines), "
            f"got {short_repr(value)}",
            file=file,
            field=field,
        )
    return value


def check_schedule_size(
    num_stages: int, num_microbatches: int, virtual_stages: int = 1, *, field: str
) -> None:
    """Refuse a schedule of more than :data:`MAX_SCHEDULE_OPS` compute actions before it
    is built (stages x microbatches x virtual stages).

    Example::

        check_schedule_size(8, 64, field="--microbatches")
    """
    check_int(num_microbatches, field=field, high=MAX_MICROBATCHES)
    ops = num_stages * num_microbatches * max(1, virtual_stages)
    if ops > MAX_SCHEDULE_OPS:
        raise InputError(
            f"{num_stages} stages x {num_microbatches:,} microbatches"
            + (f" x {virtual_stages} virtual stages" if virtual_stages > 1 else "")
            + f" = {ops:,} compute actions; expected at most {MAX_SCHEDULE_OPS:,} "
            "(fewer microbatches or stages)",
            field=field,
        )


def short_repr(value: object) -> str:
    """``repr(value)`` clipped, so that a 5000-digit number stays one short line.

    Example::

        short_repr(10**5000)    # 'an integer of about 5001 digits'
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

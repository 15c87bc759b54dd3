"""What the ranks of a run measured, typed: each rank's :class:`RankResult`, gathered by rank 0
into a :class:`RunResult` (written to the run folder as ``result.json``, read back by the
launcher, combined by :func:`planner.runtime.report.build_report`).

Example::

    result = read_record(RunResult, json.loads(Path(run_dir, "result.json").read_text()),
                         file="result.json")
    result.ranks[0].step_seconds, result.ranks[0].events[0].kind
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MeasuredEvent", "RankResult", "RunResult"]


@dataclass
class MeasuredEvent:
    """One executed action: times in ms from the start of the step."""

    device: str
    kind: str
    stage: int
    microbatch: int
    start_ms: float
    end_ms: float
    iteration: int = 0  # ALLREDUCE/STEP: which occurrence (an iteration of a 2bw stream)


@dataclass
class CountedCollective:
    """One collective a run's action issued (``run_plan(count_collectives=True)``): the
    device and action (``kind`` F/B/I/W, stage, microbatch), torch's operation name, the
    bytes it moved and the phase (``forward`` or ``backward``); a point-to-point message
    sent to another stage's device names it as ``peer`` (op ``send``)."""

    device: str
    kind: str
    stage: int
    microbatch: int
    op: str
    bytes: int
    phase: str
    peer: str = ""  # a message's receiver (op "send", kind SEND_F/SEND_B); "" otherwise


@dataclass
class RankResult:
    """What one rank measured over the measured steps (warm-up steps' losses included).

    ``step_seconds``: each measured step's time; ``losses``: per step (warm-up included),
    the unscaled loss of each microbatch of this rank's last stage; ``events``: the last
    step's actions; ``stage_ms``: the mean time of each stage action (``F0``, ``B1``,
    ``STEP0``...) over the measured steps and ``stage_count`` how many it saw; the peak
    memory (``memory_kind``: ``cuda_max_allocated`` or ``max_rss``); ``skipped``: per step,
    whether fp16's loss scaling skipped it; ``batch_dependent``: the model's modules whose
    result depends on the microbatch size.

    Example::

        RankResult(0, ["cpu0"], "cpu", step_seconds=[0.05], losses=[[1.0]])
    """

    rank: int
    devices: list[str]
    torch_device: str
    step_seconds: list[float] = field(default_factory=list)
    losses: list[list[float]] = field(default_factory=list)
    events: list[MeasuredEvent] = field(default_factory=list)
    stage_ms: dict[str, float] = field(default_factory=dict)
    stage_count: dict[str, int] = field(default_factory=dict)
    peak_memory_bytes: int = 0
    memory_kind: str = "max_rss"
    precision: str = "fp32"
    skipped: list[bool] = field(default_factory=list)
    batch_dependent: list[str] = field(default_factory=list)
    collectives: list[CountedCollective] = field(default_factory=list)


@dataclass
class RunResult:
    """Every rank's result, as rank 0 gathered them.

    Example::

        RunResult([RankResult(0, ["cpu0"], "cpu")]).ranks[0].rank
    """

    ranks: list[RankResult]

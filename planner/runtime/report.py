"""What a run measured, next to what the plan predicted.

:class:`RunReport` holds the measured iteration time (median over the measured steps of
the slowest rank's step), the plan's prediction, its band and whether the measurement lies
inside it, their ratio, throughput, the loss of
every step, peak memory per device and the measured timeline of the last step. The
timeline is written with :func:`planner.render.render_trace`, the writer ``show --trace``
uses, so the predicted and the measured trace open side by side in Perfetto.

Example::

    report = run_plan("plan.json", "model.py", steps=5)
    print(report.ratio)
    print_run_report(report, console)
    Path("measured.json").write_text(json.dumps(measured_trace(report)))
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.plan_inputs import resimulate
from planner.profile.batch_dependence import batch_dependence_warning
from planner.render import render_trace
from planner.runtime.calibrate import stage_compute_ms, stage_ratios
from planner.runtime.mesh import describe_device
from planner.simulate import SimEvent, SimResult
from planner.units import format_bytes

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from planner.plan import Plan
    from planner.runtime.collective_report import CollectiveRow
    from planner.runtime.measured import CountedCollective, RunResult
    from planner.runtime.placement import Placement

__all__ = [
    "SMALL_STAGE",
    "explain_gap",
    "note_prediction_source",
    "RunReport",
    "build_report",
    "measured_trace",
    "print_collectives",
    "print_run_report",
    "side_by_side",
    "trace_with_prediction",
]


# A stage whose profiled compute is under this share of the largest stage's is left out of
# the report's compute ratio (explain_gap).
SMALL_STAGE = 0.1


@dataclass
class RunReport:
    """The result of ``pipeplan run`` (``to_dict`` is its ``--json`` output)."""

    schedule: str
    device: str
    backend: str
    world_size: int
    shared: bool
    placement: dict[str, str]
    steps: int
    warmup: int
    microbatch_size: int
    num_microbatches: int
    iteration_ms: float
    step_ms: list[float]
    predicted_iteration_ms: float | None
    losses: list[float]
    peak_memory_bytes: dict[str, int]
    memory_kind: str
    stage_ms: dict[str, float]
    events: list[dict[str, Any]] = field(default_factory=list)
    predicted_memory_bytes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    parameters: dict[str, Any] | None = None  # full-model name -> tensor, when asked for
    profile_path: str | None = None  # the plan's profile, where it was found
    # The stages' own forward/backward against the profile: the largest measured/profiled
    # ratio over stages (None without the profile). Near ``ratio``: the gap is compute speed.
    compute_ratio: float | None = None
    precision: str = "fp32"  # fp32, or the autocast dtype the forwards ran under
    # fp16: the steps (warm-up included, from 0) every stage skipped after an overflow.
    skipped_steps: list[int] = field(default_factory=list)
    # Where the prediction's per-layer costs come from: "measured", or "analytic (GPU)" for
    # an analytic profile (a roofline of the GPU's datasheet, not a measurement); None when
    # the plan's profile was not at hand.
    prediction_source: str | None = None
    # The plan's band, [low, high] ms (planner.simulate.band); None: the plan has none.
    predicted_band_ms: list[float] | None = None
    # run_plan(count_collectives=True): each collective the last step's forwards and
    # backwards issued ({device, kind, stage, microbatch, op, bytes, phase}).
    collectives: list[CountedCollective] = field(default_factory=list)
    # The same per tensor-parallel stage and phase beside the profile's lists
    # (planner.runtime.collective_report); None: not counted.
    collective_rows: list[CollectiveRow] | None = None

    @property
    def global_batch(self) -> int:
        return self.microbatch_size * self.num_microbatches

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.iteration_ms * 1e3 if self.iteration_ms > 0 else math.inf

    @property
    def ratio(self) -> float | None:
        """Measured / predicted iteration time (1.0 = the plan was exact)."""
        if not self.predicted_iteration_ms:
            return None
        return self.iteration_ms / self.predicted_iteration_ms

    @property
    def inside_band(self) -> bool | None:
        """Whether the measured iteration lies inside the plan's band (None: no band)."""
        band = self.predicted_band_ms
        if band is None:
            return None
        return band[0] <= self.iteration_ms <= band[1]

    @property
    def predicted_samples_per_s(self) -> float | None:
        p = self.predicted_iteration_ms
        return self.global_batch / p * 1e3 if p else None

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "schedule": self.schedule,
            "device": self.device,
            "backend": self.backend,
            "world_size": self.world_size,
            "shared_devices": self.shared,
            "placement": self.placement,
            "steps": self.steps,
            "warmup": self.warmup,
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "global_batch": self.global_batch,
            "measured": {
                "iteration_ms": round(self.iteration_ms, 4),
                "step_ms": [round(x, 4) for x in self.step_ms],
                "samples_per_s": round(self.samples_per_s, 4),
                "peak_memory_bytes": self.peak_memory_bytes,
                "memory_kind": self.memory_kind,
                "stage_ms": {k: round(v, 4) for k, v in self.stage_ms.items()},
                "compute_ratio": None
                if self.compute_ratio is None
                else round(self.compute_ratio, 4),
            },
            "predicted": {
                "from": self.prediction_source,
                "iteration_ms": self.predicted_iteration_ms,
                "samples_per_s": self.predicted_samples_per_s,
                "memory_bytes": self.predicted_memory_bytes,
                "iteration_band_ms": self.predicted_band_ms,
            },
            "ratio": None if ratio is None else round(ratio, 4),
            "inside_band": self.inside_band,
            "losses": self.losses,
            "precision": self.precision,
            "skipped_steps": self.skipped_steps,
            "notes": self.notes,
        } | (
            {}
            if self.collective_rows is None
            else {"collectives": [row.to_dict() for row in self.collective_rows]}
        )


def explain_gap(report: RunReport, profile: Any, plan: Plan) -> None:
    """Set ``report.compute_ratio`` from the profile (the largest measured / profiled
    forward or backward over the stages that hold at least :data:`SMALL_STAGE` of the
    largest stage's compute), and where measured and predicted differ
    by over 15%, add a note saying whether the stages' compute accounts for it.

    Example::

        explain_gap(report, load_profile(report.profile_path), plan)
        report.compute_ratio   # e.g. 1.21: the slowest stage computed 21% slower than profiled
    """
    note_prediction_source(report, profile)
    ratios = stage_ratios(profile, plan, report.stage_ms)
    if not ratios:
        return
    # Stages with under a tenth of the largest stage's compute are left out: a 0.3 ms
    # embedding, whose actions' fixed costs weigh as much as its work, would set the maximum.
    work = stage_compute_ms(profile, plan)
    large = max(work.values(), default=0.0)
    kept = [s for s in ratios if work.get(s, 0.0) >= SMALL_STAGE * large] or list(ratios)
    report.compute_ratio = max(max(ratios[s]) for s in kept)
    ratio = report.ratio
    if ratio is None or abs(ratio - 1.0) <= 0.15:
        return
    # The stages' compute explains the gap when it is off the profile by as much, or more,
    # in the same direction (slower compute for a slower run, faster for a faster one).
    if ratio > 1.0:
        explained = report.compute_ratio >= ratio - 0.1
    else:
        explained = report.compute_ratio <= ratio + 0.1
    grouped = [st.id for st in plan.stages if st.tensor_parallel > 1]
    if explained and grouped:
        # A tensor-parallel stage's measured F and B hold its group's collectives, which
        # its profiled shard times leave to the simulator; --calibrate refuses such plans.
        which = ("stages " if len(grouped) > 1 else "stage ") + ", ".join(map(str, grouped))
        why = (
            f"the measured forward and backward of tensor-parallel {which} also hold "
            "their group's collectives, which the profile's shard times leave to the "
            "simulator (the topology's links): the gap is in their compute or in those "
            "collectives; --trace puts the measured step beside the predicted one"
        )
    elif explained:
        why = (
            "most of the gap is how fast the stages computed (machine load, clocks, cores "
            "shared), not the schedule; --calibrate folds it into a profile"
        )
    else:
        why = (
            "the gap lies outside the stages' compute (transfers, all-reduce, optimizer step "
            "or waiting); --trace puts the measured step beside the predicted one"
        )
    report.notes = [
        *report.notes,
        f"measured / predicted {ratio:.2f} with stage compute at {report.compute_ratio:.2f}x "
        f"its profiled time: {why}",
    ]


def note_prediction_source(report: RunReport, profile: Any) -> None:
    """Say where the prediction's costs come from; for an analytic profile add a note: the
    run is checked against a roofline of a GPU's datasheet, not against measurements.

    Example::

        note_prediction_source(report, load_profile("profiles/gpt-h100.json"))
        report.prediction_source     # 'analytic (h100-sxm)'
    """
    info = profile.settings.analytic
    if info is None:
        report.prediction_source = "measured"
        return
    gpu = info.gpu.name
    if profile.settings.calibrated is not None:  # --calibrate scaled its times to a run's
        report.prediction_source = f"analytic ({gpu}), calibrated by a run"
        return
    report.prediction_source = f"analytic ({gpu})"
    efficiency = ", ".join(f"{k} {v:g}" for k, v in info.efficiency.to_dict().items())
    report.notes = [
        *report.notes,
        f"the prediction is analytic: its per-layer times are a roofline of {gpu}'s peaks "
        f"(efficiencies {efficiency}), not measurements; measured / predicted checks that "
        "model of the hardware (and, on other hardware than it names, says little); "
        "--calibrate folds the measured stage times into a profile",
    ]


def build_report(
    result: RunResult,
    *,
    plan: Plan,
    placement: Placement,
    steps: int,
    warmup: int,
    notes: list[str],
) -> RunReport:
    """Combine the ranks' gathered results into one report.

    Example::

        report = build_report(result, plan=plan, placement=placement, steps=5, warmup=1,
                              notes=[])
    """
    ranks = sorted(result.ranks, key=lambda r: r.rank)
    step_ms = [
        max(r.step_seconds[i] for r in ranks) * 1e3 for i in range(len(ranks[0].step_seconds))
    ]
    m = plan.num_microbatches
    total_steps = len(ranks[0].losses)
    losses = []
    for i in range(total_steps):
        values = [x for r in ranks for x in r.losses[i]]
        losses.append(sum(values) / m)
    where = {}
    memory: dict[str, int] = {}
    for r in ranks:
        for d in r.devices:
            where[d] = f"rank {r.rank} ({r.torch_device})"
            groups = describe_device(plan.stages, d)  # tensor parallelism, sharding
            where[d] += f"; {groups}" if groups else ""
            memory[d] = int(r.peak_memory_bytes)
    stage_ms: dict[str, float] = {}
    for r in ranks:
        for k, v in r.stage_ms.items():
            stage_ms[k] = max(stage_ms.get(k, 0.0), float(v))
    events = [dataclasses.asdict(ev) for r in ranks for ev in r.events]
    pred = plan.predicted
    predicted = pred.iteration_ms if pred is not None else None
    step = max((v for k, v in stage_ms.items() if k.startswith("STEP")), default=0.0)
    step_predicted = bool(pred is not None and pred.step_ms) or bool(plan.step_ms)
    warning = batch_dependence_warning(ranks[0].batch_dependent)
    if warning is not None:  # the model's result depends on the microbatch size
        notes = [*notes, f"warning: {warning}"]
    if predicted and step > 0.05 * float(predicted) and not step_predicted:
        notes = [
            *notes,
            f"the optimizer step takes up to {step:.2f} ms per stage, which the prediction "
            f"leaves out (simulate --step-ms {step:.2f} includes it)",
        ]
    return RunReport(
        schedule=plan.schedule.name,
        device=placement.device_type,
        backend=placement.backend,
        world_size=placement.world_size,
        shared=placement.shared,
        placement=where,
        steps=steps,
        warmup=warmup,
        microbatch_size=plan.microbatch_size,
        num_microbatches=m,
        iteration_ms=statistics.median(step_ms) if step_ms else 0.0,
        step_ms=step_ms,
        predicted_iteration_ms=float(predicted) if predicted else None,
        losses=losses,
        peak_memory_bytes=memory,
        memory_kind=ranks[0].memory_kind,
        stage_ms=dict(sorted(stage_ms.items())),
        events=events,
        predicted_memory_bytes=dict(pred.memory_bytes) if pred is not None else {},
        notes=notes,
        precision=ranks[0].precision,
        skipped_steps=[i for i, skip in enumerate(ranks[0].skipped) if skip],
        predicted_band_ms=None if pred is None else pred.iteration_band_ms,
        collectives=[c for r in ranks for c in r.collectives],
    )


def measured_trace(report: RunReport, schedule: Any) -> dict[str, Any]:
    """The measured last step as Chrome/Perfetto JSON, in ``show --trace``'s format.

    Example::

        Path("measured.json").write_text(json.dumps(measured_trace(report, schedule)))
    """
    devices = list(report.placement)
    busy: dict[str, float] = dict.fromkeys(devices, 0.0)
    events = []
    for ev in report.events:
        events.append(
            SimEvent(
                ev["device"],
                ev["kind"],
                ev["stage"],
                ev["microbatch"],
                ev["start_ms"],
                ev["end_ms"],
            )
        )
        if ev["kind"] in ("F", "B", "I", "W"):
            busy[ev["device"]] = busy.get(ev["device"], 0.0) + ev["end_ms"] - ev["start_ms"]
    span = max((e.end_ms for e in events), default=0.0)
    bubble = 0.0 if span <= 0 else max(0.0, 1 - sum(busy.values()) / (len(busy) * span))
    result = SimResult(
        iteration_ms=report.iteration_ms,
        memory_bytes=dict(report.peak_memory_bytes),
        busy_ms=busy,
        bubble_fraction=bubble,
        lower_bound_ms=0.0,
        staleness=None,
        raw_events=[],
        schedule=schedule,
        device_names=devices,
        num_microbatches=report.num_microbatches,
        microbatch_size=report.microbatch_size,
    )
    # SimResult builds ``events``/``transfers`` lazily into these caches; fill them directly.
    result.__dict__["_events"] = events
    result.__dict__["_transfers"] = []
    trace = render_trace(result)
    trace["metadata"].update(
        {"source": "measured (pipeplan run)", "device": report.device, "ratio": report.ratio}
    )
    return trace


def side_by_side(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """One trace with the measured step and the plan's simulated one as separate processes.

    Both come from :func:`planner.render.render_trace` (pids 1-2); the predicted ones move
    to pids 11-12 and every process name says which it is.

    Example::

        both = side_by_side(measured_trace(report, schedule), render_trace(resimulate(...)))
    """
    events: list[dict[str, Any]] = []
    for label, trace, offset in (("measured", measured, 0), ("predicted", predicted, 10)):
        for ev in trace["traceEvents"]:
            ev = dict(ev)
            if "pid" in ev:
                ev["pid"] = ev["pid"] + offset
            if ev.get("name") == "process_name":
                ev["args"] = {"name": f"{label} {ev['args']['name']}"}
            events.append(ev)
    meta = dict(measured.get("metadata", {}))
    meta["predicted"] = predicted.get("metadata", {})
    return dict(measured, traceEvents=events, metadata=meta)


def print_run_report(report: RunReport, console: Console) -> None:
    """Predicted against measured, as a rich table, plus per-device memory.

    Example::

        print_run_report(report, Console())
    """
    from rich.table import Table

    title = f"pipeplan run: {report.schedule}, {report.steps} steps"
    table = Table(title=title if report.precision == "fp32" else f"{title}, {report.precision}")
    table.add_column("")
    table.add_column("predicted", justify="right")
    table.add_column("measured", justify="right")
    p, ps = report.predicted_iteration_ms, report.predicted_samples_per_s
    table.add_row("iteration (ms)", "-" if p is None else f"{p:.2f}", f"{report.iteration_ms:.2f}")
    band = report.predicted_band_ms
    if band is not None:
        inside = "yes" if report.inside_band else "no"
        table.add_row("band (ms); measured inside", f"{band[0]:.2f}-{band[1]:.2f}", inside)
    table.add_row("samples/s", "-" if ps is None else f"{ps:.1f}", f"{report.samples_per_s:.1f}")
    ratio = report.ratio
    if report.prediction_source is not None:
        table.add_row("predicted from", report.prediction_source, "")
    table.add_row("measured / predicted", "", "-" if ratio is None else f"{ratio:.3f}")
    if report.compute_ratio is not None:
        table.add_row("stage compute / profiled", "", f"{report.compute_ratio:.3f}")
    if report.losses:
        table.add_row(
            "loss (first -> last step)", "", f"{report.losses[0]:.4f} -> {report.losses[-1]:.4f}"
        )
    if report.precision == "fp16":
        skipped = ", ".join(map(str, report.skipped_steps)) or "none"
        table.add_row("steps skipped (fp16 overflow)", "", skipped)
    console.print(table)
    mem = Table(title=f"devices ({report.backend}, {report.world_size} processes)")
    mem.add_column("device")
    mem.add_column("runs on")
    mem.add_column("predicted memory", justify="right")
    label = "peak CUDA memory" if report.memory_kind.startswith("cuda") else "process max RSS"
    mem.add_column(label, justify="right")
    for dev, where in report.placement.items():
        pm = report.predicted_memory_bytes.get(dev)
        mem.add_row(
            dev,
            where,
            "-" if pm is None else format_bytes(pm),
            format_bytes(report.peak_memory_bytes.get(dev, 0)),
        )
    console.print(mem)
    if report.collective_rows is not None:
        print_collectives(report.collective_rows, console)
    for note in report.notes:  # a warning (the microbatch size matters) says so itself
        console.print(note if note.startswith("warning: ") else f"note: {note}")


def print_collectives(rows: list[CollectiveRow], console: Console) -> None:
    """``run --count-collectives``: per tensor-parallel stage and phase, what one
    microbatch issued on one member in the last step beside what the profile lists.

    Example::

        print_collectives(report.collective_rows, Console())
    """
    from rich.table import Table

    from planner.runtime.collective_report import describe_collectives

    if not rows:
        console.print("collectives: the plan has no tensor-parallel stage; nothing to compare")
        return
    table = Table(title="collectives per microbatch (last step, counted on every member)")
    for name in ("stage", "group", "phase", "counted", "profile lists", "same"):
        table.add_column(name)
    for row in rows:
        if row.match is not None:
            same = "yes" if row.match else "NO"
        else:  # no profile to compare with: only whether every action issued the same
            same = "-" if row.uniform else "NO: members or microbatches differ"
        table.add_row(
            str(row.stage),
            row.group,
            row.phase,
            describe_collectives(row.counted),
            describe_collectives(row.listed),
            same,
        )
    console.print(table)


def trace_with_prediction(report: RunReport, plan: Plan, plan_path: Path) -> dict[str, Any]:
    """The measured step as a Chrome/Perfetto trace, beside the plan's simulated step when
    the plan's profile is at hand (else a note in ``report`` says why not).

    Example::

        atomic_write_json("measured.json", trace_with_prediction(report, plan, plan_path))
    """
    data = measured_trace(report, plan.schedule)
    try:
        return side_by_side(data, render_trace(resimulate(plan, plan_path)))
    except InputError as exc:
        report.notes.append(f"trace: measured step only; cannot re-simulate: {exc.message}")
        return data

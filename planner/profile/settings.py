"""How a profile was made: the settings that code reads back, typed.

A profile's ``meta`` object holds free facts about its making (host, date, repeats, the
PipeDream import's records) and, among them, the settings that later commands depend on:
how the model was captured and split (``capture``, ``split_at``: ``run`` and ``export``
must split it the same way), the torch threads it was timed with (``run`` uses as many),
the clock and timing method, the modules that make its results depend on the microbatch
size (``batch_dependent``: a warning), what an analytic profile is a roofline of
(``analytic``) and a run's calibration (``calibrated``). :class:`ProfileSettings` is those,
typed; the file keeps them where every version has written them, in ``meta``
(:func:`split_meta` takes them out, :meth:`ProfileSettings.to_meta` puts them back). A
setting written as null (older profiles write ``"split_at": null``) is no setting: it stays
among the free facts, so every profile reads and writes back unchanged.

Example::

    profile = load_profile("profiles/gpt.json")
    profile.settings.capture_method, profile.settings.threads     # ('fx', 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from planner.gpus import Efficiency, GpuSpec
from planner.limits import MAX_MICROBATCH_SIZE, MAX_THREADS
from planner.records import Integer, Name, OneOf, Text, read_record, record_dict

__all__ = [
    "CAPTURED",
    "SETTINGS_KEYS",
    "AnalyticInfo",
    "Calibration",
    "ProfileSettings",
    "split_meta",
]

CAPTURED = ("fx", "export", "export-eval")
"""How a profiled model was captured (:attr:`planner.profile.split.SplitModel.capture`)."""


# Written only when known (older analytic profiles may lack them).
_OPTIONAL = frozenset({"optimizer_step_bytes_per_param_byte", "layers_counted"})
_OPTIONAL |= {"layers_from_twins", "one_capture_for_all_sizes"}


@dataclass(frozen=True)
class AnalyticInfo:
    """What an analytic profile's times are a roofline of (``meta.analytic``): the GPU's
    numbers as the catalog gave them, the efficiencies, and how the layers were counted.
    Keys a newer pipeplan adds are kept in ``extra``.

    Example::

        info = load_profile("profiles/llama-h100.json").settings.analytic
        info.gpu.name, info.efficiency.matmul
    """

    gpu: GpuSpec
    efficiency: Efficiency
    method: str = ""
    autocast: str | None = None
    optimizer_step_bytes_per_param_byte: float | None = None
    layers_counted: int | None = None
    layers_from_twins: int | None = None
    one_capture_for_all_sizes: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """``meta.analytic`` as the profile records it.

        Example::

            info.to_dict()["gpu"]["name"]
        """
        out = {
            "gpu": self.gpu.to_dict(),
            "efficiency": self.efficiency.to_dict(),
            "method": self.method,
            "autocast": self.autocast,
            "optimizer_step_bytes_per_param_byte": self.optimizer_step_bytes_per_param_byte,
            "layers_counted": self.layers_counted,
            "layers_from_twins": self.layers_from_twins,
            "one_capture_for_all_sizes": self.one_capture_for_all_sizes,
        }
        return {k: v for k, v in out.items() if v is not None or k not in _OPTIONAL} | self.extra


@dataclass(frozen=True)
class Calibration:
    """A run's stage times folded into the profile (``run --calibrate``,
    :mod:`planner.runtime.calibrate`): the plan's schedule and microbatch size, each
    stage's measured / profiled forward and backward, the measured optimizer step.

    Example::

        Calibration("1f1b", 4, {"0": [1.1, 1.2]}, 0.5).to_dict()["step_ms"]    # 0.5
    """

    plan_schedule: str
    microbatch_size: Annotated[int, Integer(1, MAX_MICROBATCH_SIZE)]
    stage_ratios: dict[str, list[float]]
    step_ms: float
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """``meta.calibrated`` as the profile records it.

        Example::

            Calibration("1f1b", 4, {}, 0.5).to_dict()["plan_schedule"]    # '1f1b'
        """
        return record_dict(self)


@dataclass(frozen=True)
class ProfileSettings:
    """The settings a profile was made with that later commands read (module docstring);
    None where the profile does not say (an imported or older profile).

    Example::

        ProfileSettings(capture="export", threads=1).capture_method   # 'export'
    """

    capture: Annotated[str, OneOf(CAPTURED)] | None = None
    split_at: Name | None = None
    threads: Annotated[int, Integer(1, MAX_THREADS)] | None = None
    clock: Annotated[str, Text()] | None = None
    timing: Annotated[str, OneOf(("layer", "pass"))] | None = None  # measure.TIMING_METHODS
    batch_dependent: tuple[Annotated[str, Text()], ...] = ()
    analytic: AnalyticInfo | None = None
    calibrated: Calibration | None = None

    @property
    def capture_method(self) -> str:
        """How to capture the model as it was profiled: ``capture``, or ``fx`` for a
        profile older than graph capture by torch.export (the one place of that default).

        Example::

            ProfileSettings().capture_method     # 'fx'
        """
        return self.capture or "fx"

    def to_meta(self) -> dict[str, Any]:
        """The settings as ``meta`` holds them (those that are set).

        Example::

            ProfileSettings(threads=2).to_meta()    # {'threads': 2}
        """
        out: dict[str, Any] = {
            "capture": self.capture,
            "split_at": self.split_at,
            "threads": self.threads,
            "clock": self.clock,
            "timing": self.timing,
            "batch_dependent": list(self.batch_dependent) or None,
            "analytic": None if self.analytic is None else self.analytic.to_dict(),
            "calibrated": None if self.calibrated is None else self.calibrated.to_dict(),
        }
        return {k: v for k, v in out.items() if v is not None}


SETTINGS_KEYS = frozenset(ProfileSettings.__dataclass_fields__)
"""The keys of ``meta`` that are settings."""


def split_meta(meta: dict[str, Any], *, file: str | None) -> tuple[ProfileSettings, dict[str, Any]]:
    """A profile's ``meta`` as its settings (read and checked) and the free facts
    (everything else, a setting written as null included).

    Example::

        settings, facts = split_meta({"threads": 1, "host": {...}}, file="p.json")
    """
    taken = {k: v for k, v in meta.items() if k in SETTINGS_KEYS and v is not None}
    rest = {k: v for k, v in meta.items() if k not in taken}
    return read_record(ProfileSettings, taken, file=file, field="meta"), rest

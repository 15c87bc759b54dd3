"""A plan's inputs: find the profile and topology it names, check them, re-simulate it.

A plan refers to its profile and topology by path and sha256. Every reader (``show``,
``simulate --plan``, ``run`` and its trace, the export) finds them the same way: the path
as written, then beside the plan file; and refuses a file whose sha256 changed since the
plan was made, with one line naming the plan and the field.

Example::

    got = plan_inputs(Plan.load("plan.json"), Path("plan.json"))
    got.profile.num_layers, got.topology, got.schedule.name
    result = resimulate(Plan.load("plan.json"), Path("plan.json"))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from planner.errors import InputError
from planner.fileio import sha256_file
from planner.profile import load_profile
from planner.simulate import SimResult, simulate
from planner.topology import Topology, load_topology

if TYPE_CHECKING:
    from planner.plan import Plan
    from planner.plan_parts import FileRef
    from planner.profile.schema import Profile
    from planner.schedule.actions import Schedule

__all__ = [
    "PlanInputs",
    "check_unchanged",
    "find_file",
    "locate",
    "plan_files",
    "plan_inputs",
    "resimulate",
]


@dataclass
class PlanInputs:
    """What re-simulating a plan needs; ``profile`` / ``topology`` are None when not asked
    for (or, for the topology, when the plan has none)."""

    profile: Profile | None
    profile_path: Path | None
    topology: Topology | None
    topology_path: Path | None
    schedule: Schedule  # the plan's per-device op order (validated when it was read)
    step_ms: float | None  # an explicit ``simulate --step-ms`` (the plan's step_ms)


def find_file(ref: FileRef, plan_path: str | Path | None, key: str = "profile") -> Path | None:
    """The file a plan's reference names, tried as written and then
    beside the plan; None when it has no path, was never saved or is not found. A path
    that names a folder (and no file) is one clear InputError naming the plan and
    ``key``'s ``.path`` field.

    Example::

        find_file(plan.profile, "runs/plan.json")   # Path('profiles/gpt.json') or None
    """
    raw = ref.path
    if not raw or raw == "<memory>":
        return None
    candidates = [Path(raw)]
    if plan_path is not None and not Path(raw).is_absolute():
        candidates.append(Path(plan_path).resolve().parent / raw)
    found = next((c for c in candidates if c.is_file()), None)
    if found is None and any(c.is_dir() for c in candidates):
        raise InputError(
            f"the {key} path {raw!r} is a folder, expected a file",
            file=str(plan_path) if plan_path is not None else None,
            field=f"{key}.path",
        )
    return found


def plan_files(plan: Plan, plan_path: str | Path) -> list[tuple[str, Path | None]]:
    """The files ``plan`` names that exist (its profile and topology), as inputs of a
    command that reads the plan (:class:`planner.outputs.Outputs` keeps outputs off them).

    Example::

        Outputs([("the plan", "plan.json"), *plan_files(plan, "plan.json")])
    """
    return [
        (f"the plan's {key}", find_file(ref, plan_path, key))
        for key, ref in (("profile", plan.profile), ("topology", plan.topology))
    ]


def check_unchanged(found: Path, ref: FileRef, key: str, plan_path: str | Path) -> None:
    """Refuse a referenced file whose sha256 differs from the one the plan recorded.

    Example::

        check_unchanged(Path("profiles/gpt.json"), plan.profile, "profile", "plan.json")
    """
    want = ref.sha256
    if want and sha256_file(found) != want:
        raise InputError(
            f"the {key} {str(found)!r} changed since this plan was made (sha256 differs); "
            "re-run `pipeplan solve` or `pipeplan simulate -o` to make a new plan",
            file=str(plan_path),
            field=f"{key}.sha256",
        )


def locate(ref: FileRef, key: str, plan_path: Path) -> Path | None:
    """The referenced file, found and unchanged; None for a plan without that file (no
    topology). A file that is missing, or was never saved, is one clear InputError.

    Example::

        locate(plan.topology, "topology", Path("plan.json"))
    """
    raw = ref.path
    if raw is None:
        return None
    if raw == "<memory>":
        raise InputError(
            f"the plan's {key} was never saved to a file, so the plan cannot be re-simulated",
            file=str(plan_path),
            field=f"{key}.path",
        )
    found = find_file(ref, plan_path, key)
    if found is None:
        raise InputError(
            f"{key} file {raw!r} not found (looked in the current folder and beside the plan)",
            file=str(plan_path),
            field=f"{key}.path",
        )
    check_unchanged(found, ref, key, plan_path)
    return found


def plan_inputs(
    plan: Plan, plan_path: Path, *, profile: bool = True, topology: bool = True
) -> PlanInputs:
    """What re-simulating ``plan`` needs, its files checked against their stored sha256.

    Example::

        got = plan_inputs(Plan.load("plan.json"), Path("plan.json"), topology=False)
        got.profile.num_layers
    """
    got = PlanInputs(None, None, None, None, plan.schedule, None)
    if profile:
        got.profile_path = locate(plan.profile, "profile", plan_path)
        if got.profile_path is None:
            raise InputError(
                "the plan names no profile file, so it cannot be re-simulated",
                file=str(plan_path),
                field="profile.path",
            )
        got.profile = load_profile(got.profile_path)
    got.topology_path = locate(plan.topology, "topology", plan_path) if topology else None
    if got.topology_path is not None:
        got.topology = load_topology(got.topology_path)
    got.step_ms = plan.step_ms
    return got


def resimulate(plan: Plan, plan_path: Path) -> SimResult:
    """Time the plan's stored schedule (validated when the plan was read) on its
    (unchanged) profile and topology.

    Example::

        result = resimulate(Plan.load("plan.json"), Path("plan.json"))
    """
    got = plan_inputs(plan, plan_path)
    assert got.profile is not None
    return simulate(
        got.profile,
        got.topology,
        plan.stages,
        got.schedule,
        plan.num_microbatches,
        plan.microbatch_size,
        step_ms=got.step_ms,
        validate=False,
    )

"""Co-located profiling: the profile records its co-location, companions run beside the
measuring process and are gone afterwards, and solve / simulate / run say when a plan runs
another number of processes on the host than its profile saw."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from planner.cli import main
from planner.errors import InputError, RunFailed
from planner.plan import parse_stages
from planner.profile import load_profile
from planner.profile.colocation import (
    MAX_COLOCATE,
    Colocation,
    check_colocate,
    colocation_note,
    load_note,
    profile_colocation,
)
from planner.profile.companions import CompanionConfig, Companions, check_companion_memory
from planner.profile.measure import profile_model
from planner.runtime.placement import place
from planner.runtime.runner import colocation_notes
from planner.simulate.colocation import (
    cpu_processes_per_host,
    plan_colocation_note,
    plan_processes_per_host,
)
from planner.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "mlp.py"
DEMO_PROFILE = ROOT / "tests" / "data" / "gpt_demo_profile.json"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_colocated_profile_records_it_and_leaves_no_companion() -> None:
    profile = profile_model(MLP, [1], repeat=1, warmup=0, min_time_s=0, colocate=2)
    assert profile.settings.colocation is not None
    assert profile.settings.colocation.processes == 2
    assert profile.settings.colocation.method == "companions"
    assert profile.settings.clock == "perf_counter"  # the run's clock
    assert profile_colocation(profile).processes == 2
    # Profiles written before the record: alone.
    older = load_profile(ROOT / "profiles" / "mlp.json")
    assert "colocation" not in older.to_dict().get("meta", {})
    assert profile_colocation(older) == Colocation()
    assert profile_colocation(profile).to_dict() == profile.to_dict()["meta"]["colocation"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_companions_compute_while_the_with_lasts_and_are_stopped_after() -> None:
    config = CompanionConfig(str(MLP), [1, 2], warmup=1)
    with Companions(config, 1) as companions:
        companions.wait_ready()
        (pid,) = [p.pid for p in companions.procs]
        before = _cpu_seconds(pid)
        time.sleep(0.5)
        assert _cpu_seconds(pid) > before  # it computes beside us
    assert companions.procs == []
    for _ in range(50):
        if _gone(pid):
            break
        time.sleep(0.02)
    assert _gone(pid)


def test_ctrl_c_stops_the_companions() -> None:
    config = CompanionConfig(str(MLP), [1])
    with pytest.raises(KeyboardInterrupt), Companions(config, 2) as companions:
        pids = [p.pid for p in companions.procs]
        raise KeyboardInterrupt
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


def test_a_companion_whose_profiler_is_already_gone_ends_at_once() -> None:
    """A Ctrl-C in the moment between starting a companion and its asking to die with the
    profiler left it computing for seconds (hostile pass, 2026-11-28): it checks."""
    import subprocess
    import sys

    config = CompanionConfig(str(MLP), [1], warmup=10**6).to_json()
    start = time.monotonic()
    done = subprocess.run(  # names pid 0 as its profiler: not its parent, gone
        [sys.executable, "-m", "planner.profile.companions", config, "0"],
        cwd=ROOT,
        timeout=60,
        capture_output=True,
    )
    assert done.returncode == 1 and time.monotonic() - start < 30


def test_a_companion_that_fails_is_named(tmp_path: Path) -> None:
    config = CompanionConfig(str(tmp_path / "gone.py"), [1])
    with pytest.raises(RunFailed) as info, Companions(config, 1) as companions:
        companions.wait_ready()
    message = str(info.value)
    assert "companion process 1 exited with code 1" in message and "gone.py" in message


@pytest.mark.parametrize("value", [0, MAX_COLOCATE + 1, True, "2", 1.5])
def test_colocate_counts_are_checked(value: object) -> None:
    with pytest.raises(InputError) as info:
        check_colocate(value, "cpu")
    assert info.value.field == "--colocate"
    with pytest.raises(InputError, match="CPU processes"):
        check_colocate(2, "cuda")
    assert check_colocate(MAX_COLOCATE, "cpu") == MAX_COLOCATE


def test_companions_that_cannot_fit_in_memory_are_refused() -> None:
    check_companion_memory(1)  # one companion needs what this process holds: it fits
    # a million copies of this process (torch imported) exceed any host's memory
    with pytest.raises(InputError, match=r"1000000 companion processes need at least") as info:
        check_companion_memory(10**6)
    assert info.value.field == "--colocate" and "\n" not in info.value.one_line()


def test_the_cli_refuses_a_bad_colocate_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    with pytest.raises(SystemExit) as info:
        main(["profile", str(MLP), "-b", "1", "--colocate", "0", "-o", str(out)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and not out.exists()
    assert "--colocate" in err and err.count("\n") == 1 and "Traceback" not in err


def test_notes_when_the_plan_runs_another_number_of_processes() -> None:
    cpu = load_topology(ROOT / "topologies" / "cpu.yaml")
    stages = parse_stages("0-2:cpu0;3-5:cpu1")
    assert cpu_processes_per_host(cpu) == 2 and plan_processes_per_host(stages, cpu) == 2
    gpus = load_topology(ROOT / "topologies" / "nvlink.yaml")
    assert plan_processes_per_host(parse_stages("0-2:gpu0;3-5:gpu1"), gpus) is None
    colocated = load_profile(DEMO_PROFILE)  # measured with 2 processes
    assert plan_colocation_note(colocated, cpu, stages) is None
    one = parse_stages("0-5:cpu0")
    note = plan_colocation_note(colocated, cpu, one)
    assert note is not None and "with 2 processes co-located" in note and "--colocate 1" in note
    alone = load_profile(ROOT / "profiles" / "gpt.json")  # written before the record
    note = plan_colocation_note(alone, cpu, stages)
    assert note is not None and "one process alone" in note and "--colocate 2" in note
    assert colocation_note(Colocation(2, "companions"), 2) is None
    # The run: its processes on this host against the profile's.
    assert colocation_notes(colocated, place(stages, "cpu")) == [] or all(
        "busy cores" in n for n in colocation_notes(colocated, place(stages, "cpu"))
    )
    assert any("--colocate 2" in n for n in colocation_notes(alone, place(stages, "cpu")))


def test_a_load_note_when_other_work_differs() -> None:
    profiled = Colocation(2, "companions", busy_cores=0.1)
    assert load_note(profiled, 0.3) is None
    assert load_note(profiled, None) is None and load_note(Colocation(), 1.5) is None
    note = load_note(profiled, 1.4)
    assert note is not None and "0.1 busy cores when profiled, 1.4 now" in note
    assert "slower" in note

"""Keeping freed memory: the profiler and every run worker use the same malloc settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from planner.allocator import keep_freed_memory

ASK = "from planner.allocator import keep_freed_memory; print(keep_freed_memory())"


def _fresh(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", ASK], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _glibc() -> bool:
    return sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))


@pytest.mark.skipif(not _glibc(), reason="mallopt settings exist on glibc only")
def test_glibc_processes_keep_freed_memory() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    said = _fresh(env)
    assert said.startswith("glibc malloc: trim_threshold=1073741824"), said


def test_the_users_malloc_tunables_win() -> None:
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.arena_max=1")
    assert _fresh(env) == "default: GLIBC_TUNABLES=glibc.malloc.arena_max=1"


def test_profiles_record_the_allocator() -> None:
    from pathlib import Path

    from planner.profile import profile_model

    model = Path(__file__).resolve().parent / "models" / "skip.py"
    profile = profile_model(model, [1], repeat=1, warmup=0, min_time_s=0)
    assert profile.meta["allocator"] == keep_freed_memory()

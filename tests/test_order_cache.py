"""The schedules' order cache (planner.schedule._pattern_order) is bounded by compute ops as
well as by orders, so orders of thousands of microbatches do not fill a solve's memory; an
order dropped and made again is the same order."""

from __future__ import annotations

import pytest

import planner.schedule as schedule_module
from planner.schedule import _OrderCache, build_schedule
from planner.stages import StageSpec


def _stages(p: int) -> list[StageSpec]:
    return [StageSpec(s, (s, s), (f"gpu{s}",)) for s in range(p)]


def test_the_cache_stops_at_its_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _OrderCache(64, 3000)
    monkeypatch.setattr(schedule_module, "_ORDERS", cache)
    first = build_schedule("1f1b", _stages(4), 100).order  # 4 x 100 x 2 = 800 ops
    assert first is build_schedule("1f1b", _stages(4), 100).order  # cached
    for m in (101, 102, 103):
        build_schedule("1f1b", _stages(4), m)
    assert cache.ops <= 3000 and len(cache.entries) == 3  # the oldest dropped
    again = build_schedule("1f1b", _stages(4), 100).order
    assert again is not first and again == first
    info = cache.cache_info()
    assert (info.hits, info.misses, info.currsize) == (1, 5, 3)


def test_the_newest_order_is_kept_whatever_its_size() -> None:
    cache = _OrderCache(64, 10)
    cache.put(("a",), {0: [("F", 0, 0), ("B", 0, 0)] * 20})
    assert cache.get(("a",)) is not None and cache.ops == 40
    cache.put(("b",), {0: [("F", 0, 0)]})
    assert list(cache.entries) == [("b",)] and cache.ops == 1

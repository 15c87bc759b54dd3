"""The chain DP's per-slot tables: one byte a cell per microbatches held (what fits, and
how), the times read from them; and the mesh grid cutting exactly as it did when the
tables held a float matrix and a recompute mask per held count."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from planner.cost import (
    stage_compute_ms,
    stage_memory_bytes,
    synthetic_profile,
    synthetic_tensor_parallel,
)
from planner.partition.dp import NO_FIT, PLAIN, RECOMPUTE, Slot, _tables, layer_costs
from planner.profile import Layer, LayerTiming, Measurement, Profile
from planner.shape import PlanShape
from planner.solve.mesh_grid import mesh_grid
from planner.solve.options import SolveOptions
from planner.solve.search import Search
from planner.topology import topology_from_dict
from planner.topology.cluster import cluster_dict

MIB, GIB = 2**20, 2**30


def _profile() -> Profile:
    """Ten layers of unequal weights, times and activations, at microbatch size 1."""
    layers = [
        Layer(f"l{i}", 0, (5 + 7 * i % 11) * MIB, 2 * (5 + 7 * i % 11) * MIB) for i in range(10)
    ]
    timings = [
        LayerTiming(
            1.0 + i % 3, 2.0 + i % 3, 1.0, 1.0 + i % 3, (8 + i % 4) * MIB, (60 + 9 * i % 7) * MIB
        )
        for i in range(10)
    ]
    return Profile("tables", layers, [Measurement(1, 8 * MIB, timings)])


def _expected_kind(profile: Profile, i: int, j: int, held: int, limit: float) -> int:
    """What a stage of layers ``i..j`` holding ``held`` microbatches is, from the cost
    model itself: as the DP's brute-force check in tests/test_dp.py prices it."""
    if j < i:
        return NO_FIT
    if stage_memory_bytes(profile, i, j, 1, held) <= limit:
        return PLAIN
    on = min(
        stage_memory_bytes(profile, i, j, 1, held, recompute=True, recompute_layers=each)
        for each in (False, True)
    )
    return RECOMPUTE if on <= limit else NO_FIT


def test_held_tables_are_one_byte_a_cell_and_price_what_the_cost_model_does() -> None:
    profile = _profile()
    n, held = profile.num_layers, 3
    limit = 700.0 * MIB  # some stages fit as they are, some with recompute, some not at all
    table = _tables(layer_costs(profile, 1), Slot(("gpu0",), 1.0, limit), 1, 8)
    kind = table.fits(held, True)
    assert kind.dtype == np.int8 and kind.nbytes == n * n and not kind.flags.writeable
    expected = [[_expected_kind(profile, i, j, held, limit) for j in range(n)] for i in range(n)]
    assert kind.tolist() == expected
    assert {NO_FIT, PLAIN, RECOMPUTE} <= set(kind.ravel().tolist())
    ms = table.ms(kind)
    for i in range(n):
        for j in range(n):
            rc = kind[i, j] == RECOMPUTE
            if kind[i, j] == NO_FIT:
                assert ms[i, j] == np.inf and table.ms_at(kind, i, j) == np.inf
                continue
            f, b = stage_compute_ms(profile, i, j, 1, recompute=bool(rc))
            assert abs(ms[i, j] - (f + b)) < 1e-9 * (f + b)
            assert table.ms_at(kind, i, j) == ms[i, j]
    assert np.array_equal(table.ms(kind, 2, 7), ms[2:7, 2:7])
    assert table.fits(held, True) is kind  # cached per microbatches held
    without = table.fits(held, False)
    assert RECOMPUTE not in set(without.ravel().tolist())
    assert np.array_equal(without == PLAIN, kind == PLAIN)


def _summary(shapes: Sequence[PlanShape], cuts: Sequence[object]) -> tuple[str, str]:
    """Digests of the grid's shapes (every stage's layers, devices, recompute, degree,
    sequence parallelism, sharding) and of its cuts (ranges, the DP's recompute flags)."""
    rows = [
        (
            s.schedule,
            s.microbatch_size,
            s.num_microbatches,
            [
                (
                    st.layers,
                    st.devices,
                    st.recompute,
                    st.tensor_parallel,
                    st.sequence_parallel,
                    st.sharding,
                )
                for st in s.stages
            ],
        )  # fmt: skip
        for s in shapes
    ]
    return (
        hashlib.sha256(repr(rows).encode()).hexdigest()[:16],
        hashlib.sha256(repr(cuts).encode()).hexdigest()[:16],
    )


def test_the_mesh_grid_cuts_as_it_did_with_float_tables() -> None:
    """Twelve layers too big for a stage of one A100 without recompute, on two DGX A100s:
    the DP's cuts (recompute, plain, none that fits) and so the grid's 342 shapes are the
    ones the tables of a float matrix and a mask per held count gave (digests recorded
    with them, 2026-11-28)."""
    layers = synthetic_profile(
        12,
        forward_ms=5.0,
        param_bytes=int(1.5 * GIB),
        optimizer_state_bytes=3 * GIB,
        output_bytes=256 * MIB,
        saved_bytes=4 * GIB,
        input_bytes=256 * MIB,
    )
    profile = synthetic_tensor_parallel(layers, (2, 4, 8))
    topo = topology_from_dict(cluster_dict("dgx-a100", 2, network="fat-tree"), "<dgx-a100 x2>")
    search = Search(profile, topo, SolveOptions(), 60.0)
    shapes = list(dict.fromkeys(mesh_grid(search, [(1, 32)], ["1f1b", "gpipe", "zb"])))
    cuts = [v for k, v in search.notes.items() if k[0] == "mesh cuts"]
    flags = [rc for c in cuts for _, rc in c if rc is not None]
    assert len(shapes) == 342 and len(cuts) == 168
    assert sum(any(f) for f in flags) == 78 and sum(not any(f) for f in flags) == 141
    assert _summary(shapes, cuts) == (SHAPES_DIGEST, CUTS_DIGEST)


SHAPES_DIGEST, CUTS_DIGEST = "a0821b9b54cb936c", "8d7da1af18479cf0"

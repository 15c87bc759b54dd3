"""The solver's search over tensor parallelism, sequence parallelism and sharding
(planner.solve.mesh_search): on the bundled uneven fabrics, where tensor parallelism pays
the plan found uses it on the fast links, beats the best plan without it, and is at least
as fast as every tuned peer (Megatron-LM, torchtitan, DeepSpeed ZeRO-3, FSDP among them);
a profile without tensor-parallel entries is searched as before."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from functools import partial
from pathlib import Path

import pytest
from synthetic_profiles import eight_heavy_layers, pcie_mixed_profile

from planner.cost import synthetic_tensor_parallel
from planner.plan import Plan
from planner.solve import solve
from planner.solve.mesh import Mesh, mesh_shape
from planner.solve.mesh_grid import mesh_degrees, placements
from planner.solve.mesh_search import mesh_search
from planner.solve.options import SolveOptions
from planner.solve.peer_partitions import PeerPartitions
from planner.solve.peers import PEERS, TP_PEERS, PeerConfig, peers_for, settle, tune_peers
from planner.solve.search import Search, TimeUp
from planner.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def _topo(name: str) -> Topology:
    return load_topology(ROOT / "topologies" / f"{name}.yaml")


# Small stashes (memory aside), big activations: with two microbatches a pipeline idles,
# and tensor parallelism pays on NVLink but not over PCIe. Tests pass ``degrees=`` (and
# ``sequence_parallel=False``) for tensor-parallel entries.
_plain = partial(eight_heavy_layers, saved_bytes=MIB)


def _iteration_ms(plan: Plan) -> float:
    assert plan.predicted is not None
    return plan.predicted.iteration_ms


def _fast_groups(topology: Topology, plan: Plan) -> None:
    """Every tensor-parallel group on one host, and on one-host fabrics every pair of
    members joined by a direct NVLink (as the topology file gives the links' kind)."""
    one_host = len(topology.hosts()) == 1
    for st in plan.stages:
        t = st.tensor_parallel
        for j in range(0, len(st.devices), t):
            group = st.devices[j : j + t]
            assert len({topology.device(d).host for d in group}) == 1, group
            if one_host:
                for a, b in itertools.combinations(group, 2):
                    edge = topology.graph.get_edge_data(a, b) or {}
                    assert edge.get("kind") == "nvlink", (a, b)


@pytest.mark.parametrize("name", ["nvlink-pairs", "dgx1-v100", "two-node-ib"])
def test_tensor_parallel_on_the_fast_links_when_it_pays(name: str) -> None:
    topo = _topo(name)
    plain = _plain()
    without = solve(plain, topo, num_microbatches=2)
    assert all(st.tensor_parallel == 1 for st in without.stages)
    plan = solve(synthetic_tensor_parallel(plain, (2, 4, 8)), topo, num_microbatches=2)
    assert plan.stages[0].tensor_parallel > 1
    assert len({(st.tensor_parallel, st.sequence_parallel) for st in plan.stages}) == 1
    _fast_groups(topo, plan)
    assert _iteration_ms(plan) < 0.9 * _iteration_ms(without)
    # The search alone (before any peer's plan joined) is reported beside the plan.
    assert plan.solver is not None and plan.solver.without_peers is not None
    assert "mesh" in plan.solver.method
    for row in plan.baselines:
        if row.kind == "tuned peer" and row.feasible:
            assert row.iteration_ms is not None
            assert _iteration_ms(plan) <= row.iteration_ms * (1 + 1e-9), row.name


def test_plan_is_at_least_every_tensor_parallel_peer() -> None:
    topo = _topo("nvlink-pairs")
    profile = _plain(degrees=(2, 4))
    plan = solve(profile, topo, num_microbatches=8)
    tuned = {b.name: b for b in plan.baselines if b.kind == "tuned peer"}
    assert set(tuned) == {p.name for p in TP_PEERS}
    for row in tuned.values():
        if row.feasible:
            assert row.iteration_ms is not None
            assert _iteration_ms(plan) <= row.iteration_ms * (1 + 1e-9), row.name
    # Megatron-LM tunes tensor parallelism within a node; ZeRO-3 and FSDP shard alone.
    megatron = tuned["Megatron-LM"]
    assert megatron.feasible and "TP" in (megatron.configuration or "")
    for name in ("DeepSpeed ZeRO-3", "FSDP"):
        assert tuned[name].extra.get("sharding") == "fsdp"


def test_profiles_without_sequence_parallel_shards_solve_without_it() -> None:
    """A profile of ``--tensor-parallel`` without ``--sequence-parallel`` has no ``tp*-sp``
    entries: the peers that tune sequence parallelism (Megatron-LM, torchtitan) leave it
    off instead of asking for an entry that is not there."""
    profile = _plain(degrees=(2, 4), sequence_parallel=False)
    plan = solve(profile, _topo("nvlink-pairs"), num_microbatches=8)
    assert not any(st.sequence_parallel for st in plan.stages)
    tuned = {b.name: b for b in plan.baselines if b.kind == "tuned peer"}
    for name in ("Megatron-LM", "torchtitan"):
        assert tuned[name].feasible, tuned[name].reason
        assert "SP" not in (tuned[name].configuration or "")


def test_profiles_without_entries_keep_the_old_peers_and_search() -> None:
    plain = _plain()
    assert peers_for(plain) == PEERS
    assert peers_for(synthetic_tensor_parallel(plain, (2,))) == TP_PEERS
    plan = solve(plain, _topo("nvlink-pairs"), num_microbatches=2)
    assert plan.solver is not None and "mesh" not in plan.solver.method
    assert {b.name for b in plan.baselines if b.kind == "tuned peer"} == {p.name for p in PEERS}


def test_degrees_and_placements() -> None:
    topo = _topo("nvlink-pairs")
    tp = _plain(degrees=(2, 4, 16))
    search = Search(tp, topo, SolveOptions(), 60.0)
    assert mesh_degrees(search) == [1, 2, 4]  # 16 is more than the devices
    assert mesh_degrees(Search(_plain(), topo, SolveOptions(), 60.0)) == [1]
    grouping = tuple((f"gpu{2 * k}", f"gpu{2 * k + 1}") for k in range(4))
    together, apart = placements(grouping, 2)
    assert together == [("gpu0", "gpu1", "gpu2", "gpu3"), ("gpu4", "gpu5", "gpu6", "gpu7")]
    assert apart == [("gpu0", "gpu1", "gpu4", "gpu5"), ("gpu2", "gpu3", "gpu6", "gpu7")]
    shape = mesh_shape(search, [(0, 3), (4, 7)], together, Mesh(2, True), "zero1", "1f1b", 1, 4)
    assert [(s.tensor_parallel, s.sequence_parallel, s.sharding) for s in shape.stages] == [
        (2, True, "zero1")
    ] * 2


def test_stages_without_parameters_are_never_sharded() -> None:
    """Layers without parameters (activations, pooling): the search and the peers leave a
    stage of only those unsharded (the simulator refuses to shard nothing)."""
    plain = _plain()
    layers = [
        dataclasses.replace(ly, param_count=0, param_bytes=0, optimizer_state_bytes=0)
        if i >= 4
        else ly
        for i, ly in enumerate(plain.layers)
    ]
    profile = synthetic_tensor_parallel(dataclasses.replace(plain, layers=layers), (2,))
    topo = _topo("nvlink-pairs")
    search = Search(profile, topo, SolveOptions(), 60.0)
    devs = [("gpu0", "gpu1", "gpu2", "gpu3"), ("gpu4", "gpu5", "gpu6", "gpu7")]
    shape = mesh_shape(search, [(0, 3), (4, 7)], devs, Mesh(2), "fsdp", "1f1b", 1, 8)
    assert [s.sharding for s in shape.stages] == ["fsdp", "none"]
    plan = solve(profile, topo, num_microbatches=8)
    for row in plan.baselines:
        assert row.feasible or row.reason, row.name
    for st in plan.stages:
        if st.sharding != "none":
            assert any(ly.param_bytes for ly in layers[st.first : st.last + 1])


def test_solve_prints_groups_and_parallelism() -> None:
    """`pipeplan solve`'s stage table writes a tensor-parallel group with '+' and says TP,
    SP and sharding in a column of its own (plain plans print as before: no column)."""
    from rich.console import Console

    from planner.commands.solve import print_plan

    topo = _topo("nvlink-pairs")
    plan = solve(_plain(degrees=(2, 4, 8)), topo, num_microbatches=2)
    console = Console(record=True, width=300)
    print_plan(plan, [f"layer{i}" for i in range(8)], console=console)
    text = console.export_text()
    st = plan.stages[0]
    assert "+".join(st.replica_groups[0]) in text
    assert "parallelism" in text and f"TP{st.tensor_parallel}" in text
    plain = solve(_plain(), topo, num_microbatches=2)
    console = Console(record=True, width=300)
    print_plan(plain, [f"layer{i}" for i in range(8)], console=console)
    assert "parallelism" not in console.export_text()


def test_past_the_deadline_no_sweep_or_bound_is_worked_out() -> None:
    """The solve's time limit stops the sweep's cuts and the peers' bounds too (a
    thousand-device sweep spends seconds on them before its first simulation)."""
    profile = _plain(degrees=(2, 4))
    topo = _topo("nvlink-pairs")
    search = Search(profile, topo, SolveOptions(), 1.0, deadline=time.perf_counter() - 1.0)
    with pytest.raises(TimeUp):
        mesh_search(search, [(1, 8)], ["1f1b"])
    assert not any(key[0] == "mesh cuts" for key in search.notes)
    tuned = tune_peers(search, [(1, 8)])
    assert all("time limit" in (best.reason or "") for best in tuned)
    assert not search.bounds and search.sims == 0


@pytest.mark.parametrize("name", ["nvlink-pairs", "two-node-ib"])
def test_tp_peers_bounded_sweep_finds_what_simulating_everything_finds(name: str) -> None:
    """The tuned peers with tensor parallelism and sharding (visited by bound, stopped where
    no bound can beat the best) find what simulating every configuration finds."""
    profile = _plain(degrees=(2, 4, 8))
    topo = _topo(name)
    settings = [(1, 16)]
    brute = Search(profile, topo, SolveOptions(), 60.0)
    parts = PeerPartitions(profile, topo)
    got = tune_peers(Search(profile, topo, SolveOptions(), 60.0), settings)
    assert [b.peer for b in got] == [p.name for p in TP_PEERS]
    for peer, best in zip(TP_PEERS, got, strict=True):
        configs = [c for c in peer.configurations(parts, settings) if isinstance(c, PeerConfig)]
        runs = [settle(brute, c)[1] for c in configs]
        expected = min((r.per_sample_ms for r in runs if r.fits), default=math.inf)
        assert best.per_sample_ms == pytest.approx(expected, rel=1e-12), peer.name
        if peer.name in ("Megatron-LM", "torchtitan"):
            assert {c.tensor_parallel for c in configs} == {1, 2, 4, 8}
    assert sum(b.simulations for b in got) < sum(b.configurations for b in got)


def test_the_local_search_may_change_one_stages_degree() -> None:
    """A move regroups one stage's own devices at another degree (neighbours then differ:
    issue #22); from such a plan the cut moves keep each stage's degree, and a degree move
    can make them one again. Kept only where the simulator says it is faster."""
    from planner.solve.local import local_search
    from planner.solve.mesh_local import mesh_moves

    profile = _plain(degrees=(2, 4), sequence_parallel=False)
    search = Search(profile, _topo("nvlink-pairs"), SolveOptions(), 60.0)
    devs = [("gpu0", "gpu1", "gpu2", "gpu3"), ("gpu4", "gpu5", "gpu6", "gpu7")]
    start = mesh_shape(search, [(0, 3), (4, 7)], devs, Mesh(2), "none", "1f1b", 1, 8)
    moves = list(mesh_moves(search, start))
    mixed = [c for c in moves if len({s.tensor_parallel for s in c.stages}) > 1]
    assert [tuple(s.tensor_parallel for s in c.stages) for c in mixed] == [
        (1, 2), (4, 2), (2, 1), (2, 4)
    ]  # fmt: skip
    assert moves[-len(mixed) :] == mixed  # last: the other moves first, as before
    assert all([s.devices for s in c.stages] == devs for c in mixed)
    assert all(not s.sequence_parallel for c in mixed for s in c.stages)
    one = mixed[0]
    scored = search.evaluate(one, "test")
    assert math.isfinite(scored.key()[1])
    again = list(mesh_moves(search, one))
    cuts = [c for c in again if [s.devices for s in c.stages] == devs]
    kept = {(1, 2), (2, 2), (4, 2), (1, 1), (1, 4)}  # cut moves keep (1, 2); degree moves
    assert all(tuple(s.tensor_parallel for s in c.stages) in kept for c in cuts)
    assert any(all(s.tensor_parallel == 2 for s in c.stages) for c in again)  # back to one
    best = local_search(search, scored, 12, moves=mesh_moves)
    assert best.key()[:3] <= scored.key()[:3]
    from planner.profile.tied import TiedParameter

    tied = dataclasses.replace(profile, tied_parameters=[TiedParameter("e", (0, 7), 1, 4)])
    plain = mesh_shape(search, [(0, 3), (4, 7)], devs, Mesh(1), "none", "1f1b", 1, 8)
    tied_search = Search(tied, _topo("nvlink-pairs"), SolveOptions(), 60.0)
    assert all(  # the simulator does not split a tied weight: degree 1 stays
        s.tensor_parallel == 1 for c in mesh_moves(tied_search, plain) for s in c.stages
    )


def test_degree_moves_keep_sequence_parallelism_where_the_degree_allows() -> None:
    """From a sequence-parallel plan a stage's degree changes too (the cut resharded along
    the sequence: planner.stages.boundary_pieces); a stage keeps sequence parallelism at
    degree 2 or more, and moves from such a plan keep it."""
    from planner.solve.mesh_local import degree_moves, mesh_moves

    profile = _plain(degrees=(2, 4))
    search = Search(profile, _topo("nvlink-pairs"), SolveOptions(), 60.0)
    devs = [("gpu0", "gpu1", "gpu2", "gpu3"), ("gpu4", "gpu5", "gpu6", "gpu7")]
    start = mesh_shape(search, [(0, 3), (4, 7)], devs, Mesh(2, True), "none", "1f1b", 1, 8)
    moved = list(degree_moves(search, start))
    assert [tuple(s.tensor_parallel for s in c.stages) for c in moved] == [
        (1, 2), (4, 2), (2, 1), (2, 4)
    ]  # fmt: skip
    for c in moved:
        assert all(s.sequence_parallel == (s.tensor_parallel > 1) for s in c.stages)
        assert math.isfinite(search.evaluate(c, "test").key()[1])
    again = list(mesh_moves(search, moved[0]))
    assert again and all(
        s.sequence_parallel == (s.tensor_parallel > 1) for c in again for s in c.stages
    )


def test_the_degree_descent_keeps_a_mixed_plan_only_where_it_is_faster() -> None:
    """Six light layers of big activations, then two heavy ones of big weights and small
    activations, on PCIe: the weights' gradient all-reduce over two replicas costs more
    than the heavy stage's collectives as a TP2 group, the light stage is better
    replicated; on NVLink the replicated plan stays (nothing returned)."""
    from planner.solve.mesh_search import _degree_descent

    profile = pcie_mixed_profile()
    devs = [("gpu0", "gpu1"), ("gpu2", "gpu3")]
    for name, wins in [("pcie", True), ("nvlink", False)]:
        search = Search(profile, _topo(name), SolveOptions(), 60.0)
        shape = mesh_shape(search, [(0, 5), (6, 7)], devs, Mesh(1), "none", "1f1b", 1, 8)
        start = search.evaluate(shape, "test")
        found = _degree_descent(search, [start])
        assert bool(found) == wins, name
        if wins:
            assert found[0].key()[:3] < start.key()[:3]
            assert [(s.tensor_parallel, s.replicas) for s in found[0].shape.stages] == [
                (1, 2),
                (2, 1),
            ]

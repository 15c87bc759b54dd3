"""Tuned peers: the configurations each peer's users would run, and the best of them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_dp import random_profile

from planner.shape import PlanShape
from planner.solve.peer_partitions import PeerPartitions
from planner.solve.peers import PEERS, Peer, PeerConfig, settle, tune_peers
from planner.solve.search import Search
from planner.stages import StageSpec
from planner.topology import load_topology, uniform_topology

ROOT = Path(__file__).resolve().parents[1]


def _configs(peer: Peer, profile, topo, settings):  # type: ignore[no-untyped-def]
    parts = PeerPartitions(profile, topo)
    return [c for c in peer.configurations(parts, settings) if isinstance(c, PeerConfig)]


def _peer(name: str) -> Peer:
    return next(p for p in PEERS if p.name == name)


def test_depths_divide_the_devices_and_data_parallelism_takes_the_rest() -> None:
    profile = random_profile(12, 0, sizes=(1, 2))
    topo = uniform_topology(6)
    configs = _configs(_peer("DeepSpeed"), profile, topo, [(1, 12), (2, 6)])
    shapes = {(c.depth, c.data_parallel, c.shape.microbatch_size) for c in configs}
    # Depths 1, 2, 3, 6; with 6 microbatches (size 2) dp 6 and dp 3 split them, dp 2 too.
    assert {(d, 6 // d) for d, _, _ in shapes} == {(1, 6), (2, 3), (3, 2), (6, 1)}
    assert all(c.depth * c.data_parallel == 6 for c in configs)
    assert {c.partition for c in configs} == {"uniform", "parameters"}
    assert {c.shape.schedule for c in configs} == {"1f1b"}
    # Every microbatch count divides among the pipelines (DeepSpeed's gradient accumulation).
    assert all(c.shape.num_microbatches % c.data_parallel == 0 for c in configs)
    dropped = _configs(_peer("DeepSpeed"), profile, topo, [(2, 3)])
    assert {c.data_parallel for c in dropped} == {3, 1}  # 3 microbatches: no dp 6 or dp 2


def test_layouts_follow_the_peer() -> None:
    profile = random_profile(8, 1)
    topo = uniform_topology(4)
    names = topo.device_names()
    ds = next(c for c in _configs(_peer("DeepSpeed"), profile, topo, [(1, 8)]) if c.depth == 2)
    # DeepSpeed's PipeDataParallelTopology: the data axis innermost.
    assert [s.devices for s in ds.shape.stages] == [tuple(names[:2]), tuple(names[2:])]
    tg = next(c for c in _configs(_peer("torchgpipe"), profile, topo, [(1, 8)]) if c.depth == 2)
    # One torchgpipe process per replica on consecutive devices.
    assert [s.devices for s in tg.shape.stages] == [(names[0], names[2]), (names[1], names[3])]


def test_megatron_needs_layers_that_divide_and_interleaves_chunks() -> None:
    profile = random_profile(6, 2)
    topo = uniform_topology(4)
    out = list(_peer("Megatron-LM").configurations(PeerPartitions(profile, topo), [(1, 8)]))
    reasons = [c for c in out if isinstance(c, str)]
    configs = [c for c in out if isinstance(c, PeerConfig)]
    assert any("divide into 4 equal stages" in r for r in reasons)
    assert {c.depth for c in configs} == {1, 2}
    inter = [c for c in configs if c.shape.schedule == "interleaved"]
    assert {c.shape.virtual_stages for c in inter} == {3}  # 2 x 3 = 6 layers; 2 x 2 does not divide
    c = inter[0]
    assert [s.layers for s in c.shape.stages] == [(i, i) for i in range(6)]
    assert [s.devices for s in c.shape.stages] == [c.shape.stages[k % 2].devices for k in range(6)]


def test_megatron_splits_the_blocks_with_the_embedding_first_and_the_head_last() -> None:
    """An embedding, 4 equal blocks and a head: 6 layers do not divide into 4 stages, the
    4 blocks do (Megatron's --num-layers), the embedding on the first, the head on the last."""
    import dataclasses

    profile = random_profile(6, 2)
    layers = [
        dataclasses.replace(ly, param_count=100 if 0 < i < 5 else 7 + i)
        for i, ly in enumerate(profile.layers)
    ]
    shaped = dataclasses.replace(profile, layers=layers)
    parts = PeerPartitions(shaped, uniform_topology(4))
    assert parts.partition("equal layers", 1, 4) == [(0, 1), (2, 2), (3, 3), (4, 5)]
    assert parts.partition("equal layers", 1, 2) == [(0, 2), (3, 5)]  # 6 divide: as before
    assert isinstance(parts.partition("equal layers", 1, 5), str)  # 4 blocks, 5 stages
    # An embedding, 4 blocks, a final norm and a head (a Hugging Face causal LM).
    layers = [
        dataclasses.replace(ly, param_count=100 if 0 < i < 5 else 7 + i)
        for i, ly in enumerate(random_profile(7, 2).layers)
    ]
    hf = dataclasses.replace(random_profile(7, 2), layers=layers)
    assert PeerPartitions(hf, uniform_topology(4)).partition("equal layers", 1, 2) == [
        (0, 2), (3, 6)
    ]  # fmt: skip
    # Layers all alike (no embedding or head to tell apart): the whole count must divide.
    assert isinstance(PeerPartitions(profile, uniform_topology(4)).partition(
        "equal layers", 1, 4), str)  # fmt: skip


def test_pipedream_uses_its_own_stages_and_replicas() -> None:
    profile = random_profile(6, 3)
    topo = uniform_topology(4)
    configs = _configs(_peer("PipeDream"), profile, topo, [(1, 8)])
    assert len(configs) == 1
    c = configs[0]
    assert sum(len(s.devices) for s in c.shape.stages) == 4
    assert c.shape.stages[0].devices[0] == "gpu0"  # consecutive devices from the first


def _brute_best(profile, topo, settings) -> dict[str, float]:  # type: ignore[no-untyped-def]
    search = Search(profile, topo)
    out = {}
    for peer in PEERS:
        runs = [settle(search, c)[1] for c in _configs(peer, profile, topo, settings)]
        out[peer.name] = min((r.per_sample_ms for r in runs if r.fits), default=math.inf)
    return out


@pytest.mark.parametrize(
    ("seed", "topo_name", "memory"),
    [(4, "hetero", None), (5, "dgx1-v100", None), (6, "uniform", 300 * 2**20)],
)
def test_the_bounded_sweep_finds_what_simulating_everything_finds(
    seed: int, topo_name: str, memory: int | None
) -> None:
    profile = random_profile(8, seed, sizes=(1, 2))
    if topo_name == "uniform":
        topo = uniform_topology(4, memory_bytes=memory or 2**34)
    else:
        topo = load_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    settings = [(1, 16), (2, 8)]
    expected = _brute_best(profile, topo, settings)
    got = tune_peers(Search(profile, topo), settings)
    assert [b.peer for b in got] == [p.name for p in PEERS]
    for best in got:
        assert best.per_sample_ms == pytest.approx(expected[best.peer], rel=1e-12), best.peer
        assert best.simulations <= 2 * best.configurations
        if best.feasible:
            assert best.config is not None and best.scored is not None
            assert best.iteration_ms == best.scored.iteration_ms
            assert best.scored.shape == best.config.shape
    if memory is None:
        # Bounding saves simulations (each peer stops once no bound can beat its best).
        assert sum(b.simulations for b in got) < sum(b.configurations for b in got)


def test_recompute_only_where_memory_needs_it() -> None:
    profile = random_profile(6, 7)  # 723 MiB for the whole model on one device
    roomy = tune_peers(Search(profile, uniform_topology(2, memory_bytes=2**36)), [(2, 4)])
    assert all(b.config is not None and not b.config.recompute for b in roomy)
    tight = Search(profile, uniform_topology(2, memory_bytes=600 * 2**20))
    got = {b.peer: b for b in tune_peers(tight, [(2, 4)])}
    dp = got["data parallel"]
    assert not dp.feasible and dp.reason is not None and "fits in memory" in dp.reason
    # GPipe stashes all 4 microbatches: torchgpipe fits only with checkpointing; 1F1B without.
    assert got["torchgpipe"].config is not None and got["torchgpipe"].config.recompute
    assert got["DeepSpeed"].config is not None and not got["DeepSpeed"].config.recompute


def test_describe_names_the_configuration() -> None:
    shape = PlanShape((StageSpec(0, (0, 1), ("a",)),), "1f1b", 8, 16)
    config = PeerConfig("DeepSpeed", "parameters", 4, 2, shape)
    assert config.describe() == "parameters, 4x2, mb 8 x 16, 1f1b"
    stage = StageSpec(0, (0, 1), ("a",), recompute=True)
    inter = PeerConfig(
        "Megatron-LM", "equal layers", 2, 1, PlanShape((stage,), "interleaved", 4, 8, 3)
    )
    assert inter.describe() == "equal layers, 2x1, mb 4 x 8, interleaved v=3, recompute"


def test_the_peers_are_scored_by_the_searchs_own_cache() -> None:
    profile = random_profile(8, 9, sizes=(1, 2))
    search = Search(profile, load_topology(ROOT / "topologies" / "hetero.yaml"))
    settings = [(1, 16), (2, 8)]
    first = tune_peers(search, settings)
    simulated = search.sims
    assert simulated > 0
    for best in first:
        if best.scored is not None:
            # The peer's best is the search's own entry for that shape.
            assert search.cache[best.scored.shape] is best.scored
    again = tune_peers(search, settings)
    assert search.sims == simulated  # every shape found in the cache
    assert [(b.describe(), b.iteration_ms) for b in again] == [
        (b.describe(), b.iteration_ms) for b in first
    ]

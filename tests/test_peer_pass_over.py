"""Work the solver leaves out without changing an answer: a tuned peer's checkpointed
configuration whose bound cannot beat that peer's best is passed over, not simulated
(planner.solve.search.Search.pass_over), and the plan, every peer's row and every peer
default are what they were when everything was simulated; only the count of simulations
falls. Also the simulator's shortcuts that keep every float: a tensor-parallel stage's
collectives summed once per distinct set of ring times, and the finiteness check of
OverLimit."""

from __future__ import annotations

import math
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from synthetic_profiles import eight_heavy_layers

from planner.profile.schema import Profile
from planner.simulate.group_comm import (
    groups_collective_ms,
    pass_collective_ms,
    pass_collectives,
)
from planner.simulate.timing import _all_finite
from planner.solve import solve
from planner.solve.peer_partitions import PeerPartitions
from planner.solve.peers import TP_PEERS, PeerConfig, settle
from planner.solve.search import Search
from planner.stages import StageSpec
from planner.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.solve_identity import plan_without_times  # noqa: E402

MIB = 2**20


# Big stashes, tensor-parallel entries for degrees 2, 4 and 8: without recompute most
# configurations overflow a tight device.
_profile = partial(eight_heavy_layers, saved_bytes=3072 * MIB, degrees=(2, 4, 8))


def _tight(name: str, gib: int) -> Topology:
    """A bundled topology with every device's memory set to ``gib`` GiB."""
    topo = load_topology(ROOT / "topologies" / f"{name}.yaml")
    return topo.with_memory(gib * 1024 * MIB, name=topo.name + "-tight")


def _plan_dict(profile: Profile, topo: Topology) -> tuple[dict[str, Any], int]:
    """The plan JSON without the wall times and the count of simulations, and that count."""
    data = plan_without_times(solve(profile, topo, num_microbatches=16))
    return data, data["solver"].pop("simulations")


@pytest.mark.parametrize(("name", "gib"), [("two-node-ib", 3), ("dgx1-v100", 12)])
def test_passing_over_changes_nothing_but_the_count(
    name: str, gib: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile, topo = _profile(), _tight(name, gib)
    passed: list[str] = []
    pass_over = Search.pass_over

    def noted(self: Search, cand: Any, origin: str) -> None:
        passed.append(origin)
        pass_over(self, cand, origin)

    monkeypatch.setattr(Search, "pass_over", noted)
    pruned, fewer = _plan_dict(profile, topo)
    assert passed, "the case should pass some checkpointed configurations over"
    # Every bound at minus infinity: nothing is passed over, everything is simulated.
    monkeypatch.setattr(Search, "bound_as_given", lambda self, cand: -math.inf)
    passed.clear()
    everything, more = _plan_dict(profile, topo)
    assert not passed
    assert pruned == everything
    assert fewer < more


def test_a_passed_shape_met_later_is_simulated_as_the_peer_would_have() -> None:
    profile, topo = _profile(), _tight("two-node-ib", 3)
    search = Search(profile, topo)
    shape = solve(profile, topo, num_microbatches=16).shape
    search.pass_over(shape, "peer X")
    assert search.met(shape) and search.sims == 0
    got = search.evaluate(shape, "local search")
    assert got.origin == "peer X" and search.sims == 1 and not search.passed
    assert search.evaluate(shape, "again") is got and search.sims == 1


def test_a_checkpointed_configuration_is_passed_over_only_when_its_bound_is_above() -> None:
    """settle's cut at the bound itself: a checkpointed configuration whose bound is above
    the peer's best is passed over, one whose bound equals it is simulated. (The solves
    above give the same answers with the cut at 0.9 or 0.25 of the best: peers visit
    configurations by bound, so those cannot pin the cut.)"""
    profile, topo = _profile(), _tight("dgx1-v100", 12)
    parts = PeerPartitions(profile, topo)
    configs = [c for c in TP_PEERS[0].configurations(parts, [(1, 16)]) if isinstance(c, PeerConfig)]
    for config in configs:  # the first that overflows plain, with a finite bound checkpointed
        search = Search(profile, topo)
        plain = search.refuse_or_simulate(config.shape, "test")
        bound = search.bound_as_given(config.checkpointed().shape)
        if not plain.fits and not plain.infinite() and math.isfinite(bound):
            break
    else:
        pytest.fail("no configuration overflows plain with a finite checkpointed bound")
    checkpointed = config.checkpointed().shape
    above = Search(profile, topo)
    assert settle(above, config, beat=bound * (1 - 1e-9))[0] == config
    assert above.passed == {checkpointed: f"peer {config.peer}"}
    at = Search(profile, topo)
    settle(at, config, beat=bound)
    assert not at.passed and checkpointed in at.cache


def test_groups_share_collective_sums_bit_for_bit() -> None:
    profile = _profile()
    topo = load_topology(ROOT / "topologies" / "two-node-ib.yaml")
    names = topo.device_names()
    for t in (2, 4, 8):
        st = StageSpec(0, (1, 5), tuple(names[: (len(names) // t) * t]), tensor_parallel=t)
        groups = st.replica_groups
        got = groups_collective_ms(topo, groups, pass_collectives(profile, st, 1))
        assert got == [pass_collective_ms(profile, topo, st, g, 1) for g in groups]


def test_all_finite() -> None:
    assert _all_finite([[1.0, 2.0], [3.0]]) and _all_finite([])
    assert _all_finite([[1e308, 1e308]])  # the sum overflows, every number is finite
    assert not _all_finite([[1.0], [math.inf]])
    assert not _all_finite([[math.nan]])
    assert not _all_finite([[math.inf, -math.inf]])

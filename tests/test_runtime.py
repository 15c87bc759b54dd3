"""`pipeplan run` on CPU with gloo: pipelined training equals single-process training.

Every run here spawns real torch.distributed processes (2-3, one thread each) and trains a
tiny model for a few steps; each multi-process test has a hard timeout so CI never hangs.
"""

from __future__ import annotations

import contextlib
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from families import SYNCHRONOUS, partition

from planner.plan import FileRef, Plan, Prediction, parse_stages
from planner.profile.loader import load_model_file
from planner.runtime import run_plan
from planner.schedule import build_schedule, family

HARD_TIMEOUT_S = 100


@contextlib.contextmanager
def hard_timeout_after(seconds: int) -> Iterator[None]:
    """SIGALRM interrupts a hung run; run_plan then kills every worker it started."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"test exceeded its hard timeout of {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def hard_timeout() -> Iterator[None]:
    with hard_timeout_after(HARD_TIMEOUT_S):
        yield


HERE = Path(__file__).parent
SKIP = HERE / "models" / "skip.py"  # two inputs, values carried across several cuts
CPUS = ["cpu0", "cpu1"]

TINY = textwrap.dedent(
    """
    import torch
    from torch import nn

    def build_model():
        return nn.Sequential(
            nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
        )

    def sample_batch(batch_size):
        x = torch.randn(batch_size, 6)          # the runtime seeds torch per step
        return x, torch.randn(batch_size, 3)
    """
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.py"
    path.write_text(TINY)
    return path


def make_plan(text: str, schedule: str, m: int, mbs: int, recompute: tuple[int, ...] = ()) -> Plan:
    stages = parse_stages(text, recompute=list(recompute))
    sched = build_schedule(schedule, stages, m)
    return Plan(
        profile=FileRef("<memory>", ""),
        topology=FileRef("<none>", ""),
        microbatch_size=mbs,
        num_microbatches=m,
        stages=stages,
        schedule=sched,
        predicted=Prediction(10.0, m * mbs / 10.0 * 1e3, 0.0, 10.0, {}, {}),
    )


def reference(
    model: Path, steps: int, batch: int, optimizer: str, lr: float, *, two_bw: bool = False
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain single-process training on the same global batches (2bw: its stated rule)."""
    user = load_model_file(model)
    torch.manual_seed(0)
    net = user.build()
    params = dict(net.named_parameters())
    if optimizer == "adam":
        opt: torch.optim.Optimizer
        current = {n: p.detach().clone() for n, p in params.items()}
        opt = torch.optim.Adam(list(current.values()) if two_bw else net.parameters(), lr=lr)
    else:
        current = {n: p.detach().clone() for n, p in params.items()}
        target = list(current.values()) if two_bw else list(net.parameters())
        opt = torch.optim.SGD(target, lr=lr, momentum=0.9 if optimizer == "momentum" else 0)
    losses = []
    for step in range(steps):
        torch.manual_seed(step)
        x, y = user.batch(batch)
        net.zero_grad()
        loss = user.loss(net(*x), y)
        loss.backward()
        losses.append(loss.item())
        if two_bw:
            # W(t+1) = W(t) - lr * grad f(W(t-1)): the module holds W(t-1).
            newer = {n: c.clone() for n, c in current.items()}
            for n, c in current.items():
                c.grad = params[n].grad
            opt.step()
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(newer[n])
        else:
            opt.step()
    final = current if two_bw else {n: p.detach() for n, p in params.items()}
    return losses, final


def check_same(report, ref_losses, ref_params) -> None:  # type: ignore[no-untyped-def]
    assert report.losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-7)
    assert report.parameters is not None
    assert set(report.parameters) == set(ref_params)
    for name, value in ref_params.items():
        torch.testing.assert_close(report.parameters[name], value, rtol=1e-5, atol=1e-6)


def _two_cpus(schedule: str) -> str:
    """A partition of the tiny model on cpu0 and cpu1 the family can run."""
    chunked = family(schedule).interleaved
    return partition(schedule, ["0", "1-2", "3", "4"] if chunked else ["0-2", "3-4"], CPUS)


# Every synchronous family (stage 0 recomputed; test_tied runs them without recompute).
@pytest.mark.parametrize("schedule", SYNCHRONOUS)
def test_synchronous_schedules_match_single_process(tiny: Path, schedule: str) -> None:
    stages, m, recompute = _two_cpus(schedule), 4, (0,)
    steps, warmup, mbs = 3, 1, 2
    plan = make_plan(stages, schedule, m, mbs, recompute)
    report = run_plan(
        plan, tiny, steps=steps, warmup=warmup, timeout_s=60, optimizer="momentum", lr=0.05,
        return_params=True,
    )  # fmt: skip
    losses, params = reference(tiny, steps + warmup, mbs * m, "momentum", 0.05)
    check_same(report, losses, params)
    torch.manual_seed(0)
    initial = dict(load_model_file(tiny).build().named_parameters())
    assert all(not torch.equal(initial[n], p) for n, p in params.items())  # it trained
    assert len(report.step_ms) == steps and report.iteration_ms > 0


def test_zero_bubble_with_carried_values_recompute_and_adam() -> None:
    """ZB's split backward (I, then W later) on a model with two inputs and values that
    skip stages; the first stage recomputed; the Adam optimizer."""
    plan = make_plan("0-1:cpu0;2-5:cpu1", "zb", 3, 2, recompute=(0,))
    report = run_plan(
        plan, SKIP, steps=2, warmup=1, timeout_s=60, optimizer="adam", lr=1e-2,
        return_params=True,
    )  # fmt: skip
    losses, params = reference(SKIP, 3, 6, "adam", 1e-2)
    check_same(report, losses, params)
    kinds = {(ev["kind"], ev["stage"]) for ev in report.events}
    assert {("I", 0), ("W", 0), ("I", 1), ("W", 1)} <= kinds


def test_replicated_stage_allreduce(tiny: Path) -> None:
    """Stage 0 on two replicas (microbatches round robin), all-reduced before the step."""
    plan = make_plan("0-2:cpu0,cpu1;3-4:cpu2", "1f1b", 4, 2)
    assert "ALLREDUCE0" in [str(a) for a in plan.schedule.devices["cpu0"]]
    report = run_plan(
        plan, tiny, steps=2, warmup=0, timeout_s=60, optimizer="sgd", lr=0.1, return_params=True
    )
    assert report.world_size == 3
    losses, params = reference(tiny, 2, 8, "sgd", 0.1)
    check_same(report, losses, params)


def test_shared_devices_in_one_process(tiny: Path) -> None:
    """Three plan devices on two processes (the mode a single GPU uses), same results."""
    plan = make_plan("0-1:cpu0;2-3:cpu1;4:cpu2", "1f1b", 3, 2)
    report = run_plan(
        plan,
        tiny,
        steps=2,
        warmup=0,
        timeout_s=60,
        optimizer="sgd",
        lr=0.1,
        device_map="cpu0=0,cpu1=0,cpu2=1",
        return_params=True,
    )
    assert report.shared and report.world_size == 2
    assert any("shared" in n for n in report.notes)
    losses, params = reference(tiny, 2, 6, "sgd", 0.1)
    check_same(report, losses, params)


@pytest.mark.parametrize(
    ("stages", "optimizer", "lr"),
    [
        ("0-2:cpu0;3-4:cpu1", "sgd", 0.1),
        ("0-1:cpu0;2-3:cpu1;4:cpu2", "adam", 1e-2),
        ("0:cpu0;1-2:cpu1;3-4:cpu2", "momentum", 0.05),
    ],
)
def test_2bw_follows_its_update_rule(tiny: Path, stages: str, optimizer: str, lr: float) -> None:
    plan = make_plan(stages, "2bw", 4, 2)
    report = run_plan(
        plan, tiny, steps=3, warmup=0, timeout_s=60, optimizer=optimizer, lr=lr,
        return_params=True,
    )  # fmt: skip
    losses, params = reference(tiny, 3, 8, optimizer, lr, two_bw=True)
    check_same(report, losses, params)
    # ... and that rule is not plain synchronous training.
    _, sync = reference(tiny, 3, 8, optimizer, lr)
    assert any(not torch.allclose(sync[n], params[n]) for n in params)


@pytest.mark.parametrize("m", [4, 5])
def test_2bw_with_a_replicated_first_stage_follows_its_update_rule(tiny: Path, m: int) -> None:
    """Replicas (3, 1, 1), as PipeDream's optimizer picks them: the stream deadlocked (each
    replica all-reduced after its own last backward, before forwards a later stage was
    waiting for). Three processes, each holding a replica of stage 0 (real all-reduces)."""
    plan = make_plan("0-2:cpu0,cpu1,cpu2;3:cpu3;4:cpu4", "2bw", m, 2)
    report = run_plan(
        plan, tiny, steps=3, warmup=0, timeout_s=30, optimizer="sgd", lr=0.1,
        device_map="cpu0=0,cpu1=1,cpu2=2,cpu3=0,cpu4=1", return_params=True,
    )  # fmt: skip
    assert report.world_size == 3
    losses, params = reference(tiny, 3, 2 * m, "sgd", 0.1, two_bw=True)
    check_same(report, losses, params)


def test_run_validates_the_stream_it_will_execute(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's one-iteration lists are checked on load; the 2bw stream the ranks run is
    another list, checked before any rank starts (a deadlocking one hung the ranks)."""
    import planner.runtime.runner as runner
    from planner.errors import InputError
    from planner.schedule import ActionType, as_stream

    plan = make_plan("0-2:cpu0,cpu1;3-4:cpu2", "2bw", 4, 2)

    def swapped(schedule, stages, iterations):  # type: ignore[no-untyped-def]
        stream = as_stream(schedule, stages, iterations)
        acts = stream.devices["cpu0"]  # its first all-reduce moved before its first forward
        first = next(i for i, a in enumerate(acts) if a.kind is ActionType.ALLREDUCE)
        acts.insert(0, acts.pop(first))
        return stream

    monkeypatch.setattr(runner, "as_stream", swapped)
    monkeypatch.setattr(runner, "launch_local", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(InputError, match="2bw stream of 3 iterations .* deadlocks: cpu0 waits"):
        run_plan(plan, tiny, steps=2, warmup=1, timeout_s=30)


SHARED = {
    # ALBERT's way: one block (two linears) that every layer calls, twice each
    "block called twice": HERE / "models" / "repeated_block.py",
    # DeBERTa-v2's rel_embeddings: one table every layer reads through its own projection
    "weight read by every layer": HERE / "models" / "shared_table.py",
}


@pytest.mark.parametrize("kind", list(SHARED))
@pytest.mark.parametrize(
    ("schedule", "stages"),
    [
        # No GPipe case: its stage code and F/B actions are 1F1B's, in another order.
        ("1f1b", "0:cpu0;1-5:cpu1"),
        ("interleaved", "0:cpu0;1-2:cpu1;3:cpu0;4-5:cpu1"),  # shared across stages too
        ("zb", "0:cpu0;1-5:cpu1"),
        ("2bw", "0:cpu0;1-5:cpu1"),
    ],
)
def test_weights_shared_inside_a_stage_train_exactly(kind: str, schedule: str, stages: str) -> None:
    """Zero bubble's weight half (W) ran torch's per-group weight backward in one call that
    freed the graph after the first group; groups that share the weight side of the graph
    then failed ("backward through the graph a second time"). Every schedule's stage code
    (the runtime has none of GPipe's own: 1F1B's actions in another order), both kinds of
    sharing, one process driving both plan devices (the same stage code, faster)."""
    model = SHARED[kind]
    plan = make_plan(stages, schedule, 4, 2)
    report = run_plan(
        plan, model, steps=2, warmup=0, timeout_s=60, optimizer="momentum", lr=0.05,
        device_map="cpu0=0,cpu1=0", return_params=True,
    )  # fmt: skip
    losses, params = reference(model, 2, 8, "momentum", 0.05, two_bw=schedule == "2bw")
    check_same(report, losses, params)
    if schedule == "zb":
        kinds = {(ev["kind"], ev["stage"]) for ev in report.events}
        assert ("W", 1) in kinds


def test_batchnorm_trains_like_accumulation_over_the_same_microbatches() -> None:
    """What run promises for a model whose result depends on the microbatch size: one
    process accumulating gradients over the same microbatches, not one pass over the global
    batch; the report says so once."""
    from planner.runtime.reference import train_single_process

    model = HERE / "models" / "batchnorm.py"
    plan = make_plan("0-2:cpu0;3-5:cpu1", "1f1b", 4, 2)
    report = run_plan(
        plan, model, steps=2, warmup=0, timeout_s=60, optimizer="sgd", lr=0.1,
        return_params=True,
    )  # fmt: skip
    accumulated = train_single_process(
        model, steps=2, batch_size=8, microbatch_size=2, optimizer="sgd", lr=0.1
    )
    check_same(report, accumulated.losses, accumulated.parameters)
    whole = train_single_process(model, steps=2, batch_size=8, optimizer="sgd", lr=0.1)
    assert report.losses != pytest.approx(whole.losses, rel=1e-5, abs=1e-7)
    warnings = [n for n in report.notes if "depends on the microbatch size" in n]
    assert len(warnings) == 1 and "BatchNorm1d" in warnings[0]


def test_optimized_schedules_run_exactly(tiny: Path) -> None:
    """The optimized family's orders (warm-up depths, deferred W) run as they simulate: a
    searched one and a hand-picked deep one, both equal to single-process training."""
    from planner.cost import synthetic_profile
    from planner.schedule import schedule_from_order
    from planner.schedule.order_family import family_order
    from planner.simulate import optimized_schedule

    stages = parse_stages("0-1:cpu0;2-3:cpu1;4:cpu2")
    m = 4
    searched = optimized_schedule(
        stages, m, profile=synthetic_profile(5, backward_weight_ms=3.0), microbatch_size=1
    )
    deep = schedule_from_order("optimized", stages, family_order(m, [4, 2, 1], [2, 1, 0]), m)
    assert searched.meta["family"] == "zb"
    for schedule in (searched, deep):
        plan = make_plan("0-1:cpu0;2-3:cpu1;4:cpu2", "1f1b", m, 2)
        plan.schedule = schedule
        report = run_plan(
            plan, tiny, steps=2, warmup=0, timeout_s=60, optimizer="adam", lr=1e-2,
            return_params=True,
        )  # fmt: skip
        losses, params = reference(tiny, 2, 8, "adam", 1e-2)
        check_same(report, losses, params)
        kinds = {ev["kind"] for ev in report.events}
        assert {"I", "W"} <= kinds  # the split backward ran

"""On a CUDA GPU: shared-mode training equals one process, bf16 included, and the GPU
profile predicts memory and adds up to its passes. Skipped where there is no GPU.

Every plan runs on the one GPU in shared mode (all plan devices on rank 0, each on its own
CUDA stream), against plain training in this process on the same GPU (tests/test_runtime.py's
reference, moved to CUDA). Run on a GPU machine with ``pytest -q tests/test_cuda.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_runtime import SKIP, TINY, check_same, hard_timeout, make_plan  # noqa: F401

from planner.fileio import sha256_file
from planner.optimizers import make_optimizer
from planner.plan import FileRef, Plan, Prediction, parse_stages
from planner.precision import autocast
from planner.profile import load_model_file, profile_model
from planner.runtime import run_plan
from planner.schedule import build_schedule
from planner.simulate import simulate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ROOT = Path(__file__).resolve().parents[1]
GPT_LARGE = ROOT / "examples" / "gpt_large.py"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.py"
    path.write_text(TINY)
    return path


def cuda_reference(
    model: Path, steps: int, batch: int, optimizer: str, lr: float, precision: str = "fp32"
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process on the GPU taking the run's global batches (seeded as run seeds them)."""
    user = load_model_file(model)
    torch.manual_seed(0)
    net = user.build().cuda()
    net.train()
    opt = make_optimizer(optimizer, net.parameters(), lr)
    losses = []
    for step in range(steps):
        torch.manual_seed(step)
        x, y = user.batch(batch)
        x = tuple(t.cuda() for t in x)
        opt.zero_grad(set_to_none=False)
        with autocast("cuda", precision):
            loss = user.loss(net(*x), y.cuda())
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses, {n: p.detach().cpu() for n, p in net.named_parameters()}


def _shared(plan: Plan) -> str:
    devices = sorted({d for s in plan.stages for d in s.devices})
    return ",".join(f"{d}=0" for d in devices)


@pytest.mark.parametrize(
    ("schedule", "stages", "m", "recompute", "optimizer"),
    [
        ("gpipe", "0-1:gpu0;2-4:gpu1", 4, (), "momentum"),
        ("1f1b", "0-2:gpu0;3-4:gpu1", 4, (0,), "momentum"),
        ("interleaved", "0:gpu0;1-2:gpu1;3:gpu0;4:gpu1", 4, (), "momentum"),
        ("1f1b", "0-2:gpu0,gpu1;3-4:gpu2", 4, (), "sgd"),  # a replicated stage
    ],
)
def test_shared_mode_equals_one_process(
    tiny: Path, schedule: str, stages: str, m: int, recompute: tuple[int, ...], optimizer: str
) -> None:
    steps, warmup, mbs, lr = 3, 1, 2, 0.05
    plan = make_plan(stages, schedule, m, mbs, recompute)
    report = run_plan(
        plan, tiny, steps=steps, warmup=warmup, device="cuda", timeout_s=120,
        optimizer=optimizer, lr=lr, device_map=_shared(plan), return_params=True,
    )  # fmt: skip
    assert report.shared and report.world_size == 1 and report.device == "cuda"
    losses, params = cuda_reference(tiny, steps + warmup, mbs * m, optimizer, lr)
    check_same(report, losses, params)


def test_zero_bubble_with_recompute_and_adam_equals_one_process() -> None:
    plan = make_plan("0-1:gpu0;2-5:gpu1", "zb", 3, 2, recompute=(0,))
    report = run_plan(
        plan, SKIP, steps=2, warmup=1, device="cuda", timeout_s=120, optimizer="adam", lr=1e-2,
        device_map=_shared(plan), return_params=True,
    )  # fmt: skip
    losses, params = cuda_reference(SKIP, 3, 6, "adam", 1e-2)
    check_same(report, losses, params)
    kinds = {(ev["kind"], ev["stage"]) for ev in report.events}
    assert {("I", 1), ("W", 1)} <= kinds


def test_bf16_run_matches_one_process_in_bf16(tiny: Path) -> None:
    """bf16 autocast on the GPU: the pipelined run rounds each microbatch's matmuls and
    gradients to bf16 where one process rounds the whole batch's, so the two agree to
    bf16's precision (2^-8), not bit for bit; and the run is not fp32 training."""
    steps, mbs, m, lr = 3, 2, 4, 0.05
    plan = make_plan("0-2:gpu0;3-4:gpu1", "1f1b", m, mbs)
    report = run_plan(
        plan, tiny, steps=steps, warmup=0, device="cuda", timeout_s=120, optimizer="sgd",
        lr=lr, precision="bf16", device_map=_shared(plan), return_params=True,
    )  # fmt: skip
    losses, params = cuda_reference(tiny, steps, mbs * m, "sgd", lr, precision="bf16")
    assert report.losses == pytest.approx(losses, rel=2e-2)
    assert report.parameters is not None
    for name, value in params.items():
        torch.testing.assert_close(report.parameters[name], value, rtol=2e-2, atol=2e-3)
    _, fp32 = cuda_reference(tiny, steps, mbs * m, "sgd", lr)
    assert any(not torch.equal(report.parameters[n], fp32[n]) for n in fp32)


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def large_profile(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/gpt_large.py profiled on the GPU at microbatch size 2 (pass timing)."""
    profile = profile_model(
        GPT_LARGE, [2], device="cuda", precision=request.param, repeat=5, warmup=2
    )
    path = tmp_path_factory.mktemp("profiles") / f"gpt_large.{request.param}.json"
    profile.save(path)
    return path


def test_layers_add_up_to_the_whole_pass(large_profile: Path) -> None:
    from planner.profile import load_profile

    profile = load_profile(large_profile)
    assert profile.settings.timing == "pass" and profile.settings.clock == "cuda_events"
    ratios = profile.measurements[0].pass_ratios()
    assert ratios is not None
    forward, backward = ratios
    assert abs(forward - 1) <= 0.02 and abs(backward - 1) <= 0.02, ratios


def test_memory_prediction_within_ten_percent(large_profile: Path) -> None:
    """One stage, 1F1B, 4 microbatches of 2: the simulator's peak against the run's
    torch.cuda.max_memory_allocated."""
    from planner.profile import load_profile

    profile = load_profile(large_profile)
    stages = parse_stages(f"0-{profile.num_layers - 1}:gpu0")
    schedule = build_schedule("1f1b", stages, 4)
    result = simulate(profile, None, stages, schedule, 4, 2)
    plan = Plan(
        profile=FileRef(str(large_profile), sha256_file(large_profile)),
        topology=FileRef("<one GPU>", ""),
        microbatch_size=2,
        num_microbatches=4,
        stages=stages,
        schedule=schedule,
        predicted=Prediction.from_result(result),
    )
    plan_path = large_profile.with_suffix(".plan.json")
    plan.save(plan_path)
    report = run_plan(plan_path, GPT_LARGE, steps=2, warmup=1, device="cuda", timeout_s=300)
    predicted = result.memory_bytes["gpu0"]
    measured = report.peak_memory_bytes["gpu0"]
    assert 0.9 <= measured / predicted <= 1.1, (measured, predicted)

"""``python -m bench --gpu`` on a machine without CUDA, and bench/gpu.py's parts on CPU.

The GPU benchmark itself needs a GPU; here: it skips in one line, its predictions for a
plan on one shared GPU are checked by hand, and the whole script runs once on CPU on a
tiny model (gloo, shared mode), so that what a GPU machine runs is known to work end to end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu import (  # noqa: E402
    compare_profiles,
    four_stages,
    main,
    render_markdown,
)
from bench.suite import GPU_BEGIN, GPU_END, replace_section, run_gpu  # noqa: E402
from planner.cost import synthetic_profile  # noqa: E402
from planner.plan import parse_stages  # noqa: E402
from planner.simulate import simulate  # noqa: E402
from planner.simulate.one_device import one_device_prediction  # noqa: E402


def test_without_cuda_it_skips_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_gpu(quick=False, out=None, docs=None, cuda=False) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "skipped, no CUDA device" in out


def test_four_stages_cover_the_layers() -> None:
    assert four_stages(14) == "0-3:gpu0;4-6:gpu1;7-9:gpu2;10-13:gpu3"
    assert four_stages(4) == "0-0:gpu0;1-1:gpu1;2-2:gpu2;3-3:gpu3"


def test_profiles_compared_over_the_threshold_only() -> None:
    a = synthetic_profile(3, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0)
    b = synthetic_profile(3, forward_ms=1.04, backward_input_ms=1.0, backward_weight_ms=1.2)
    b.measurements[0].layers[0].forward_ms = 0.4  # 1.0 against 0.4: far off
    a.measurements[0].layers[1].forward_ms = b.measurements[0].layers[1].forward_ms = 0.3
    got = compare_profiles(a, b)
    # Forward: layer 0 off (150%), layer 1 under 0.5 ms (left out), layer 2 within (4%);
    # backward 2.0 against 2.2 on every layer: 10% off.
    assert got["compared"] == 5 and got["within"] == 1
    assert got["worst"] == pytest.approx(1.5)


def test_a_plan_on_one_shared_gpu_runs_its_work_one_after_another() -> None:
    prof = synthetic_profile(
        4, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0, optimizer_ms=0.5
    )
    result = simulate(prof, None, parse_stages("0-1:a;2-3:b"), "1f1b", 3, 1)
    ms, nbytes = one_device_prediction(result)
    # 2 stages x 3 microbatches x (F 2 ms + B 4 ms) + 2 steps of 2 x 0.5 ms.
    assert ms == pytest.approx(2 * 3 * 6 + 2 * 1.0)
    assert result.iteration_ms < ms
    # Memory: both devices' static (4 x 2000 each) and at most their stashes at once.
    assert sum(result.static_bytes.values()) < nbytes <= sum(result.memory_bytes.values())


def test_the_docs_section_names_the_gpu_and_is_replaced_in_place() -> None:
    data = {
        "device_name": "NVIDIA H100 80GB HBM3",
        "torch": "2.11.0",
        "cuda": "13.0",
        "model": "examples/gpt_large.py",
        "note": "4 microbatches.",
        "rows": [{"precision": "bf16", "plan": "1 stage", "ratio": 1.01}],
        "plain": [],
        "profiles": [
            {
                "precision": "bf16",
                "seconds": 20.0,
                "repeatability": {"compared": 10, "within": 10, "share": 1.0, "worst": 0.01},
                "pass_sums": {"1": [1.0, 1.01]},
            }
        ],
        "summary": {
            "bf16": {"mean_time_error": 0.01, "worst_time_error": 0.02, "worst_memory_error": 0.03}
        },
    }
    text = render_markdown(data, command="python -m bench --gpu", date="today", seconds=5.0)
    assert "NVIDIA H100 80GB HBM3" in text and "| bf16 | 1 stage | 1.01 |" in text
    assert "10/10 layer times" in text
    doc = replace_section("# Benchmarks\n\nhand-written\n", "one\n", GPU_BEGIN, GPU_END)
    assert doc == f"# Benchmarks\n\nhand-written\n\n{GPU_BEGIN}\none\n{GPU_END}\n"
    again = replace_section(doc + "\nlater\n", "two\n", GPU_BEGIN, GPU_END)
    assert again == f"# Benchmarks\n\nhand-written\n\n{GPU_BEGIN}\ntwo\n{GPU_END}\nlater\n"
    with pytest.raises(ValueError, match="without the other"):
        replace_section(f"x\n{GPU_BEGIN}\n", "y", GPU_BEGIN, GPU_END)


def test_the_script_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    """The GPU benchmark's own code on CPU (gloo; shared mode for the 4-stage plan): a
    tiny model, one size, one step. Times are not compared: only that every part ran."""
    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--model", str(ROOT / "tests" / "models" / "skip.py")]
    args += ["--sizes", "2", "--precisions", "bf16", "--repeat", "1", "--steps", "1"]
    assert main([*args, "--warmup", "0", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["plan"] for r in data["rows"]] == ["1 stage", "4 stages shared"]
    assert all(r["measured_ms"] > 0 and r["predicted_ms"] > 0 for r in data["rows"])
    assert data["plain"][0]["plain_ms"] > 0
    assert data["profiles"][0]["repeatability"]["compared"] >= 0
    assert set(data["summary"]) == {"bf16", "bf16_speedup"}


def test_the_gpu_sized_example_is_the_model_the_issue_names() -> None:
    """examples/gpt_large.py: 12 blocks of width 1024 and 16 heads, sequence 512, vocab
    8192 (built on the meta device: no memory, no time)."""
    import torch

    from planner.profile.loader import load_model_file

    user = load_model_file(ROOT / "examples" / "gpt_large.py")
    with torch.device("meta"):
        model = user.build()
    assert sum(p.numel() for p in model.parameters()) == 168_458_240
    assert len(model.blocks) == 12 and model.blocks[0].n_head == 16
    assert model.head.out.weight.shape == (8192, 1024)
    (tokens,), targets = user.batch(2)
    assert tokens.shape == targets.shape == (2, 512)


def test_render_only_writes_the_section_from_the_results_at_hand(tmp_path: Path) -> None:
    """Runs split over several device calls: the docs section from the merged JSON."""
    data = {
        "device_name": "NVIDIA H200",
        "torch": "2.11.0",
        "cuda": "13.0",
        "model": "examples/gpt_large.py",
        "note": "n.",
        "date": "2026-12-01 10:00 UTC",
        "rows": [],
        "plain": [],
        "profiles": [],
        "summary": {},
    }
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "gpu.json").write_text(json.dumps(data))
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n")
    assert run_gpu(quick=False, out=None, docs=docs, root=tmp_path, render_only=True) == 0
    text = docs.read_text()
    assert GPU_BEGIN in text and "NVIDIA H200" in text and "2026-12-01 10:00 UTC" in text
    missing = tmp_path / "nothing"
    assert run_gpu(quick=False, out=None, docs=docs, root=missing, render_only=True) == 1


def test_run_predicts_a_plan_on_one_shared_gpu_as_it_runs_there() -> None:
    """``run`` on one GPU with several plan devices replaces the plan's prediction (a GPU per
    plan device) by the one-GPU one; other placements keep it."""
    from types import SimpleNamespace

    from planner.plan import FileRef, Plan, Prediction
    from planner.runtime.report import RunReport
    from planner.runtime.runner import _predict_one_gpu
    from planner.schedule import build_schedule

    prof = synthetic_profile(4, optimizer_ms=0.5)
    stages = parse_stages("0-1:a;2-3:b")
    result = simulate(prof, None, stages, "1f1b", 3, 1)
    plan = Plan(
        FileRef("<memory>", ""), FileRef(None), 1, 3, stages,
        build_schedule("1f1b", stages, 3), Prediction.from_result(result),
    )  # fmt: skip

    def report() -> RunReport:
        return RunReport(
            schedule="1f1b", device="cuda", backend="nccl", world_size=1, shared=True,
            placement={"a": "rank 0", "b": "rank 0"}, steps=1, warmup=0, microbatch_size=1,
            num_microbatches=3, iteration_ms=40.0, step_ms=[40.0],
            predicted_iteration_ms=result.iteration_ms, losses=[1.0],
            peak_memory_bytes={"a": 1, "b": 1}, memory_kind="cuda_max_allocated",
            stage_ms={}, predicted_memory_bytes=dict(result.memory_bytes),
        )  # fmt: skip

    one_gpu = report()
    _predict_one_gpu(one_gpu, prof, plan, SimpleNamespace(device_type="cuda", world_size=1))
    ms, nbytes = one_device_prediction(result)
    assert one_gpu.predicted_iteration_ms == pytest.approx(ms) and ms > result.iteration_ms
    assert one_gpu.predicted_memory_bytes == {"a": nbytes, "b": nbytes}
    assert any("share one GPU" in n for n in one_gpu.notes)
    for placement in (("cuda", 2), ("cpu", 1)):
        kept = report()
        _predict_one_gpu(
            kept, prof, plan, SimpleNamespace(device_type=placement[0], world_size=placement[1])
        )
        assert kept.predicted_iteration_ms == result.iteration_ms and not kept.notes

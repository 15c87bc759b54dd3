"""Hugging Face models: captured exactly, profiled from the CLI, and trained as pipelines
equal to one process. Skipped without transformers (``pip install 'pipeplan[hf]'``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from planner.plan import FileRef, Plan, Prediction, parse_stages  # noqa: E402
from planner.profile.export_graph import call_for_training  # noqa: E402
from planner.profile.split import capture_model  # noqa: E402
from planner.runtime import run_plan  # noqa: E402
from planner.runtime.reference import train_single_process  # noqa: E402
from planner.schedule import build_schedule  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from hf_zoo import ARCHITECTURES, build_model_for, sample_batch_for, write_model_file  # noqa: E402


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_is_captured_exactly(name: str) -> None:
    model = build_model_for(name).train()
    inputs, _ = sample_batch_for(name, 2)
    split = capture_model(model, inputs)
    assert split.capture in ("export", "export-eval")
    assert split.num_layers >= 4
    got = split(*split.flat_inputs(inputs))
    torch.manual_seed(0)
    expected = call_for_training(model, inputs)
    torch.testing.assert_close(got["logits"], expected["logits"], rtol=0, atol=0)


def test_llama_splits_at_its_own_pipeline_plan_and_carries_rotary_values() -> None:
    model = build_model_for("llama")
    inputs, _ = sample_batch_for("llama", 2)
    split = capture_model(model, inputs)
    assert split.names == [
        "model.embed_tokens+model.rotary_emb",
        "model.layers.0",
        "model.layers.1",
        "model.layers.2",
        "model.norm",
        "lm_head",
    ]
    # cos and sin (and the mask) are made once and cross every cut between decoder layers.
    assert len(split.cut_names[2]) >= 3 and split.cut_names[2][:-1] == split.cut_names[3][:-1]


def test_profile_cli_takes_a_hugging_face_model(tmp_path: Path) -> None:
    out = tmp_path / "gpt2.json"
    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli", "profile", str(ROOT / "examples" / "hf_gpt2.py"),
         "-b", "1,2", "--repeat", "1", "--warmup", "0", "--min-time", "0", "-o", str(out),
         "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["capture"] == "export"
    names = [layer["name"] for layer in data["layers"]]
    assert names[0].startswith("transformer.wte") and names[-1] == "transformer.ln_f+lm_head"
    # The head's tied weight is counted once, with the embedding, and the tie is recorded.
    assert data["layers"][-1]["param_count"] < data["layers"][0]["param_count"]
    (tie,) = data["tied_parameters"]
    assert tie["name"] == "transformer.wte.weight" and tie["layers"] == [0, len(names) - 1]
    sizes = [m["microbatch_size"] for m in data["measurements"]]
    assert sizes == [1, 2]
    cut = [m["layers"][1]["output_bytes"] for m in data["measurements"]]
    assert cut[1] == 2 * cut[0] or cut[1] > cut[0]


def _plan(text: str, schedule: str = "1f1b", m: int = 4, mbs: int = 2) -> Plan:
    stages = parse_stages(text)
    return Plan(
        profile=FileRef("<memory>", ""),
        topology=FileRef("<none>", ""),
        microbatch_size=mbs,
        num_microbatches=m,
        stages=stages,
        schedule=build_schedule(schedule, stages, m),
        predicted=Prediction(10.0, m * mbs / 10.0 * 1e3, 0.0, 10.0, {}, {}),
    )


def _same_as_one_process(model: Path, plan: Plan, steps: int = 2) -> None:
    report = run_plan(
        plan, model, steps=steps, warmup=0, timeout_s=120, optimizer="sgd", lr=0.05,
        return_params=True,
    )  # fmt: skip
    ref = train_single_process(
        model, steps=steps, batch_size=plan.num_microbatches * plan.microbatch_size, lr=0.05
    )
    assert report.losses == pytest.approx(ref.losses, rel=1e-5)
    assert report.parameters is not None and set(report.parameters) == set(ref.parameters)
    for name, value in ref.parameters.items():
        torch.testing.assert_close(report.parameters[name], value, rtol=1e-5, atol=1e-6)


def test_llama_pipeline_trains_like_one_process() -> None:
    _same_as_one_process(ROOT / "examples" / "hf_llama.py", _plan("0-2:cpu0;3-6:cpu1"))


def test_tied_gpt2_embedding_and_head_on_different_stages() -> None:
    _same_as_one_process(ROOT / "examples" / "hf_gpt2.py", _plan("0-2:cpu0;3-5:cpu1"))


def test_t5_encoder_decoder_across_three_stages(tmp_path: Path) -> None:
    model = write_model_file("t5", tmp_path)
    _same_as_one_process(model, _plan("0-2:cpu0;3-5:cpu1;6-7:cpu2", "gpipe", m=2))


ALBERT = """
import torch
from torch import nn

VOCAB, SEQ, WIDTH = 128, 16, 32


def build_model() -> nn.Module:
    from transformers import AlbertConfig, AlbertForMaskedLM

    config = AlbertConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=WIDTH, num_hidden_layers=4,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return AlbertForMaskedLM(config)


def sample_batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)
    return {"input_ids": tokens}, torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)
"""


def test_albert_shared_layer_under_zero_bubble(tmp_path: Path) -> None:
    """ALBERT runs one layer's weights in every block: under zb the weight half of the split
    backward freed the graph the next parameter group needed, and rank 1 crashed."""
    model = tmp_path / "albert.py"
    model.write_text(ALBERT)
    _same_as_one_process(model, _plan("0:cpu0;1-2:cpu1", "zb", m=2))

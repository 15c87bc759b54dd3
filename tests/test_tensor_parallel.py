"""Tensor-parallel shards profiled (issue 22): each layer's rank-0 shard measured in one
process on torch's fake process group, or counted on the meta model, with the collectives
it issues; the plans they come from; what is refused.

What must hold: entries for every layer and setting; a shard's parameters exactly its part
(split weights divided by the degree, the rest whole); the collectives those torch's own
CommDebugMode counts, and Megatron-LM's count for the GPT blocks (two all-reduces of
b*s*h per block and pass; with sequence parallelism a reduce-scatter and an all-gather
each); the split matmuls' FLOPs the unsharded closed form over the degree; saved bytes
below the unsharded layer's and above its share; one line for every refusal.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from test_analytic import _gpt_file

from planner.cli import main
from planner.errors import InputError
from planner.gpus import Efficiency, gpu_spec
from planner.profile import load_model_file
from planner.profile.analytic import analytic_profile
from planner.profile.fake_group import fake_group
from planner.profile.roofline import Roofline
from planner.profile.schema import profile_from_dict
from planner.profile.shard_count import count_shards
from planner.profile.shard_measure import profile_with_shards
from planner.profile.sharding import Collective
from planner.profile.split import capture_model, discover_split_points
from planner.profile.tensor_parallel import (
    TensorParallelRequest,
    build_shard,
    parse_tensor_parallel,
)
from planner.profile.tp_plan import layer_modules, tensor_parallel_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
FAST: dict[str, Any] = {"repeat": 1, "warmup": 0, "min_time_s": 0}
F32 = 4


def _ops(collectives: tuple[Collective, ...] | list[Collective]) -> list[tuple[str, int, str]]:
    return [(c.op, c.bytes, c.phase) for c in collectives]


def _comm_debug_counts(path: Path, degree: int, sp: bool, size: int) -> list[Counter[str]]:
    """Each layer's collectives as torch's CommDebugMode counts them, on a shard built
    independently of the profiler's runners (one forward and backward per layer)."""
    from torch.distributed.tensor.debug import CommDebugMode

    user = load_model_file(path)
    torch.manual_seed(0)
    model = user.build()
    inputs, targets = user.batch(size)
    names = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather"}
    names["reduce_scatter_tensor"] = "reduce_scatter"
    out: list[Counter[str]] = []
    with fake_group(degree) as mesh:
        capture = "fx" if path.name == "gpt.py" else "export"
        split = build_shard(
            user, model, [inputs], mesh, degree=degree, sequence_parallel=sp, split_at=None,
            capture=capture,
        ).splits[0]  # fmt: skip
        values: Any = split.flat_inputs(inputs)
        for k, layer in enumerate(split.layers):
            leaves = [v.detach().requires_grad_(v.is_floating_point()) for v in values]
            mode = CommDebugMode()
            with mode:
                result = layer(*leaves)
                if k == split.num_layers - 1:
                    roots = [user.loss(result, targets)]
                else:
                    roots = [t for t in result if t.grad_fn is not None]
                torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
            counts: Counter[str] = Counter()
            for op, n in mode.get_comm_counts().items():
                counts[names[str(op).split(".")[-1]]] += n
            out.append(counts)
            values = tuple(v.detach() for v in result) if isinstance(result, tuple) else ()
    return out


# ---------------------------------------------------------------- measured


def test_gpt_shards_measured_at_tp2_match_their_parts_and_commdebugmode() -> None:
    request = parse_tensor_parallel("2", sequence_parallel=True)
    profile = profile_with_shards(EXAMPLES / "gpt.py", [2], tensor_parallel=request, **FAST)
    assert profile.tensor_parallel is not None
    assert profile.tensor_parallel.keys() == ["tp2", "tp2-sp"]
    assert profile.tensor_parallel.plan_source == "tp_plan"
    again = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.to_dict() == profile.to_dict()
    m = profile.measurement(2).layers
    assert all(set(t.sharded) == {"tp2", "tp2-sp"} for t in m)
    assert all(set(layer.sharded) == {"tp2"} for layer in profile.layers)

    # Parameters: a block's split weights halved, its norms and row-split biases whole.
    h, vocab, b, s = 256, 2048, 2, 128
    split, whole = 12 * h * h + 7 * h, 6 * h
    for layer in profile.layers[1:5]:
        assert layer.param_count == split + whole
        assert layer.sharded["tp2"].param_count == split // 2 + whole
        assert layer.sharded["tp2"].param_bytes == (split // 2 + whole) * F32
    head = profile.layers[5]
    assert head.sharded["tp2"].param_count == h * vocab // 2 + 2 * h  # its norm whole
    embed = profile.layers[0]  # replicated: the whole layer on every rank
    assert embed.sharded["tp2"].param_bytes == embed.param_bytes
    assert embed.sharded["tp2"].optimizer_state_bytes == embed.optimizer_state_bytes

    # Collectives: Megatron's count, and what torch's CommDebugMode counts.
    hidden = b * s * h * F32
    for t in m[1:5]:
        assert _ops(t.sharded["tp2"].collectives) == [
            ("all_reduce", hidden, "forward"),
            ("all_reduce", hidden, "forward"),
            ("all_reduce", hidden, "backward"),
            ("all_reduce", hidden, "backward"),
        ]
        pairs = [("all_gather", hidden), ("reduce_scatter", hidden)]
        assert [(op, n) for op, n, phase in _ops(t.sharded["tp2-sp"].collectives)] == pairs * 4
        assert [c.phase for c in t.sharded["tp2-sp"].collectives] == ["forward"] * 4 + [
            "backward"
        ] * 4
    assert _ops(m[5].sharded["tp2"].collectives) == [
        ("all_gather", b * s * vocab * F32, "forward"),
        ("all_reduce", hidden, "backward"),
    ]
    for sp, key in ((False, "tp2"), (True, "tp2-sp")):
        counted = _comm_debug_counts(EXAMPLES / "gpt.py", 2, sp, 2)
        assert counted == [Counter(c.op for c in t.sharded[key].collectives) for t in m]

    # Memory: a split block saves less than the whole block and more than its half; with
    # sequence parallelism less again, and hands on half the hidden states.
    for t in m[1:5]:
        assert t.saved_bytes / 2 < t.sharded["tp2"].saved_bytes < t.saved_bytes
        assert t.sharded["tp2-sp"].saved_bytes < t.sharded["tp2"].saved_bytes
        assert t.sharded["tp2"].output_bytes == t.output_bytes
    mask = s * s  # bool, carried through every cut
    assert m[1].sharded["tp2-sp"].output_bytes == mask + hidden // 2
    assert all(t.sharded[k].forward_ms > 0 for t in m[1:] for k in ("tp2", "tp2-sp"))
    assert all(layer.sharded["tp2"].optimizer_ms > 0 for layer in profile.layers)


def test_hugging_face_llama_shards_use_its_own_plan() -> None:
    pytest.importorskip("transformers")
    path = EXAMPLES / "hf_llama.py"
    request = parse_tensor_parallel("2")
    profile = profile_with_shards(path, [1], tensor_parallel=request, **FAST)
    assert profile.tensor_parallel is not None
    assert profile.tensor_parallel.plan_source == "base_model_tp_plan"
    names = [layer.name for layer in profile.layers]
    assert names[1:6] == [f"model.layers.{i}" for i in range(4)] + ["model.norm"]
    h, i, kv, vocab, s = 128, 256, 64, 1024, 64
    block_split = 2 * h * h + 2 * kv * h + 3 * h * i
    for layer in profile.layers[1:5]:
        assert layer.param_count == block_split + 2 * h
        assert layer.sharded["tp2"].param_count == block_split // 2 + 2 * h
    embedding, norm, head = profile.layers[0], profile.layers[5], profile.layers[6]
    assert embedding.sharded["tp2"].param_count == vocab * h // 2  # vocabulary-parallel
    assert head.sharded["tp2"].param_count == vocab * h // 2
    assert norm.sharded["tp2"].param_count == norm.param_count == h
    m = profile.measurement(1).layers
    hidden = s * h * F32
    # transformers' plan splits q, k, v, gate and up separately: torch's ColwiseParallel
    # all-reduces each one's input gradient (Megatron fuses them into two).
    for t in m[1:5]:
        assert (
            _ops(t.sharded["tp2"].collectives)
            == [("all_reduce", hidden, "forward")] * 2 + [("all_reduce", hidden, "backward")] * 5
        )
        assert t.saved_bytes / 2 < t.sharded["tp2"].saved_bytes < t.saved_bytes
    assert _ops(m[0].sharded["tp2"].collectives) == [("all_reduce", hidden, "forward")]
    assert m[0].sharded["tp2"].backward_ms > 0  # the embedding's gradient flows
    counted = _comm_debug_counts(path, 2, False, 1)
    assert counted == [Counter(c.op for c in t.sharded["tp2"].collectives) for t in m]


# ---------------------------------------------------------------- analytic


@pytest.mark.parametrize("degree", [2, 4, 8])
def test_analytic_gpt_shards_are_megatrons_closed_form_over_the_degree(
    tmp_path: Path, degree: int
) -> None:
    h, heads, layers, s, vocab, b = 1024, 16, 2, 256, 8192, 2
    path = _gpt_file(tmp_path, vocab=vocab, seq=s, width=h, heads=heads, layers=layers)
    request = TensorParallelRequest((degree,), sequence_parallel=True)
    profile = analytic_profile(path, [b], gpu="h100-sxm")
    counts = count_shards(
        load_model_file(path), profile, request, Roofline(gpu_spec("h100-sxm"), Efficiency()),
        precision="fp32", split_at=None, step_ms=lambda size: 0.0,
    )  # fmt: skip
    block = 24 * b * s * h * h + 4 * b * s * s * h
    head = 2 * b * s * h * vocab
    hidden = b * s * h * F32
    for key in (f"tp{degree}", f"tp{degree}-sp"):
        shards = counts[(key, b)]
        assert [c.count.forward.flops for c in shards] == [0] + [block // degree] * layers + [
            head // degree
        ]
        for c in shards[1:-1]:
            assert c.count.backward_input.flops + c.count.backward_weight.flops == 2 * (
                block // degree
            )
    for c in counts[(f"tp{degree}", b)][1:-1]:
        assert (
            _ops(c.collectives)
            == [("all_reduce", hidden, "forward")] * 2 + [("all_reduce", hidden, "backward")] * 2
        )
    for c in counts[(f"tp{degree}-sp", b)][1:-1]:
        ops = [(op, n) for op, n, _ in _ops(c.collectives)]
        assert ops == [("all_gather", hidden), ("reduce_scatter", hidden)] * 4
    split, whole = 12 * h * h + 7 * h, 6 * h
    for layer in profile.layers[1:-1]:
        assert layer.sharded[f"tp{degree}"].param_count == split // degree + whole
    assert profile.measurement(b).layers[1].sharded[f"tp{degree}-sp"].output_bytes == (
        s * s + hidden // degree
    )  # the mask (bool) and this rank's part of the sequence


def test_analytic_llama_shards_divide_the_swiglu_gqa_block(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    h, i, heads, kv_heads, s, vocab, b, t = 256, 688, 8, 4, 128, 1024, 1, 4
    path = tmp_path / "llama.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import torch
            from transformers import LlamaConfig, LlamaForCausalLM

            def build_model():
                return LlamaForCausalLM(LlamaConfig(
                    hidden_size={h}, intermediate_size={i}, num_attention_heads={heads},
                    num_key_value_heads={kv_heads}, vocab_size={vocab}, num_hidden_layers=2,
                    max_position_embeddings={s}, tie_word_embeddings=False, use_cache=False))

            def sample_batch(b):
                x = torch.randint(0, {vocab}, (b, {s} + 1))
                return {{"input_ids": x[:, :-1].contiguous()}}, x[:, 1:].contiguous()
            """
        )
    )
    profile = analytic_profile(path, [b], gpu="h100-sxm", precision="bf16")
    counts = count_shards(
        load_model_file(path), profile, TensorParallelRequest((t,)),
        Roofline(gpu_spec("h100-sxm"), Efficiency()), precision="bf16", split_at=None,
        step_ms=lambda size: 0.0,
    )  # fmt: skip
    kv = h * kv_heads // heads
    block = 2 * b * s * h * (h + 2 * kv + h) + 4 * b * s * s * h + 3 * 2 * b * s * h * i
    shards = counts[(f"tp{t}", b)]
    assert [c.count.forward.flops for c in shards[1:3]] == [block // t] * 2
    assert shards[-1].count.forward.flops == 2 * b * s * h * vocab // t
    for layer in profile.layers[1:3]:
        assert layer.sharded[f"tp{t}"].param_count == (2 * h * h + 2 * kv * h + 3 * h * i) // t + (
            2 * h
        )


# ---------------------------------------------------------------- plans and refusals


def test_a_degree_that_does_not_divide_the_heads_is_refused_naming_the_layer(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(InputError, match=r"layer model\.layers\.0.*2 key/value heads") as err:
        analytic_profile(
            EXAMPLES / "hf_llama.py",
            [1],
            gpu="h100-sxm",
            tensor_parallel=parse_tensor_parallel("4"),
        )
    assert err.value.field == "--tensor-parallel" and "\n" not in str(err.value)
    # GPT: 8 does not divide its 4 heads although it divides every split dimension
    path = _gpt_file(tmp_path, vocab=512, seq=16, width=64, heads=4, layers=1)
    with pytest.raises(InputError, match=r"layer blocks\.0: .*does not divide its 4 attention"):
        analytic_profile(path, [1], gpu="h100-sxm", tensor_parallel=parse_tensor_parallel("8"))


def _model_file(tmp: Path, name: str, body: str) -> Path:
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_plans_refused_in_one_line(tmp_path: Path) -> None:
    tied = _model_file(
        tmp_path,
        "tied",
        """
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(64, 8)
                self.out = torch.nn.Linear(8, 64, bias=False)
                self.out.weight = self.emb.weight
            def forward(self, x):
                return self.out(self.emb(x))
        def build_model():
            return M()
        def sample_batch(b):
            x = torch.randint(0, 64, (b, 4))
            return x, x
        def tp_plan():
            return {"out": "colwise_rep"}
        """,
    )
    packed = tied.with_name("packed.py")
    packed.write_text(tied.read_text().replace('"colwise_rep"', '"packed_colwise"'))
    conv = tied.with_name("conv.py")
    conv.write_text(tied.read_text().replace('{"out": "colwise_rep"}', '{"emb": "rowwise"}'))
    cases = [
        (tied, r"layer out: its parameter out\.weight is tied to emb\.weight"),
        (packed, r"out: style 'packed_colwise' has no torch parallelize_module style"),
        (conv, r"layer emb: its parameter emb\.weight is tied"),
    ]
    for path, message in cases:
        with pytest.raises(InputError, match=message) as err:
            analytic_profile(path, [1], gpu="h100-sxm", tensor_parallel=parse_tensor_parallel("2"))
        assert "\n" not in err.value.one_line()
    untied = tied.with_name("untied.py")
    untied.write_text(tied.read_text().replace("self.out.weight = self.emb.weight", "pass"))
    with_sp = parse_tensor_parallel("2", sequence_parallel=True)
    with pytest.raises(InputError, match="tp_plan\\(\\) takes no sequence_parallel argument"):
        analytic_profile(untied, [1], gpu="h100-sxm", tensor_parallel=with_sp)


def test_a_hugging_face_plan_has_no_sequence_parallel_form(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    path = _model_file(
        tmp_path,
        "llama_own_plan",
        f"""
        import sys
        sys.path.insert(0, {str(EXAMPLES)!r})
        from hf_llama import build_model, sample_batch
        """,
    )
    user = load_model_file(path)
    model = user.build()
    plan = tensor_parallel_plan(user, model)
    assert plan.source == "base_model_tp_plan"
    assert "model.layers.3.mlp.down_proj" in plan.styles and "lm_head" in plan.styles
    assert layer_modules(plan, discover_split_points(model)) == [
        "lm_head", "model.embed_tokens", *[f"model.layers.{i}" for i in range(4)]
    ]  # fmt: skip
    with pytest.raises(InputError, match="has no sequence-parallel form") as err:
        tensor_parallel_plan(user, model, sequence_parallel=True)
    assert err.value.field == "--sequence-parallel"


def test_module_calls_keep_the_exported_layers() -> None:
    pytest.importorskip("transformers")
    user = load_model_file(EXAMPLES / "hf_llama.py")
    torch.manual_seed(0)
    model = user.build()
    inputs, _ = user.batch(2)
    plain = capture_model(model, inputs)
    points = discover_split_points(model)
    called = capture_model(model, inputs, module_calls=points)
    assert called.names == plain.names and called.capture == plain.capture == "export"
    calls = [n.target for n in called.layers[1].graph.nodes if n.op == "call_module"]
    assert calls == ["model.layers.0"]
    with torch.no_grad():
        expected = plain(*plain.flat_inputs(inputs)).logits
        got = called(*called.flat_inputs(inputs)).logits
    assert torch.equal(expected, got)


def test_profile_command_refuses_a_model_without_a_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.json"
    for args, message in [
        (["--tensor-parallel", "2"], "examples/mlp.py: --tensor-parallel: defines no tp_plan()"),
        (["--sequence-parallel"], "--sequence-parallel: sequence parallelism splits"),
        (["--tensor-parallel", "1"], "--tensor-parallel: expected an integer from 2 to 1,024"),
        (["--tensor-parallel", ""], "--tensor-parallel: expected a value, got an empty string"),
        (["--tensor-parallel="], "--tensor-parallel: expected a value, got an empty string"),
    ]:
        with pytest.raises(SystemExit) as info:
            main(["profile", "examples/mlp.py", "-b", "1", "-o", str(out), *args])
        err = capsys.readouterr().err
        assert info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
        assert not out.exists()


# ---------------------------------------------------------------- the shards train exactly


def _gloo_rank(rank: int, port: int, path: str, out: str) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        user = load_model_file(path)
        results = []
        for sp in (False, True):
            torch.manual_seed(0)
            model = user.build()
            inputs, targets = user.batch(2)
            split = build_shard(
                user, model, [inputs], init_device_mesh("cpu", (2,)), degree=2,
                sequence_parallel=sp, split_at=None, capture="fx",
            ).splits[0]  # fmt: skip
            loss = user.loss(split(*split.flat_inputs(inputs)), targets)
            loss.backward()
            grads = {}
            for name, p in model.named_parameters():
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[name] = g.detach().clone()
            results.append((loss.detach(), grads))
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def test_shards_built_for_the_profile_train_like_one_process_on_gloo(tmp_path: Path) -> None:
    """What a run will build (build_shard on a real group) is exact: examples/gpt.py's GPT
    and tp_plan at TP 2 on two gloo processes, with and without sequence parallelism, give
    the single-process loss and every gradient element. At tests/models/tiny_gpt.py's size
    (the runtime's tensor-parallel tests' model): the same modules and split, which do not
    depend on the width (the full example took 30 s of the suite)."""
    import socket

    import torch.multiprocessing as mp

    from planner.profile.export_graph import call_for_training

    path = ROOT / "tests" / "models" / "tiny_gpt.py"
    user = load_model_file(path)
    torch.manual_seed(0)
    reference = user.build()
    inputs, targets = user.batch(2)
    expected = user.loss(call_for_training(reference, inputs), targets)
    expected.backward()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "rank0.pt"
    mp.start_processes(_gloo_rank, args=(port, str(path), str(out)), nprocs=2, start_method="spawn")
    for loss, grads in torch.load(out):
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
        for name, p in reference.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)

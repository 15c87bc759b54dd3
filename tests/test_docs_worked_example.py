"""docs/parallelism.md's worked example: its commands parse as written and name files that
exist (or that an earlier command writes), and part 1's chain (analytic profile of the
Llama-3-8B example, solve, show, simulate the hand layouts, export) runs as documented on
the same model cut to two layers and 1024 tokens, with the properties the text draws from
the full-size numbers: a TP group across the InfiniBand link is slower than in a node, the
solver's plan is no slower than the Megatron-style layout and keeps its TP groups inside
the nodes, and the export refuses the bf16 plan with the line the doc shows."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "parallelism.md"
EXAMPLE = ROOT / "examples" / "llama3-8b"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Worked example\n")
    return text[start : text.index("\n### From Python", start)]


def _commands() -> list[list[str]]:
    """Every command line of the section's ```bash blocks, continuations joined."""
    out: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", _section(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(shlex.split(line))
    return out


def _pipeplan() -> list[list[str]]:
    return [c[1:] for c in _commands() if c[0] == "pipeplan"]


def _option(args: list[str], *names: str) -> str | None:
    for k, a in enumerate(args[:-1]):
        if a in names:
            return args[k + 1]
    return None


def test_the_documented_commands_parse_and_name_files_that_exist() -> None:
    import typer

    from planner.cli import _register_commands, app

    _register_commands()
    group = typer.main.get_command(app)
    root = group.context_class(group, info_name="pipeplan")
    commands = _pipeplan()
    verbs = [c[0] for c in commands]
    assert verbs.count("profile") == 3 and "solve" in verbs and "show" in verbs
    assert verbs.count("simulate") == 6 and verbs.count("export") == 5 and "run" in verbs
    written: set[str] = set()
    for args in commands:
        sub = group.get_command(root, args[0])
        assert sub is not None, args
        sub.make_context(args[0], list(args[1:]), parent=root)  # a renamed flag, a bad value
        for a in args:
            if a.startswith(("examples/", "topologies/")):
                assert (ROOT / a).is_file(), a
        for read in (_option(args, "--profile"), *(a for a in args[1:2] if a.endswith(".json"))):
            if read is not None:
                assert read in written, f"{read} is read before a command writes it: {args}"
        out = _option(args, "-o", "--output")
        if out is not None:
            written.add(out)
    torchrun = [c for c in _commands() if c[0] == "torchrun"]
    assert torchrun == [
        ["torchrun", "--nproc-per-node", "4", "cpu-plan-torch/train_pipeline.py", "--steps", "2"]
    ]


def _small_llama(folder: Path) -> Path:
    """examples/llama3-8b with two decoder layers and 1024 tokens per sample."""
    config = json.loads((EXAMPLE / "config.json").read_text())
    config["num_hidden_layers"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    source = (EXAMPLE / "model.py").read_text()
    assert "\nSEQ_LEN = 8192" in source
    (folder / "model.py").write_text(source.replace("\nSEQ_LEN = 8192", "\nSEQ_LEN = 1024"))
    return folder / "model.py"


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def test_part_one_runs_as_documented_on_a_smaller_llama(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)  # the commands' relative paths (topologies/...) are the checkout's
    model = _small_llama(tmp_path)
    commands = _pipeplan()
    part1 = commands[: [c[0] for c in commands].index("profile", 1)]
    by_verb = {verb: [c for c in part1 if c[0] == verb] for verb in ("profile", "solve", "show")}
    (profile_cmd,), (solve_cmd,), (show_cmd,) = by_verb.values()
    megatron, across = (
        next(c for c in part1 if out in c) for out in ("megatron.json", "across-ib.json")
    )
    export_torch, export_titan = (c for c in part1 if c[0] == "export")
    assert profile_cmd[:2] == ["profile", "examples/llama3-8b/model.py"]
    documented_profile = _option(profile_cmd, "-o")
    assert documented_profile is not None
    profile = str(tmp_path / "llama.json")
    plan = str(tmp_path / "plan.json")

    def here(args: list[str]) -> list[str]:
        """The documented command on the small model's files in tmp_path; layer ranges
        0-16 / 17-34 (35 layers) become 0-2 / 3-4 (5 layers)."""
        swap = {
            "examples/llama3-8b/model.py": str(model),
            documented_profile: profile,
            "plan.json": plan,
        }
        out = [swap.get(a, a) for a in args]
        out = [a.replace("0-16:", "0-2:").replace(";17-34:", ";3-4:") for a in out]
        return [str(tmp_path / a) if a.endswith(".json") and "/" not in a else a for a in out]

    code, _, err = _cli([*here(profile_cmd), "-q"], capsys)
    assert code == 0, err
    code, _, err = _cli(here(solve_cmd), capsys)
    assert code == 0, err
    code, out, err = _cli(here(show_cmd), capsys)
    assert code == 0 and "Iteration:" in out, err
    times = {}
    for name, args in (("megatron", megatron), ("across", across)):
        assert "--stages" in args and "-m" in args
        code, out, err = _cli([*here(args), "--json", "--no-gantt"], capsys)
        assert code == 0, err
        times[name] = json.loads(out)["iteration_ms"]
    # A TP8 group across the InfiniBand link pays its collectives there (2.6x at full size).
    assert times["across"] > 1.5 * times["megatron"]
    # The solver's plan is no slower than the Megatron-style layout, and no TP group of it
    # crosses the nodes (gpu0-7 are node0's).
    solved = json.loads(Path(plan).read_text())
    assert solved["predicted"]["iteration_ms"] <= times["megatron"] * (1 + 1e-9)
    for stage in solved["stages"]:
        t = stage.get("tensor_parallel", 1)
        for k in range(0, len(stage["devices"]), t):
            nodes = {int(d.removeprefix("gpu")) // 8 for d in stage["devices"][k : k + t]}
            assert len(nodes) == 1, stage
    # The bf16 plan exports for torch (autocast recorded); torchtitan refuses it with the
    # line the doc shows.
    code, out, err = _cli([*here(export_torch), "-o", str(tmp_path / "torch")], capsys)
    assert code == 0 and "wrote" in out + err, err
    config = json.loads((tmp_path / "torch" / "pipeline.json").read_text())
    assert config["precision"] == "bf16"
    doc_line = (
        "precision: precision bf16: torchtitan's mixed precision is FSDP's parameter dtype "
        "(mixed_precision_param), not the autocast pipeplan plans and runs; export with "
        "--to torch, or a plan profiled at fp32"
    )
    assert doc_line in _section()
    code, _, err = _cli([*here(export_titan), "-o", str(tmp_path / "titan")], capsys)
    assert code == 2 and doc_line in err, err

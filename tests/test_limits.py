"""Hostile numbers, sizes, ranges, nesting and text: one line, exit 2, before any work.

Each case is one of issue 19's reproductions, run through the command line as a user
would: a 5000-digit integer, 1e308 bytes, huge microbatch counts and ranges, duplicate keys,
unknown fields and optimizers, deep nesting, a schedule renamed, a non-graph imported, a
terminal escape in a device name. Every case is answered with one line naming the file
and the field (or the flag), exit code 2, no traceback and nothing written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "profiles" / "mlp.json"
NVLINK = ROOT / "topologies" / "nvlink.yaml"
DIGITS = "9" * 5000


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one stderr line of a command that must exit 2."""
    code, _, err = _run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "\x1b" not in err
    return lines[0]


def _profile_text(tmp_path: Path, edit: Any) -> Path:
    """profiles/mlp.json as text, edited by ``edit(text) -> text``."""
    path = tmp_path / "hostile.json"
    path.write_text(edit(MLP.read_text()))
    return path


FIRST_PARAM_BYTES = '"param_bytes": 2109440'


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (
            lambda t: t.replace(FIRST_PARAM_BYTES, f'"param_bytes": {DIGITS}', 1),
            ["layers[0].param_bytes", "5000 digits"],
        ),
        (
            lambda t: t.replace(FIRST_PARAM_BYTES, '"param_bytes": 1e308', 1),
            ["layers[0].param_bytes", "expected an integer from 0 to"],
        ),
        (
            lambda t: t.replace('"microbatch_size": 8', '"microbatch_size": 1e308', 1),
            ["measurements[0].microbatch_size", "expected an integer from 1 to"],
        ),
        (
            lambda t: t.replace('"forward_ms": 0.6505', '"forward_ms": 1e400', 1),
            ["forward_ms", "finite"],
        ),
        (
            lambda t: t.replace('"model": "mlp"', '"model": "mlp", "model": "x"', 1),
            ["key 'model' is given twice"],
        ),
        (
            lambda t: t.replace('"model": "mlp"', '"model": "mlp", "colour": "red"', 1),
            ["colour: unknown field; expected one of", "measurements"],
        ),
        (
            lambda t: t.replace('"optimizer": "adam"', '"optimizer": "lamb"', 1),
            ["optimizer: expected one of sgd, momentum, adam, adamw, got 'lamb'"],
        ),
        (lambda t: "[" * 100_000 + "]" * 100_000, ["nested deeper than 64 levels"]),
    ],
    ids=["digits", "1e308-bytes", "1e308-size", "1e400", "duplicate", "unknown", "lamb", "deep"],
)
@pytest.mark.parametrize("verb", ["solve", "simulate"])
def test_a_hostile_profile_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Any,
    needles: list[str],
    verb: str,
) -> None:
    path = _profile_text(tmp_path, edit)
    out = tmp_path / "plan.json"
    args = ["--profile", str(path), "-o", str(out)]
    if verb == "solve":
        args += ["--topology", str(NVLINK), "--microbatches", "4", "--time-limit", "5"]
    else:
        args += ["--stages", "0-2:gpu0;3-5:gpu1", "-m", "4"]
    line = _refused(capsys, verb, *args)
    assert "hostile.json: " in line
    for needle in needles:
        assert needle in line
    assert not out.exists()


TOPOLOGY = """\
schema: pipeplan.topology/v1
devices:
  - {{name: {name}, memory: {memory}, speed: {speed}}}
  - {{name: gpu1, memory: 80 GiB}}
links:
  - {{between: [{name}, gpu1], bandwidth: {bandwidth}, count: {count}}}
"""


def _topology(**fields: str) -> str:
    values = {"name": "gpu0", "memory": "80 GiB", "speed": "1.0", "bandwidth": "25 GB/s"}
    return TOPOLOGY.format(**{**values, "count": "1", **fields})


HOSTS = "schema: pipeplan.topology/v1\nhosts:\n  count: {hosts}\n  devices: {{count: {per}, memory: 80 GiB}}\n  switch: {{bandwidth: 450 GB/s}}\n"  # noqa: E501
MESH = "schema: pipeplan.topology/v1\ndevices:\n  - {name: 'g{0..999}', memory: 1 GiB}\nlinks:\n  - {between: ['g{0..999}', 'g{0..999}'], bandwidth: 25 GB/s}\n"  # noqa: E501


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (_topology(speed=DIGITS), ["devices[0].speed", "5000 digits"]),
        (_topology(count=DIGITS), ["links[0].count", "5000 digits"]),
        (_topology(count="100001"), ["links[0].count", "from 1 to 10,000"]),
        (_topology(speed="1.0e-300"), ["devices[0].speed", "from 1e-06"]),
        (_topology(name=f"'gpu{{0..{DIGITS}}}'"), ["devices[0].name", "at most 1,024"]),
        (_topology(name="'gpu{0..99999999}'"), ["devices[0].name", "more than 100,000 names"]),
        (_topology(name="'g{0..999}{0..999}{0..999}'"), ["more than 100,000 names"]),
        (_topology(bandwidth="1e-300 B/s"), ["links[0].bandwidth", "from 1 B/s"]),
        (_topology(memory="1e20 TiB"), ["devices[0].memory", "at most"]),
        (_topology(name='"gpu\\e[31m0"'), ["devices[0].name", "control characters", "\\x1b"]),
        (HOSTS.format(hosts=1, per=100_000_000), ["hosts.devices.count", "to 100,000"]),
        (HOSTS.format(hosts=100_000_000, per=1), ["hosts.count", "to 100,000"]),
        (HOSTS.format(hosts=10000, per=8), ["hosts.count", "80,000 devices", "at most 65,536"]),
        (MESH, ["links[0].between", "more than 200,000 links (1,000 x 1,000 here)"]),
        (_topology().replace("memory: 80 GiB}", "memory: 80 GiB, memory: 1 GiB}"), ["twice"]),
        ("[" * 100_000 + "]" * 100_000, ["nested deeper than 64 levels"]),
    ],
    ids=[
        "speed-digits",
        "count-digits",
        "count",
        "speed",
        "range-digits",
        "range",
        "ranges",
        "bandwidth",
        "memory",
        "escape",
        "per-host",
        "hosts",
        "hosts-total",
        "mesh",
        "duplicate",
        "deep",
    ],
)
def test_a_hostile_topology_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needles: list[str]
) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    line = _refused(capsys, "topology", "check", str(path))
    assert "topo.yaml" in line
    for needle in needles:
        assert needle in line


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["solve", "--topology", str(NVLINK), "--microbatches", "99999999999"], ["--microbatches"]),
        (["solve", "--topology", str(NVLINK), "--global-batch", "8" + "0" * 11], ["--global-b"]),
        (["solve", "--topology", str(NVLINK), "--time-limit", "1e400"], ["--time-limit"]),
        (["simulate", "--stages", "0-2:a;3-5:b", "-m", "99999999"], ["--microbatches"]),
        (["simulate", "--stages", "0:a;1:b;2:c;3:d;4:e;5:f", "-m", "99999"], ["compute actions"]),
        (["simulate", "--stages", "0-2:a;3-5:b", "--step-ms", "1e308", "--json"], ["--step-ms"]),
        (["simulate", "--stages", f"0-{DIGITS}:a", "-m", "2"], ["--stages"]),
        (["simulate", "--stages", "0-2:a;3-5:b", "--recompute", DIGITS], ["--recompute"]),
        (["simulate", "--stages", "0-2:a;3-5:b", "--virtual-stages", "9" * 9], ["--virtual"]),
        (["simulate", "--stages", "0-2:a\x1b[2J;3-5:b"], ["--stages", "\\x1b[2J"]),
    ],
    ids=["solve-m", "solve-batch", "time", "m", "ops", "step", "stages", "recompute", "v", "esc"],
)
def test_hostile_numbers_on_the_command_line_are_refused_before_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    out = tmp_path / "o.json"
    line = _refused(capsys, *args, "--profile", str(MLP), "-o", str(out))
    for needle in needles:
        assert needle in line
    assert not out.exists()


@pytest.fixture
def plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "plan.json"
    args = ["--profile", str(MLP), "--topology", str(NVLINK), "--stages", "0-2:gpu0;3-5:gpu1"]
    code, _, err = _run(capsys, "simulate", *args, "-m", "4", "-o", str(path), "--no-gantt")
    assert code == 0, err
    return path


def test_show_refuses_a_wide_chart_a_renamed_schedule_and_names_the_plan(
    plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--width" in _refused(capsys, "show", str(plan), "--width", "100000000")
    data = json.loads(plan.read_text())
    data["schedule"]["name"] = "bogus"
    renamed = plan.with_name("renamed.json")
    renamed.write_text(json.dumps(data))
    line = _refused(capsys, "show", str(renamed))
    assert "renamed.json: schedule.name: unknown schedule 'bogus'" in line and "'1f1b'" in line
    # The stages and lists moved to a device the topology does not have: the error comes
    # from re-simulating on the topology, and still names the plan.
    moved = plan.with_name("moved.json")
    moved.write_text(plan.read_text().replace('"gpu1"', '"gpu9"'))
    line = _refused(capsys, "show", str(moved))
    assert line.startswith("pipeplan: error: ") and "moved.json: " in line and "gpu9" in line


def test_every_reader_of_a_plan_refuses_an_unknown_optimizer_before_running(
    plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lamb = tmp_path / "lamb.json"
    lamb.write_text(MLP.read_text().replace('"optimizer": "adam"', '"optimizer": "lamb"'))
    data = json.loads(plan.read_text())
    data["profile"] = {"path": str(lamb), "sha256": None}
    plan.write_text(json.dumps(data))
    model = str(ROOT / "examples" / "mlp.py")
    for args in (["show", str(plan)], ["simulate", "--plan", str(plan)]):
        assert "lamb.json: optimizer: expected one of" in _refused(capsys, *args)
    line = _refused(capsys, "run", str(plan), "--model", model, "--steps", "1")
    assert "lamb.json: optimizer: expected one of" in line


def test_json_written_is_valid_json_or_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = tmp_path / "slow.yaml"
    topo.write_text(_topology(bandwidth="1e-305 B/s"))
    out = tmp_path / "o.json"
    args = ["--profile", str(MLP), "--topology", str(topo), "--stages", "0-2:gpu0;3-5:gpu1"]
    line = _refused(capsys, "simulate", *args, "-m", "4", "-o", str(out), "--json")
    assert "links[0].bandwidth" in line and not out.exists()


def test_import_never_shows_a_file_that_is_not_a_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n")
    line = _refused(capsys, "import", "pipedream", str(secret), "-o", str(tmp_path / "p.json"))
    assert "id_rsa: line 1: not a PipeDream graph.txt" in line
    assert "PRIVATE" not in line and "BEGIN" not in line
    graph = tmp_path / "graph.txt"
    node = "node1 -- Input -- forward_compute_time={}, backward_compute_time=0.0, "
    graph.write_text(node.format("1e400") + "activation_size=1.0, parameter_size=0.0\n")
    line = _refused(capsys, "import", "pipedream", str(graph), "-o", str(tmp_path / "p.json"))
    assert "graph.txt: line 1: expected times up to" in line


@pytest.mark.parametrize("name", ["gpu\x1b[2J\x1b[31m0", "[/x]", "[bold]0", ":smile:"])
def test_names_are_shown_as_text_never_as_terminal_codes_or_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A topology device name with an escape is refused with it escaped; names that look
    like rich markup or emoji codes are printed as they are."""
    topo = tmp_path / "t.yaml"
    topo.write_text(_topology(name=json.dumps(name)))
    plan = tmp_path / "plan.json"
    args = ["--profile", str(MLP), "--topology", str(topo), "--stages", f"0-2:{name};3-5:gpu1"]
    code, out, err = _run(capsys, "simulate", *args, "-m", "2", "-o", str(plan))
    assert "\x1b" not in out + err and "Traceback" not in err
    if "\x1b" in name:
        assert code == 2 and "\\x1b[2J" in err
        return
    assert code == 0, err
    code, out, err = _run(capsys, "show", str(plan))
    assert code == 0, err
    stage_row = next(line for line in out.splitlines() if re.search(r"\b0-2\b", line))
    device_rows = [line for line in out.splitlines() if "MiB" in line and "%" in line]
    assert name in stage_row and name in device_rows[0]


def test_detect_refuses_an_nvlink_count_of_any_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for count in (DIGITS, "99999999"):
        matrix = tmp_path / "topo.txt"
        matrix.write_text(f"\tGPU0\tGPU1\nGPU0\t X \tNV{count}\nGPU1\tNV{count}\t X \n")
        args = ["topology", "detect", "--from-file", str(matrix), "--memory", "80 GiB"]
        line = _refused(capsys, *args)
        assert "topo.txt: unknown link kind 'NV9999" in line and "expected X" in line


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["-b", "99999999999"], "-b: expected an integer from 1 to 1,000,000"),
        (["--repeat", str(10**12)], "--repeat: expected an integer from 1 to 10,000"),
        (["--warmup", str(10**12)], "--warmup: expected an integer from 0 to 10,000"),
        (
            ["--min-time", "1e12"],
            "--min-time: expected seconds from 0 to 3600, got 1000000000000.0",
        ),
        (["--min-time", "nan"], "--min-time: expected seconds from 0 to 3600"),
        (["--min-time", "-1"], "--min-time: expected seconds from 0 to 3600"),
    ],
)
def test_profile_refuses_counts_it_would_allocate_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    out = tmp_path / "p.json"
    model = str(ROOT / "examples" / "mlp.py")
    assert needle in _refused(capsys, "profile", model, "-o", str(out), *flags)
    assert not out.exists()


def test_strict_decoding_names_the_field_and_allows_yaml_merge_keys() -> None:
    from planner.datafile import decode_json, decode_yaml
    from planner.errors import InputError

    cases = [
        (lambda: decode_json('{"a": [{"b": 1, "b": 2}]}', source="f.json"), "a[0]", "'b'"),
        (lambda: decode_json('{"a": {"n": NaN}}', source="f.json"), "a.n", "finite"),
        (lambda: decode_json('{"a": [1e400]}', source="f.json"), "a[0]", "finite"),
        (lambda: decode_json('{"a": ' + "[" * 70 + "]" * 70 + "}", source="f.json"), "a", "64"),
        (lambda: decode_yaml("a:\n  b: 1\n  b: 2\n", source="f.yaml"), "a", "'b'"),
        (lambda: decode_yaml(f"a: {DIGITS}\n", source="f.yaml"), "a", "5000 digits"),
    ]
    for decode, field, needle in cases:
        with pytest.raises(InputError) as info:
            decode()
        assert info.value.field == field and needle in info.value.message
        assert info.value.file in ("f.json", "f.yaml")
    merged = decode_yaml("base: &b {bw: 1, lat: 2}\nlink:\n  <<: *b\n  bw: 3\n", source="f.yaml")
    assert merged["link"] == {"bw": 3, "lat": 2}


def test_printable_escapes_what_a_terminal_would_act_on() -> None:
    from planner.terminal import printable

    assert printable("gpu0 [bold] :smile: µs") == "gpu0 [bold] :smile: µs"
    assert printable("a\x1b[2Jb\u202ec\nd") == "a\\x1b[2Jb\\u202ec\\nd"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--steps", "99999999999"], "--steps: expected an integer from 1 to 1,000,000"),
        (["--warmup", "99999999999"], "--warmup: expected an integer from 0 to 1,000,000"),
        (["--threads", "99999999"], "--threads: expected an integer from 1 to 4,096"),
    ],
)
def test_run_refuses_counts_without_bound_before_any_process_starts(
    plan: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    """--steps / --warmup ran until killed, --threads 99999999 crashed a rank (blamed on
    model.py): each is one line now, before any rank starts."""
    model = str(ROOT / "examples" / "mlp.py")
    assert needle in _refused(capsys, "run", str(plan), "--model", model, *flags)


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--bandwidth", "NV=1e-300 B/s"], "--bandwidth NV"),
        (["--bandwidth", "SYS=1e30 GB/s"], "--bandwidth SYS"),
        (["--speed", "1e7"], "--speed"),
        (["--memory", "1e30 GiB"], "--memory"),
        (["--name", "x\x1b[31m"], "--name"),
    ],
)
def test_detect_refuses_flags_that_would_write_a_topology_check_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], field: str
) -> None:
    """Each wrote a file (exit 0) that `topology check` then refused (hostile re-test)."""
    out = tmp_path / "d.yaml"
    matrix = ROOT / "tests" / "data" / "nvidia-smi" / "dgx-a100.txt"
    args = ["topology", "detect", "--from-file", str(matrix), *flags, "-o", str(out)]
    assert f": {field}: " in _refused(capsys, *args)
    assert not out.exists()

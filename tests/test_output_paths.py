"""Output and input paths of every command, tried as a hostile user would.

Every writer of every command (solve, simulate, profile, import and topology detect ``-o``;
show and simulate ``--svg/--html/--trace``; topology show ``--svg``; run ``--trace``,
``--calibrate``, ``--save-params``; export ``-o DIR``; demo ``--out DIR``) is given every
kind of bad destination: a missing folder, an unwritable one, a name longer than the file
system allows, a folder (or, for a folder output, a file), a pipe, a path under a file, and
(with the command's first output flag) each of its own inputs, also through a symlink and
a hard link. Each must be refused before any work with one line naming the flag and the
path, exit 2, and leave every file as it was: no output, no temporary, the other outputs of
the same command not written either (all or nothing), no input replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.errors import InputError
from planner.outputs import Outputs, WriteFailed, _signals_held

ROOT = Path(__file__).resolve().parent.parent
GPUS = ROOT / "tests" / "data" / "nvidia-smi" / "dgx-h100.txt"
# One timed round, no minimum time: a profile these tests write but never read the times of.
QUICK_PROFILE = ("--repeat", "1", "--warmup", "0", "--min-time", "0", "-q")
GRAPH = (
    "node1 -- Linear(in_features=4, out_features=4) -- forward_compute_time=1.0, "
    "backward_compute_time=2.0, activation_size=16.0, parameter_size=80.0\n"
    "node2 -- ReLU() -- forward_compute_time=0.5, backward_compute_time=0.5, "
    "activation_size=16.0, parameter_size=0.0\n"
    "\tnode1 -- node2\n"
)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs ``args``; asserts exit 2, one line on stderr and no traceback; returns the line."""
    code, _, err = _run(args, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a file's bytes, else what it is."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = f"link to {os.readlink(path)}"
        elif path.is_dir():
            out[key] = "folder"
        elif path.is_file():
            out[key] = path.read_bytes()
        else:
            out[key] = "special"
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with every command's inputs: the mlp model, its profile, the CPU topology,
    a plan made from them (naming them beside it), a PipeDream graph and nvidia-smi output."""
    folder = tmp_path_factory.mktemp("inputs")
    shutil.copy(ROOT / "examples" / "mlp.py", folder / "mlp.py")
    shutil.copy(ROOT / "profiles" / "mlp.json", folder / "mlp.json")
    shutil.copy(ROOT / "topologies" / "cpu.yaml", folder / "cpu.yaml")
    shutil.copy(GPUS, folder / "gpus.txt")
    (folder / "graph.txt").write_text(GRAPH)
    here = Path.cwd()
    os.chdir(folder)  # the plan names its profile and topology relative to itself
    try:
        with pytest.raises(SystemExit) as info:
            main(
                ["simulate", "--profile", "mlp.json", "--topology", "cpu.yaml", "--stages"]
                + ["0-2:cpu0;3-5:cpu1", "-m", "4", "-o", "plan.json", "--json"]
            )
    finally:
        os.chdir(here)
    assert info.value.code in (0, None)
    return folder


@pytest.fixture
def case(inputs: Path, tmp_path: Path) -> Path:
    """A fresh copy of the inputs, with a folder ``D``, a file ``a-file``, a pipe ``fifo``."""
    folder = tmp_path / "case"
    shutil.copytree(inputs, folder)
    (folder / "D").mkdir()
    (folder / "a-file").write_text("not a folder\n")
    os.mkfifo(folder / "fifo")
    return folder


def _chattr(flag: str, folder: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", flag, str(folder)], capture_output=True, check=False)
    return done.returncode == 0


@contextlib.contextmanager
def _unwritable(folder: Path) -> Iterator[bool]:
    """Make ``folder`` unwritable for this process (root: immutable); yields whether that
    worked, and undoes it."""
    folder.mkdir(exist_ok=True)
    folder.chmod(0o555)
    immutable = os.geteuid() == 0 and _chattr("+i", folder)
    try:
        probe = folder / ".probe"
        try:
            probe.touch()
        except OSError:
            yield True
        else:
            probe.unlink()
            yield False
    finally:
        if immutable:
            _chattr("-i", folder)
        folder.chmod(0o755)


@dataclass(frozen=True)
class Writer:
    """A command that writes: its arguments (``{d}`` the case folder), its output flags,
    the flags that take a folder, and the input files (in the case folder) it reads."""

    name: str
    args: tuple[str, ...]
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    folders: frozenset[str] = frozenset()

    def argv(self, folder: Path) -> list[str]:
        return [a.replace("{d}", str(folder)) for a in self.args]


WRITERS = (
    Writer(
        "solve",
        ("solve", "--profile", "{d}/mlp.json", "--topology", "{d}/cpu.yaml", "--microbatches", "4"),
        ("-o",),
        ("mlp.json", "cpu.yaml"),
    ),
    Writer(
        "simulate",
        ("simulate", "--profile", "{d}/mlp.json", "--topology", "{d}/cpu.yaml")
        + ("--stages", "0-2:cpu0;3-5:cpu1", "--no-gantt"),
        ("-o", "--svg", "--html", "--trace"),
        ("mlp.json", "cpu.yaml"),
    ),
    Writer(
        "simulate --plan",
        ("simulate", "--plan", "{d}/plan.json", "--schedule", "gpipe", "--no-gantt"),
        ("-o", "--svg"),
        ("plan.json", "mlp.json", "cpu.yaml"),
    ),
    Writer(
        "show",
        ("show", "{d}/plan.json", "--no-gantt"),
        ("--svg", "--html", "--trace"),
        ("plan.json", "mlp.json", "cpu.yaml"),
    ),
    Writer(
        "profile",
        ("profile", "{d}/mlp.py", "-b", "1", *QUICK_PROFILE),
        ("-o",),
        ("mlp.py",),
    ),
    Writer("import", ("import", "pipedream", "{d}/graph.txt"), ("-o",), ("graph.txt",)),
    Writer(
        "topology detect",
        ("topology", "detect", "--from-file", "{d}/gpus.txt"),
        ("-o",),
        ("gpus.txt",),
    ),
    Writer("topology show", ("topology", "show", "{d}/cpu.yaml"), ("--svg",), ("cpu.yaml",)),
    Writer(
        "run",
        ("run", "{d}/plan.json", "--model", "{d}/mlp.py", "--steps", "1", "--timeout", "30"),
        ("--trace", "--calibrate", "--save-params"),
        ("plan.json", "mlp.py", "mlp.json", "cpu.yaml"),
    ),
    Writer("export", ("export", "{d}/plan.json", "--to", "torch"), ("-o",), (), frozenset({"-o"})),
    Writer(
        "demo", ("demo", "--model", "mlp", "--steps", "1"), ("--out",), (), frozenset({"--out"})
    ),
)

Bad = Callable[[Path], Path]
"""A bad destination, made in the case folder."""


def _symlink_to(name: str) -> Bad:
    def make(folder: Path) -> Path:
        (folder / "link").symlink_to(folder / name)
        return folder / "link"

    return make


def _hard_link_to(name: str) -> Bad:
    def make(folder: Path) -> Path:
        os.link(folder / name, folder / "hard-link")
        return folder / "hard-link"

    return make


FILE_KINDS: dict[str, Bad] = {
    "missing folder": lambda d: d / "no-such-folder" / "out.x",
    "unwritable folder": lambda d: d / "read-only" / "out.x",
    "name too long": lambda d: d / ("n" * 300 + ".x"),
    "a folder": lambda d: d / "D",
    "a pipe": lambda d: d / "fifo",
    "under a file": lambda d: d / "a-file" / "out.x",
}
FOLDER_KINDS: dict[str, Bad] = {
    "missing folder": lambda d: d / "no-such-folder" / "out",
    "unwritable folder": lambda d: d / "read-only" / "out",
    "name too long": lambda d: d / ("n" * 300),
    "a file": lambda d: d / "a-file",
    "under a file": lambda d: d / "a-file" / "out",
}


def _cases() -> list[tuple[Writer, str, str, Bad]]:
    cases = []
    for writer in WRITERS:
        for flag in writer.outputs:
            if flag in writer.folders:
                kinds = dict(FOLDER_KINDS)
                if writer.name == "demo":  # demo makes missing folders above --out
                    del kinds["missing folder"]
            else:
                kinds = dict(FILE_KINDS)
            if flag == writer.outputs[0] and writer.inputs:  # one flag is enough for these
                for name in writer.inputs:
                    kinds[f"the input {name}"] = lambda d, name=name: d / name
                kinds["a symlink to an input"] = _symlink_to(writer.inputs[0])
                kinds["a hard link to an input"] = _hard_link_to(writer.inputs[-1])
            cases.extend((writer, flag, kind, make) for kind, make in kinds.items())
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    ("writer", "flag", "kind", "make"),
    CASES,
    ids=[f"{w.name} {flag}: {kind}" for w, flag, kind, _ in CASES],
)
def test_every_writer_refuses_every_bad_destination_before_any_work(
    writer: Writer,
    flag: str,
    kind: str,
    make: Bad,
    case: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(case)  # default outputs (profile, import) would land here
    bad = make(case)
    others = [f for f in writer.outputs if f != flag]
    args = writer.argv(case) + [flag, str(bad)]
    for other in others:  # the command's other outputs, good ones: not written either
        args += [other, str(case / f"good{other}.out")]
    with _unwritable(case / "read-only") as locked:
        if kind == "unwritable folder" and not locked:
            pytest.skip("cannot make a folder this process cannot write")
        before = _snapshot(case)
        line = _refused(args, capsys)
        after = _snapshot(case)
    assert f": {flag}: " in line, line
    assert str(bad)[-40:] in line, line
    assert after == before  # nothing written, nothing replaced, no temporary left


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["solve", "--profile", "{d}/D", "--topology", "{d}/cpu.yaml"], "--profile"),
        (["solve", "--profile", "{d}/mlp.json", "--topology", "{d}/D"], "--topology"),
        (["simulate", "--profile", "{d}/D", "--stages", "0-2:a;3-5:b"], "--profile"),
        (["simulate", "--plan", "{d}/D"], "--plan"),
        (["simulate", "--profile", "{d}/mlp.json", "--stages", "{d}/D"], "--stages"),
        (
            ["simulate", "--profile", "{d}/mlp.json", "--stages", "0-5:a", "--schedule", "{d}/D"],
            "--schedule",
        ),
        (["show", "{d}/D"], None),
        (["run", "{d}/D", "--model", "{d}/mlp.py"], None),
        (["export", "{d}/D", "--to", "torch"], None),
        (["topology", "check", "{d}/D"], None),
        (["topology", "show", "{d}/D"], None),
        (["topology", "detect", "--from-file", "{d}/D"], "--from-file"),
    ],
)
def test_a_folder_given_as_an_input_file_is_named_a_folder(
    args: list[str], flag: str | None, case: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _refused([a.replace("{d}", str(case)) for a in args], capsys)
    assert f"{case / 'D'}: " in line and "is a folder, expected a file" in line, line
    if flag is not None:
        assert f": {flag}: " in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["show", "{d}/plan.json", "--no-gantt"],
        ["simulate", "--plan", "{d}/plan.json", "--no-gantt"],
        ["run", "{d}/plan.json", "--model", "{d}/mlp.py", "--steps", "1"],
        ["export", "{d}/plan.json", "--to", "torch", "-o", "{d}/out"],
    ],
)
def test_a_plan_whose_profile_path_is_a_folder_says_so(
    args: list[str], case: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = case / "plan.json"
    plan.write_text(plan.read_text().replace('"path": "mlp.json"', '"path": "D"'))
    line = _refused([a.replace("{d}", str(case)) for a in args], capsys)
    assert line.startswith(f"pipeplan: error: {plan}: profile.path: "), line
    assert "'D' is a folder, expected a file" in line, line


@contextlib.contextmanager
def _as_nobody() -> Iterator[None]:
    """Root reads every file: run the block as the unprivileged user ``nobody``."""
    if os.geteuid() != 0:
        yield
        return
    try:
        os.setegid(65534)
        os.seteuid(65534)
    except OSError:
        pytest.skip("cannot drop root privileges here")
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["solve", "--profile", "{d}/mlp.json", "--topology", "{d}/cpu.yaml"], "--profile"),
        (["simulate", "--profile", "{d}/mlp.json", "--stages", "0-2:a;3-5:b"], "--profile"),
        (["show", "{d}/mlp.json"], None),
    ],
)
def test_an_unreadable_input_is_permission_denied(
    args: list[str], flag: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="pipeplan-unreadable-"))
    try:
        folder.chmod(0o755)  # reachable by the unprivileged user
        shutil.copy(ROOT / "profiles" / "mlp.json", folder / "mlp.json")
        shutil.copy(ROOT / "topologies" / "cpu.yaml", folder / "cpu.yaml")
        (folder / "mlp.json").chmod(0)
        with _as_nobody():
            line = _refused([a.replace("{d}", str(folder)) for a in args], capsys)
        assert f"{folder / 'mlp.json'}: " in line, line
        assert "cannot be read (permission denied)" in line, line
        if flag is not None:
            assert f": {flag}: " in line, line
    finally:
        shutil.rmtree(folder)


def test_several_outputs_are_written_together_with_no_temporary_left(
    case: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = case / "out"
    out.mkdir()
    names = {"-o": "p.json", "--svg": "g.svg", "--html": "g.html", "--trace": "t.json"}
    args = ["simulate", "--plan", str(case / "plan.json"), "--no-gantt", "--json"]
    for flag, name in names.items():
        args += [flag, str(out / name)]
    code, _, err = _run(args, capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(names.values())


def test_export_into_the_plans_folder_never_replaces_the_plan(
    case: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan is named like one of export's files: refused, nothing written beside it."""
    plan = case / "pipeline.json"
    (case / "plan.json").rename(plan)
    before = _snapshot(case)
    line = _refused(["export", str(plan), "--to", "torch", "-o", str(case)], capsys)
    assert f"{plan}: -o: is the same file as the plan" in line, line
    assert _snapshot(case) == before


def test_run_calibrate_without_the_plans_profile_is_refused_before_the_model_loads(
    case: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--calibrate needs the plan's profile: refused before anything runs (the model.py,
    which marks its import, is never loaded), not after training."""
    plan = case / "plan.json"
    plan.write_text(plan.read_text().replace('"path": "mlp.json"', '"path": "gone.json"'))
    model = case / "marked.py"
    marker = case / "imported"
    model.write_text(
        (case / "mlp.py").read_text()
        + "\n\nimport os, pathlib\n\npathlib.Path(os.environ['MARKER']).touch()\n"
    )
    monkeypatch.setenv("MARKER", str(marker))
    args = ["run", str(plan), "--model", str(model), "--steps", "1"]
    line = _refused([*args, "--calibrate", str(case / "c.json")], capsys)
    assert f"{plan}: --calibrate: the plan's profile was not found" in line, line
    assert not marker.exists() and not (case / "c.json").exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["run", "{plan}", "--steps", "1", "--calibrate", ""], "--calibrate"),
        (["simulate", "--plan", "{plan}", "--trace="], "--trace"),
        (["solve", "", "--topology", "{plan}"], "argument"),
        (["export", "{plan}", "--to", "torch", "-o", " "], "-o"),
    ],
)
def test_an_empty_value_is_refused_naming_its_option(
    case: Path, capsys: pytest.CaptureFixture[str], args: list[str], flag: str
) -> None:
    """An empty value is never read as the current folder (Path("") is "."): one line
    naming the option, before anything runs or is written."""
    before = _snapshot(case)
    line = _refused([a.format(plan=case / "plan.json") for a in args], capsys)
    assert f"{flag}: expected a value, got an empty string" in line, line
    assert _snapshot(case) == before


def test_a_write_that_fails_after_its_checks_is_one_line_exit_1_and_leaves_nothing(
    case: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose build_model removes the output folder while it is profiled: the
    checks passed, the write cannot succeed; one line, exit 1, nothing written."""
    out = case / "out"
    out.mkdir()
    model = case / "hostile.py"
    model.write_text(
        (case / "mlp.py").read_text()
        + "\n\n_build = build_model\n\n\ndef build_model():\n"
        + "    import os, shutil\n\n"
        + "    shutil.rmtree(os.environ['HOSTILE_REMOVES'], ignore_errors=True)\n"
        + "    return _build()\n"
    )
    monkeypatch.setenv("HOSTILE_REMOVES", str(out))
    args = ["profile", str(model), "-b", "1", *QUICK_PROFILE]
    code, _, err = _run([*args, "-o", str(out / "p.json")], capsys)
    lines = err.strip().splitlines()
    assert code == 1, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{out / 'p.json'}: -o: could not be written" in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in case.iterdir() if p.name.startswith(".")]


_NAMES = st.builds(
    lambda text, padding: text + "n" * padding,
    st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"),
        min_size=1,
        max_size=40,
    ).filter(lambda name: name not in (".", "..")),
    st.integers(min_value=0, max_value=300),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=_NAMES)
def test_any_file_name_is_written_whole_or_refused_in_one_line(
    name: str,
    inputs: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Any name (any characters, some over the file system's 255 bytes): written whole (and
    only it), or refused with one line that names the flag, exit 2, and nothing written."""
    out = tmp_path_factory.mktemp("names")
    target = out / name
    args = ["show", str(inputs / "plan.json"), "--no-gantt", "--json", "--svg", str(target)]
    code, _, err = _run(args, capsys)
    written = list(out.iterdir())
    if len(os.fsencode(name)) > 255:
        assert code == 2 and written == []
        assert len(err.strip().splitlines()) == 1 and ": --svg: " in err, err
    else:
        assert code == 0 and written == [target]
        assert target.read_text().startswith("<svg")


# ------------------------------------------------------------ the mechanism itself


def _leftovers(*folders: Path) -> list[str]:
    return sorted(p.name for folder in folders if folder.exists() for p in folder.iterdir())


def test_outputs_touch_the_disk_only_at_commit(tmp_path: Path) -> None:
    outs = Outputs()
    first = outs.file(tmp_path / "a.json", "-o")
    second = outs.file(tmp_path / "new" / "b.svg", "--svg", make_folder=True)
    folder = outs.folder(tmp_path / "made" / "dir", "--out", make_folder=True)
    outs.write_json(first, {"a": 1})
    outs.write_text(second, "<svg/>")
    outs.write_text(folder / "x.csv", "1,2\n")
    assert _leftovers(tmp_path) == []
    written = outs.commit()
    assert written == [first, second, folder / "x.csv"]
    assert json.loads(first.read_text()) == {"a": 1} and second.read_text() == "<svg/>"
    assert (folder / "x.csv").read_text() == "1,2\n"
    assert _leftovers(tmp_path) == ["a.json", "made", "new"]
    assert _leftovers(tmp_path / "made") == ["dir"] and _leftovers(folder) == ["x.csv"]


def test_a_write_failing_at_commit_leaves_no_output_and_no_temporary(tmp_path: Path) -> None:
    """The second output's folder turns unwritable after the checks: WriteFailed (exit 1),
    one line naming the flag and path; the first output is not written either."""
    good, bad = tmp_path / "good", tmp_path / "read-only"
    good.mkdir()
    bad.mkdir()
    outs = Outputs()  # declared while both folders are writable
    first = outs.file(good / "a.json", "-o")
    second = outs.file(bad / "b.svg", "--svg")
    outs.write_json(first, {})
    outs.write_text(second, "<svg/>")
    with _unwritable(bad) as locked:
        if not locked:
            pytest.skip("cannot make a folder this process cannot write")
        with pytest.raises(WriteFailed) as info:
            outs.commit()
    line = str(info.value)
    assert line.startswith(f"{second}: --svg: could not be written (") and "\n" not in line
    assert _leftovers(good, bad) == []


def test_a_rename_failing_at_commit_undoes_the_renames_before_it(tmp_path: Path) -> None:
    """The second target became a folder after the checks: the first output, already
    renamed into place, is removed again; no temporary is left."""
    outs = Outputs()
    first = outs.file(tmp_path / "a.json", "-o")
    second = outs.file(tmp_path / "b.svg", "--svg")
    outs.write_json(first, {})
    outs.write_text(second, "<svg/>")
    second.mkdir()
    (second / "keep").write_text("x")
    with pytest.raises(WriteFailed, match="--svg: could not be written"):
        outs.commit()
    assert _leftovers(tmp_path) == ["b.svg"] and _leftovers(second) == ["keep"]


def test_outputs_refuse_inputs_added_later_and_each_other(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    outs = Outputs()
    outs.file(tmp_path / "copy.json", "-o")
    os.link(plan, tmp_path / "copy.json")  # a hard link made after the declaration
    with pytest.raises(InputError, match="-o: is the same file as the plan"):
        outs.add_inputs([("the plan", plan)])
    with pytest.raises(InputError, match="--svg and --html name the same path"):
        both = Outputs()
        both.file(tmp_path / "x.svg", "--svg")
        both.file(tmp_path / "." / "x.svg", "--html")
    with pytest.raises(ValueError, match="was not declared"):
        Outputs().write_text(tmp_path / "undeclared.txt", "")


def test_a_link_in_an_output_folder_is_written_through_or_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """A file of an output folder that is a symbolic link: written through to its target,
    as a declared file is, unless the target is an input (one line naming both)."""
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    (tmp_path / "other.txt").write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.csv").symlink_to(tmp_path / "other.txt")
    (out / "b.json").symlink_to(plan)
    outs = Outputs([("the plan", plan)])
    outs.folder(out, "-o")
    assert outs.write_text(out / "a.csv", "new") == tmp_path / "other.txt"
    with pytest.raises(InputError, match=r"b.json: -o: is the same file as the plan .* links to"):
        outs.write_text(out / "b.json", "{}")
    outs.commit()
    assert (tmp_path / "other.txt").read_text() == "new" and plan.read_text() == "{}"


def test_ctrl_c_during_the_renames_waits_until_they_are_done() -> None:
    """A commit's renames run with Ctrl-C held: it arrives, as KeyboardInterrupt, after."""
    arrived = []
    # Python's own Ctrl-C handler, whatever the suite inherited (a background job ignores it).
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _signals_held():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler would have run by now
                    arrived.append(len(arrived))
            pytest.fail("the held Ctrl-C did not arrive after the block")
    finally:
        signal.signal(signal.SIGINT, saved)
    assert len(arrived) == 1000


def test_an_output_through_a_symbolic_link_writes_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o latest.json`` where latest.json links elsewhere writes the file it links to, as a
    shell's ``>`` does (the link stays a link); a link into a missing folder is refused
    before anything is simulated, naming the folder."""
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "plan.json"
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    base = ["simulate", "--profile", str(ROOT / "profiles" / "mlp.json")]
    base += ["--topology", str(ROOT / "topologies" / "cpu.yaml"), "--stages", "0-2:cpu0;3-5:cpu1"]
    code, _, err = _run([*base, "--no-gantt", "-o", str(link)], capsys)
    assert code == 0, err
    assert link.is_symlink() and json.loads(target.read_text())["stages"]
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "missing" / "plan.json")
    line = _refused([*base, "-o", str(dangling)], capsys)
    assert "missing" in line and "does not exist" in line
    assert not (tmp_path / "missing").exists() and dangling.is_symlink()

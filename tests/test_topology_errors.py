"""Bad topology files: one clear line naming file, field and expectation; exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cli import main

GOOD = """\
name: t
devices:
  - {name: gpu0, memory: 16 GiB}
  - {name: gpu1, memory: 16 GiB}
switches: [sw]
links:
  - {between: [gpu0, sw], bandwidth: 25 GB/s, latency: 1 us}
  - {between: [gpu1, sw], bandwidth: 25 GB/s, latency: 1 us}
"""


def _check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as info:
        main(["topology", "check", str(path)])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), err


def test_the_good_file_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _check(tmp_path, GOOD, capsys)
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    ("old", "new", "field", "expectation"),
    [
        (
            "memory: 16 GiB}\n  - {name: gpu1",
            "memory: 16 Gigs}\n  - {name: gpu1",
            "devices[0].memory",
            "unknown unit 'Gigs'",
        ),
        (
            "bandwidth: 25 GB/s, latency: 1 us}\n  - {between: [gpu1",
            "bandwidth: 25 GB/sec, latency: 1 us}\n  - {between: [gpu1",
            "links[0].bandwidth",
            "unknown unit 'GB/sec'",
        ),
        (
            "latency: 1 us}\n  - {between: [gpu1",
            "latency: 1 fortnight}\n  - {between: [gpu1",
            "links[0].latency",
            "unknown unit",
        ),
        (
            "memory: 16 GiB}\n  - {name: gpu1",
            "memory: 16}\n  - {name: gpu1",
            "devices[0].memory",
            "with a unit",
        ),
        (
            "bandwidth: 25 GB/s, latency: 1 us}\n  - {between: [gpu1",
            "bandwidth: -25 GB/s, latency: 1 us}\n  - {between: [gpu1",
            "links[0].bandwidth",
            "positive bandwidth",
        ),
        (
            "bandwidth: 25 GB/s, latency: 1 us}\n  - {between: [gpu1",
            "bandwidth: 0 GB/s, latency: 1 us}\n  - {between: [gpu1",
            "links[0].bandwidth",
            "positive bandwidth",
        ),
        (
            "memory: 16 GiB}\n  - {name: gpu1",
            "memory: 0 GiB}\n  - {name: gpu1",
            "devices[0].memory",
            "positive size",
        ),
        (
            "memory: 16 GiB}\n  - {name: gpu1",
            "memory: -1 GiB}\n  - {name: gpu1",
            "devices[0].memory",
            "positive size",
        ),
        (
            "latency: 1 us}\n  - {between: [gpu1",
            "latency: -1 us}\n  - {between: [gpu1",
            "links[0].latency",
            ">= 0",
        ),
        (
            "{between: [gpu1, sw]",
            "{between: [gpu9, sw]",
            "links[1].between",
            "'gpu9' is not a declared device or switch",
        ),
        ("{name: gpu1, memory", "{name: gpu0, memory", "devices[1].name", "duplicate name 'gpu0'"),
        ("switches: [sw]", "switches: [gpu1]", "switches[0]", "duplicate name 'gpu1'"),
        (
            "  - {between: [gpu1, sw], bandwidth: 25 GB/s, latency: 1 us}\n",
            "",
            "links",
            "device 'gpu1' is not connected to 'gpu0'",
        ),
        (
            "{name: gpu1, memory: 16 GiB}",
            "{name: gpu1, memory: 16 GiB, speed: 0}",
            "devices[1].speed",
            "positive number",
        ),
        (
            "{name: gpu1, memory: 16 GiB}",
            "{name: gpu1, memroy: 16 GiB}",
            "devices[1].memroy",
            "unknown field; expected one of host, kind, memory, message_overhead, name, speed",
        ),
        (
            "{name: gpu1, memory: 16 GiB}",
            "{name: gpu1, memory: 16 GiB, message_overhead: -1 us}",
            "devices[1].message_overhead",
            "a time >= 0",
        ),
        (
            "{name: gpu1, memory: 16 GiB}",
            "{name: gpu1, memory: 16 GiB, message_overhead: 3}",
            "devices[1].message_overhead",
            "a time with a unit",
        ),
        ("{name: gpu1, memory: 16 GiB}", "{name: gpu1}", "devices[1].memory", "missing"),
        (
            "latency: 1 us}\n  - {between: [gpu1",
            "count: 0}\n  - {between: [gpu1",
            "links[0].count",
            "whole number >= 1",
        ),
        ("{between: [gpu1, sw]", "{between: [gpu1]", "links[1].between", "two names"),
        (
            "  - {between: [gpu1, sw], bandwidth: 25 GB/s, latency: 1 us}\n",
            "  - {between: [gpu1, sw], bandwidth: 25 GB/s, latency: 1 us}\n"
            "  - {between: [sw, gpu1], bandwidth: 25 GB/s}\n",
            "links[2].between",
            "second link between 'gpu1' and 'sw'",
        ),
        ("name: t\n", "name: t\nschema: pipeplan.topology/v9\n", "schema", "pipeplan.topology/v1"),
    ],
)
def test_bad_input_is_one_line_naming_file_field_and_expectation(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    field: str,
    expectation: str,
) -> None:
    assert old in GOOD
    code, err = _check(tmp_path, GOOD.replace(old, new, 1), capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert f"topo.yaml: {field}: " in lines[0]
    assert expectation in lines[0]


@pytest.mark.parametrize(
    ("text", "expectation"),
    [
        ("- gpu0\n- gpu1\n", "expected a mapping with 'devices' and 'links' at the top; got list"),
        ("just a string\n", "expected a mapping"),
        ("", "expected a mapping with 'devices' and 'links' at the top; got empty"),
        ("name: t\nlinks: []\n", "devices: missing; expected a list of devices"),
        ("devices: []\n", "devices: expected a non-empty list"),
        ("devices: {gpu0: 1}\n", "devices: expected a non-empty list"),
        ("devices: [\n", "not valid YAML at line"),
        ("devices:\n  - {name: g, memory: 1 GiB}\ncolour: red\n", "colour: unknown field"),
        ("devices:\n  - {name: g, memory: 1 GiB}\nswitches: [s]\n", "switch 's' has no links"),
        (
            "allreduce_efficiency: 1.5\ndevices:\n  - {name: g, memory: 1 GiB}\n",
            "allreduce_efficiency: expected a number in (0, 1]; got 1.5",
        ),
        (
            "allreduce_efficiency: fast\ndevices:\n  - {name: g, memory: 1 GiB}\n",
            "allreduce_efficiency: expected a number in (0, 1]; got 'fast'",
        ),
    ],
)
def test_malformed_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expectation: str
) -> None:
    code, err = _check(tmp_path, text, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "topo.yaml" in err and expectation in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["topology", "show", str(tmp_path / "nope.yaml")])
    assert info.value.code == 2
    assert "nope.yaml: file does not exist" in capsys.readouterr().err

"""``pipeplan topology show`` and ``check``: tables, JSON, the SVG picture."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parent.parent
TOPOS = ROOT / "topologies"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_show_prints_devices_and_the_bandwidth_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["topology", "show", str(TOPOS / "hetero.yaml")], capsys)
    assert code == 0
    for text in ("a100_0", "v100_3", "80 GiB", "32 GiB", "0.36", "node1", "GB/s"):
        assert text in out
    assert "12.5" in out and "300" in out  # Ethernet and NVSwitch bottlenecks


def test_show_lists_message_overheads_where_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["topology", "show", str(TOPOS / "hetero.yaml")], capsys)
    assert code == 0 and "message overhead" not in out
    path = tmp_path / "cpu.yaml"
    path.write_text(
        "devices:\n"
        "  - {name: 'cpu{0..1}', memory: 4 GiB, kind: cpu, message_overhead: 250 us}\n"
        "links:\n  - {between: [cpu0, cpu1], bandwidth: 3 GB/s}\n"
    )
    code, out, _ = _run(["topology", "show", str(path)], capsys)
    assert code == 0 and "message overhead" in out and "250 us" in out


def test_show_json_has_matrices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["topology", "show", str(TOPOS / "two-node-ib.yaml"), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["devices"] == 16 and data["hosts"] == 2
    bw = data["bandwidth_bytes_per_s"]
    assert bw[0][0] is None and bw[0][1] == 450e9 and bw[0][8] == 50e9
    assert data["latency_ms"][0][8] == pytest.approx(0.005)
    assert data["normalized"]["devices"][8]["host"] == "node1"


def test_show_svg_is_a_valid_picture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "dgx1.svg"
    code, out, _ = _run(
        ["topology", "show", str(TOPOS / "dgx1-v100.yaml"), "--svg", str(target)], capsys
    )
    assert code == 0 and f"wrote {target}" in out
    root = ET.fromstring(target.read_text())
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    assert len(root.findall(f"{ns}circle")) >= 8  # one per device (+ legend)
    assert len(root.findall(f"{ns}line")) == 29  # one per link
    assert "gpu7" in target.read_text() and "50 GB/s" in target.read_text()
    # Deterministic: drawing twice gives the same file.
    again = tmp_path / "again.svg"
    _run(["topology", "show", str(TOPOS / "dgx1-v100.yaml"), "--svg", str(again)], capsys)
    assert again.read_text() == target.read_text()


def test_show_svg_checks_the_path_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        ["topology", "show", str(TOPOS / "nvlink.yaml"), "--svg", str(tmp_path / "no/x.svg")],
        capsys,
    )
    assert code == 2 and "--svg" in err and "does not exist" in err


@pytest.mark.parametrize("name", sorted(p.name for p in TOPOS.glob("*.yaml")))
def test_check_passes_every_preset(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["topology", "check", str(TOPOS / name)], capsys)
    assert code == 0 and out.startswith("ok: ")
    code, out, _ = _run(["topology", "check", str(TOPOS / name), "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"] is True


def test_check_normalized_expands_shorthands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        ["topology", "check", str(TOPOS / "two-node-ib.yaml"), "--normalized"], capsys
    )
    assert code == 0
    assert "{name: gpu15, memory: 80 GiB, speed: 1.0, host: node1, kind: H100}" in out
    assert "{between: [gpu15, ib], bandwidth: 50 GB/s, count: 1, latency: 2.5 us" in out


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("show", "check", "detect"):  # in this process: `-m planner.cli` is test_show's
        code, out, err = _run(["topology", verb, "--help"], capsys)
        assert code == 0, err
        assert "Example" in out and "pipeplan topology" in out

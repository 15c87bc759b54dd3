"""python -m bench: marker handling of docs/benchmarks.md and the quick run's exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.suite import BEGIN, END, Benchmark, main, replace_generated  # noqa: E402

GOOD = """
import json, sys
from pathlib import Path
out = Path(__file__).resolve().parent / "results" / "fake_good.json"
out.parent.mkdir(parents=True, exist_ok=True)
rows = [{"size": 2 if "--quick" in sys.argv else 8, "ms": 1.25}]
out.write_text(json.dumps({"rows": rows}))
print("ok")
"""

BAD = """
import sys
print("about to fail --quick")
sys.exit(3)
"""


def test_markers_inserted_after_title_and_hand_written_text_kept() -> None:
    doc = "# Benchmarks\n\nintro\n\n## Hand-written\n\nnumbers 1.23\n"
    once = replace_generated(doc, "GEN ONE\n")
    assert once.startswith("# Benchmarks\n\n" + BEGIN + "\nGEN ONE\n" + END + "\n")
    assert once.endswith("intro\n\n## Hand-written\n\nnumbers 1.23\n")
    twice = replace_generated(once, "GEN TWO\n")
    assert "GEN ONE" not in twice and twice.count(BEGIN) == 1 and twice.count(END) == 1
    assert twice == once.replace("GEN ONE", "GEN TWO")


def test_one_marker_alone_is_an_error() -> None:
    with pytest.raises(ValueError, match="marker"):
        replace_generated(f"# B\n{BEGIN}\nx\n", "y")


def test_a_second_end_marker_is_an_error_not_a_kept_stale_copy() -> None:
    doc = f"# B\n{BEGIN}\nold\n{END}\nhand\nold tail\n{END}\nhand again\n"
    with pytest.raises(ValueError, match="1 begin and 2 end"):
        replace_generated(doc, "new\n")


def test_the_committed_report_has_one_pair_of_markers() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    assert doc.count(BEGIN) == doc.count(END) == 1


def _registry(tmp_path: Path) -> list[Benchmark]:
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    return [
        Benchmark("fake_good", str(tmp_path / "good.py"), "Good", quick_timeout_s=30),
        Benchmark("fake_bad", str(tmp_path / "bad.py"), "Bad", quick_timeout_s=30),
    ]


def test_quick_fails_when_a_benchmark_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    status = main(["--quick", "--out", str(out)], registry=_registry(tmp_path), root=tmp_path)
    assert status == 1
    report = (out / "benchmarks.md").read_text()
    assert "fake_bad" in report and "FAILED: exit status 3" in report
    assert "| size | ms |" in report and "| 2 | 1.25 |" in report  # quick args reached it
    summary = json.loads((out / "bench-summary.json").read_text())
    assert [b["ok"] for b in summary["benchmarks"]] == [True, False]
    assert "failed: fake_bad" in capsys.readouterr().err


def test_quick_passes_and_leaves_the_tree_alone(tmp_path: Path) -> None:
    registry = _registry(tmp_path)[:1]
    out = tmp_path / "out"
    assert main(["--quick", "--out", str(out)], registry=registry, root=tmp_path) == 0
    assert not (tmp_path / "results").exists()  # the script ran from the shadow tree
    assert (out / "tree" / "bench" / "results" / "fake_good.json").exists()


def test_full_run_rewrites_only_the_generated_block(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## Mine\n\nkeep me\n")
    registry = _registry(tmp_path)[:1]
    for _ in range(2):
        assert main(["--docs", str(docs)], registry=registry, root=tmp_path) == 0
    text = docs.read_text()
    assert text.count(BEGIN) == 1 and text.endswith("## Mine\n\nkeep me\n")
    assert "| 8 | 1.25 |" in text and "`python bench/good.py`" in text


def test_timeout_kills_and_fails(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(60)\n")
    slow = Benchmark("slow", str(tmp_path / "slow.py"), "Slow", quick_args=(), quick_timeout_s=1)
    out = tmp_path / "out"
    assert main(["--quick", "--out", str(out)], registry=[slow], root=tmp_path) == 1
    assert "timed out after 1 s" in (out / "benchmarks.md").read_text()


def test_unknown_name_in_only(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown benchmark nope"):
        main(["--quick", "--only", "nope"], registry=_registry(tmp_path), root=tmp_path)


def test_full_run_with_out_changes_nothing_in_the_tree(tmp_path: Path) -> None:
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    docs.write_text("# Benchmarks\n\nhand-written\n")
    out = tmp_path / "out"
    assert main(["--out", str(out)], registry=_registry(tmp_path)[:1], root=tmp_path) == 0
    assert docs.read_text() == "# Benchmarks\n\nhand-written\n"
    assert not (tmp_path / "results").exists()
    assert "| 8 | 1.25 |" in (out / "benchmarks.md").read_text()  # full-size arguments


def test_only_keeps_the_other_benchmarks_sections(tmp_path: Path) -> None:
    """A full run of one benchmark (--only) rewrites its section and keeps the others' as
    the earlier full run wrote them, in the registry's order."""
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "other.py").write_text(GOOD.replace("fake_good", "fake_other").replace("8", "9"))
    registry = [
        Benchmark("fake_good", str(tmp_path / "good.py"), "Good", quick_timeout_s=30),
        Benchmark("fake_other", str(tmp_path / "other.py"), "Other", quick_timeout_s=30),
    ]
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n")
    assert main(["--docs", str(docs)], registry=registry, root=tmp_path) == 0
    before = docs.read_text()
    other = before[before.index("### Other") :]
    (tmp_path / "good.py").write_text(GOOD.replace("1.25", "2.5"))
    assert main(["--docs", str(docs), "--only", "fake_good"], registry=registry, root=tmp_path) == 0
    after = docs.read_text()
    assert "| 8 | 2.50 |" in after and "| 8 | 1.25 |" not in after  # rerun
    assert other.split(END)[0] in after  # kept, word for word
    assert after.index("### Good") < after.index("### Other")
    assert "| fake_other |" in after and "1 more kept" in after


def test_an_object_with_rows_of_its_own_is_a_second_table() -> None:
    """A result's top-level object holding ``rows`` (scaling_on_paper's ``ptdp``) renders
    under its title: its scalars as bullets, then its table, after the main table."""
    from bench.suite import Outcome, render_section

    data = {
        "note": "derived",
        "rows": [{"model": "a", "solve_s": 1.5}],
        "ptdp": {
            "title": "PTD-P Table 1",
            "calibration_row": "145.6B",
            "rows": [{"model": "1.7B", "error": 0.064}],
        },
    }
    bench = Benchmark("fake", "fake.py", "Fake")
    outcome = Outcome(bench, "python fake.py", 0, 1.0, "today", data=data)
    machine = {"cpu": "cpu", "cores": 2, "torch": "t", "python": "p"}
    text = render_section(outcome, machine, None)
    main_table, sub = text.split("#### PTD-P Table 1")
    assert "| a " in main_table and "1.7B" not in main_table
    assert "- calibration_row: 145.6B" in sub
    assert "| 1.7B " in sub and "title" not in sub

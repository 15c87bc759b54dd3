"""The GPU catalog (planner/gpus.py, planner/data/gpus.yaml): entries, user entries,
efficiencies, and that the data file ships with the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.errors import InputError
from planner.gpus import (
    Efficiency,
    catalog_names,
    gpu_from_dict,
    gpu_spec,
    load_catalog,
    parse_efficiency,
)

ROOT = Path(__file__).resolve().parents[1]


def test_catalog_holds_the_issues_gpus_each_with_a_source() -> None:
    catalog = load_catalog()
    for name in (
        "a100-40gb-sxm",
        "a100-80gb-sxm",
        "h100-sxm",
        "h100-pcie",
        "h200",
        "b200",
        "mi300x",
        "l40s",
        "cpu",
    ):
        assert name in catalog
    for spec in catalog.values():
        assert len(spec.source) > 20
        if spec.measure:
            continue
        assert {"fp32", "bf16", "fp16"} <= set(spec.peak_flops_per_s)
        assert spec.memory_bytes > 0 and spec.memory_bytes_per_s > 0
        # Dense tensor-core peaks: more than the plain fp32 rate, bf16 as fp16.
        assert spec.peak_flops_per_s["bf16"] > spec.peak_flops_per_s["fp32"]
        assert spec.peak_flops_per_s["bf16"] == spec.peak_flops_per_s["fp16"]


def test_h100_numbers_are_the_datasheets() -> None:
    h100 = gpu_spec("h100-sxm")
    assert h100.peak_flops_per_s["bf16"] == pytest.approx(989.4e12)
    assert h100.memory_bytes_per_s == pytest.approx(3.35e12)
    assert h100.memory_bytes == 80 * 2**30
    assert h100.interconnect_bytes_per_s == pytest.approx(450e9)
    assert h100.efficiency == Efficiency(0.7, 0.5, 0.8)
    assert gpu_spec("cpu").measure and gpu_spec("cpu").efficiency == Efficiency(1.0, 1.0, 1.0)


def test_the_catalog_is_package_data() -> None:
    # A plain (non-editable) install ships only what setuptools is told to: the data file
    # must be named as package data, beside the packages it belongs to.
    config = (ROOT / "pyproject.toml").read_text()
    section = config.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    assert 'planner = ["data/*.yaml"]' in section
    assert (ROOT / "planner" / "data" / "gpus.yaml").is_file()


def test_a_users_own_entry(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.yaml"
    path.write_text(
        "name: rtx-6000\n"
        "tflops: {fp32: 91.1, bf16: 364.2, fp16: 364.2}\n"
        "memory: 48 GiB\n"
        "memory_bandwidth: 960 GB/s\n"
        "source: my vendor's datasheet\n"
        "efficiency: {matmul: 0.6}\n"
    )
    spec = gpu_spec(str(path))
    assert spec.name == "rtx-6000"
    assert spec.peak_flops_per_s["fp32"] == pytest.approx(91.1e12)
    assert spec.memory_bytes_per_s == pytest.approx(960e9)
    assert spec.efficiency == Efficiency(matmul=0.6)
    assert spec.interconnect_bytes_per_s == 0


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"memory": "1 GiB", "memory_bandwidth": "1 TB/s", "source": "x"}, "tflops", "mapping"),
        (
            {"tflops": {"fp32": 1}, "memory": "1 GiB", "memory_bandwidth": "1 TB/s", "source": "x"},
            "tflops",
            "missing bf16, fp16",
        ),
        (
            {"tflops": {"fp32": 1, "bf16": 2, "fp16": 2, "int4": 9}, "source": "x"},
            "tflops.int4",
            "expected one of fp32, tf32, bf16, fp16, fp8, got 'int4'",
        ),
        (
            {"tflops": {"fp32": 1, "bf16": 2, "fp16": 2}, "memory": "1 GiB", "source": "x"},
            "memory_bandwidth",
            "missing",
        ),
        (
            {"tflops": {"fp32": 1, "bf16": 2, "fp16": 2}, "memory": 80, "source": "x"},
            "memory",
            "unit",
        ),
        ({"tflops": {"fp32": 1, "bf16": 2, "fp16": 2}}, "source", "where the numbers come from"),
        ({"tflops": {}, "source": "x", "colour": "green"}, "colour", "unknown field"),
        ({"source": "x", "efficiency": {"matmul": 1.5}}, "efficiency.matmul", "(0, 1]"),
    ],
)
def test_a_bad_entry_is_one_line_naming_the_field(
    entry: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(InputError) as info:
        gpu_from_dict(entry, name="mine", source="mine.yaml")
    assert info.value.file == "mine.yaml"
    assert info.value.field == field
    assert words in info.value.message


def test_unknown_names_and_missing_files() -> None:
    with pytest.raises(InputError, match="unknown GPU 'h100'.*h100-sxm"):
        gpu_spec("h100")
    with pytest.raises(InputError, match="file does not exist"):
        gpu_spec("nowhere/my-gpu.yaml")
    assert "h200" in catalog_names()


def test_efficiency_overrides() -> None:
    base = gpu_spec("h100-sxm").efficiency
    assert parse_efficiency(None, base) == base
    got = parse_efficiency("matmul=0.6, memory=0.9", base)
    assert got == Efficiency(matmul=0.6, attention=base.attention, memory=0.9)
    for bad, words in (
        ("matmul", "NAME=FRACTION"),
        ("speed=0.5", "unknown efficiency 'speed'"),
        ("matmul=0", "(0, 1]"),
        ("memory=lots", "(0, 1]"),
    ):
        with pytest.raises(InputError, match=words.replace("(", r"\(").replace("]", r"\]")) as e:
            parse_efficiency(bad, base)
        assert e.value.field == "--efficiency"


def test_a_users_entry_is_read_as_every_data_file_is(tmp_path: Path) -> None:
    """Duplicate keys, deep nesting and non-YAML are one line naming the file, as for a
    topology (planner.datafile), not a traceback or a silently kept last value."""
    entry = 'source: x\nmeasure: true\nsource: "y"\n'
    (tmp_path / "dup.yaml").write_text(entry)
    with pytest.raises(InputError, match="given twice") as info:
        gpu_spec(tmp_path / "dup.yaml")
    assert info.value.file == str(tmp_path / "dup.yaml")
    (tmp_path / "deep.yaml").write_text("source: x\nefficiency: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(InputError) as info:
        gpu_spec(tmp_path / "deep.yaml")
    assert info.value.file == str(tmp_path / "deep.yaml")
    (tmp_path / "ok.yaml").write_text("name: mine\nsource: my bench\nmeasure: true\n")
    assert gpu_spec(tmp_path / "ok.yaml").name == "mine"


def test_numbers_beyond_any_gpu_are_one_line() -> None:
    """1e300 TFLOP/s would make every layer take 0 ms (inf FLOP/s), silently."""
    base = {"memory": "1 GiB", "memory_bandwidth": "1 TB/s", "source": "x"}
    for entry, field in (
        ({**base, "tflops": {"fp32": 1e300, "bf16": 2, "fp16": 2}}, "tflops.fp32"),
        ({**base, "tflops": {"fp32": 1, "bf16": 2, "fp16": 2}, "memory": "1e30 GiB"}, "memory"),
        (
            {**base, "tflops": {"fp32": 1, "bf16": 2, "fp16": 2}, "memory_bandwidth": "1e30 TB/s"},
            "memory_bandwidth",
        ),
    ):
        with pytest.raises(InputError) as info:
            gpu_from_dict(entry, name="mine", source="mine.yaml")
        assert info.value.field == field and "at most" in info.value.message

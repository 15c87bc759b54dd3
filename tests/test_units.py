"""Units: sizes (binary vs decimal), bandwidths (bytes vs bits), times; bad units are errors."""

from __future__ import annotations

import pytest

from planner.errors import InputError
from planner.units import (
    format_bandwidth,
    format_bytes,
    format_time_ms,
    parse_bandwidth,
    parse_bytes,
    parse_time_ms,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 B", 1),
        ("1 KB", 1000),
        ("1 kB", 1000),
        ("1 KiB", 1024),
        ("80 GiB", 80 * 2**30),
        ("80 GB", 80 * 10**9),
        ("1.5 MiB", 3 * 2**19),
        ("16160 MiB", 16160 * 2**20),
        ("2 TB", 2 * 10**12),
        ("1e3 MB", 10**9),
        ("  512MiB ", 512 * 2**20),
    ],
)
def test_sizes_parse_binary_and_decimal_prefixes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("25 GB/s", 25e9),
        ("200 Gbit/s", 25e9),
        ("200 Gb/s", 25e9),
        ("200 Gbps", 25e9),
        ("1 Tbit/s", 125e9),
        ("1 GiB/s", 2.0**30),
        ("100 MB/s", 1e8),
        ("8 B/s", 8.0),
        ("800 Mbit/s", 1e8),
    ],
)
def test_bandwidths_parse_bytes_and_bits(text: str, expected: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1 us", 1e-3), ("500 ns", 5e-4), ("2.5 ms", 2.5), ("1 s", 1000.0), ("3 µs", 3e-3)],
)
def test_times_parse_to_milliseconds(text: str, expected: float) -> None:
    assert parse_time_ms(text) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["80", 80, 80.0, "80 parsecs", "GiB", "", None, True, [80]])
def test_values_without_a_known_unit_are_errors_naming_file_and_field(value: object) -> None:
    with pytest.raises(InputError) as info:
        parse_bytes(value, file="t.yaml", field="devices[0].memory")
    text = str(info.value)
    assert text.startswith("t.yaml: devices[0].memory: ")
    assert "\n" not in text
    assert "size" in text


def test_unknown_unit_names_the_unit_and_lists_known_ones() -> None:
    with pytest.raises(InputError, match=r"unknown unit 'GB/h'.*GB/s"):
        parse_bandwidth("3 GB/h", field="links[0].bandwidth")
    with pytest.raises(InputError, match=r"unknown unit 'min'.*ns, us, ms or s"):
        parse_time_ms("1 min")
    # A bandwidth is not a size and a size is not a bandwidth.
    with pytest.raises(InputError):
        parse_bytes("1 GB/s")
    with pytest.raises(InputError):
        parse_bandwidth("1 GB")


def test_case_of_b_matters() -> None:
    assert parse_bandwidth("8 Gb/s") * 8 == parse_bandwidth("8 GB/s")


@pytest.mark.parametrize("nbytes", [1, 1000, 1024, 16160 * 2**20, 80 * 2**30, 123456789, 10**12])
def test_exact_formats_read_back_exactly(nbytes: int) -> None:
    assert parse_bytes(format_bytes(nbytes, exact=True)) == nbytes


@pytest.mark.parametrize("bw", [25e9, 15.75e9, 20.6e9, 12.5e9, 3e9, 1.0, 123456.789])
def test_exact_bandwidth_and_time_formats_read_back_exactly(bw: float) -> None:
    assert parse_bandwidth(format_bandwidth(bw, exact=True)) == bw
    assert parse_time_ms(format_time_ms(bw / 1e12, exact=True)) == pytest.approx(bw / 1e12)


def test_human_formats() -> None:
    assert format_bytes(80 * 2**30) == "80 GiB"
    assert format_bandwidth(25e9) == "25 GB/s"
    assert format_time_ms(0.001) == "1 us"
    assert format_time_ms(0) == "0 us"
    assert format_bandwidth(float("inf")) == "inf"

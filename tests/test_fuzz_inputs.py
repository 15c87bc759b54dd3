"""Fuzzing the readers and the command line with mutated and hostile inputs (hypothesis).

Profiles, topologies, plans, stage strings, JSON/YAML text and command-line numbers are
mutated at random (a leaf replaced by a hostile value: a 5000-digit integer, 1e308,
Infinity, a terminal escape, a huge range, deep nesting; a key deleted, added or given
twice). Each must be either accepted or refused with one :class:`InputError` line naming
the file (exit 2 on the command line) -- never another exception, a hang, a huge
allocation, or JSON holding Infinity/NaN. What is accepted is used: a profile or topology
is simulated, a plan written back, and every number that comes out is finite.

Examples are derandomized (the same every run) and few, so the module takes seconds.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import resource
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.cost import synthetic_profile
from planner.datafile import decode_json
from planner.errors import InputError
from planner.fileio import json_text
from planner.limits import MAX_INT_DIGITS, MAX_NESTING
from planner.plan import Plan, parse_stages, plan_from_dict
from planner.profile import load_profile
from planner.simulate import simulate
from planner.terminal import is_printable
from planner.topology import load_topology

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=100,
    # capsys is read (and so emptied) after every example; the module fixtures are shared.
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
DIGITS = "9" * 5000
HARD_TIMEOUT_S = 120  # a hang fails the test instead of holding the suite


@pytest.fixture(autouse=True)
def hard_timeout() -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"fuzz test exceeded {HARD_TIMEOUT_S} s: an input hangs")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(HARD_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module", autouse=True)
def no_huge_allocation() -> Iterator[None]:
    """The peak memory of the process grows by less than 1 GiB over the whole module."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 2**20, f"the fuzzed inputs grew the peak memory by {grown / 2**20:.1f} GiB"


WORK = Path(tempfile.mkdtemp(prefix="pipeplan-fuzz-"))


# ------------------------------------------------------------------- hostile values

# Placeholders written into JSON/YAML text and replaced by text json.dumps cannot write.
_RAW = {"@DIGITS@": DIGITS, "@MINUS@": "-" + DIGITS, "@BIGFLOAT@": "1e400"}

hostile_scalars = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([2**31, 2**53 + 1, 2**63, 10**19, 10**29, -(10**29), 2**60 + 1]),
    st.sampled_from([0.5, -0.0, 1e-320, 1e308, -1e308, 1.5e300, math.inf, math.nan]),
    st.sampled_from(list(_RAW)),
    st.sampled_from(
        [
            "",
            " ",
            "gpu{0..99999999}",
            "g{0..999}{0..999}",
            "gpu\x1b[2J",
            "a\u202eb",
            "[/x]",
            "x" * 1500,
            "80 GiB",
            "1e400 GB/s",
            "1e-300 B/s",
            "-1 us",
            "lamb",
            "bogus",
            "F0.99999999999",
            "SEND_F0.0->nowhere",
            "0-2:gpu0",
        ]
    ),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


hostile_values = st.one_of(
    hostile_scalars,
    st.lists(hostile_scalars, max_size=3),
    st.dictionaries(st.sampled_from(["x", "name", "layers"]), hostile_scalars, max_size=2),
    st.sampled_from([MAX_NESTING + 5, 400]).map(_nested),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside decoded JSON (dict keys, list indices)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:4]):  # a few entries of long lists are enough
            yield from _paths(item, (*prefix, i))


@st.composite
def mutated(draw: Any, base: Any) -> tuple[Any, str]:
    """``base`` with one mutation, and how to finish the text (``duplicate`` or not)."""
    data = copy.deepcopy(base)
    paths = [p for p in _paths(data) if p]
    path = draw(st.sampled_from(paths))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "duplicate"]))
    if kind == "replace":
        parent[path[-1]] = draw(hostile_values)
    elif kind == "delete":
        del parent[path[-1]]
    elif kind == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["colour", "tp_groups", "weight_versions"]))] = 1
    return data, kind


def _text(data: Any, kind: str, *, yaml_form: bool = False) -> str:
    text = yaml.safe_dump(data, sort_keys=False) if yaml_form else json.dumps(data)
    for marker, raw in _RAW.items():
        text = text.replace(f'"{marker}"', raw).replace(f"'{marker}'", raw)
        text = text.replace(marker, raw)
    if kind == "duplicate":  # the first key of the first object, given twice
        text = text.replace('{"', '{"schema": 0, "', 1) if not yaml_form else "schema: 0\n" + text
    return text


def _accepted_or_one_line(read: Callable[[], Any], source: Path) -> Any:
    """``read()``'s value, or None after checking that its InputError is one printable
    line naming ``source``; any other exception fails the test."""
    try:
        return read()
    except InputError as exc:
        line = exc.one_line()
        assert "\n" not in line and is_printable(line), line
        assert len(line) < 2000, line[:300]
        assert source.name in line, line
        return None


def _finite(obj: Any) -> None:
    """Strict JSON: json_text refuses NaN and Infinity, json.loads reads it back."""
    json.loads(json_text(obj), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))


# ---------------------------------------------------------------------------- profiles

PROFILE = synthetic_profile(4, forward_ms=1.0, output_bytes=1000).to_dict()
PROFILE["measurements"][0]["layers"][0]["spread"] = {"forward_ms": [0.9, 1.1]}


@FUZZ
@given(mutated(PROFILE))
def test_a_mutated_profile_is_read_or_refused_in_one_line(case: tuple[Any, str]) -> None:
    data, kind = case
    path = WORK / "profile.json"
    path.write_text(_text(data, kind))
    profile = _accepted_or_one_line(lambda: load_profile(path), path)
    if profile is None:
        return
    # Accepted: it simulates to finite numbers, and JSON that any reader accepts.
    stages = f"0-1:a;2-{profile.num_layers - 1}:b" if profile.num_layers > 2 else "0-0:a"
    try:
        result = simulate(profile, None, parse_stages(stages), "1f1b", 2)
    except InputError:
        return  # e.g. a layer count the stages do not cover
    assert math.isfinite(result.iteration_ms)
    _finite(profile.to_dict())


# -------------------------------------------------------------------------- topologies

TOPOLOGY: dict[str, Any] = {
    "schema": "pipeplan.topology/v1",
    "name": "fuzz",
    "devices": [
        {"name": "gpu{0..1}", "memory": "16 GiB", "speed": 1.0, "host": "n0", "kind": "x"},
        {"name": "gpu2", "memory": "8 GiB", "speed": 0.5},
    ],
    "switches": [{"name": "sw", "kind": "nvswitch"}],
    "links": [
        {"between": ["gpu{0..2}", "sw"], "bandwidth": "25 GB/s", "latency": "1 us", "count": 2}
    ],
}
HOSTS: dict[str, Any] = {
    "schema": "pipeplan.topology/v1",
    "hosts": {
        "count": 2,
        "devices": {"count": 2, "memory": "16 GiB"},
        "switch": {"bandwidth": "450 GB/s"},
        "network": {"bandwidth": "50 GB/s", "per": "host"},
    },
}


@FUZZ
@given(st.one_of(mutated(TOPOLOGY), mutated(HOSTS)))
def test_a_mutated_topology_is_read_or_refused_in_one_line(case: tuple[Any, str]) -> None:
    data, kind = case
    path = WORK / "topology.yaml"
    path.write_text(_text(data, kind, yaml_form=True))
    topology = _accepted_or_one_line(lambda: load_topology(path), path)
    if topology is None:
        return
    names = topology.device_names()
    for dst in names[1:3]:
        assert math.isfinite(topology.transfer_ms(names[0], dst, 2**60))
    _finite(topology.to_dict())


# ------------------------------------------------------------------------------- plans


@pytest.fixture(scope="module")
def plan_data() -> dict[str, Any]:
    profile = WORK / "plan-profile.json"
    synthetic_profile(4).save(profile)
    out = WORK / "base-plan.json"
    args = ["simulate", "--profile", str(profile), "--stages", "0-1:a,b;2-3:c", "-m", "4"]
    with pytest.raises(SystemExit) as info:
        main([*args, "-o", str(out), "--no-gantt", "--json"])
    assert info.value.code in (0, None)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@FUZZ
@given(data=st.data())
def test_a_mutated_plan_is_read_or_refused_in_one_line(
    plan_data: dict[str, Any], data: st.DataObject, capsys: pytest.CaptureFixture[str]
) -> None:
    mutation, kind = data.draw(mutated(plan_data))
    path = WORK / "plan.json"
    path.write_text(_text(mutation, kind))
    plan = _accepted_or_one_line(lambda: Plan.load(path), path)
    if plan is not None:
        _finite(plan.to_dict())
        # Accepted: show re-simulates it (exit 0, strict JSON) or names the file (exit 2).
        with pytest.raises(SystemExit) as info:
            main(["show", str(path), "--json"])
        out, err = capsys.readouterr()
        assert info.value.code in (0, 2, None) and "Traceback" not in err, err[-1000:]
        if info.value.code == 2:
            assert len(err.strip().splitlines()) == 1 and "plan.json" in err, err
        else:
            json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    # The same object given to the API directly (no JSON decoding on the way).
    if kind != "duplicate":
        # ValueError: json.loads itself refusing a 5000-digit integer.
        with contextlib.suppress(InputError, ValueError):
            plan_from_dict(json.loads(_text(mutation, kind)), source="plan.json")


# ------------------------------------------------------------------ text and numbers

stage_text = st.text(alphabet="0123456789-:,; abgpu\x1b[]{}.+", max_size=40)


@FUZZ
@given(
    st.one_of(
        stage_text,
        st.sampled_from(
            [f"0-{DIGITS}:a", "0-1:" + "a," * 5000, "0-1:a\x1b[2J;2-3:b", "0-1:" + "g" * 2000]
        ),
    )
)
def test_stage_strings_parse_or_are_refused_in_one_line(text: str) -> None:
    try:
        stages = parse_stages(text)
    except InputError as exc:
        assert exc.field == "--stages" and is_printable(exc.one_line())
        return
    assert stages and all(s.devices and is_printable("".join(s.devices)) for s in stages)


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**40), 10**40),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


@FUZZ
@given(json_values)
def test_json_decodes_exactly_or_is_refused_in_one_line(value: Any) -> None:
    text = json.dumps(value)
    try:
        decoded = decode_json(text, source="v.json")
    except InputError as exc:
        assert exc.file == "v.json" and "\n" not in exc.one_line()
        refused = "Infinity" in text or "NaN" in text or _digits(value) > MAX_INT_DIGITS
        assert refused, exc.one_line()
        return
    assert decoded == value


def _digits(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return len(str(abs(value)))
    if isinstance(value, list):
        return max(map(_digits, value), default=0)
    if isinstance(value, dict):
        return max(map(_digits, value.values()), default=0)
    return 0


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_read_or_refused_in_one_line(blob: bytes) -> None:
    for name, read in (("b.json", load_profile), ("b.yaml", load_topology)):
        path = WORK / name
        path.write_bytes(blob)
        _accepted_or_one_line(lambda read=read, path=path: read(path), path)


hostile_numbers = st.one_of(
    st.integers(-2, 6).map(str),
    st.sampled_from(["0", "-1", "99999999999", DIGITS, "1e308", "nan", "inf", "-inf", "1e-400"]),
)


@FUZZ
@given(
    flag=st.sampled_from(["-m", "-b", "--virtual-stages", "--step-ms", "--recompute"]),
    value=hostile_numbers,
)
def test_hostile_numbers_on_simulate_are_exit_2_or_valid_json(
    plan_data: dict[str, Any], flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = WORK / "plan-profile.json"
    out = WORK / "cli-plan.json"
    out.unlink(missing_ok=True)
    args = ["simulate", "--profile", str(profile), "--stages", "0-1:a;2-3:b", flag, value]
    with pytest.raises(SystemExit) as info:
        main([*args, "-o", str(out), "--json"])
    stdout, err = capsys.readouterr()
    code = int(info.value.code or 0)
    assert code in (0, 2) and "Traceback" not in err, err[-1000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("pipeplan: error: ")
        assert not out.exists()
        return
    for text in (stdout, out.read_text()):
        json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))


@FUZZ
@given(value=hostile_numbers)
def test_hostile_widths_on_show_are_exit_2_or_a_chart(
    plan_data: dict[str, Any], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = WORK / "base-plan.json"
    with pytest.raises(SystemExit) as info:
        main(["show", str(plan), "--width", value])
    _, err = capsys.readouterr()
    code = int(info.value.code or 0)
    assert code in (0, 2) and "Traceback" not in err, err[-1000:]
    assert code == 0 or len(err.strip().splitlines()) == 1

"""Scenario loading: every bad field gives one clear message naming file, field and value."""

import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutedebug.engine import scenario as S

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = ROOT / "kernels" / "minimal.py"

GOOD = f"""
id = "t/good"
description = "a good one"
[kernel]
file = "{MINIMAL}"
entry = "Minimal"
[params]
n = 4096
[expect]
verdict = "PASS"
[limits]
deadline_s = 5
[requires]
arch = ["sm_90a"]
"""


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_good_scenario_loads(tmp_path):
    sc = S.load(write(tmp_path, GOOD))
    assert sc.id == "t/good"
    assert sc.params == {"n": 4096}
    assert sc.limits.deadline_s == 5.0 and isinstance(sc.limits.deadline_s, float)
    assert sc.archs == ("sm_90a",)
    assert sc.kernel_file == str(MINIMAL)


def test_relative_kernel_path_is_relative_to_the_scenario(tmp_path):
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    (tmp_path / "k.py").write_text(MINIMAL.read_text())
    text = GOOD.replace(str(MINIMAL), "../../k.py")
    sc = S.load(write(sub, text))
    assert sc.kernel_file == str((tmp_path / "k.py").resolve())


@pytest.mark.parametrize(
    "old,new,needles",
    [
        ('id = "t/good"', 'idd = "t/good"', ["unknown field 'idd'", "allowed"]),
        ('id = "t/good"', 'id = "has space"', ["field id", "has space"]),
        ('verdict = "PASS"', 'verdict = "PASSED"', ["expect.verdict", "'PASSED'", "HANG"]),
        ('verdict = "PASS"', "verdict = 3", ["expect.verdict", "expected str"]),
        (
            'verdict = "PASS"',
            'verdict = "HANG"\nrole = "warp"',
            ["expect.role", "'warp'", "producer"],
        ),
        ('verdict = "PASS"', 'verdict = "HANG"\nop = "wait"', ["expect.op", "consumer_wait"]),
        ('verdict = "PASS"', 'verdict = "HANG"\nbarrier = "ful"', ["expect.barrier", "full"]),
        ('verdict = "PASS"', 'verdict = "HANG"\nstage = -1', ["expect.stage", "-1"]),
        ("deadline_s = 5", "deadline_s = 0", ["limits.deadline_s", "within"]),
        ("deadline_s = 5", 'deadline_s = "5"', ["limits.deadline_s", "expected float"]),
        ("deadline_s = 5", "deadlin_s = 5", ["unknown field 'limits.deadlin_s'"]),
        ('arch = ["sm_90a"]', 'arch = ["sm_89"]', ["requires.arch", "'sm_89'", "sm_100a"]),
        ('arch = ["sm_90a"]', "arch = []", ["requires.arch is empty"]),
        ("n = 4096", "n = 40.5", ["params.n", "expected int"]),
        ("n = 4096", "m = 1", ["unknown field params.m", "'n'"]),
        ('entry = "Minimal"', 'entry = "Maximal"', ["kernel.entry", "'Maximal'", "Minimal"]),
        (f'file = "{MINIMAL}"', 'file = "nope/k.py"', ["kernel.file", "nope/k.py", "no such file"]),
        ('entry = "Minimal"', "", ["kernel.entry is missing"]),
        ('[expect]\nverdict = "PASS"', "", ["'expect' is missing"]),
        (
            'verdict = "PASS"',
            'verdict = "PASS"\nalso = ["PASS"]',
            ["expect.also", "'PASS'", "HANG"],
        ),
        ('verdict = "PASS"', 'verdict = "PASS"\nalso = ["HUNG"]', ["expect.also", "'HUNG'"]),
        ('verdict = "PASS"', 'verdict = "PASS"\nalso = ["HANG", "HANG"]', ["expect.also", "twice"]),
        ('verdict = "PASS"', 'verdict = "PASS"\nalso = "HANG"', ["expect.also", "expected list"]),
    ],
)
def test_bad_fields_name_file_field_and_value(tmp_path, old, new, needles):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(S.ScenarioError) as err:
        S.load(path)
    msg = str(err.value)
    assert msg.startswith(str(path))
    for n in needles:
        assert n in msg, msg


def test_timing_dependent_scenario_accepts_its_measured_alternatives(tmp_path):
    sc = S.load(
        write(
            tmp_path,
            GOOD.replace('verdict = "PASS"', 'verdict = "MISMATCH"\nalso = ["PASS", "HANG"]'),
        )
    )
    assert sc.expect.also == ("PASS", "HANG") and sc.expect.timing_dependent
    assert [sc.expect.accepts(v) for v in ("MISMATCH", "PASS", "HANG", "CRASH")] == [
        True,
        True,
        True,
        False,
    ]
    assert sc.expect.verdict_text() == "MISMATCH (timing-dependent: also PASS, HANG)"
    assert S.Scenario.from_json(sc.to_json()) == sc  # replay keeps it
    plain = S.load(write(tmp_path, GOOD, "plain.toml"))
    assert not plain.expect.timing_dependent and plain.expect.verdict_text() == "PASS"
    assert not plain.expect.accepts("HANG")


def test_not_toml(tmp_path):
    path = write(tmp_path, "id = \n[")
    with pytest.raises(S.ScenarioError, match="not valid TOML"):
        S.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(S.ScenarioError, match="scenario file not found"):
        S.load(tmp_path / "none.toml")


def test_switch_fault_declared_by_the_kernel(tmp_path):
    sc = S.load(write(tmp_path, GOOD + '[fault]\nkind = "spin_hang"\n'))
    assert sc.fault == "spin_hang" and sc.fault_args == {}


def test_switch_fault_takes_no_arguments(tmp_path):
    with pytest.raises(S.ScenarioError, match="argument"):
        S.load(write(tmp_path, GOOD + '[fault]\nkind = "spin_hang"\nx = 1\n'))


def test_unknown_fault_lists_allowed(tmp_path):
    with pytest.raises(S.ScenarioError) as err:
        S.load(write(tmp_path, GOOD + '[fault]\nkind = "cosmic_ray"\n'))
    assert "fault.kind = 'cosmic_ray'" in str(err.value)
    assert "spin_hang" in str(err.value)


def test_every_committed_scenario_loads():
    files = S.discover(ROOT / "scenarios")
    assert files, "no scenarios committed"
    for f in files:
        S.load(f)


def test_adhoc_target():
    sc = S.adhoc(f"{MINIMAL}:Minimal", {"n": 10}, None, {}, "PASS")
    assert sc.kernel_entry == "Minimal" and sc.params == {"n": 10}
    with pytest.raises(S.ScenarioError, match="FILE.py:ENTRY"):
        S.adhoc("kernels/minimal.py", {}, None, {}, "PASS")


def test_parse_value():
    assert S.parse_value("3") == 3
    assert S.parse_value("2.5") == 2.5
    assert S.parse_value("true") is True
    assert S.parse_value("bfloat16") == "bfloat16"
    assert S.parse_value('"x y"') == "x y"


# ---- fuzzing: whatever the TOML says, loading raises ScenarioError or succeeds ---------
scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.text(max_size=12),
    st.lists(st.text(max_size=6), max_size=3),
)
keys = st.sampled_from(
    [
        "id",
        "description",
        "kernel",
        "params",
        "fault",
        "expect",
        "limits",
        "requires",
        "probes",
        "file",
        "entry",
        "verdict",
        "kind",
        "n",
        "deadline_s",
        "arch",
        "role",
        "stage",
        "enabled",
        "zzz",
    ]
)
tables = st.recursive(
    scalars, lambda inner: st.dictionaries(keys, inner, max_size=6), max_leaves=20
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.dictionaries(keys, tables, max_size=8))
def test_fuzzed_tables_never_traceback(tmp_path_factory, data):
    base = tmp_path_factory.mktemp("fz")
    try:
        S.build(data, "fuzz.toml", base, None)
    except S.ScenarioError as e:
        assert str(e).startswith("fuzz.toml")


@settings(max_examples=150, deadline=None)
@given(mutation=st.sampled_from(list(tomllib.loads(GOOD))), value=scalars)
def test_fuzzed_fields_of_a_good_scenario(tmp_path_factory, mutation, value):
    data = tomllib.loads(GOOD)
    data[mutation] = value
    try:
        S.build(data, "fuzz.toml", tmp_path_factory.mktemp("fz"), None)
    except S.ScenarioError as e:
        assert str(e).startswith("fuzz.toml")


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_fuzzed_text_never_traceback(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("fz") / "s.toml"
    p.write_text(text)
    try:
        S.load(p)
    except S.ScenarioError:
        pass

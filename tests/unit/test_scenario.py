"""Scenarios: every shipped scenario loads under every profile and is scaled as profiles.toml
says; a bare name resolves; bad input is refused with a ScenarioError naming the file, the
field and the reason."""
from __future__ import annotations

import os
import pathlib
import re
import tomllib

import pytest

import chaos.spec.scenario
from chaos.spec.scenario import (RATES, SCENARIO_DIR, SHARES, Run, ScenarioError, apply_profile,
                            load_scenario)

SCENARIOS = pathlib.Path(SCENARIO_DIR)
SCENARIO_FILES = sorted(p for p in SCENARIOS.glob("*.toml") if p.name != "profiles.toml")
PROFILES = tomllib.loads((SCENARIOS / "profiles.toml").read_text())


def test_scenarios_and_profiles_are_shipped():
    assert len(SCENARIO_FILES) >= 10 and {"smoke", "ci", "soak"} <= set(PROFILES)


# -- shipped scenarios x profiles -----------------------------------------------------------

@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
def test_every_scenario_loads_under_every_profile_scaled_as_the_profile_says(path, profile):
    raw = tomllib.loads(path.read_text())
    run, faults = raw.get("run", {}), raw.get("faults", {})
    scale = PROFILES[profile]
    jobs, duration, rates = (scale.get(k, 1.0) for k in ("jobs", "duration", "rates"))

    s = load_scenario(str(path), profile)

    assert (s.name, s.profile) == (raw["name"], profile)
    assert s.run.jobs == max(1, round(run.get("jobs", Run.jobs) * jobs))
    assert s.run.chaos == pytest.approx(run.get("chaos", Run.chaos) * duration)
    assert (s.run.heal, s.run.drain) == (run.get("heal", Run.heal), run.get("drain", Run.drain))
    for name in RATES:
        assert getattr(s.faults, name) == pytest.approx(faults.get(name, 0.0) * rates), name
    for name in SHARES:  # shares are fractions of calls or jobs: a profile leaves them alone
        assert getattr(s.faults, name) == pytest.approx(faults.get(name, 0.0)), name
    expected = [pytest.approx([a * duration, b * duration]) for a, b in faults.get("outages", [])]
    assert [list(w) for w in s.faults.outages] == expected
    assert all(0 <= a < b <= s.run.chaos for a, b in s.faults.outages)
    assert s.engine == raw.get("engine", {})


def test_a_profile_scales_rates_and_outage_windows(monkeypatch):
    # The shipped profiles all keep rates = 1.0; a made-up one shows rates really scale.
    base = load_scenario("everything")
    monkeypatch.setattr(chaos.spec.scenario, "load_profiles",
                        lambda: {"hot": {"jobs": 2.0, "duration": 3.0, "rates": 2.5}})
    hot = apply_profile(base, "hot")
    assert (hot.profile, hot.run.jobs) == ("hot", base.run.jobs * 2)
    assert hot.run.chaos == pytest.approx(base.run.chaos * 3.0)
    for name in RATES:
        assert getattr(hot.faults, name) == pytest.approx(getattr(base.faults, name) * 2.5)
    assert hot.faults.outages == tuple((a * 3.0, b * 3.0) for a, b in base.faults.outages)
    assert (hot.faults.poison, hot.run.drain) == (base.faults.poison, base.run.drain)


@pytest.mark.parametrize("name", ["smoke", "smoke.toml"])
def test_a_bare_name_resolves_to_the_shipped_file(name):
    s = load_scenario(name)
    assert pathlib.Path(s.path).resolve() == (SCENARIOS / "smoke.toml").resolve()
    assert (s.name, s.profile) == ("smoke", "ci")


# -- bad input ------------------------------------------------------------------------------

BAD = [
    # (case id, file body, fragments the message must contain: the field and the reason)
    ("unknown-top-level", 'name = "x"\nspeed = 3\n', ["'speed'", "unknown field"]),
    ("unknown-run-field", 'name = "x"\n[run]\nworkerz = 2\n', ["run.workerz", "unknown field"]),
    ("unknown-faults-field", 'name = "x"\n[faults]\nkil = 1.0\n',
     ["faults.kil", "unknown field"]),
    ("unknown-expect-field", 'name = "x"\n[expect]\nallowance = 1.0\n',
     ["expect.allowance", "unknown field"]),
    ("unknown-engine-setting", 'name = "x"\n[engine]\nleese = 2.0\n',
     ["engine.leese", "unknown field"]),
    ("unsafe-engine", 'name = "x"\n[engine]\nheartbeat = false\ncall_timeout = 2.0\n'
     'lease = 2.0\n', ["[engine]", "call_timeout", "lease", "heartbeat", "unsafe"]),
    ("unsafe-engine-longer-call", 'name = "x"\n[engine]\nheartbeat = false\n'
     'call_timeout = 3.0\nlease = 2.0\n', ["[engine]", "call_timeout", "lease", "heartbeat"]),
    ("string-for-float", 'name = "x"\n[faults]\nkill = "fast"\n',
     ["faults.kill", "must be a finite number", "'fast'"]),
    ("float-for-int", 'name = "x"\n[run]\njobs = 2.5\n', ["run.jobs", "must be an integer", "2.5"]),
    ("bool-for-float", 'name = "x"\n[faults]\nslow = true\n',
     ["faults.slow", "must be a finite number"]),
    ("bool-for-int", 'name = "x"\n[run]\nworkers = true\n', ["run.workers", "must be an integer"]),
    # nan and inf compare false with every bound: they would hang the planner
    ("nan-chaos", 'name = "x"\n[run]\nchaos = nan\n', ["run.chaos", "finite", "nan"]),
    ("inf-chaos", 'name = "x"\n[run]\nchaos = inf\n', ["run.chaos", "finite", "inf"]),
    ("inf-kill", 'name = "x"\n[faults]\nkill = inf\n', ["faults.kill", "finite", "inf"]),
    ("nan-share", 'name = "x"\n[faults]\nslow = nan\n', ["faults.slow", "finite"]),
    ("nan-outage", 'name = "x"\n[faults]\noutages = [[1.0, nan]]\n',
     ["faults.outages", "finite"]),
    ("nan-latency", 'name = "x"\n[faults]\nlatency = "fixed:nan"\n',
     ["faults.latency", "finite seconds"]),
    ("inf-latency", 'name = "x"\n[faults]\nlatency = "lognormal:1:inf"\n',
     ["faults.latency", "finite seconds"]),
    ("nan-engine", 'name = "x"\n[engine]\nlease = nan\n', ["engine.lease", "finite"]),
    ("string-engine-number", 'name = "x"\n[engine]\nlease = "2"\n',
     ["[engine]", "'lease'", "finite number", "'2'", "without quotes"]),
    ("string-engine-boolean", 'name = "x"\n[engine]\nheartbeat = "yes"\n',
     ["[engine]", "'heartbeat'", "boolean", "'yes'"]),
    ("float-engine-integer", 'name = "x"\n[engine]\nmax_attempts = 3.0\n',
     ["[engine]", "'max_attempts'", "integer", "3.0"]),
    ("number-engine-string", 'name = "x"\n[engine]\nsynchronous = 1\n',
     ["[engine]", "'synchronous'", "string"]),
    ("outages-flat-list", 'name = "x"\n[faults]\noutages = [1.0, 2.0]\n', ["faults.outages"]),
    ("outages-short-window", 'name = "x"\n[faults]\noutages = [[1.0]]\n', ["faults.outages"]),
    ("outages-string-bound", 'name = "x"\n[faults]\noutages = [[1.0, "2"]]\n',
     ["faults.outages"]),
    ("share-above-one", 'name = "x"\n[faults]\nslow = 1.5\n', ["faults.slow", "share", "[0, 1]"]),
    ("share-below-zero", 'name = "x"\n[faults]\nreceiver_drop = -0.1\n',
     ["faults.receiver_drop", "share"]),
    ("needs-review-above-one", 'name = "x"\n[run]\nneeds_review = 1.2\n',
     ["run.needs_review", "[0, 1]"]),
    ("negative-rate", 'name = "x"\n[faults]\nkill = -1.0\n', ["faults.kill", "rate", ">= 0"]),
    ("negative-operator-rate", 'name = "x"\n[faults]\noperator = -0.5\n',
     ["faults.operator", "rate"]),
    ("negative-heal", 'name = "x"\n[run]\nheal = -1.0\n', ["run.heal", ">= 0", "-1.0"]),
    ("negative-senders", 'name = "x"\n[run]\nsenders = -1\n', ["run.senders", ">= 0"]),
    ("zero-drain", 'name = "x"\n[run]\ndrain = 0.0\n', ["run.drain", "> 0"]),
    ("negative-pause-seconds", 'name = "x"\n[faults]\npause_seconds = -2.0\n',
     ["faults.pause_seconds", ">= 0", "-2.0"]),
    ("too-many-unhappy-jobs", 'name = "x"\n[run]\nneeds_review = 0.2\n[faults]\npoison = 0.2\n'
     'crash_loop = 0.2\n', ["faults.poison", "faults.crash_loop", "run.needs_review", "half"]),
    ("crash-points-never-fire", 'name = "x"\n[faults]\ncrash_points = ["*"]\n',
     ["faults.crash_points", "crash_point_probability", "0"]),
    ("outage-past-chaos", 'name = "x"\n[run]\nchaos = 4.0\n[faults]\noutages = [[3.0, 5.0]]\n',
     ["faults.outages", "[3.0, 5.0]", "chaos phase"]),
    ("outage-before-chaos", 'name = "x"\n[faults]\noutages = [[-1.0, 2.0]]\n',
     ["faults.outages", "chaos phase"]),
    ("outage-backwards", 'name = "x"\n[faults]\noutages = [[3.0, 2.0]]\n',
     ["faults.outages", "chaos phase"]),
    ("too-many-skewed", 'name = "x"\n[run]\nworkers = 2\n[faults]\nskewed_workers = 3\n',
     ["faults.skewed_workers", "run.workers", "exceeds"]),
    ("contention-range-backwards", 'name = "x"\n[faults]\ncontention_seconds = 1.0\n'
     'contention_seconds_max = 0.5\n', ["faults.contention_seconds_max", "below"]),
    ("missing-name", 'description = "nameless"\n', ["'name'", "required"]),
    ("empty-name", 'name = ""\n', ["'name'", "required"]),
    # the name becomes the run's folder under --out: no path may escape it
    ("name-climbs-out", 'name = "../../../etc/evil"\n', ["'name'", "slug", "no path"]),
    ("name-absolute", 'name = "/tmp/evil"\n', ["'name'", "slug"]),
    ("name-with-a-folder", 'name = "a/b"\n', ["'name'", "slug"]),
    ("name-with-nul", 'name = "a\\u0000b"\n', ["'name'", "slug"]),
    ("name-too-long", f'name = "{"x" * 5000}"\n', ["'name'", "at most 100", "..."]),
    ("invalid-toml", 'name = "x"\n[run\njobs = 2\n', ["not valid TOML", "line 2"]),
    # counts, durations and rates past chaos.spec.limits: each would sit silent for hours
    ("jobs-1e11", 'name = "x"\n[run]\njobs = 100000000000\n',
     ["run.jobs", "at most 100,000", "100000000000"]),
    ("jobs-5e6", 'name = "x"\n[run]\njobs = 5000000\n', ["run.jobs", "at most 100,000"]),
    ("workers-past-bound", 'name = "x"\n[run]\nworkers = 100000\n',
     ["run.workers", "at most 256"]),
    ("senders-past-bound", 'name = "x"\n[run]\nsenders = 257\n', ["run.senders", "at most 256"]),
    ("chaos-1e300", 'name = "x"\n[run]\nchaos = 1e300\n',
     ["run.chaos", "at most 86,400 seconds", "1e+300"]),
    ("drain-past-a-day", 'name = "x"\n[run]\ndrain = 86401.0\n', ["run.drain", "a day"]),
    ("pause-seconds-past-a-day", 'name = "x"\n[faults]\npause_seconds = 1e12\n',
     ["faults.pause_seconds", "a day"]),
    ("rate-past-bound", 'name = "x"\n[faults]\nkill = 1e6\n',
     ["faults.kill", "at most 100 per second"]),
    ("fault-events-past-bound", 'name = "x"\n[run]\nchaos = 3000.0\n[faults]\nkill = 50.0\n'
     'pause = 50.0\n', ["faults.kill, faults.pause", "run.chaos", "300,000 fault events",
                        "100,000"]),
]


def load_bad(tmp_path, case: str, body: str) -> str:
    """Load a scenario file named after the case; return the error message (which must
    name that file)."""
    path = tmp_path / f"{case}.toml"
    path.write_text(body)
    with pytest.raises(ScenarioError) as err:
        load_scenario(str(path))
    message = str(err.value)
    assert f"{case}.toml" in message, f"message does not name the file: {message}"
    return message


@pytest.mark.parametrize("case,body,fragments", BAD, ids=[case for case, _, _ in BAD])
def test_bad_scenario_is_refused_naming_file_field_and_reason(tmp_path, case, body, fragments):
    message = load_bad(tmp_path, case, body)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


# -- a scenario path that is no scenario file -------------------------------------------------

def test_a_binary_scenario_names_the_file_and_the_offset_of_the_bad_byte(tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b'name = "x"\n# \x81\x00\xff' + b"\xfe" * 10_000)
    with pytest.raises(ScenarioError) as err:
        load_scenario(str(path))
    message = str(err.value)
    assert "binary.toml" in message and "0x81" in message and "offset 13" in message
    assert len(message) < 300, message  # no dump of the input


def test_a_scenario_larger_than_a_mebibyte_is_refused_unread(tmp_path):
    path = tmp_path / "huge.toml"
    path.write_text('name = "x"\n#' + "a" * (1 << 20) + "\n")
    with pytest.raises(ScenarioError, match=r"huge.toml: larger than 1,048,576 bytes"):
        load_scenario(str(path))


def test_a_folder_as_the_scenario_is_refused_naming_it(tmp_path):
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    with pytest.raises(ScenarioError, match=r"folder.toml: is a folder, not a regular file"):
        load_scenario(str(folder))


def test_a_fifo_or_a_device_as_the_scenario_exits_2_naming_it_without_blocking(tmp_path):
    import subprocess
    import sys
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)  # nothing ever writes it: opening it to read would block for good
    for path, kind in ((str(fifo), "a FIFO"), ("/dev/zero", "a device")):
        done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", "run", path, "--out",
                               str(tmp_path / "out")], capture_output=True, text=True,
                              timeout=20, cwd=SCENARIOS.parent)
        assert done.returncode == 2, done.stderr
        # named as given, not as a climb out of where the command runs ('../../dev/zero')
        assert f"error: {path}: is {kind}, not a regular file" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


#: Every duration field of [run] and [faults]: a message about one names no other.
DURATIONS = ("run.chaos", "run.heal", "run.drain", "faults.pause_seconds",
             "faults.skew_seconds", "faults.slow_seconds", "faults.retry_after",
             "faults.hang_seconds", "faults.contention_seconds",
             "faults.contention_seconds_max")


@pytest.mark.parametrize("field", DURATIONS)
def test_a_negative_duration_names_that_field_and_no_other(tmp_path, field):
    table, name = field.split(".")
    message = load_bad(tmp_path, f"negative-{name}", f'name = "x"\n[{table}]\n{name} = -1.0\n')
    named = [d for d in DURATIONS if re.search(rf"(?<![\w.]){re.escape(d)}(?!\w)", message)]
    assert named == [field], message


@pytest.mark.parametrize("body,field", [
    ("jobs = nan", "jobs"), ("rates = inf", "rates"), ("duration = -1.0", "duration"),
    ('rates = "2"', "rates")])
def test_a_profile_factor_must_be_a_finite_number_at_least_zero(tmp_path, monkeypatch, body,
                                                                 field):
    (tmp_path / "profiles.toml").write_text(f"[hot]\n{body}\n")
    monkeypatch.setattr(chaos.spec.scenario, "SCENARIO_DIR", str(tmp_path))
    with pytest.raises(ScenarioError, match=rf"profiles.toml: field 'hot.{field}' must be a "
                                            "finite number >= 0"):
        chaos.spec.scenario.load_profiles()


@pytest.mark.parametrize("body,scale,field", [
    ("[faults]\nkill = 50.0\n", {"rates": 10.0}, "faults.kill"),
    ("[run]\njobs = 50000\n", {"jobs": 10.0}, "run.jobs"),
    ("[run]\nchaos = 50000.0\n", {"duration": 10.0}, "run.chaos")])
def test_a_value_a_profile_scales_past_its_bound_is_refused(tmp_path, monkeypatch, body,
                                                             scale, field):
    path = tmp_path / "big.toml"
    path.write_text(f'name = "x"\n{body}')
    load_scenario(str(path))  # within the bound as written
    base = chaos.spec.scenario.load_profiles
    monkeypatch.setattr(chaos.spec.scenario, "load_profiles", lambda: {**base(), "hot": scale})
    with pytest.raises(ScenarioError, match=rf"big.toml: field '{field}' must be at most .*"
                                            r"\(scaled by profile 'hot'\)"):
        load_scenario(str(path), "hot")


def test_the_bad_cases_differ_from_a_loadable_file_only_in_their_fault(tmp_path):
    # Guards the table above: the same skeleton with sane values loads.
    path = tmp_path / "good.toml"
    path.write_text('name = "x"\n[run]\nchaos = 4.0\nworkers = 2\n'
                    '[faults]\noutages = [[1.0, 2.0]]\n'
                    'crash_points = ["worker.before_call"]\ncrash_point_probability = 0.1\n'
                    'skewed_workers = 2\npoison = 0.2\ncrash_loop = 0.1\n'
                    '[engine]\nheartbeat = false\ncall_timeout = 1.0\nlease = 2.0\n')
    s = load_scenario(str(path))
    assert s.faults.outages == ((1.0, 2.0),) and s.faults.skewed_workers == 2
    assert s.engine == {"heartbeat": False, "call_timeout": 1.0, "lease": 2.0}


def test_an_unknown_profile_is_refused_listing_the_known_ones():
    with pytest.raises(ScenarioError) as err:
        load_scenario("smoke", profile="turbo")
    message = str(err.value)
    assert "profile" in message and "'turbo'" in message
    for known in PROFILES:
        assert known in message


def test_an_unknown_scenario_name_is_refused_listing_the_known_ones():
    with pytest.raises(ScenarioError) as err:
        load_scenario("no-such-scenario")
    message = str(err.value)
    assert "'no-such-scenario'" in message
    for path in SCENARIO_FILES:
        assert path.stem in message
    assert "profiles" not in message  # the profile table is not a scenario


def test_a_crash_point_the_engine_does_not_declare_is_refused_unless_optional(tmp_path):
    # (resolution by role and engine name: tests/unit/test_crashpoints.py)
    from chaos.reference import REFERENCE
    from chaos.reports.fired import not_applicable
    from chaos.spec.scenario import crash_points_for
    path = tmp_path / "points.toml"
    path.write_text('name = "x"\n[faults]\ncrash_points = ["worker.nowhere", '
                    '"worker.before_call"]\ncrash_point_probability = 0.1\n')
    with pytest.raises(ScenarioError, match=r"points.toml: field 'faults.crash_points' .*"
                                            r"'worker.nowhere'"):
        load_scenario(str(path))
    path.write_text('name = "x"\n[faults]\ncrash_points = ["worker.nowhere?", '
                    '"worker.before_call"]\ncrash_point_probability = 0.1\n')
    scenario = load_scenario(str(path))
    assert crash_points_for(scenario, REFERENCE) == (("worker.before_call",),
                                                      ("worker.nowhere?",))
    assert "crash_points" not in not_applicable(scenario, REFERENCE)
    path.write_text('name = "x"\n[faults]\ncrash_points = ["worker.nowhere?"]\n'
                    'crash_point_probability = 0.1\n')
    assert "crash_points" in not_applicable(load_scenario(str(path)), REFERENCE)


@pytest.mark.parametrize("table,name,value", [("run", "chaos", float("nan")),
                                              ("faults", "kill", float("inf")),
                                              ("faults", "outages", [[0.0, float("nan")]])])
def test_a_saved_schedule_whose_scenario_holds_nan_is_refused_not_simulated(tmp_path, table,
                                                                            name, value):
    import json

    from chaos.sim.shrink import SCHEDULE_FORMAT, load_schedule
    data = load_scenario("smoke").to_json()
    data[table][name] = value  # JSON writes NaN and Infinity, and reads them back
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"format": SCHEDULE_FORMAT, "scenario": data, "choices": [],
                                "seed": 1}))
    with pytest.raises(ScenarioError, match=rf"field '{table}.{name}' must be a finite number"):
        load_schedule(str(path))

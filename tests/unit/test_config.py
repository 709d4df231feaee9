"""Engine settings: defaults are valid, unsafe or invalid combinations are refused naming the
settings, file < environment < flags, and every bad value names where it came from."""
from __future__ import annotations

import pytest

from engine.config import ConfigError, EngineConfig, load_config


def write_toml(tmp_path, text: str, name: str = "engine.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_are_valid():
    assert load_config(env={}) == EngineConfig()
    assert EngineConfig().validate() == EngineConfig()


@pytest.mark.parametrize("settings,named", [
    ({"heartbeat": False, "call_timeout": 30.0, "lease": 30.0},
     ["call_timeout", "lease", "heartbeat"]),
    ({"heartbeat": False, "call_timeout": 45.0, "lease": 30.0},
     ["call_timeout", "lease", "heartbeat"]),
    ({"heartbeat": True, "heartbeat_interval": 30.0, "lease": 30.0},
     ["heartbeat_interval", "lease"]),
    ({"send_timeout": 30.0, "outbox_lease": 30.0}, ["send_timeout", "outbox_lease"]),
    ({"max_claims": 5, "max_attempts": 5}, ["max_claims", "max_attempts"]),
    ({"max_claims": 3, "max_attempts": 5}, ["max_claims", "max_attempts"]),
    ({"lease": -1.0}, ["lease"]),
    ({"call_timeout": 0.0}, ["call_timeout"]),
    ({"max_attempts": 0}, ["max_attempts"]),
    ({"synchronous": "OFF"}, ["synchronous"]),
    ({"reconnect_window": -1.0}, ["reconnect_window"]),
])
def test_unsafe_or_invalid_settings_are_refused_naming_them(settings, named):
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides=settings)
    for name in named:
        assert name in str(err.value)


@pytest.mark.parametrize("settings", [
    {"heartbeat": False, "call_timeout": 29.9, "lease": 30.0},
    {"heartbeat": True, "call_timeout": 60.0, "lease": 30.0},   # the heartbeat keeps the lease
    {"heartbeat_interval": 29.0, "lease": 30.0},
    {"max_claims": 6, "max_attempts": 5},
    {"synchronous": "normal"},
    {"reconnect_window": 0.0},   # one try, as before the window existed
])
def test_safe_settings_next_to_the_limits_are_accepted(settings):
    cfg = load_config(env={}, overrides=settings)
    for name, value in settings.items():
        assert getattr(cfg, name) == value


def test_file_then_environment_then_flags(tmp_path):
    path = write_toml(tmp_path, 'lease = 40\ncall_timeout = 4.0\nmodel = "from-file"\n'
                                'max_attempts = 3\n')
    env = {"NINELIVES_CALL_TIMEOUT": "6", "NINELIVES_MODEL": "from-env"}
    cfg = load_config(file=path, env=env, overrides={"model": "from-flag", "lease": None})
    assert (cfg.lease, cfg.call_timeout, cfg.model, cfg.max_attempts) == (
        40.0, 6.0, "from-flag", 3)
    assert load_config(file=path, env=env).model == "from-env"
    assert load_config(file=path, env={}).model == "from-file"


def test_settings_may_sit_under_an_engine_table(tmp_path):
    path = write_toml(tmp_path, "[engine]\nlease = 50\nheartbeat = false\ncall_timeout = 10\n")
    cfg = load_config(file=path, env={})
    assert (cfg.lease, cfg.heartbeat, cfg.call_timeout) == (50.0, False, 10.0)


@pytest.mark.parametrize("text", ["lease = 40\nleese = 3\n", "[engine]\nleese = 3\n"])
def test_unknown_key_in_a_file_names_the_file_and_the_key(tmp_path, text):
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(file=path, env={})
    assert path in str(err.value) and "'leese'" in str(err.value)


@pytest.mark.parametrize("text,setting", [('lease = "long"\n', "lease"),
                                          ("max_attempts = 2.5\n", "max_attempts"),
                                          ('heartbeat = "sometimes"\n', "heartbeat"),
                                          ("model = 3\n", "model")])
def test_wrong_type_in_a_file_names_the_file(tmp_path, text, setting):
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(file=path, env={})
    assert f"config file {path}" in str(err.value) and repr(setting) in str(err.value)


@pytest.mark.parametrize("var,value,setting", [("NINELIVES_LEASE", "long", "lease"),
                                               ("NINELIVES_MAX_CLAIMS", "many", "max_claims"),
                                               ("NINELIVES_HEARTBEAT", "maybe", "heartbeat")])
def test_wrong_type_in_the_environment_names_the_variable(var, value, setting):
    with pytest.raises(ConfigError) as err:
        load_config(env={var: value})
    assert f"environment variable {var}" in str(err.value) and repr(setting) in str(err.value)


@pytest.mark.parametrize("name,value,flag", [("call_timeout", "fast", "--call-timeout"),
                                             ("heartbeat", "maybe", "--heartbeat"),
                                             ("max_attempts", True, "--max-attempts")])
def test_wrong_type_in_a_flag_names_the_flag(name, value, flag):
    with pytest.raises(ConfigError) as err:
        load_config(env={}, flags={name: value})
    assert f"flag {flag}" in str(err.value)


def test_flags_and_the_environment_are_text_and_are_parsed():
    cfg = load_config(env={"NINELIVES_HEARTBEAT": "off", "NINELIVES_LEASE": "40"},
                      flags={"max_attempts": "3", "call_timeout": "2.5", "keep_job": "no"})
    assert (cfg.heartbeat, cfg.lease, cfg.max_attempts, cfg.call_timeout, cfg.keep_job) == (
        False, 40.0, 3, 2.5, False)


# -- typed values (a TOML file, a scenario's table) are not coerced -------------------------

@pytest.mark.parametrize("name,value,kind", [
    ("lease", "2", "a finite number"), ("heartbeat", "yes", "a boolean"),
    ("heartbeat", 1, "a boolean"), ("max_attempts", 3.0, "an integer"),
    ("max_attempts", "3", "an integer"), ("synchronous", 1, "a string"),
    ("lease", True, "a finite number")])
def test_a_typed_value_of_the_wrong_type_is_refused_not_coerced(tmp_path, name, value, kind):
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={name: value})
    assert f"setting {name!r} must be {kind}" in str(err.value) and repr(value) in str(err.value)
    toml = f"{name} = {value!r}\n".replace("'", '"').replace("True", "true")
    with pytest.raises(ConfigError, match=f"config file .*: setting {name!r} must be {kind}"):
        load_config(file=write_toml(tmp_path, toml), env={})


def test_an_integer_is_a_number_for_a_float_setting():
    assert load_config(env={}, overrides={"lease": 40}).lease == 40.0


# -- nan and infinity, from every source ----------------------------------------------------
# nan compares false with every bound (lease nan passed `<= 0`, then failed in SQLite), and an
# infinite lease or timeout never ends.

@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "infinity"])
@pytest.mark.parametrize("name", ["lease", "call_timeout", "heartbeat_interval", "backoff_cap"])
def test_nan_and_infinity_are_refused_from_the_environment_and_flags(name, text):
    var = f"NINELIVES_{name.upper()}"
    with pytest.raises(ConfigError, match=f"environment variable {var}: setting {name!r} "
                                          "must be a finite number"):
        load_config(env={var: text})
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"flag {flag}: setting {name!r} must be a finite"):
        load_config(env={}, flags={name: text})


@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_nan_and_infinity_are_refused_from_a_file_and_a_table(tmp_path, text):
    path = write_toml(tmp_path, f"[engine]\nlease = {text}\n")
    with pytest.raises(ConfigError, match=f"config file {path}: setting 'lease' must be a "
                                          "finite number"):
        load_config(file=path, env={})
    with pytest.raises(ConfigError, match="setting 'lease' must be a finite number"):
        load_config(env={}, overrides={"lease": float(text)})


@pytest.mark.parametrize("text", ["inf", "1e400"])
def test_an_infinite_integer_setting_is_refused_not_raised(tmp_path, text):
    path = write_toml(tmp_path, f"max_claims = {text}\n")
    with pytest.raises(ConfigError, match="'max_claims' must be an integer"):
        load_config(file=path, env={})
    with pytest.raises(ConfigError, match="'max_claims' must be an integer"):
        load_config(env={"NINELIVES_MAX_CLAIMS": text})


@pytest.mark.parametrize("name", ["lease", "send_timeout", "price_prompt_per_1k",
                                  "reconnect_window"])
def test_a_config_built_directly_is_checked_for_finite_numbers(name):
    with pytest.raises(ConfigError, match=f"{name!r} must be a finite number"):
        EngineConfig(**{name: float("nan")}).validate()


@pytest.mark.parametrize("name", ["heartbeat_interval", "price_completion_per_1k",
                                  "reconnect_window"])
def test_a_negative_interval_or_price_is_refused(name):
    with pytest.raises(ConfigError, match=f"{name!r} must be >= 0"):
        load_config(env={}, overrides={name: -1.0})


def test_unknown_flag_is_named():
    with pytest.raises(ConfigError, match="'leese'"):
        load_config(env={}, overrides={"leese": 3})


@pytest.mark.parametrize("text", ["lease = ", "[engine\n"])
def test_malformed_file_names_the_file(tmp_path, text):
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError, match="not valid TOML") as err:
        load_config(file=path, env={})
    assert path in str(err.value)


def test_missing_file_names_the_file(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="does not exist") as err:
        load_config(file=missing, env={})
    assert missing in str(err.value)


def test_environment_is_read_from_the_process_when_not_given(monkeypatch):
    monkeypatch.setenv("NINELIVES_LEASE", "77")
    assert load_config().lease == 77.0


@pytest.mark.parametrize("item", ["worker.after_call@nan", "worker.after_call@inf",
                                  "worker.after_call@1.5", "worker.after_call@x",
                                  "worker.after_call:0", "worker.after_call:1.5"])
def test_a_crash_point_item_that_is_not_a_count_or_probability_is_named(item):
    from engine.hooks import KillAt
    with pytest.raises(ValueError, match=rf"NINELIVES_CRASH_AT item '{item}'"):
        KillAt(item)


def test_a_crash_point_item_still_names_an_unknown_point():
    from engine.hooks import KillAt
    with pytest.raises(ValueError, match="unknown crash point 'worker.nowhere'"):
        KillAt("worker.nowhere@0.5")
    assert KillAt("worker.after_call@0.5,worker.before_call:2").nth == {"worker.before_call": 2}


def test_a_crash_seed_that_is_not_a_whole_number_is_named():
    from engine.hooks import arm_from_env
    with pytest.raises(ValueError, match="NINELIVES_CRASH_SEED must be a whole number, got 'x'"):
        arm_from_env({"NINELIVES_CRASH_AT": "worker.after_call@0.5", "NINELIVES_CRASH_SEED": "x"})


def test_only_a_typed_string_is_told_to_drop_its_quotes():
    with pytest.raises(ConfigError) as typed:
        load_config(env={}, overrides={"lease": "2"})
    assert "written without quotes" in str(typed.value)
    for source in ({"env": {"NINELIVES_LEASE": "nan"}}, {"env": {}, "flags": {"lease": "x"}}):
        with pytest.raises(ConfigError) as text:  # text has no quotes to drop
            load_config(**source)
        assert "quotes" not in str(text.value) and "'lease'" in str(text.value)


@pytest.mark.parametrize("env, named", [
    ({"NINELIVES_CRASH_AT": "a.point@nan"}, "a probability must be within 0..1"),
    ({"NINELIVES_CRASH_AT": "a.point@1.5"}, "a probability must be within 0..1"),
    ({"NINELIVES_CRASH_AT": "a.point@often"}, "'often' is not a number"),
    ({"NINELIVES_CRASH_AT": "a.point:0"}, "0 is below 1"),
    ({"NINELIVES_CRASH_AT": "a.point:two"}, "'two' is not a whole number"),
    ({"NINELIVES_CRASH_AT": "a.point:1", "NINELIVES_CRASH_SEED": "x"}, "NINELIVES_CRASH_SEED"),
], ids=["nan", "above-one", "not-a-number", "zeroth-hit", "not-whole", "seed"])
def test_the_probe_other_engines_import_refuses_what_would_disarm_or_crash_it(env, named):
    # An engine we did not write arms chaos.probe from the same variables as ours.
    from chaos.probe import Armed
    with pytest.raises(ValueError, match=named) as refused:
        Armed(env, ["a.point"])
    assert "NINELIVES_CRASH_" in str(refused.value)
    assert Armed({"NINELIVES_CRASH_AT": "a.point@0.5,a.point:2"}, ["a.point"]).nth == {"a.point": 2}


def test_the_reconnect_window_comes_from_the_environment_and_flags_and_names_its_source():
    assert EngineConfig().reconnect_window == 30.0
    assert load_config(env={"NINELIVES_RECONNECT_WINDOW": "5"}).reconnect_window == 5.0
    with pytest.raises(ConfigError, match="flag --reconnect-window: setting 'reconnect_window'"
                                          " must be a finite number"):
        load_config(env={}, flags={"reconnect_window": "soon"})

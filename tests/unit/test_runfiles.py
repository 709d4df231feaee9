"""The run folder's records: secrets redacted at any depth, JSON written atomically."""
from __future__ import annotations

import json
import os

import pytest

from chaos.run.runfiles import REDACTED, redact, scenario_record, write_json
from chaos.spec.scenario import load_scenario


def test_every_setting_named_for_a_secret_is_redacted_at_any_depth_in_any_case():
    table = {"provider_key": "sk-1", "API_TOKEN": "t-2", "nested": {"db_Password": "p-3",
             "list": [{"client_secret": "s-4", "lease": 2.0}]}, "lease": 2.0, "model": "m"}
    assert redact(table) == {"provider_key": REDACTED, "API_TOKEN": REDACTED,
                             "nested": {"db_Password": REDACTED,
                                        "list": [{"client_secret": REDACTED, "lease": 2.0}]},
                             "lease": 2.0, "model": "m"}
    assert table["provider_key"] == "sk-1"  # a copy: the run itself still has the key


def test_an_adapter_names_more_secrets_and_an_empty_key_stays_visible():
    assert redact({"credentials": "c", "provider_key": ""}, ["credentials"]) == {
        "credentials": REDACTED, "provider_key": ""}


@pytest.mark.parametrize("value", ['["sk-live-4711"]', "nan", '{ k = "sk-live-4711" }'])
def test_a_scenario_error_never_shows_a_secrets_value(tmp_path, value):
    from chaos.spec.scenario import ScenarioError, load_scenario
    scenario = tmp_path / "leaky.toml"
    scenario.write_text(f'name = "leaky"\n[engine]\napi_token = {value}\n')
    with pytest.raises(ScenarioError) as error:
        load_scenario(str(scenario))
    assert "engine.api_token" in str(error.value)
    assert "sk-live-4711" not in str(error.value) and "nan" not in str(error.value)


def test_the_scenario_record_redacts_the_engine_table(tmp_path):
    scenario = tmp_path / "keyed.toml"
    scenario.write_text('name = "keyed"\n[engine]\nprovider_key = "sk-secret"\n')
    loaded = load_scenario(str(scenario))
    assert loaded.engine["provider_key"] == "sk-secret"
    assert scenario_record(loaded)["engine"]["provider_key"] == REDACTED


def test_write_json_replaces_the_file_whole_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_json(path, {"a": 1})
    monkeypatch.setattr(json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError("full")))
    with pytest.raises(OSError):
        write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["report.json"]


def test_an_engine_setting_error_never_shows_a_secrets_value(tmp_path):
    from engine.config import ConfigError, load_config
    config = tmp_path / "engine.toml"
    config.write_text("[engine]\nprovider_key = 912873465\n")
    for attempt in (lambda: load_config(str(config), env={}),
                    lambda: load_config(env={}, overrides={"provider_key": 912873465})):
        with pytest.raises(ConfigError) as error:
            attempt()
        assert "provider_key" in str(error.value) and "912873465" not in str(error.value)


def test_the_scenario_record_redacts_the_secrets_an_adapter_names(tmp_path):
    import dataclasses
    scenario = tmp_path / "plain.toml"
    scenario.write_text('name = "plain"\n')
    loaded = dataclasses.replace(load_scenario(str(scenario)),
                                 engine={"credentials": "c-1", "lease": 2.0})

    class Adapter:
        secret_settings = ("credentials",)
    assert scenario_record(loaded, Adapter())["engine"] == {"credentials": REDACTED,
                                                           "lease": 2.0}
    assert scenario_record(loaded)["engine"]["credentials"] == "c-1"

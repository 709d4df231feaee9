"""The power_loss fault in real runs: the reference engine at its defaults keeps every
acknowledged transaction over several cuts, each fired with its evidence, and leaves no
mount behind; a machine that cannot mount is refused before the run, naming why."""
from __future__ import annotations

import json
import os

import pytest

from chaos.backends import Backend
from chaos.contract import load_engine
from chaos.powerloss import mount as pl
from chaos.runner import HarnessError, run_campaign
from chaos.scenario import load_scenario


def test_power_loss_passes_on_the_reference_engine_and_each_cut_has_evidence(tmp_path):
    scenario = load_scenario("power-loss", "smoke")
    result = run_campaign(scenario, 3, load_engine("reference"), str(tmp_path), progress=False)
    verdicts = {v["name"]: v for v in result.report["verdicts"]}
    failed = {n: v["reason"] for n, v in verdicts.items() if v["verdict"] == "fail"}
    assert result.exit_code == 0, failed
    assert verdicts["durable-commits"]["verdict"] == "pass"
    events = [json.loads(line) for line in open(os.path.join(result.run_dir, "events.jsonl"))]
    cuts = [e for e in events if e["type"] == "power_loss"]
    assert len(cuts) >= 3
    for e in cuts:
        assert e["lost_count"] == 0 and e["acknowledged"] > 0 and e["killed"]
        assert {"dropped_writes", "dropped_bytes", "dropped_entries", "mode"} <= set(e)
        assert e["durability_promised"] is True
    assert any(e["dropped_writes"] for e in cuts)  # the cuts did take writes back
    assert not pl.mounted(os.path.join(result.run_dir, "store"))


def test_power_loss_is_refused_before_the_run_where_fuse_cannot_mount(tmp_path, monkeypatch):
    monkeypatch.setenv(pl.FUSERMOUNT_ENV, str(tmp_path / "missing-fusermount3"))
    scenario = load_scenario("power-loss", "smoke")
    with pytest.raises(HarnessError, match="faults.power_loss cannot run on this machine: "
                                           "no fusermount3 program"):
        run_campaign(scenario, 3, load_engine("reference"), str(tmp_path / "out"),
                     progress=False)
    assert not (tmp_path / "out").exists()


def test_power_loss_is_refused_on_postgres_naming_the_store(tmp_path):
    scenario = load_scenario("power-loss", "smoke")
    with pytest.raises(HarnessError, match="SQLite store only"):
        run_campaign(scenario, 3, load_engine("reference"), str(tmp_path / "out"),
                     progress=False, backend=Backend("postgres", "postgresql://127.0.0.1/x"))

"""The power_loss fault in real runs: the reference engine at its defaults keeps every
acknowledged transaction over several cuts, each fired with its evidence, and leaves no
mount behind; a machine that cannot mount is refused before the run, naming why."""
from __future__ import annotations

import glob
import json
import os
import tempfile

import pytest

from chaos.run.backends import Backend
from chaos.contract import load_engine
from chaos.powerloss import mount as pl
from chaos.run.runner import HarnessError, run_campaign
from chaos.spec.scenario import load_scenario


def passing_cuts(tmp_path, seed: int, backend: Backend | None = None):
    """The reference engine's run of power-loss at `seed` on `backend`: it must pass, with
    durable-commits judged and at least 3 cuts; returns (the cuts' events, the result)."""
    scenario = load_scenario("power-loss", "smoke")
    result = run_campaign(scenario, seed, load_engine("reference"), str(tmp_path),
                          progress=False, **({"backend": backend} if backend else {}))
    verdicts = {v["name"]: v for v in result.report["verdicts"]}
    failed = {n: v["reason"] for n, v in verdicts.items() if v["verdict"] == "fail"}
    assert result.exit_code == 0, failed
    assert verdicts["durable-commits"]["verdict"] == "pass"
    with open(os.path.join(result.run_dir, "events.jsonl"), encoding="utf-8") as fh:
        cuts = [e for e in map(json.loads, fh) if e["type"] == "power_loss"]
    assert len(cuts) >= 3
    return cuts, result


def test_power_loss_passes_on_the_reference_engine_and_each_cut_has_evidence(tmp_path):
    cuts, result = passing_cuts(tmp_path, 3)
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


def test_power_loss_is_refused_on_a_server_the_run_does_not_own(tmp_path):
    scenario = load_scenario("power-loss", "smoke")
    with pytest.raises(HarnessError, match="cannot cut a server it does not own"):
        run_campaign(scenario, 3, load_engine("reference"), str(tmp_path / "out"),
                     progress=False, backend=Backend("postgres", "postgresql://127.0.0.1/x"))
    assert not (tmp_path / "out").exists()


def test_power_loss_on_postgres_kills_and_recovers_the_server_and_loses_nothing(tmp_path):
    """The data directory on the mount, the server killed with the engine at each cut and
    recovered from its WAL: synchronous_commit=on keeps every acknowledged transaction, and
    no server, mount or data directory is left behind."""
    cuts, result = passing_cuts(tmp_path, 1, Backend("postgres"))
    for e in cuts:
        assert "server" in e["killed"] and len(e["server_pids"]) > 1  # postmaster and children
        assert e["lost_count"] == 0 and e["acknowledged"] > 0 and e["server_up_after"] > 0
        assert e["durability_promised"] is True and "synchronous_commit=on" in \
            e["durability_setting"]
        assert not any(_alive(pid) for pid in e["server_pids"])
    assert any(e["dropped_writes"] for e in cuts)
    assert not list(tmp_path.glob("power-loss/*/powerloss/disk/data"))  # the cluster's files
    run = os.path.basename(result.run_dir)  # in the mount point's name (others may run)
    assert not [line for line in open("/proc/self/mountinfo") if run in line]
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"ninelives-powerloss-{run}-*"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie is no process left running
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

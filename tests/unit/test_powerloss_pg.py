"""The PostgreSQL side of the power_loss fault, without a server: which runs may have it, and
the reading made just before a cut (clients and WAL writer stopped, the live server read)
that leaves everything running when it fails."""
from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from chaos.powerloss import fault
from chaos.reference.adapter import ReferenceEngine
from chaos.spec.scenario import load_scenario


def test_power_loss_runs_on_a_server_of_the_runs_own_and_refuses_one_it_does_not_own():
    scenario = load_scenario("power-loss", "smoke")
    assert fault.refusal(scenario, "postgres", own_server=True) is None
    refused = fault.refusal(scenario, "postgres", own_server=False)
    assert "without --pg-url" in refused and "cannot cut a server it does not own" in refused
    assert fault.refusal(load_scenario("smoke", "smoke"), "postgres", own_server=False) is None


def test_the_reference_declares_durability_by_synchronous_commit_on_postgres():
    promised, setting = ReferenceEngine().durability({})
    assert promised is True and "synchronous_commit=on" in setting
    promised, setting = ReferenceEngine().durability({"synchronous": "NORMAL"})
    assert promised is False and "synchronous_commit=off" in setting


class Supervisor:
    def __init__(self):
        self.sent = []

    def signal(self, child, sig):
        self.sent.append((child, sig))


def nemesis(operations):
    return SimpleNamespace(supervisor=Supervisor(), db="postgresql://u@127.0.0.1:1/db",
                           server=SimpleNamespace(stop_wal_writer=lambda: None),
                           engine=SimpleNamespace(operations=operations))


def test_the_reading_stops_the_clients_first_and_returns_what_the_server_shows():
    n = nemesis(lambda db: [{"type": "state", "job": "doc-1"}])
    assert fault._server_reading(n, ["worker-0", "sender-0"]) == [
        {"type": "state", "job": "doc-1"}]
    assert n.supervisor.sent == [("worker-0", signal.SIGSTOP), ("sender-0", signal.SIGSTOP)]


def test_a_reading_that_fails_lets_the_stopped_clients_go_on():
    def unreachable(db):
        raise ConnectionError("server gone")
    n = nemesis(unreachable)
    with pytest.raises(ConnectionError):
        fault._server_reading(n, ["worker-0"])
    assert n.supervisor.sent == [("worker-0", signal.SIGSTOP), ("worker-0", signal.SIGCONT)]

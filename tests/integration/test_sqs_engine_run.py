"""A real `ninelives run` of the SQS engine (examples/sqs_engine): real processes killed,
paused past their visibility timeout and resumed as zombies, leases expired under them; the
engine holds every claim it gives evidence for."""
from __future__ import annotations

from test_example_engines import run

SQS = "examples.sqs_engine.adapter:SQS"


def test_the_sqs_engine_passes_a_real_lost_lease_run(tmp_path):
    done, report, verdicts = run(tmp_path, SQS, "lost-lease", 1)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {v["verdict"] for v in verdicts.values()} <= {"pass", "unknown"}
    assert verdicts["fenced-writes"]["verdict"] == "pass"
    assert {"fencing", "heartbeat"} <= set(report["capabilities"])
    assert report["faults_applied"], report["faults_applied"]

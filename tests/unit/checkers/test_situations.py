"""The situations a run reached ("sometimes" coverage): each recogniser on a hand-made history
that reaches it and on one that nearly does, the marking of a pass not exercised, and
--require-exercised through the CLI."""
from __future__ import annotations

import json
import os

from chaos.checkers import Verdict
from chaos.commands.cli import main
from chaos.reports.report import exit_code_for, require_exercised, situations_record
from chaos.situations import CATALOG, EXERCISES, exercise, recognise

from builders import (S1, W1, W2, call, delivered_job, job, memo, nemesis, outbox, process,
                       request, snapshot_of, submit)


def reached(history, name, **snap):
    return recognise(history, snapshot_of(history, **snap))[name]


def test_the_catalog_names_every_declared_situation_and_describes_each():
    assert all(n in CATALOG for names in EXERCISES.values() for n in names)
    assert all(CATALOG[n].endswith(".") and len(CATALOG[n]) > 40 for n in CATALOG)
    assert len(CATALOG) >= 15


def _taken_over(zombie_writes):
    """W1 claims doc-1, W2 takes it over after the lease lapsed, then W1 (the zombie)
    writes what `zombie_writes` gives."""
    h = [submit(1.0, "doc-1"), job(1.0, "doc-1", None, "pending", "submit", 0, op="insert"),
         job(1.1, "doc-1", "pending", "fetching", W1, 1, old_token=0, claims=1, lease_until=3.1),
         job(3.5, "doc-1", "fetching", "fetching", W2, 2, old_token=1, claims=2, lease_until=5.5)]
    return h + zombie_writes


def test_zombie_write_after_takeover_is_the_zombies_memo_kept():
    h = _taken_over([memo(3.6, "doc-1", "fetch", W1, 1)])
    r = reached(h, "zombie-write-after-takeover")
    assert r.count == 1 and r.examples[0]["type"] == "memo" and r.lines == [5]


def test_no_zombie_write_when_the_worker_wrote_before_the_takeover():
    h = _taken_over([])
    h.insert(3, memo(3.0, "doc-1", "fetch", W1, 1))
    assert reached(h, "zombie-write-after-takeover").count == 0


def test_call_answered_after_takeover_and_a_call_answered_before_it():
    late = _taken_over([call(3.0, 3.8, "doc-1", "fetch", W1)])
    early = _taken_over([call(2.0, 2.5, "doc-1", "fetch", W1)])
    assert reached(late, "call-answered-after-takeover").count == 1
    assert reached(early, "call-answered-after-takeover").count == 0


def test_memo_resume_with_effects_and_a_step_finished_by_its_own_call():
    h = delivered_job("doc-1")          # every step by its own call, deliver by its own memo
    assert reached(h, "memo-resume").count == 0
    # W1 wrote deliver's memo and died; W2 finishes the step from it, queueing the effects.
    resume = [e for e in h if e["src"] == "engine" and e["type"] in ("memo", "state",
                                                                       "effect_queued")
              and e.get("step", "deliver") == "deliver" and e["t"] >= h[-3]["t"]]
    assert resume  # the builder's deliver: memo, delivered, two effects
    base = [e for e in h if e not in resume]
    last = base[-1]["t"]
    story = base + [memo(last + 0.01, "doc-1", "deliver", W1, 1, cost=0.0),
                    process(last + 0.02, "exit", "worker-0", 101, signal="SIGKILL"),
                    job(last + 3.0, "doc-1", "delivering", "delivering", W2, 2, old_token=1,
                        claims=2, lease_until=last + 5),
                    job(last + 3.1, "doc-1", "delivering", "delivered", W2, 2),
                    outbox(last + 3.1, 1, "doc-1", "charge", W2, 0, op="insert")]
    r = reached(story, "memo-resume")
    assert r.count == 1 and r.examples[0]["worker"] == W2
    assert reached(story, "memo-resume-with-effects").count == 1


def test_retry_after_honoured_needs_the_header_and_a_later_call():
    refused = call(1.0, 1.01, "doc-1", "fetch", W1, status=429, outcome="error", billed=0,
                   retry_after=0.5)
    again = call(1.6, 1.61, "doc-1", "fetch", W1, n=2)
    h = [refused, again]
    assert reached(h, "retry-after-honoured").count == 1
    assert reached([refused], "retry-after-honoured").count == 0
    no_header = dict(refused, retry_after=None)
    assert reached([no_header, again], "retry-after-honoured").count == 0


def test_ambiguous_send_retried_and_a_clean_second_send():
    lost = request(1.0, 1.1, "doc-1", "charge", outcome="dropped", applied=True, status=0)
    lost["completion"] = "info"
    again = request(2.0, 2.01, "doc-1", "charge", n=2, outcome="replayed", applied=False)
    clean = request(1.0, 1.01, "doc-1", "charge")
    assert reached([lost, again], "ambiguous-send-retried").count == 1
    assert reached([clean, again], "ambiguous-send-retried").count == 0


def test_failed_send_retried_and_sends_that_were_not_refused_or_not_retried():
    refused = request(1.0, 1.01, "doc-1", "charge", status=503, outcome="error", applied=False)
    again = request(1.3, 1.31, "doc-1", "charge", n=2)
    r = reached([refused, again], "failed-send-retried")
    assert r.count == 1 and r.examples == [again]
    assert reached([refused], "failed-send-retried").count == 0
    assert reached([request(1.0, 1.01, "doc-1", "charge"), again],
                   "failed-send-retried").count == 0
    declined = dict(refused, status=402)  # refused for good: a retry is another fault
    assert reached([declined, again], "failed-send-retried").count == 0


def test_retry_discipline_with_no_failed_send_nor_retry_is_not_exercised():
    """A run whose receiver refused nothing examined no retry wait: "pass, not exercised";
    one failed send retried exercises it."""
    from chaos.checkers.retries import check_retry_discipline
    from builders import sent_effect, snapshot_with_effects
    clean = delivered_job("doc-1") + sent_effect(2.0, "doc-1", "charge", 1)
    refused = sent_effect(2.0, "doc-1", "charge", 1, status=503, outcome="error",
                          applied=False, mark=False)
    retried = delivered_job("doc-1") + refused + sent_effect(2.3, "doc-1", "charge", 1,
                                                             token=2)
    for h, label in ((clean, "pass, not exercised"), (retried, "pass")):
        verdict = check_retry_discipline(h, snapshot_with_effects(h))
        exercise([verdict], recognise(h, snapshot_with_effects(h)))
        assert verdict.label == label, (verdict.label, verdict.reason, verdict.situations)


def test_outbox_takeover_from_a_live_sender_not_from_a_dead_one():
    S2 = "sender:host:202:dddd"
    first = outbox(1.0, 1, "doc-1", "charge", S1, 1, old_token=0, attempts=1, lease_until=2.0)
    second = outbox(2.5, 1, "doc-1", "charge", S2, 2, old_token=1, attempts=2, lease_until=3.5)
    first["pid"], second["pid"] = 201, 202
    assert reached([first, second], "outbox-takeover-from-live-sender").count == 1
    dead = process(2.0, "exit", "sender-0", 201, role="sender", signal="SIGKILL")
    assert reached([first, dead, second], "outbox-takeover-from-live-sender").count == 0


def test_duplicate_submit_and_none():
    assert reached([nemesis(1.0, "duplicate_submit", job="doc-1", kind="same",
                            result="exists")], "duplicate-submit").count == 1
    assert reached([submit(1.0, "doc-1")], "duplicate-submit").count == 0


def test_an_engine_without_an_outbox_cannot_show_its_situations():
    h = [submit(1.0, "doc-1")]
    snap = snapshot_of(h, engine={"name": "x", "capabilities": ["fencing"]})
    r = recognise(h, snap)["ambiguous-send-retried"]
    assert not r.observable and "outbox" in r.why


def test_a_pass_without_its_situations_is_not_exercised_and_an_error_when_required():
    verdicts = [Verdict("submissions-idempotent", checked=3), Verdict("db-intact", checked=1)]
    h = [submit(1.0, "doc-1")]
    exercise(verdicts, recognise(h, snapshot_of(h)))
    assert verdicts[0].exercised is False and verdicts[0].label == "pass, not exercised"
    assert verdicts[1].exercised is None and verdicts[1].label == "pass"
    data = [v.to_json() for v in verdicts]
    assert data[0]["verdict"] == "pass" and data[0]["exercised"] is False
    assert "exercised" not in data[1]
    report = {"verdicts": data, **situations_record(h, snapshot_of(h), data)}
    report["exit_code"] = exit_code_for(data)
    report["result"] = "pass"
    assert report["not_exercised"] == ["submissions-idempotent"]
    assert require_exercised(report)["exit_code"] == 2 and report["result"] == "error"


def test_require_exercised_makes_a_sim_pass_not_exercised_exit_2(tmp_path, capsys):
    args = ["sim", "smoke", "--profile", "smoke", "--seed", "1", "--out", str(tmp_path),
            "--quiet"]
    assert main(args) == 0
    assert main(args + ["--require-exercised"]) == 2
    out = capsys.readouterr().out
    assert "pass, not exercised" in out and "situations reached:" in out
    assert "ERROR: passed, but not exercised" in out and "submissions-idempotent" in out
    runs = sorted(p for p in (tmp_path / "smoke").iterdir() if p.name.startswith("sim-"))
    report = json.loads((runs[-1] / "report.json").read_text())
    assert report["result"] == "error" and "submissions-idempotent" in report["not_exercised"]
    assert report["situations"]["duplicate-submit"]["count"] == 0
    junit = (runs[-1] / "junit.xml").read_text()
    assert 'name="situation.kill-mid-step"' in junit and 'name="exercised" value="false"' in junit
    assert "pass, not exercised" in (runs[-1] / "summary.md").read_text()
    assert "PASS, NOT EXERCISED" in (runs[-1] / "report.html").read_text()
    assert main(["check", str(runs[-1])]) == 0
    assert main(["check", str(runs[-1]), "--require-exercised"]) == 2


def test_a_real_lost_lease_run_reaches_a_call_answered_after_its_lease_was_lost(tmp_path):
    """Paused workers resume holding answers to calls whose leases were cut or taken."""
    code = main(["run", "lost-lease", "--profile", "smoke", "--seed", "1", "--out",
                 str(tmp_path), "--quiet"])
    assert code == 0
    run = os.path.join(tmp_path, "lost-lease", "latest")
    report = json.loads(open(os.path.join(run, "report.json")).read())
    found = report["situations"]
    assert found["call-answered-after-takeover"]["count"] \
        + found["zombie-write-after-takeover"]["count"] >= 1


def _cut_then_committed(commit_at):
    """W1 claims doc-1 (lease to 3.1); the harness cuts its lease at 1.5; nobody claims it;
    W1 commits fetching -> fetched at `commit_at`."""
    return [submit(1.0, "doc-1"), job(1.0, "doc-1", None, "pending", "submit", 0, op="insert"),
            job(1.1, "doc-1", "pending", "fetching", W1, 1, old_token=0, claims=1,
                lease_until=3.1),
            nemesis(1.5, "expire"),
            job(1.5, "doc-1", "fetching", "fetching", "nemesis", 1, lease_until=1.49),
            job(commit_at, "doc-1", "fetching", "fetched", W1, 1, lease_until=0.0)]


def test_commit_after_lease_lapse_counts_a_lease_the_harness_cut_short():
    r = reached(_cut_then_committed(1.8), "commit-after-lease-lapse")
    assert r.count == 1 and "cut short by the harness" in r.notes[0]
    # committed before the cut: its lease still held
    early = _cut_then_committed(1.4)
    early.sort(key=lambda e: e["t"])
    assert reached(early, "commit-after-lease-lapse").count == 0


def test_a_heartbeat_held_at_its_renewal_until_a_takeover_renews_a_lost_lease():
    def released(reason):
        return _taken_over([nemesis(3.6, "release", role="heartbeat", reason=reason,
                                    job="doc-1", target="worker-0.1", by="worker-1.2")])
    settings = {"heartbeat": True, "heartbeat_interval": 10.0}
    r = recognise(released("takeover"), snapshot_of(released("takeover"), settings=settings))
    assert r["heartbeat-after-lease-lost"].count == 1
    assert "held at its renewal" in r["heartbeat-after-lease-lost"].notes[0]
    r = recognise(released("deadline"), snapshot_of(released("deadline"), settings=settings))
    assert r["heartbeat-after-lease-lost"].count == 0


def test_kill_mid_step_counts_the_probes_own_kill_and_not_an_orderly_exit():
    held = [submit(1.0, "doc-1"), job(1.0, "doc-1", None, "pending", "submit", 0, op="insert"),
            job(1.1, "doc-1", "pending", "fetching", W1, 1, old_token=0, claims=1,
                lease_until=3.1)]
    crashed = held + [process(1.5, "exit", "worker-0.1", 101, signal="SIGKILL", killed=False)]
    assert reached(crashed, "kill-mid-step").count == 1
    quit_ = held + [process(1.5, "exit", "worker-0.1", 101, code=0)]
    assert reached(quit_, "kill-mid-step").count == 0


def test_one_history_is_recognised_once_and_again_when_it_or_its_snapshot_changes():
    h = _taken_over([memo(3.6, "doc-1", "fetch", W1, 1)])
    snap = snapshot_of(h)
    first = recognise(h, snap)
    assert recognise(h, dict(snap)) is first           # the checkers', then the report's
    other = recognise(h, {**snap, "phases": {"drain_end": 1.0}})
    assert other is not first                           # another snapshot: read again
    h.append(memo(3.7, "doc-1", "extract", W1, 1))
    assert recognise(h, snap) is not first              # the history grew: read again

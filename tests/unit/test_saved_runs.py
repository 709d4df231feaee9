"""`check` and `report` on saved run folders that are not whole: an empty or torn history, a
snapshot lacking what checkers need, files that cannot be read, a report.json cut short.
Each gets a verdict that says what it lacks, or an error naming the file: never a traceback,
never a pass that stands on part of a run. Fixture runs: tests/fixtures/runs/{pass,fail}."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from chaos.checkers import Verdict
from chaos.checkers.verdict import PREFIX_CLOSED, judge_incomplete
from chaos.commands.cli import main
from chaos.history import load_history

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "runs")


@pytest.fixture
def copy(tmp_path):
    """A fresh copy of a fixture run folder: copy("pass") or copy("fail")."""
    def make(name: str):
        folder = tmp_path / name
        shutil.copytree(os.path.join(FIXTURES, name), folder)
        return folder
    return make


def check(folder, capsys) -> tuple[int, str, dict]:
    """`ninelives check FOLDER`: (exit code, what it printed, the check.json it wrote)."""
    code = main(["check", str(folder)])
    out = capsys.readouterr()
    report = json.loads((folder / "check.json").read_text())
    return code, out.out + out.err, report


def verdicts(report: dict) -> dict[str, str]:
    return {v["name"]: v["verdict"] for v in report["verdicts"]}


def test_an_empty_history_leaves_every_checker_unknown_and_exits_2(copy, capsys):
    folder = copy("pass")
    (folder / "history.jsonl").write_text("")
    code, out, report = check(folder, capsys)
    assert code == 2 and report["exit_code"] == 2 and report["result"] == "error"
    assert set(verdicts(report).values()) == {"unknown"}
    assert all("history is empty" in v["reason"] for v in report["verdicts"])
    assert "checker crashed" not in out and "nothing was checked" in out


def test_an_empty_snapshot_makes_checkers_unknown_naming_what_it_lacks(copy, capsys):
    folder = copy("pass")
    (folder / "snapshot.json").write_text("{}")
    code, out, report = check(folder, capsys)
    assert "checker crashed" not in out
    assert not any("traceback" in v["metrics"] for v in report["verdicts"])
    lacking = [v for v in report["verdicts"] if "the snapshot lacks" in v["reason"]]
    assert {"jobs", "pipeline", "settings"} <= {v["reason"].split("'")[1] for v in lacking}
    # What the history alone proves still passes; nothing failed; so the exit code is 0.
    assert "pass" in verdicts(report).values() and code == 0


def test_a_snapshot_table_lacking_a_key_names_the_key_with_its_table(copy, capsys):
    folder = copy("pass")
    snapshot = json.loads((folder / "snapshot.json").read_text())
    del snapshot["plan"]["expect"]
    (folder / "snapshot.json").write_text(json.dumps(snapshot))
    _, out, report = check(folder, capsys)
    assert "checker crashed" not in out
    assert any("'plan.expect'" in v["reason"] for v in report["verdicts"])


@pytest.mark.parametrize("name, content, named", [
    ("history.jsonl", b'{"t": 1.0, "src": "runner", "type": "phase"}\n{"t": 2.0, "x": "\xff"}\n',
     "history.jsonl:2"),
    ("history.jsonl", b'{"t": 1.0}\nnot json\n{"t": 2.0}\n', "history.jsonl:2"),
    ("snapshot.json", b"{not json", "snapshot.json"),
    ("snapshot.json", b"\xff\xfe", "snapshot.json"),
    ("snapshot.json", b"[]", "snapshot.json"),
    ("report.json", b"{cut", "report.json"),
])
def test_a_file_that_cannot_be_read_is_named_with_exit_2(copy, capsys, name, content, named):
    folder = copy("pass")
    (folder / name).write_bytes(content)
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_a_history_cut_mid_line_is_torn_and_no_pass_stands(copy, capsys):
    folder = copy("pass")
    data = (folder / "history.jsonl").read_bytes()
    (folder / "history.jsonl").write_bytes(data[:len(data) // 2])
    lines = data[:len(data) // 2].count(b"\n")
    code, out, report = check(folder, capsys)
    assert code == 2 and "pass" not in verdicts(report).values()
    assert f"line {lines + 1} is cut mid-record" in report["torn"]
    assert "s before the run's end" in report["torn"] and "TORN" in out
    assert all(v["reason"].startswith("torn history") for v in report["verdicts"])


def test_a_history_cut_at_a_line_end_is_torn_by_the_runs_end_time(copy, capsys):
    folder = copy("pass")
    data = (folder / "history.jsonl").read_bytes()
    at = data.index(b"\n", len(data) // 2) + 1
    (folder / "history.jsonl").write_bytes(data[:at])
    last = json.loads(data[:at].splitlines()[-1])["t"]
    code, _, report = check(folder, capsys)
    assert code == 2 and "pass" not in verdicts(report).values()
    assert "ends at a complete record" in report["torn"] and f"{last:.3f}" in report["torn"]


def test_a_whole_history_is_not_torn(copy, capsys):
    folder = copy("pass")
    snapshot = json.loads((folder / "snapshot.json").read_text())
    _, tear = load_history(folder / "history.jsonl", snapshot["phases"]["check_start"])
    assert tear is None
    code, _, report = check(folder, capsys)
    assert code == 0 and report["torn"] is None


def test_failures_in_the_part_of_a_torn_history_there_is_still_fail(copy, capsys):
    folder = copy("fail")
    before = json.loads((folder / "report.json").read_text())
    failed = {v["name"] for v in before["verdicts"] if v["verdict"] == "fail"}
    assert failed and failed <= PREFIX_CLOSED
    last_witness = max(e["t"] for v in before["verdicts"] if v["verdict"] == "fail"
                       for f in v["errors"] for e in f["events"])
    lines = (folder / "history.jsonl").read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["t"] <= last_witness + 0.5]
    assert len(kept) < len(lines)
    (folder / "history.jsonl").write_bytes(b"".join(kept) + lines[len(kept)][:20])
    code, _, report = check(folder, capsys)
    assert code == 1 and report["torn"]
    assert {n for n, v in verdicts(report).items() if v == "fail"} == failed
    assert "pass" not in verdicts(report).values()


def test_an_incomplete_verdict_keeps_prefix_closed_failures_and_defers_the_rest():
    safety, liveness, passing = Verdict("no-rebill-after-commit"), Verdict("all-jobs-settle"), \
        Verdict("db-intact", checked=3)
    safety.fail("rebilled", "called after the commit", {"t": 1.0})
    liveness.fail("unsettled", "doc-1 still pending", {"t": 2.0})
    judge_incomplete([safety, liveness, passing], "torn history")
    assert safety.valid is False and safety.reason == "called after the commit"
    assert liveness.valid is None and liveness.error_count == 1 and liveness.failures
    assert "may be excused" in liveness.reason and "doc-1 still pending" in liveness.reason
    assert passing.valid is None and passing.reason.startswith("torn history")


def test_report_renders_a_report_json_without_verdicts_marked_partial(copy, capsys):
    folder = copy("pass")
    report = json.loads((folder / "report.json").read_text())
    for key in ("verdicts", "metrics", "faults_applied", "result", "exit_code"):
        del report[key]
    (folder / "report.json").write_text(json.dumps(report))
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "PARTIAL" in out
    assert "Partial run" in (folder / "report.html").read_text()
    assert "Partial run" in (folder / "summary.md").read_text()
    assert 'name="run-complete"' in (folder / "junit.xml").read_text()


def test_report_names_what_a_report_json_lacks(copy, capsys):
    folder = copy("pass")
    (folder / "report.json").write_text(json.dumps({"verdicts": []}))
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "report.json" in err and "scenario" in err and "Traceback" not in err


def test_a_partial_snapshot_holds_only_the_jobs_the_killed_runner_submitted(copy):
    from chaos.reference.adapter import ReferenceEngine
    from chaos.run.saved import partial_snapshot
    folder = copy("pass")
    report = json.loads((folder / "report.json").read_text())
    first, second, third, *_ = report["plan"]["jobs"]
    with open(folder / "events.jsonl", "w", encoding="utf-8") as fh:
        for i, job in enumerate((first, second)):  # killed before the third was recorded
            fh.write(json.dumps({"t": 1.0 + i, "src": "runner", "type": "submit", "job": job,
                                 "result": "created"}) + "\n")
        fh.write(json.dumps({"t": 3.0, "src": "runner", "type": "phase", "phase": "chaos"})
                 + "\n")

    class Killed(ReferenceEngine):
        def snapshot(self, db):  # the store: the third job made it in, its record did not
            return {"jobs": {j: {"state": "pending"} for j in (first, second, third)},
                    "memos": [], "outbox": [], "spend": [], "orphans": {}}
    snapshot = partial_snapshot(str(folder), report, Killed())
    assert snapshot["submitted"] == [first, second, third]
    assert snapshot["phases"] == {"chaos_start": 3.0}


def test_check_of_a_torn_copy_keeps_the_runs_own_record(copy, capsys):
    folder = copy("pass")
    assert main(["report", str(folder)]) == 0
    own = {name: (folder / name).read_bytes()
           for name in ("report.json", "report.html", "junit.xml", "summary.md")}
    data = (folder / "history.jsonl").read_bytes()
    (folder / "history.jsonl").write_bytes(data[:len(data) // 2])
    code, out, report = check(folder, capsys)
    assert code == 2 and report["result"] == "error" and report["torn"]
    assert report["check"]["recorded_result"] == "pass"
    for name, before in own.items():  # the run said pass: a damaged copy cannot erase it
        assert (folder / name).read_bytes() == before, name
    assert "Checked again" in (folder / "check.html").read_text()
    assert "check.json" in out and "report.json (pass), is unchanged" in out


def killed_before_its_checks(folder) -> None:
    """Make a fixture run folder look like a run killed after its chaos: report.json back to
    a start record, the history and snapshot kept."""
    report = json.loads((folder / "report.json").read_text())
    for key in ("verdicts", "metrics", "faults_applied", "result", "exit_code", "finished"):
        report.pop(key, None)
    report.update(partial=True, result="partial")
    (folder / "report.json").write_text(json.dumps(report))


def test_a_partial_run_is_headed_partial_with_what_it_gathered(copy, capsys):
    folder = copy("pass")
    killed_before_its_checks(folder)
    events = len((folder / "history.jsonl").read_text().splitlines())
    code, out, report = check(folder, capsys)
    assert code == 2 and report["gathered"]["history_events"] == events
    assert report["gathered"]["provider_calls"] > 0 and report["gathered"]["billed"] > 0
    last = [line for line in out.splitlines() if line.startswith("ERROR")][-1]
    assert f"partial run: gathered {events:,} events" in last and "provider calls" in last
    # the start record had no verdicts: it is filled in, once, and its page rendered
    assert json.loads((folder / "report.json").read_text())["verdicts"]
    for page in ("report.html", "check.html"):
        html = (folder / page).read_text()
        assert "did not exercise what the scenario asked" not in html, page
        assert "partial run: nothing failed in the part there is" in html, page
        assert f"gathered {events} events" in html, page
        assert '<div class="n">$0</div><div class="l">billed' not in html, page

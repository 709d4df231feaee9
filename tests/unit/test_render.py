"""Rendering a saved run (chaos.reports.render): report.html parses, names every invariant and the
replay command, references nothing outside itself, and shows a failure's witnesses in the
verdict table and on the timeline; junit.xml has one test case per invariant with the right
failure count; summary.md carries the verdicts; the timeline model draws held steps, kills
and witnesses where they happened and thins long histories; a rendering failure never loses
a run. Fixture runs: tests/fixtures/runs/pass (a smoke run) and tests/fixtures/runs/fail (a
broken engine that skips the memo check)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from chaos.commands.cli import main as cli_main
from chaos.history import read_history
from chaos.reference import chaos_pipeline
from chaos.reports.render import FILES, render_run
from chaos.reports.render.charts import MAX_SAMPLES, state_counts
from chaos.reports.render.evidence import event_key, witnesses
from chaos.reports.render.html import render_html
from chaos.reports.render.junit import render_junit
from chaos.reports.render.markdown import render_markdown
from chaos.reports.render.timeline import MAX_BARS, build_timeline
from engine import DOCUMENT

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "runs")
PIPELINE = chaos_pipeline(DOCUMENT, ("charge", "notify")).to_json()
VOID = {"meta", "link", "br", "hr", "img", "input", "col", "area", "base", "embed", "source",
        "track", "wbr", "param"}
W1, W2 = "w-1@h", "w-2@h"     # worker ids of any format: their pids come from the operations
PID = {W1: 101, W2: 102}


# -- helpers ----------------------------------------------------------------------------------

class Page(HTMLParser):
    """Parses a page strictly enough to catch unbalanced tags; keeps every element's attrs,
    whether it sits inside the timeline's plot, and the text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []
        self.elements: list[tuple[str, dict, bool]] = []
        self.text: list[str] = []
        self.problems: list[str] = []
        self.feed(text)
        self.close()
        self.problems += [f"unclosed <{tag}>" for tag, _ in self.stack]

    def handle_starttag(self, tag, attrs):
        self.handle_startendtag(tag, attrs)
        if tag not in VOID:
            in_plot = self.elements[-1][2] or "tl-plot" in (dict(attrs).get("class") or "")
            self.stack.append((tag, in_plot))

    def handle_startendtag(self, tag, attrs):
        in_plot = bool(self.stack) and self.stack[-1][1]
        self.elements.append((tag, dict(attrs), in_plot))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1][0] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1][0] if self.stack else ''}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)

    @property
    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())

    def with_attr(self, name: str, plot_only: bool = False) -> list[dict]:
        return [a for _, a, in_plot in self.elements if name in a and (in_plot or not plot_only)]


def rendered(kind: str, tmp_path_factory) -> dict:
    """Fixture run `kind` copied to a temporary folder and rendered in every format."""
    folder = tmp_path_factory.mktemp(kind) / "run"
    shutil.copytree(os.path.join(FIXTURES, kind), folder)
    paths = render_run(str(folder))
    with open(folder / "report.json", encoding="utf-8") as fh:
        report = json.load(fh)
    html = (folder / "report.html").read_text(encoding="utf-8")
    return {"kind": kind, "dir": folder, "paths": paths, "report": report, "html": html,
            "page": Page(html)}


@pytest.fixture(scope="module", params=["pass", "fail"])
def run(request, tmp_path_factory) -> dict:
    return rendered(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> dict:
    return rendered("fail", tmp_path_factory)


@pytest.fixture(scope="module")
def passing(tmp_path_factory) -> dict:
    return rendered("pass", tmp_path_factory)


def failed_names(report: dict, verdict: str = "fail") -> list[str]:
    return [v["name"] for v in report["verdicts"] if v["verdict"] == verdict]


# -- report.html ------------------------------------------------------------------------------

def test_render_run_writes_every_format_beside_report_json(run):
    assert run["paths"] == [str(run["dir"] / name) for name in FILES.values()]
    assert all(os.path.getsize(p) > 0 for p in run["paths"])


def test_html_parses_with_balanced_tags(run):
    assert run["page"].problems == []
    assert run["html"].startswith("<!DOCTYPE html>")


def test_html_names_every_invariant_its_verdict_and_the_commands(run):
    text, report = run["page"].all_text, run["report"]
    for v in report["verdicts"]:
        row = next(a for _, a, _ in run["page"].elements if a.get("id") == f"v-{v['name']}")
        assert v["name"] in text and row["class"] == f"v-{v['verdict']}"
    assert report["replay_command"] in text and report["run_command"] in text
    assert f"seed {report['seed']}" in text


@pytest.mark.parametrize("pattern", [
    r"""\b(?:src|href|xlink:href|action|poster|data|srcset)\s*=\s*["']?\s*(?:https?:)?//""",
    r"""url\(\s*["']?\s*(?!#|data:)""", r"<script[^>]*\bsrc\s*=", r"<link\b", r"@import",
    r"<(?:iframe|img|object|embed)\b"])
def test_html_makes_no_external_reference(run, pattern):
    assert not re.search(pattern, run["html"], re.IGNORECASE)


def test_failures_come_first_in_the_verdict_table(run):
    rows = [a["id"][2:] for _, a, _ in run["page"].elements
            if a.get("id", "").startswith("v-") and a.get("class", "").startswith("v-")]
    verdicts = {v["name"]: v["verdict"] for v in run["report"]["verdicts"]}
    ranks = [{"fail": 0, "unknown": 1, "pass": 2}[verdicts[n]] for n in rows]
    assert len(rows) == len(verdicts) and ranks == sorted(ranks)


def test_failing_page_shows_each_violation_and_its_witnesses(failing):
    page, report = failing["page"], failing["report"]
    assert failed_names(report), "the failing fixture must hold a failed verdict"
    rows = {a["data-key"] for a in page.with_attr("data-key")}
    for v in report["verdicts"]:
        if v["verdict"] == "fail":
            assert v["reason"] in page.all_text
            keys = {event_key(e) for err in v["errors"] for e in err["events"]}
            assert keys and keys <= rows


def test_failing_timeline_marks_every_witness_with_its_invariant(failing):
    marked = {}
    for attrs in failing["page"].with_attr("data-witness", plot_only=True):
        marked.setdefault(attrs["data-witness"], set()).update(attrs["data-verdicts"].split())
    expected = witnesses(failing["report"])
    assert expected and set(expected) <= set(marked)
    for key, (_, names) in expected.items():
        assert set(names) <= marked[key]


def test_passing_timeline_marks_no_witness(passing):
    assert passing["page"].with_attr("data-witness") == []


def test_timeline_marks_every_kill_and_crash_point_kill(run):
    history = read_history(run["dir"] / "history.jsonl")
    page = run["page"]
    for src, type_, css in (("nemesis", "kill", "mark kill"),
                            ("process", "crashpoint", "mark crashpoint")):
        drawn = [a for _, a, in_plot in page.elements if in_plot and a.get("class") == css]
        assert len(drawn) == sum(e["src"] == src and e["type"] == type_ for e in history)


def test_page_without_history_explains_what_is_missing(run, tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    shutil.copy(run["dir"] / "report.json", folder / "report.json")
    render_run(str(folder), ["html"])
    page = Page((folder / "report.html").read_text(encoding="utf-8"))
    assert page.problems == [] and "history.jsonl is missing" in page.all_text


def test_render_run_refuses_a_folder_without_report_json(tmp_path):
    with pytest.raises(ValueError, match="report.json does not exist"):
        render_run(str(tmp_path))


# -- junit.xml and summary.md -----------------------------------------------------------------

def test_junit_has_one_case_per_invariant_and_counts_failures(run):
    report = run["report"]
    root = ET.parse(run["dir"] / "junit.xml").getroot()
    suites = root.findall("testsuite")
    assert root.tag == "testsuites" and len(suites) == 1
    suite, name = suites[0], f"ninelives.{report['scenario']['name']}"
    cases = suite.findall("testcase")
    assert suite.get("name") == name and float(suite.get("time")) >= 0
    assert [c.get("name") for c in cases] == [v["name"] for v in report["verdicts"]]
    assert {c.get("classname") for c in cases} == {name}
    failures = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("tests")) == len(cases) == len(report["verdicts"])
    assert int(suite.get("failures")) == len(failures) == len(failed_names(report))
    assert int(suite.get("errors")) == 0 == len(failed_names(report, "unknown"))


def test_junit_failure_carries_the_reason_and_first_witnesses(failing):
    root = ET.parse(failing["dir"] / "junit.xml").getroot()
    for v in failing["report"]["verdicts"]:
        if v["verdict"] != "fail":
            continue
        failure = root.find(f".//testcase[@name='{v['name']}']/failure")
        assert failure.get("message") == v["reason"]
        assert failure.get("type") == v["first_error"]["type"]
        first = v["errors"][0]["events"][0]
        assert json.dumps(first, sort_keys=True) in failure.text


def test_junit_reports_an_undecided_invariant_as_an_error(failing):
    report = json.loads(json.dumps(failing["report"]))
    report["verdicts"][0].update(verdict="unknown", reason="checker crashed: boom",
                                 errors=[], first_error=None)
    suite = ET.fromstring(render_junit(report)).find("testsuite")
    error = suite.find(f"testcase[@name='{report['verdicts'][0]['name']}']/error")
    assert error.get("message") == "checker crashed: boom" and suite.get("errors") == "1"


def test_junit_adds_an_error_case_for_faults_that_never_fired(failing):
    report = {**failing["report"], "faults_unfired": ["pause"]}
    suite = ET.fromstring(render_junit(report)).find("testsuite")
    error = suite.find("testcase[@name='configured-faults-fired']/error")
    assert "pause" in error.get("message") and suite.get("errors") == "1"


def test_markdown_has_the_result_every_verdict_and_the_replay_command(run):
    text = (run["dir"] / "summary.md").read_text(encoding="utf-8")
    report = run["report"]
    assert f"**{report['result'].upper()}**" in text.splitlines()[0]
    for v in report["verdicts"]:
        assert re.search(rf"^\| `{v['name']}` \| \S+ {v['verdict']} \|", text, re.MULTILINE)
    assert f"`{report['replay_command']}`" in text


def test_markdown_keeps_a_reason_with_pipes_and_newlines_in_its_cell(failing):
    report = json.loads(json.dumps(failing["report"]))
    report["verdicts"][0].update(verdict="fail", reason="a | b\nc")
    row = next(line for line in render_markdown(report).splitlines()
               if line.startswith(f"| `{report['verdicts'][0]['name']}`"))
    assert row.endswith("| a \\| b c |")


# -- the command line and the runner ----------------------------------------------------------

def test_report_command_renders_only_the_formats_asked(run, tmp_path, capsys):
    folder = tmp_path / "again"
    shutil.copytree(run["dir"], folder)
    for name in FILES.values():
        os.remove(folder / name)
    assert cli_main(["report", str(folder), "--format", "md,junit"]) == 0
    assert sorted(os.listdir(folder)) == sorted(
        ["history.jsonl", "report.json", "snapshot.json", "summary.md", "junit.xml"])
    assert capsys.readouterr().out.split() == [str(folder / "summary.md"),
                                              str(folder / "junit.xml")]


def test_report_command_refuses_an_unknown_format(failing, capsys):
    assert cli_main(["report", str(failing["dir"]), "--format", "html,pdf"]) == 2
    assert "unknown format pdf" in capsys.readouterr().err


def test_a_rendering_failure_is_a_warning_not_a_lost_run(monkeypatch, tmp_path, capsys):
    import chaos.run.runner

    def broken(run_dir):
        raise RuntimeError("template exploded")
    monkeypatch.setattr(chaos.run.runner, "render_run", broken)
    assert chaos.run.runner.render_reports(str(tmp_path)) == []
    assert "template exploded" in capsys.readouterr().err


# -- the timeline model, on hand-made histories -----------------------------------------------

def spawn(t, name, pid):
    return {"t": t, "src": "process", "type": "spawn", "name": name, "role": "worker",
            "pid": pid}


def engine_op(t, type_, job_id, frm, to, worker, token, **fields):
    return {"t": t, "src": "engine", "type": type_, "completion": "ok", "job": job_id,
            "from": frm, "to": to, "worker": worker, "pid": PID.get(worker),
            "actor": "worker" if worker in PID else "submitter", "token": token, **fields}


def claim(t, job_id, frm, to, worker, token, step="fetch"):
    return engine_op(t, "claimed", job_id, frm, to, worker, token, step=step, continued=False)


def state(t, job_id, frm, to, worker, token, heartbeat=False):
    return engine_op(t, "state", job_id, frm, to, worker, token, heartbeat=heartbeat,
                     took_lease=False)


def submitted(t, job_id):
    return engine_op(t, "submitted", job_id, None, "pending", "submit", 0, state="pending")


def call(t, t_end, job_id, worker, step="fetch"):
    return {"t": t, "src": "provider", "type": "call", "job": job_id, "step": step,
            "worker": worker, "n": 1, "t_start": t, "t_end": t_end, "status": 200,
            "outcome": "ok", "billed": 0.01, "fault": None}


def timeline(events, witnessed=None):
    return build_timeline(sorted(events, key=lambda e: e["t"]), PIPELINE, witnessed or {})


def steps(tl):
    return [(b.lane, b.label, b.start, b.end, b.outcome) for b in tl.bars if b.kind == "step"]


BOTH = [spawn(0.0, "worker-0.1", 101), spawn(0.0, "worker-1.2", 102)]


def test_a_held_step_runs_from_claim_to_commit_and_heartbeats_do_not_split_it():
    tl = timeline(BOTH + [claim(1.0, "j", "pending", "fetching", W1, 1),
                          state(1.5, "j", "fetching", "fetching", W1, 1, heartbeat=True),
                          state(2.0, "j", "fetching", "fetched", W1, 1)])
    assert steps(tl) == [("worker-0", "fetch", 1.0, 2.0, "ok")]
    assert [lane.key for lane in tl.lanes] == ["harness", "worker-0", "worker-1"]


def test_a_step_whose_lease_was_taken_ends_at_its_owner_last_activity():
    tl = timeline(BOTH + [claim(1.0, "j", "pending", "fetching", W1, 1),
                          call(1.1, 1.4, "j", W1),
                          claim(3.0, "j", "fetching", "fetching", W2, 2),
                          claim(5.0, "k", "pending", "fetching", W1, 1)])
    assert ("worker-0", "fetch", 1.0, 1.4, "lost lease") in steps(tl)
    assert ("worker-1", "fetch", 3.0, tl.t1, "unfinished") in steps(tl)


def test_a_killed_worker_step_ends_at_its_death_beside_the_kill_mark():
    tl = timeline(BOTH + [claim(1.0, "j", "pending", "fetching", W1, 1),
                          {"t": 2.0, "src": "nemesis", "type": "kill", "pid": 101},
                          {"t": 2.01, "src": "process", "type": "exit", "pid": 101,
                           "signal": "SIGKILL", "code": None}])
    assert steps(tl) == [("worker-0", "fetch", 1.0, 2.01, "killed")]
    assert [(m.lane, m.kind, m.t) for m in tl.marks] == [("worker-0", "kill", 2.0)]
    assert tl.lanes[1].segments[0].ended == "SIGKILL"


def test_a_witness_is_marked_on_the_lane_of_the_worker_that_did_it():
    rebill = call(4.0, 4.2, "j", W2)
    tl = timeline(BOTH + [claim(0.9, "j", "pending", "fetching", W1, 1), call(1.0, 1.2, "j", W1),
                          claim(3.9, "j", "fetching", "fetching", W2, 2), rebill],
                  {event_key(rebill): (rebill, ["no-rebill-after-commit"])})
    [mark] = [m for m in tl.marks if m.kind == "witness"]
    assert (mark.lane, mark.t, mark.verdicts) == ("worker-1", 4.0, ("no-rebill-after-commit",))
    flagged = [b for b in tl.bars if b.witness]
    assert [(b.start, b.verdicts) for b in flagged] == [(4.0, ("no-rebill-after-commit",))]
    assert "by worker 102" in flagged[0].title and "by worker 102" in mark.title


def test_a_long_history_is_thinned_per_lane_and_the_page_says_so():
    events = [spawn(0.0, "worker-0.1", 101)]
    for i in range(3 * MAX_BARS):
        events.append(call(i * 0.1, i * 0.1 + 0.05, f"j{i}", W1))
    witness = events[-1]
    tl = timeline(events, {event_key(witness): (witness, ["cost-accounted"])})
    calls = [b for b in tl.bars if b.kind == "call"]
    assert len(calls) <= MAX_BARS + 1 and any(b.witness for b in calls)
    assert sum(b.merged for b in calls) == 3 * MAX_BARS
    assert tl.notes and "merged" in tl.notes[0]


def test_state_counts_replay_the_job_operations_and_sample_long_runs():
    changes = [submitted(float(t), f"j{t}") for t in range(1000)]
    series = state_counts(changes, PIPELINE, 0.0, 999.0)
    assert len(series.times) == MAX_SAMPLES and "sampled" in series.note
    assert series.counts["pending"][-1] == 1000 and series.counts["pending"][0] == 1
    moved = changes[:3] + [claim(5.0, "j0", "pending", "fetching", W1, 1),
                           engine_op(6.0, "removed", "j2", "pending", None, "submit", 0)]
    short = state_counts(moved, PIPELINE, 0.0, 10.0)
    assert (short.counts["pending"][-1], short.counts["fetching"][-1]) == (1, 1)


def test_a_soak_sized_history_renders_to_a_few_megabytes(failing):
    history = read_history(failing["dir"] / "history.jsonl")
    with open(failing["dir"] / "snapshot.json", encoding="utf-8") as fh:
        snapshot = json.load(fh)
    span = history[-1]["t"] - history[0]["t"] + 1.0
    long = [{**e, "t": e["t"] + k * span, **({"t_start": e["t_start"] + k * span,
                                              "t_end": e["t_end"] + k * span}
                                             if "t_start" in e else {})}
            for k in range(120) for e in history]
    html = render_html(failing["report"], long, snapshot)
    assert len(html) < 4_000_000
    assert "Sampled:" in html and "sampled at 400" in html


# -- a real browser ---------------------------------------------------------------------------

def test_the_page_loads_in_headless_chromium_without_script_errors(failing, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed (`make test` installs it as root with apt; "
                    "Debian: apt-get install -y chromium): the page must open in a real browser")
    proc = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", f"file://{failing['dir'] / 'report.html'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        dom, log = proc.communicate(timeout=90)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    recorded = re.search(r'id="js-errors"[^>]*>([^<]*)<', dom)
    why = recorded.group(1) if recorded and recorded.group(1) else log[-2000:]
    assert 'data-report-ready="1"' in dom, why
    assert not re.search(r"<html[^>]*data-js-errors", dom) and "Uncaught" not in log, why
    assert 'class="tl-plot"' in dom

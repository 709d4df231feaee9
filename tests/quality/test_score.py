"""The mutation score's machinery (chaos.score): its test command catches a one-line bug
written to the engine's file on disk and passes the engine as it is; the campaign's
configuration is one cosmic-ray accepts, operators filtered; the report counts outcomes per
module and operator and leaves the argued equivalents out of the score."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from timed import lines_until

from chaos import score
import chaos.score.report  # noqa: F401  score.report, the survivors read back

ROOT = score.ROOT


def copy_of_checkout(tmp_path) -> str:
    work = str(tmp_path / "work")
    os.makedirs(work)
    for name in score.COPIED:
        src = os.path.join(ROOT, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(
            src, os.path.join(work, name))
    return work


#: The test command of a campaign with one sim seed, no deep stage, no real runs.
COMMAND = score.test_command(range(1, 2), 0, None)


def kill(work: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.score", "kill", "--seeds", "1",
                           "--deep", "1"],
                          cwd=work, env={**os.environ, "PYTHONPATH": work},
                          capture_output=True, text=True, timeout=280)


def test_the_test_command_passes_the_engine_and_kills_a_bug_written_to_its_file(tmp_path):
    work = copy_of_checkout(tmp_path)
    clean = kill(work)
    assert clean.returncode == 0 and "survived" in clean.stdout, clean.stdout + clean.stderr
    retry = os.path.join(work, "engine", "retry.py")
    text = open(retry).read()
    assert "500 <= status <= 599" in text
    with open(retry, "w") as fh:  # 5xx answers taken for poison, as a mutation tool would
        fh.write(text.replace("500 <= status <= 599", "500 <= status == 599"))
    broken = kill(work)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "killed: sim" in broken.stdout and "retry-discipline" in broken.stdout


def test_the_campaign_configuration_is_one_cosmic_ray_initialises(tmp_path):
    work = str(tmp_path)
    config = score.write_config(work, ["engine/retry.py"], COMMAND, 60,
                                ["http://127.0.0.1:1"])
    score.copy_checkout(work, ("engine",))
    tools = os.path.dirname(sys.executable)
    session = os.path.join(work, "session.sqlite")
    for argv in ([os.path.join(tools, "cosmic-ray"), "init", config, session],
                 [os.path.join(tools, "cr-filter-operators"), session, config]):
        subprocess.run(argv, cwd=work, check=True, capture_output=True, timeout=120)
    rows = score.results(session)
    assert rows and {r["module"] for r in rows} == {"engine/retry.py"}
    assert all(r["outcome"] == "pending" for r in rows)
    assert not any("BitOr" in r["operator"] or "Pow" in r["operator"] for r in rows)


def row(module, operator, occurrence, outcome, line="x = 1", function="f"):
    return {"module": module, "operator": operator, "occurrence": occurrence, "line": 1,
            "function": function, "outcome": outcome, "output": "killed: sim smoke",
            "diff": f"--- a/{module}\n+++ b/{module}\n@@ -1 +1 @@\n-    {line}\n+    y\n"}


def entry(kind="equivalent", module="engine/a.py", line="x = 1", operators=(), function=None):
    return {"kind": kind, "module": module, "line": line, "operators": operators,
            "function": function, "reason": "a default no caller relies on"}


def test_the_report_scores_killed_and_timed_out_over_all_but_the_argued():
    rows = [row("engine/a.py", "core/NumberReplacer", 0, "killed", line="n = 2"),
            row("engine/a.py", "core/NumberReplacer", 1, "survived", line="n = 2"),
            row("engine/a.py", "core/AddNot", 0, "survived"),
            row("engine/a.py", "core/NumberReplacer", 2, "survived", line="stats += 1"),
            row("engine/b.py", "core/AddNot", 1, "timeout"),
            row("engine/b.py", "core/AddNot", 2, "incompetent")]
    entries = [entry(operators=("AddNot",)),
               entry("out-of-scope", line="stats += 1")]
    summary = score.summarize(rows, entries)
    assert summary["total"] == {"killed": 1, "survived": 1, "equivalent": 1,
                                "out-of-scope": 1, "timeout": 1, "incompetent": 1}
    assert summary["score"] == 2 / 3
    assert [r["occurrence"] for r in summary["survivors"]] == [1]
    assert summary["by_module"]["engine/b.py"]["timeout"] == 1
    assert summary["by_operator"]["AddNot"]["equivalent"] == 1
    assert summary["contradicted"] == []


def test_an_argued_mutant_that_was_killed_is_reported_not_counted_as_argued():
    rows = [row("engine/a.py", "core/AddNot", 0, "killed"),
            row("engine/a.py", "core/AddNot", 1, "survived", function="g")]
    summary = score.summarize(rows, [entry(function="g")])
    assert [r["occurrence"] for r in summary["contradicted"]] == []  # function f: not covered
    summary = score.summarize(rows, [entry()])
    assert [r["occurrence"] for r in summary["contradicted"]] == [0]
    assert summary["total"] == {"killed": 1, "equivalent": 1}


def test_an_entry_with_to_covers_only_the_mutated_lines_it_names():
    rows = [row("engine/a.py", "core/NumberReplacer", n, "survived") for n in (0, 1)]
    rows[1]["diff"] = rows[1]["diff"].replace("+    y", "+    z  =  2")
    argued = {**entry(operators=("NumberReplacer",)), "to": ("z = 2",)}
    assert score.argued(rows[0], [argued]) is None
    assert score.argued(rows[1], [argued]) is argued


def test_the_equivalents_file_names_scored_lines_and_argues_each_entry():
    entries = score.equivalents()
    assert entries  # the file is read, not silently empty
    sources = {m: [line.strip() for line in open(os.path.join(ROOT, m), encoding="utf-8")]
               for m in score.MODULES}
    for e in entries:
        assert e["module"] in score.MODULES, e
        assert e["line"] in sources[e["module"]], f"{e['module']}: no line {e['line']!r}"
        assert len(e["reason"].split()) >= 5, e


def test_an_entrys_operators_cover_names_families_and_beginnings_ending_in_an_underscore():
    assert score.report._covers("ReplaceComparisonOperator_Lt_Is", "ReplaceComparisonOperator_Lt_Is")
    assert not score.report._covers("ReplaceComparisonOperator_Lt_Is",
                             "ReplaceComparisonOperator_Lt_IsNot")
    assert score.report._covers("ReplaceComparisonOperator_Lt_", "ReplaceComparisonOperator_Lt_IsNot")
    assert not score.report._covers("ReplaceComparisonOperator_Lt_",
                             "ReplaceComparisonOperator_LtE_Gt")
    assert score.report._covers("NumberReplacer", "NumberReplacer")
    assert score.report._covers("ReplaceComparisonOperator", "ReplaceComparisonOperator_Eq_Is")
    assert not score.report._covers("AddNot", "ReplaceAndWithOr")


def test_again_makes_only_the_survivors_of_the_given_modules_pending(tmp_path):
    import sqlite3
    work = str(tmp_path)
    config = score.write_config(work, ["engine/retry.py", "engine/store/operator.py"],
                                COMMAND, 60, ["http://127.0.0.1:1"])
    score.copy_checkout(work, ("engine",))
    session = os.path.join(work, "session.sqlite")
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "cosmic-ray"), "init",
                    config, session], cwd=work, check=True, capture_output=True, timeout=120)
    conn = sqlite3.connect(session)
    jobs = conn.execute("SELECT job_id, module_path FROM mutation_specs").fetchall()
    outcomes = ["SURVIVED", "KILLED"]
    with conn:
        for i, (job, _) in enumerate(jobs):
            conn.execute("INSERT INTO work_results (worker_outcome, output, test_outcome, diff,"
                         " job_id) VALUES ('NORMAL', '', ?, '', ?)", (outcomes[i % 2], job))
    survivors = {m: sum(1 for i, (_, mm) in enumerate(jobs) if mm == m and i % 2 == 0)
                 for m in ("engine/retry.py", "engine/store/operator.py")}
    assert score.reset_survivors(session, ["engine/retry.py"]) == survivors["engine/retry.py"]
    left = dict(conn.execute("SELECT m.module_path, COUNT(*) FROM work_results r JOIN"
                             " mutation_specs m USING (job_id) WHERE r.test_outcome='SURVIVED'"
                             " GROUP BY 1").fetchall())
    assert left == {"engine/store/operator.py": survivors["engine/store/operator.py"]}
    conn.close()


def test_again_keeps_the_argued_mutants_it_need_not_judge_again(tmp_path):
    import sqlite3
    work = str(tmp_path)
    config = score.write_config(work, ["engine/retry.py"], COMMAND, 60,
                                ["http://127.0.0.1:1"])
    score.copy_checkout(work, ("engine",))
    session = os.path.join(work, "session.sqlite")
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "cosmic-ray"), "init",
                    config, session], cwd=work, check=True, capture_output=True, timeout=120)
    entries = [entry(module="engine/retry.py", line="cap: float = 30.0",
                     operators=("NumberReplacer",))]
    keep = score.argued_jobs(session, work, entries)
    conn = sqlite3.connect(session)
    lines = open(os.path.join(work, "engine", "retry.py"), encoding="utf-8").read().splitlines()
    want = {job for job, row, op in conn.execute(
        "SELECT job_id, start_pos_row, operator_name FROM mutation_specs")
        if lines[row - 1].strip() == "cap: float = 30.0" and op == "core/NumberReplacer"}
    assert keep == want and want
    with conn:
        conn.executemany("INSERT INTO work_results (worker_outcome, output, test_outcome, diff,"
                         " job_id) VALUES ('NORMAL', '', 'SURVIVED', '', ?)",
                         [(j,) for (j,) in conn.execute("SELECT job_id FROM mutation_specs")])
    total = conn.execute("SELECT COUNT(*) FROM work_results").fetchone()[0]
    assert score.reset_survivors(session, ["engine/retry.py"], keep) == total - len(keep)
    assert {j for (j,) in conn.execute("SELECT job_id FROM work_results")} == keep
    conn.close()


def test_a_campaign_runs_end_to_end_on_parallel_workers_and_leaves_nothing_running(tmp_path):
    """The smallest real campaign (the operator's actions, one sim seed, no deep stage) on
    two workers: it prints its report, scores what it judged, and every worker is gone."""
    work = str(tmp_path / "campaign")
    done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", "score", "--modules",
                           "engine/store/operator.py", "--seeds", "1", "--deep", "0", "--jobs",
                           "2", "--timeout", "60", "--workdir", work],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    assert "engine/store/operator.py" in done.stdout and "mutation score:" in done.stdout
    rows = score.results(os.path.join(work, "session.sqlite"))
    assert rows and all(r["outcome"] != "pending" for r in rows)
    assert any(r["outcome"] == "killed" for r in rows)
    assert not processes_in(work), "a worker or test command outlived the campaign"
    judged = re.findall(r"judging mutants: (\d+)/(\d+) mutants", done.stderr)
    assert judged and judged[-1][0] == judged[-1][1], done.stderr[-2000:]  # to the last one


def processes_in(folder: str) -> list[int]:
    """The processes whose working directory lies under `folder`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue  # gone, or not ours to read
        if cwd == folder or cwd.startswith(folder + os.sep):
            found.append(int(pid))
    return found


def test_again_meets_the_engine_as_it_is_now_but_refuses_a_changed_module(tmp_path):
    """--again refreshes the campaign's engine from the checkout (a fix elsewhere must be
    seen), and refuses when a module under judgment changed: its mutants are elsewhere."""
    work = str(tmp_path / "campaign")
    os.makedirs(work)
    score.copy_checkout(work, ("engine",))
    stale = os.path.join(work, "engine", "store", "sqlite.py")
    with open(stale, "a", encoding="utf-8") as fh:
        fh.write("\n# the store as the campaign found it\n")
    score.refresh_engine(work, ["engine/retry.py"])
    with open(stale, encoding="utf-8") as fh, \
            open(os.path.join(ROOT, "engine", "store", "sqlite.py"), encoding="utf-8") as now:
        assert fh.read() == now.read()
    mutated = os.path.join(work, "engine", "retry.py")
    with open(mutated, "a", encoding="utf-8") as fh:
        fh.write("\n# an older text\n")
    with pytest.raises(score.StaleCampaign, match="engine/retry.py changed"):
        score.refresh_engine(work, ["engine/retry.py"])


def test_a_test_command_past_its_timeout_is_a_timeout_not_a_kill():
    """cosmic-ray's http distributor reports it as killed with the output "timeout"."""
    late = {"worker_outcome": "normal", "test_outcome": "killed", "output": "timeout"}
    caught = {"worker_outcome": "normal", "test_outcome": "killed",
              "output": "killed: sim smoke --profile smoke seed 1: lease-kept"}
    assert score.report._outcome(late) == "timeout"
    assert score.report._outcome(caught) == "killed"


@pytest.mark.parametrize("flags,named", [
    (["--modules", "/etc/passwd"], "--modules: '/etc/passwd'"),
    (["--modules", "../pyproject.toml"], "--modules: '../pyproject.toml'"),
    (["--modules", "engine/retry.py,chaos/commands/cli.py"], "--modules: 'chaos/commands/cli.py'"),
    (["--modules", "engine"], "--modules: 'engine'"),
    (["--modules", "engine/no_such.py"], "--modules: 'engine/no_such.py' does not exist"),
    (["--modules", " , "], "--modules names no engine file"),
    (["--workdir", "FILE"], "--workdir: "),
    (["--jobs", "100000"], "--jobs"),
], ids=["absolute", "outside", "harness-file", "folder", "missing", "empty", "workdir-file",
        "jobs"])
def test_a_bad_score_option_exits_2_with_one_line_naming_it(tmp_path, flags, named):
    """Bad input is exit 2 naming the option, before any campaign starts: exit 1 is a
    judgement (`--modules /etc/passwd` had run a campaign of no mutant and exited 1)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    flags = [str(a_file) if f == "FILE" else f for f in flags]
    work = tmp_path / "campaign"
    done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", "score", "--jobs", "1",
                           "--workdir", str(work), *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stdout[-1000:] + done.stderr[-1000:]
    assert named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len([line for line in lines if "error" in line]) == 1, done.stderr
    assert not done.stdout and not work.exists()  # no campaign began


def test_a_campaign_that_judges_no_mutant_is_exit_2_not_a_missed_target(tmp_path):
    """engine/__main__.py gives cosmic-ray nothing to mutate: no judgement, so no exit 1."""
    work = tmp_path / "campaign"
    done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", "score", "--modules",
                           "engine/__main__.py", "--jobs", "1", "--seeds", "1", "--deep", "0",
                           "--workdir", str(work)], cwd=ROOT, capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 2, done.stdout[-1000:] + done.stderr[-1000:]
    assert "misses" not in done.stdout and "no mutant judged" in done.stdout
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "engine/__main__.py" in error and "Traceback" not in done.stderr
    assert not processes_in(str(work))


def test_a_campaign_says_where_it_stands_while_it_prepares_and_stops_on_ctrl_c(tmp_path):
    """Copying the checkout, starting the workers and listing the mutants of the store (over
    10 s) had been silent: a line within a second of each step's start (1.5 s measured from
    the line before), one every 2 s after; Ctrl-C then ends it with 130 and nothing left."""
    import signal
    work = str(tmp_path / "campaign")
    proc = subprocess.Popen([sys.executable, "-m", "chaos.commands.cli", "score", "--modules",
                             "engine/store/sqlite.py", "--jobs", "2", "--workdir", work],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, rest = lines_until(proc, proc.stdout,
                             lambda seen: "listing the mutants" in seen[-1][1] or len(seen) > 8)
    log = "\n".join(f"{t - seen[0][0]:6.2f} {text}" for t, text in seen) + "\n" + rest
    assert seen[0][1].startswith("mutation campaign in"), log
    assert [text.split(":")[0] for _, text in seen[1:]] == ["  preparing"] * (len(seen) - 1)
    for (t0, before), (t1, text) in zip(seen, seen[1:]):  # a new step, or the same again
        assert t1 - t0 <= (3.0 if text.split(",")[-1] == before.split(",")[-1] else 1.5), log
    assert "listing the mutants of engine/store/sqlite.py" in seen[-1][1], log
    assert proc.returncode == 130 and "Traceback" not in rest, log
    assert "interrupted (SIGINT)" in rest and not processes_in(work), log

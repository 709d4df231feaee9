"""The mutation matrix's output: a mutant's runs and the reference's live in folders of their
own (each `latest` points at its own engine's run), and the page and the Markdown explain
their marks and column heads."""
from __future__ import annotations

import os

import chaos.run.runner
from chaos.checkers import INVARIANTS
from chaos.mutants.matrix import (CELLS, SHORT, Task, point_latest, render_html,
                                  render_markdown, render_text, run_task)
from chaos.run.runner import RunResult, run_dir_for

MUTANT = "memo_check_skipped"


def fake_campaign(scenario, seed, engine, out, **_):
    """A campaign that only makes its run folder, as the runner does, and a report."""
    run_dir = run_dir_for(out, scenario, seed)
    failed = "mutant" in engine.name
    verdict = [{"name": "memo-consistent", "verdict": "fail" if failed else "pass",
                "reason": ""}]
    return RunResult(run_dir, {"result": "fail" if failed else "pass", "verdicts": verdict,
                               "started": 0.0, "finished": 1.0})


def test_a_mutant_s_run_and_the_reference_s_on_one_scenario_get_folders_and_latest_of_their_own(
        tmp_path, monkeypatch):
    monkeypatch.setattr(chaos.run.runner, "run_campaign", fake_campaign)
    runs = str(tmp_path / "runs")
    mutant = run_task(Task(MUTANT, "mutants/memo-hits", "smoke", 1, runs))
    reference = run_task(Task("reference", "mutants/memo-hits", "smoke", 1, runs))
    assert mutant["result"] == "fail" and reference["result"] == "pass"
    assert os.path.dirname(mutant["run_dir"]) != os.path.dirname(reference["run_dir"])
    for row, engine in ((mutant, MUTANT), (reference, "reference")):
        scenario_dir = os.path.dirname(row["run_dir"])
        assert os.path.relpath(scenario_dir, runs).split(os.sep)[0] == engine
        latest = os.path.join(scenario_dir, "latest")
        assert os.path.realpath(latest) == os.path.realpath(row["run_dir"])


def test_latest_beside_the_matrices_points_at_the_newest(tmp_path):
    for name in ("20261201T000000Z", "20261202T000000Z"):
        (tmp_path / name).mkdir()
        point_latest(str(tmp_path / name))
    assert os.readlink(tmp_path / "latest") == "20261202T000000Z"


def matrix() -> dict:
    run = {"seed": 1, "failed": ["memo-consistent", "lease-kept"], "run_dir": None}
    return {"invariants": list(INVARIANTS), "caught": 1, "total": 1, "reference_clean": True,
            "ok": True, "reference": [{"scenario": "mutants/memo-hits", "seed": 1,
                                       "result": "pass", "run_dir": None, "failed": [],
                                       "unknown": []}],
            "mutants": [{"name": MUTANT, "removes": "the memo check", "expect":
                         ["memo-consistent", "no-rebill-after-commit"],
                         "scenario": "mutants/memo-hits", "caught": True, "seed": 1,
                         "seconds": 4.6, "run_dir": None, "runs": [run]}]}


def test_the_matrix_page_has_a_legend_of_every_mark_and_every_column_head(tmp_path):
    page = render_html(matrix(), str(tmp_path))
    legend = page[page.index("<h2>Legend</h2>"):]
    for invariant in INVARIANTS:
        assert f"<th>{SHORT[invariant]}</th><td><code>{invariant}</code></td>" in legend
    for mark, what in CELLS.items():
        assert f">{mark}</td><td>{what}</td>" in legend


def test_the_markdown_and_the_terminal_say_what_the_heads_and_marks_mean():
    for text in (render_markdown(matrix()), render_text(matrix(), console=None)):
        assert all(SHORT[i] in text and i in text for i in INVARIANTS)
        assert all(what in text for what in CELLS.values())
    row = render_text(matrix(), console=None).splitlines()[1].split()
    assert row[:2] == [MUTANT, "mutants/memo-hits"]
    cells = dict(zip(INVARIANTS, row[2:]))
    assert (cells["memo-consistent"], cells["lease-kept"], cells["no-rebill-after-commit"],
            cells["legal-transitions"]) == ("X", "x", "o", ".")

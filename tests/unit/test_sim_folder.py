"""A simulated run's folder holds the same reports as a real run's, rendered when it is
written, not only after `ninelives report`."""
from __future__ import annotations

import json
import os

from chaos.commands.cli import main


def test_a_sim_folder_has_report_html_junit_and_summary_when_sim_ends(tmp_path, capsys):
    code = main(["sim", "smoke", "--seed", "3", "--profile", "smoke", "--out",
                 str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    folder = next(line.split(": ", 1)[1] for line in out.splitlines()
                  if line.startswith("run folder: "))
    for name in ("report.json", "report.html", "junit.xml", "summary.md"):
        assert os.path.getsize(os.path.join(folder, name)) > 0, name
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    with open(os.path.join(folder, "junit.xml"), encoding="utf-8") as fh:
        junit = fh.read()
    assert all(v["name"] in junit for v in report["verdicts"])

"""`ninelives annotate`: a run's or a campaign's failing invariants as GitHub Actions workflow
commands, so the job's page shows each failure where it is looked at first.

    ninelives annotate FOLDER

FOLDER is a run folder (report.json) or a campaign's folder (campaign.json: the --out of
`sim --seeds`, `run --seeds`, `explore` or `merge`). Prints one `::error title=...::` line
per failing invariant (how many runs failed it, the first reason, the command that reruns
it) and per run in error, and a `::warning` for an invariant that passed without being
exercised; nothing when all is well. Other CI systems read junit.xml and the exit code.

Exit code: the folder's verdict (0 pass, 1 an invariant failed, 2 an error), so that a
step that only annotates still fails the job; 2 for a folder that holds neither record.
"""
from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `annotate` subcommand's arguments."""
    p = sub.add_parser("annotate", help="print a run's or a campaign's failures as GitHub "
                                        "Actions workflow commands (::error)")
    p.add_argument("folder", help="a run folder (report.json) or a campaign's folder "
                                  "(campaign.json)")


def cmd_annotate(args: argparse.Namespace) -> int:
    """Print the folder's annotations; returns its exit code. Raises ValueError naming the
    folder when it holds no record."""
    from chaos.run.campaign import CAMPAIGN_FILE
    from chaos.reports.render.campaign import annotations, run_annotations
    if os.path.exists(os.path.join(args.folder, CAMPAIGN_FILE)):
        from chaos.reports.merge import read_campaign
        record = read_campaign(args.folder)
        lines, code = annotations(record), record["exit_code"]
    elif os.path.exists(os.path.join(args.folder, "report.json")):
        from chaos.run.saved import load_report
        report = load_report(args.folder)
        lines, code = run_annotations(report), report.get("exit_code")
        code = 2 if code is None else code  # a partial run has no verdict
    else:
        raise ValueError(f"{args.folder} holds neither a run's report.json nor a campaign's "
                         f"{CAMPAIGN_FILE}")
    for line in lines:
        print(line)
    return int(code)

"""`ninelives merge`: the shards of one campaign, run as parallel CI jobs, as one report.

    ninelives merge FOLDER... [--out DIR]

Each FOLDER is the --out of one shard (`sim --seeds A..B --shard I/N`, `run --seeds A..B
--shard I/N`, `explore --shard I/N`): its campaign.json (chaos.run.campaign). The merged record
is written into --out as campaign.json, summary.md, junit.xml and report.html; its verdicts
combine the shards' (a failure in any shard fails the invariant, unknown or "not exercised"
only where no shard exercised it, situations summed), and so does the exit code: 0 pass,
1 an invariant failed, 2 an error in a shard, or folders that are not the shards of one
campaign (refused before anything is written, naming the folder): no campaign.json, shards
of another command, scenario, profile, engine, seed range or budget, a shard given twice,
or a shard missing ("shard 2 of 3 is missing").
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

from chaos.run.campaign import (CAMPAIGN_FILE, CAMPAIGN_SCHEMA, Tally, campaign_lines,
                                campaign_record, write_campaign)
from chaos.run.shards import Shard
from chaos.reports.report import RESULTS


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `merge` subcommand's arguments."""
    p = sub.add_parser("merge", help="combine the folders of a campaign's shards (--shard "
                                     "I/N) into one report")
    p.add_argument("folders", nargs="+", metavar="FOLDER",
                   help="a shard's output folder (the --out holding its campaign.json)")
    p.add_argument("--out", default="merged", help="where the merged campaign.json, "
                   "summary.md, junit.xml and report.html go (default merged)")
    p.add_argument("--require-exercised", action="store_true",
                   help="an invariant that passed in every merged run but was exercised in "
                        "none ('passed, not exercised in any run') makes the result an error, "
                        "exit 2 (a failed invariant still exits 1)")


def cmd_merge(args: argparse.Namespace) -> int:
    """Merge the shards named on the command line; returns the combined exit code. Raises
    ValueError naming the folder for shards that cannot be merged."""
    records = [(folder, read_campaign(folder)) for folder in args.folders]
    check_shards(records)
    record = merge_records(records, args.out)
    if args.require_exercised:
        record = require_exercised(record)
    write_campaign(args.out, record)
    from chaos.reports.render.campaign import headline
    print(f"merged {len(records)} folder(s): {headline(record)}")
    print("\n".join(campaign_lines(record, args.out)))
    if record.get("required_exercised"):
        print(f"error: --require-exercised: passed in every run but exercised in none: "
              f"{', '.join(record['required_exercised'])}")
    return record["exit_code"]


def require_exercised(record: dict[str, Any]) -> dict[str, Any]:
    """The merged record judged by --require-exercised: a pass with invariants exercised in
    no run becomes an error (exit 2) naming them; a failure stays a failure (exit 1)."""
    if record["exit_code"] != 0 or not record["not_exercised"]:
        return record
    return {**record, "result": RESULTS[2], "exit_code": 2,
            "required_exercised": list(record["not_exercised"])}


def read_campaign(folder: str) -> dict[str, Any]:
    """The campaign.json of a shard's folder. Raises ValueError naming the folder when it
    holds none, or one this version cannot read."""
    path = os.path.join(folder, CAMPAIGN_FILE)
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: no such folder (a shard's output folder, its --out, "
                         "was expected)")
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"{folder} is no shard output: it holds no {CAMPAIGN_FILE} (written "
                         "by sim --seeds, run --seeds and explore into their --out)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from None
    if not isinstance(record, dict) or record.get("schema") != CAMPAIGN_SCHEMA:
        raise ValueError(f"{path} is not a campaign record (schema {CAMPAIGN_SCHEMA!r})")
    try:
        Tally.from_json(record)
        [Shard(int(i), int(record["shards"]["count"])) for i in record["shards"]["given"]]
        dict(record["key"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not a whole campaign record: {type(exc).__name__} "
                         f"{exc}") from None
    return record


def check_shards(records: list[tuple[str, dict[str, Any]]]) -> None:
    """Refuse folders that are not the shards of one campaign, each exactly once: raises
    ValueError naming the folder (and the field that differs, or the shard)."""
    first_folder, first = records[0]
    for folder, record in records[1:]:
        differs = [k for k in sorted(set(first["key"]) | set(record["key"]))
                   if first["key"].get(k) != record["key"].get(k)]
        if differs:
            k = differs[0]
            raise ValueError(f"{folder} is a shard of another campaign than {first_folder}: "
                             f"its {k} is {record['key'].get(k)!r}, not "
                             f"{first['key'].get(k)!r}")
        if record["shards"]["count"] != first["shards"]["count"]:
            raise ValueError(f"{folder} is of {record['shards']['count']} shards, "
                             f"{first_folder} of {first['shards']['count']}: one campaign "
                             "has one count of shards")
    count = first["shards"]["count"]
    owner: dict[int, str] = {}
    for folder, record in records:
        for index in record["shards"]["given"]:
            if index in owner:
                raise ValueError(f"{folder} and {owner[index]} both hold shard {index} of "
                                 f"{count}: each shard is merged once")
            owner[index] = folder
    missing = [i for i in range(1, count + 1) if i not in owner]
    if missing:
        raise ValueError(f"shard {', '.join(map(str, missing))} of {count} "
                         f"{'is' if len(missing) == 1 else 'are'} missing: given "
                         f"{', '.join(f'{i} ({owner[i]})' for i in sorted(owner))}")


def merge_records(records: list[tuple[str, dict[str, Any]]], out: str) -> dict[str, Any]:
    """One campaign record of the shards' records (checked by `check_shards`), to be written
    into `out`: every count summed; a failing seed's folder named, as in any campaign
    record, relative to the record's own folder (`out`), under its shard's folder."""
    first = records[0][1]
    tally = Tally(list_seeds=all(r["seeds"] is not None for _, r in records))
    for folder, record in records:
        shard = Tally.from_json(record)
        for row in shard.failing + shard.errors:
            if row.get("run_dir"):
                row["run_dir"] = os.path.relpath(os.path.join(folder, row["run_dir"]), out)
            row.setdefault("shard_folder", folder)
        tally.absorb(shard)
    count = first["shards"]["count"]
    started = min((r.get("started") or 0 for _, r in records), default=None) or None
    extra = {k: first[k] for k in ("budget_per_shard",) if k in first}
    if any(r.get("stopped_at_first_failure") for _, r in records):
        extra["stopped_at_first_failure"] = True
    return campaign_record(first["key"], tally, [Shard(i, count) for i in range(1, count + 1)],
                           started, merged=[folder for folder, _ in records], **extra)


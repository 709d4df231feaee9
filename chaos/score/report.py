"""The mutation score's report: the campaign's results read from cosmic-ray's session, each
survivor matched against `mutation/equivalent.toml` (equivalent, or out of scope, each with
its reason), the score summed and printed with every survivor's diff."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from typing import Any

from chaos.reports.console import Column
from chaos.reports.console import table as table_of
from chaos.score.checkout import ROOT

EQUIVALENT = os.path.join(ROOT, "mutation", "equivalent.toml")
TARGET = 0.90


#: The two kinds of entry in mutation/equivalent.toml, and the outcome each gives a survivor.
LISTS = {"equivalent": "equivalent", "out_of_scope": "out-of-scope"}


def equivalents(path: str = EQUIVALENT) -> list[dict[str, Any]]:
    """The hand-argued entries of mutation/equivalent.toml: `equivalent` (no run can tell
    the mutant from the engine) and `out_of_scope` (a line of the safety modules that is not
    safety code: a statistic, a message's wording, a path no worker or sender takes). Each
    names its module and the source line as written (`line`), optionally the function that
    holds it (`function`, where the line occurs twice) and the operators it covers
    (`operators`: names, families such as "NumberReplacer", or beginnings ending in "_" such
    as "ReplaceComparisonOperator_Lt_"), optionally the mutated lines it covers (`to`: the
    line as the mutant writes it, where one operator makes several mutants of a line and
    only some are argued), and its reason.
    Raises ValueError naming the entry that lacks a field."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    entries = []
    for table, outcome in LISTS.items():
        for i, e in enumerate(data.get(table, [])):
            missing = [k for k in ("module", "line", "reason") if not e.get(k)]
            if missing:
                raise ValueError(f"{os.path.relpath(path)}: [[{table}]] entry {i + 1} has no "
                                 f"{', '.join(missing)}")
            entries.append({"kind": outcome, "module": e["module"], "line": e["line"].strip(),
                            "function": e.get("function"),
                            "operators": tuple(e.get("operators", ())),
                            "to": tuple(" ".join(t.split()) for t in e.get("to", ())),
                            "reason": " ".join(e["reason"].split())})
    return entries


def source_line(row: dict[str, Any], mark: str = "-") -> str:
    """The line a mutant changed, as written in the engine (from its diff); with mark "+",
    the line as the mutant writes it, its spaces collapsed."""
    for text in row["diff"].splitlines():
        # Blank lines a mutation drops around it (a decorator removed) are not the line.
        if text.startswith(mark) and not text.startswith(mark * 3) and text[1:].strip():
            return text[1:].strip() if mark == "-" else " ".join(text[1:].split())
    return ""


def _covers(op: str, name: str) -> bool:
    """An entry's operator covers a mutant's: the same name, a family ("NumberReplacer"),
    or a beginning that ends in "_" ("ReplaceComparisonOperator_Lt_")."""
    if op == name:
        return True
    if op.endswith("_"):
        return name.startswith(op)
    return "_" not in op and name.split("_")[0] == op


def argued(row: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The entry that covers this mutant, if any."""
    name = row["operator"].split("/")[-1]
    line = source_line(row)
    for e in entries:
        if e["module"] == row["module"] and e["line"] == line and (
                e["function"] in (None, row.get("function"))) and (
                not e["operators"] or any(_covers(op, name) for op in e["operators"])) and (
                not e.get("to") or source_line(row, "+") in e["to"]):
            return e
    return None


def results(session: str) -> list[dict[str, Any]]:
    """One dict per mutant of the session: module, operator, occurrence, line, outcome
    ("killed" | "survived" | "timeout" | "incompetent" | "pending" | "filtered"), diff,
    output. Filtered mutants (operators left out) are not returned."""
    dump = subprocess.run([os.path.join(os.path.dirname(sys.executable), "cosmic-ray"), "dump",
                           session], capture_output=True, text=True, check=True)
    rows = []
    for line in dump.stdout.splitlines():
        item, result = json.loads(line)
        mutation = item["mutations"][0]
        rows.append({"module": mutation["module_path"], "operator": mutation["operator_name"],
                     "occurrence": mutation["occurrence"],
                     "line": mutation.get("start_pos", [None])[0],
                     "function": mutation.get("definition_name"),
                     "outcome": _outcome(result), "diff": (result or {}).get("diff") or "",
                     "output": ((result or {}).get("output") or "").strip()[-300:]})
    return [r for r in rows if r["outcome"] != "filtered"]


def _outcome(result: dict | None) -> str:
    if result is None:
        return "pending"
    status, outcome = result.get("worker_outcome"), result.get("test_outcome")
    if status == "skipped":
        return "filtered"  # an operator the configuration leaves out
    # cosmic-ray's http distributor reports a test command past its timeout as killed, with
    # the output "timeout": that is no invariant's verdict.
    if status == "timeout" or outcome == "timeout" or (
            outcome == "killed" and (result.get("output") or "").strip() == "timeout"):
        return "timeout"
    if status != "normal":
        return "incompetent"  # the mutation could not be applied or run
    return "killed" if outcome == "killed" else "survived"


def summarize(rows: list[dict[str, Any]], entries: list[dict[str, Any]]) -> dict:
    """Counts per module and per operator, the score, the survivors, and any argued entry
    that a killed mutant contradicts (an argument to fix, or a false alarm to find)."""
    contradicted = []
    for row in rows:
        entry = argued(row, entries)
        if entry is None:
            continue
        if row["outcome"] == "survived":
            row["outcome"], row["reason"] = entry["kind"], entry["reason"]
        elif row["outcome"] == "killed":
            contradicted.append(row)
    by_module: dict[str, Counter] = defaultdict(Counter)
    by_operator: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        by_module[row["module"]][row["outcome"]] += 1
        by_operator[row["operator"].split("/")[-1].split("_")[0]][row["outcome"]] += 1
    total = Counter(row["outcome"] for row in rows)
    judged = total["killed"] + total["survived"] + total["timeout"]
    # A mutant that hangs the engine past the timeout is caught: the run could not finish.
    score = (total["killed"] + total["timeout"]) / judged if judged else None
    strict = ((total["killed"] + total["timeout"]) / (judged + total["out-of-scope"])
              if judged + total["out-of-scope"] else None)
    return {"total": dict(total), "score": score, "strict": strict, "by_module": by_module,
            "by_operator": by_operator,
            "survivors": [r for r in rows if r["outcome"] == "survived"],
            "equivalent": [r for r in rows if r["outcome"] == "equivalent"],
            "out_of_scope": [r for r in rows if r["outcome"] == "out-of-scope"],
            "contradicted": contradicted}


def print_report(summary: dict, session: str) -> None:
    columns = ("killed", "survived", "equivalent", "out-of-scope", "timeout", "incompetent",
               "pending")

    def table(title: str, groups: dict[str, Counter]) -> None:
        rows = []
        for name, counts in sorted(groups.items()):
            judged = counts["killed"] + counts["survived"] + counts["timeout"]
            score = f"{(counts['killed'] + counts['timeout']) / judged:.1%}" if judged else "-"
            rows.append([name, *(counts[c] for c in columns), score])
        print(table_of([Column(title), *(Column(c, "right") for c in columns),
                        Column("score", "right")], rows))

    table("module", summary["by_module"])
    print()
    table("operator", summary["by_operator"])
    print()
    for row in summary["survivors"]:
        print(f"survived: {row['module']}:{row['line']} {row['operator']} "
              f"(occurrence {row['occurrence']})")
        print("  " + "\n  ".join(row["diff"].splitlines()[2:]))
    for row in summary["contradicted"]:
        said = row["output"].splitlines()[-1] if row["output"] else "?"
        print(f"warning: {row['module']}:{row['line']} {row['operator']} is argued in "
              f"{os.path.relpath(EQUIVALENT, ROOT)} but was killed ({said}): fix the "
              "argument, or find the false alarm")
    score = summary["score"]
    if score is None:
        print(f"\nmutation score: none, no mutant judged; session {session}")
    else:
        print(f"\nmutation score: {score:.1%} of {summary['total']} non-equivalent mutants "
              f"judged ({'meets' if score >= TARGET else 'misses'} the {TARGET:.0%} target); "
              f"session {session}")
    strict = summary.get("strict")
    if strict is not None:
        print(f"strict score, the out-of-scope mutants counted as survivors: {strict:.1%}")

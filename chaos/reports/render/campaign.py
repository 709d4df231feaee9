"""A campaign's pages (chaos.run.campaign): summary.md for a CI job summary, junit.xml with one
test case per invariant, report.html (one self-contained page, no network request), and the
GitHub Actions workflow commands (`::error ...::`) that annotate a failing invariant.

Each reads campaign.json's record alone: what a failing seed's own folder shows (its
witnesses, its timeline) is in that folder, which every failing seed's row names.
"""
from __future__ import annotations

import html
import os
import xml.etree.ElementTree as ET
from typing import Any

from chaos.reports.render.junit import document

ICON = {"pass": "✅", "fail": "❌", "unknown": "❓", "error": "⚠️"}
MAX_REASON = 160
MAX_SEEDS = 10
MAX_FAILING_ROWS = 50


def render_campaign(folder: str, record: dict[str, Any]) -> list[str]:
    """Write summary.md, junit.xml and report.html into `folder`; returns their paths."""
    paths = []
    for name, text in (("summary.md", render_markdown(record)),
                       ("junit.xml", render_junit(record)),
                       ("report.html", render_html(record))):
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        paths.append(path)
    return paths


def ordered(record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(invariant, entry): failures, then unknowns, then passes not exercised, then passes."""
    def rank(item):
        v = item[1]
        return ({"fail": 0, "unknown": 1}.get(v["verdict"], 2 if v["exercised"] is False
                                                else 3), item[0])
    return sorted(record["invariants"].items(), key=rank)


def shown(v: dict[str, Any]) -> str:
    """The verdict as the pages show it."""
    return "pass, not exercised" if v["verdict"] == "pass" and v["exercised"] is False \
        else v["verdict"]


def headline(record: dict[str, Any]) -> str:
    """`sim smoke (profile smoke, engine reference): seeds 1..6, 3 shards`."""
    key, shards = record["key"], record["shards"]
    what = [f"profile {key['profile']}", f"engine {key['engine']}"]
    if key.get("seeds"):
        what.append(f"seeds {key['seeds']}")
    if key.get("budget") is not None:
        what.append(f"budget {key['budget']:g} s")
    if shards["count"] > 1:
        given = shards["given"]
        what.append(f"{shards['count']} shards merged" if len(given) == shards["count"]
                    else f"shard {', '.join(map(str, given))} of {shards['count']}")
    return f"{key['command']} {key['scenario']} ({', '.join(what)})"


def counts_text(v: dict[str, Any]) -> str:
    parts = [f"{v[k]} {label}" for k, label in (("pass", "pass"), ("not_exercised",
             "not exercised"), ("fail", "fail"), ("unknown", "unknown"),
             ("crashed", "crashed")) if v[k]]
    return ", ".join(parts) or "no run"


def seeds_text(seeds: list[int]) -> str:
    text = ", ".join(map(str, seeds[:MAX_SEEDS]))
    return text + (f" (+{len(seeds) - MAX_SEEDS})" if len(seeds) > MAX_SEEDS else "")


# -- summary.md --------------------------------------------------------------------------

def render_markdown(record: dict[str, Any]) -> str:
    """The result line, the verdict table over the runs, the situations reached and every
    failing seed with the commands that rerun and replay it."""
    result = record["result"]
    lines = [f"## {ICON.get(result, '')} ninelives {headline(record)}: **{result.upper()}**",
             "", f"{record['runs']} runs: " + ", ".join(
                 f"{n} {k}" for k, n in sorted(record["results"].items())), "",
             "| invariant | verdict | runs | failing seeds | reason |", "|---|---|---|---|---|"]
    for name, v in ordered(record):
        lines.append(f"| `{name}` | {ICON[v['verdict']]} {shown(v)} | {counts_text(v)} | "
                     f"{seeds_text(v['failing_seeds'])} | {_cell(v['reason'])} |")
    reached = {n: s for n, s in record["situations"].items() if s["count"]}
    missed = [n for n, s in record["situations"].items() if not s["count"]]
    lines += ["", "**Situations reached:** " + (", ".join(
        f"`{n}` ×{s['count']} ({s['runs']} runs)" for n, s in reached.items()) or "none")]
    if missed:
        lines.append(f"**Not reached:** {', '.join(missed)}")
    if record["not_exercised"]:
        lines.append(f"**Passed, not exercised in any run:** "
                     f"{', '.join(record['not_exercised'])}")
    if record["failing"]:
        lines += ["", "**Failing seeds:**", ""]
        for f in record["failing"][:MAX_FAILING_ROWS]:
            lines.append(f"- seed {f['seed']}: {', '.join(f['invariants'])}; rerun "
                         f"`{f.get('rerun', '?')}`" + (f"; replay `{f['replay']}`"
                                                       if f.get("replay") else ""))
        if len(record["failing"]) > MAX_FAILING_ROWS:
            lines.append(f"- and {len(record['failing']) - MAX_FAILING_ROWS} more "
                         "(campaign.json lists them all)")
    for e in record["errors"][:MAX_FAILING_ROWS]:
        lines.append(f"- seed {e['seed']}: **error**: {_cell(e['why'])}")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    text = " ".join((text or "").split()).replace("|", "\\|")
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"


# -- junit.xml ----------------------------------------------------------------------------

def render_junit(record: dict[str, Any]) -> str:
    """One test case per invariant: a failure names its failing seeds and the first
    reason, an unknown is an error, a pass not exercised says so in a property."""
    name = f"ninelives.{record['key']['scenario']}"
    seconds = max(0.0, (record.get("finished") or 0) - (record.get("started") or 0))
    suite = ET.Element("testsuite", name=name, time=f"{seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for key, value in (("campaign", headline(record)), ("runs", record["runs"]),
                       ("shards", f"{record['shards']['given']} of "
                                  f"{record['shards']['count']}")):
        ET.SubElement(props, "property", name=key, value=str(value))
    for sname, s in record["situations"].items():
        ET.SubElement(props, "property", name=f"situation.{sname}", value=str(s["count"]))
    for iname, v in record["invariants"].items():
        case = ET.SubElement(suite, "testcase", classname=name, name=iname, time="0")
        if v["verdict"] == "pass" and v["exercised"] is False:
            cprops = ET.SubElement(case, "properties")
            ET.SubElement(cprops, "property", name="exercised", value="false")
        if v["verdict"] == "pass":
            continue
        tag = "failure" if v["verdict"] == "fail" else "error"
        node = ET.SubElement(case, tag, type=v["verdict"], message=(
            f"failed in {v['fail']} of {record['runs']} runs (seeds "
            f"{seeds_text(v['failing_seeds'])}): {v['reason']}" if v["verdict"] == "fail"
            else v["reason"] or "no run had evidence either way"))
        node.text = "\n".join(f"seed {f['seed']}: rerun {f.get('rerun', '?')}"
                              for f in record["failing"] if iname in f["invariants"])
    for e in record["errors"]:
        case = ET.SubElement(suite, "testcase", classname=name, name=f"seed-{e['seed']}",
                             time="0")
        ET.SubElement(case, "error", type="error", message=e["why"])
    return document(suite, name, seconds)


# -- report.html --------------------------------------------------------------------------

STYLE = """body{font:14px/1.45 system-ui,sans-serif;color:#1f2328;margin:0}
main{max-width:1200px;margin:0 auto;padding:18px 24px 48px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid #d8dee4;vertical-align:top}th{background:#f6f8fa;font-size:12px}
.b{display:inline-block;padding:1px 9px;border-radius:10px;color:#fff;font-weight:700}
.pass{background:#1b7f3b}.fail{background:#c62828}.unknown,.error,.unexercised{background:#a15c00}
code{font-family:ui-monospace,monospace;font-size:12.5px}
td:first-child,.b{white-space:nowrap}"""


def render_html(record: dict[str, Any]) -> str:
    """One self-contained page (inline CSS, no script, no network request)."""
    e = html.escape
    result = record["result"]
    rows = "".join(
        f"<tr><td><code>{e(n)}</code></td><td><span class='b "
        f"{'unexercised' if shown(v) == 'pass, not exercised' else v['verdict']}'>"
        f"{e(shown(v))}</span></td><td>{e(counts_text(v))}</td>"
        f"<td>{e(seeds_text(v['failing_seeds']))}</td><td>{e(v['reason'])}</td></tr>"
        for n, v in ordered(record))
    situations = "".join(
        f"<tr><td><code>{e(n)}</code></td><td>{s['count']}</td><td>{s['runs']}</td>"
        f"<td>{e(s['why']) if s['unobservable'] else ''}</td></tr>"
        for n, s in record["situations"].items())
    failing = "".join(
        f"<li>seed {f['seed']}: {e(', '.join(f['invariants']))}<br>rerun: "
        f"<code>{e(f.get('rerun', '?'))}</code>"
        + (f"<br>replay: <code>{e(f['replay'])}</code>" if f.get("replay") else "")
        + (f"<br>run folder: <a href='{e(f['run_dir'])}/report.html'><code>{e(f['run_dir'])}"
           "</code></a>" if f.get("run_dir") else "")
        + "</li>" for f in record["failing"])
    errors = "".join(f"<li>seed {x['seed']}: {e(x['why'])}</li>" for x in record["errors"])
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "style-src 'unsafe-inline'\">"
        f"<title>{e(result.upper())} · ninelives {e(headline(record))}</title>"
        f"<style>{STYLE}</style></head><body><main>"
        f"<h1><span class='b {e(result)}'>{e(result.upper())}</span> ninelives "
        f"{e(headline(record))}</h1>"
        f"<p>{record['runs']} runs: " + e(", ".join(
            f"{n} {k}" for k, n in sorted(record["results"].items()))) + "</p>"
        "<h2>Invariants over the runs</h2><table><tr><th>invariant</th><th>verdict</th>"
        f"<th>runs</th><th>failing seeds</th><th>reason</th></tr>{rows}</table>"
        + (f"<h2>Failing seeds</h2><ul>{failing}</ul>" if failing else "")
        + (f"<h2>Runs in error</h2><ul>{errors}</ul>" if errors else "")
        + "<h2>Situations reached</h2><table><tr><th>situation</th><th>times</th>"
        f"<th>runs</th><th>unobservable</th></tr>{situations}</table>"
        f"<p><small>{e(record['shards']['rule'])}</small></p></main></body></html>\n")


# -- GitHub Actions workflow commands ------------------------------------------------------

def _data(text: str) -> str:
    """A workflow command's message, escaped as GitHub's runner reads it."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotations(record: dict[str, Any]) -> list[str]:
    """`::error title=...::` for every failing invariant and every run in error,
    `::warning title=...::` for an invariant that passed, not exercised, in every run."""
    lines = []
    for name, v in ordered(record):
        if v["verdict"] == "fail":
            first = next((f for f in record["failing"] if name in f["invariants"]), {})
            lines.append(f"::error title={_prop('ninelives: ' + name + ' failed')}::" + _data(
                f"{name} failed in {v['fail']} of {record['runs']} runs (seeds "
                f"{seeds_text(v['failing_seeds'])}): {v['reason']}"
                + (f" | rerun: {first['rerun']}" if first.get("rerun") else "")))
    for x in record["errors"]:
        lines.append(f"::error title={_prop('ninelives: error')}::"
                     + _data(f"seed {x['seed']}: {x['why']}"))
    for name in record["not_exercised"]:
        lines.append(f"::warning title={_prop('ninelives: ' + name + ' not exercised')}::"
                     + _data(f"{name} passed in every run without reaching any of its "
                             "dangerous situations"))
    return lines


def run_annotations(report: dict[str, Any]) -> list[str]:
    """The same for one run's report.json."""
    lines = []
    for v in report.get("verdicts") or []:
        if v["verdict"] == "fail":
            lines.append(f"::error title={_prop('ninelives: ' + v['name'] + ' failed')}::"
                         + _data(f"{v['name']}: {v.get('reason', '')} | rerun: "
                                 f"{report.get('run_command', '?')}"))
    if report.get("result") == "error":
        why = ", ".join(report.get("faults_unfired") or []) or "the run ended in error"
        lines.append(f"::error title={_prop('ninelives: error')}::"
                     + _data(f"{report.get('run_dir', '')}: {why}"))
    for name in report.get("not_exercised") or []:
        lines.append(f"::warning title={_prop('ninelives: ' + name + ' not exercised')}::"
                     + _data(f"{name} passed without reaching any of its dangerous situations"))
    return lines

"""junit.xml: one test suite per run, one test case per invariant, so any CI lists the
verdicts natively. fail -> <failure>, unknown -> <error>; unfired faults add an <error> case."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from chaos.reports.render.evidence import describe, first_events

MAX_EVENTS = 10
MAX_MESSAGES = 5


def render_junit(report: dict[str, Any], t0: float | None = None) -> str:
    """The run's verdicts as JUnit XML (a <testsuites> holding one <testsuite>); event times
    are printed relative to `t0` (the history's first event), else to the run's start."""
    name = f"ninelives.{report['scenario']['name']}"
    seconds = float(report.get("metrics", {}).get("run_seconds", 0.0))
    suite = ET.Element("testsuite", name=name, timestamp=_iso(report.get("started")),
                       time=f"{seconds:.3f}")
    _properties(suite, report)
    t0 = report.get("started", 0.0) if t0 is None else t0
    for verdict in report["verdicts"]:
        _testcase(suite, name, verdict, t0)
    if report.get("faults_unfired"):
        case = ET.SubElement(suite, "testcase", classname=name, name="configured-faults-fired",
                             time="0")
        ET.SubElement(case, "error", message="configured faults never fired: "
                      + ", ".join(report["faults_unfired"]), type="unfired-faults")
    for flag, case_name, what in (("partial", "run-complete", "the run ended before its checks"),
                                  ("torn", "history-complete", report.get("torn"))):
        if report.get(flag):
            case = ET.SubElement(suite, "testcase", classname=name, name=case_name, time="0")
            ET.SubElement(case, "error", message=str(what), type=flag)
    return document(suite, name, seconds)


def document(suite: ET.Element, name: str, seconds: float) -> str:
    """The JUnit file of one `suite` whose test cases are in: the counts set on it and on
    the <testsuites> around it."""
    cases = suite.findall("testcase")
    counts = {"tests": len(cases), "failures": sum(c.find("failure") is not None for c in cases),
              "errors": sum(c.find("error") is not None for c in cases), "skipped": 0}
    for key, value in counts.items():
        suite.set(key, str(value))
    root = ET.Element("testsuites", name=name, time=f"{seconds:.3f}",
                      **{k: str(v) for k, v in counts.items() if k != "skipped"})
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _properties(suite: ET.Element, report: dict[str, Any]) -> None:
    props = ET.SubElement(suite, "properties")
    for key in ("seed", "profile", "engine", "run_command", "replay_command", "run_dir"):
        ET.SubElement(props, "property", name=key, value=str(report.get(key, "")))
    found = report.get("situations") or {}
    for name, r in found.items():   # one per situation: times reached, or why unobservable
        ET.SubElement(props, "property", name=f"situation.{name}",
                      value=str(r["count"]) if r.get("observable", True)
                      else f"unobservable: {r.get('why')}")
    out = ET.SubElement(suite, "system-out")
    out.text = f"rerun: {report.get('run_command')}\nreplay: {report.get('replay_command')}\n"
    for name, r in found.items():
        for x in (r.get("examples") or [])[:1]:
            out.text += (f"situation {name} x{r['count']}, e.g. history line {x.get('line')}: "
                         f"{x.get('note')}\n")


def _testcase(suite: ET.Element, classname: str, verdict: dict[str, Any], t0: float) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=verdict["name"],
                         time="0")
    if verdict["verdict"] == "pass" and verdict.get("exercised") is False:
        # A pass that reached none of its situations: said so, on the case itself.
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="exercised", value="false")
        out = ET.SubElement(case, "system-out")
        out.text = ("pass, not exercised: none of its situations was reached ("
                    + ", ".join(f"{n} {'unobservable' if c is None else c}"
                                for n, c in (verdict.get("situations") or {}).items()) + ")")
    if verdict["verdict"] == "pass":
        return
    tag = "failure" if verdict["verdict"] == "fail" else "error"
    first = (verdict.get("first_error") or {}).get("type") or verdict["verdict"]
    node = ET.SubElement(case, tag, message=verdict.get("reason") or verdict["verdict"],
                         type=first)
    node.text = _detail(verdict, t0)


def _detail(verdict: dict[str, Any], t0: float) -> str:
    lines = [f"{verdict['name']}: {verdict['verdict']}, {verdict.get('error_count', 0)} "
             f"error(s) of {verdict.get('checked', 0)} checked"]
    lines += [f"- [{e['type']}] {e['message']}" for e in
              (verdict.get("errors") or [])[:MAX_MESSAGES]]
    events = first_events(verdict, MAX_EVENTS)
    if events:
        lines.append("first witnessing events:")
        lines += [f"  {describe(e, t0)}\n    {json.dumps(e, sort_keys=True)}" for e in events]
    if verdict.get("metrics", {}).get("traceback"):
        lines.append(verdict["metrics"]["traceback"])
    return "\n".join(lines)


def _iso(started: float | None) -> str:
    from datetime import datetime, timezone
    if not started:
        return ""
    return datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")

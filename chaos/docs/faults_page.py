"""The faults' reference page, generated from the code: the random faults a scenario's
`[faults]` table draws (`chaos.spec.scenario.Faults`, grouped as there), the crash windows by role
(`chaos.engines.crashpoints.ROLES`), the reference engine's own points (`engine.hooks`), the aimed
faults (`chaos.spec.aim`) and what the nemesis records of each (`chaos.docs.history_page`)."""
from __future__ import annotations

from dataclasses import fields


def page() -> str:
    """docs/reference/faults.md's text."""
    from chaos.spec import aim
    from chaos.engines import crashpoints
    from chaos.reference.docs import crashpoints_source
    from chaos.spec.scenario import RATES, SHARES, Faults
    from chaos.docs.scenario_page import comments
    docs, sections = comments(Faults)
    lines = ["# The faults", "",
             "Generated from the code (`python -m chaos.docs --write`). Every fault of a run "
             "comes from its plan, a pure function of the scenario and the seed, so a seed "
             "replays the same faults; each one the run applied is recorded in its history "
             "(`nemesis` operations, see [the history](history.md)) and counted in the report "
             "as fired. The fields are those of [the scenario format](scenario.md).", "",
             "## Random faults", "",
             "A rate is events per second of the chaos phase; a share is the fraction of calls, "
             "requests or documents struck.", ""]
    for f in fields(Faults):
        if f.name in sections:
            lines += ["", f"**{sections[f.name].capitalize()}**", ""]
        kind = "rate" if f.name in RATES else "share" if f.name in SHARES else "setting"
        lines.append(f"- `{f.name}` ({kind}): {docs.get(f.name, '')}")
    lines += ["", "## Crash points, by role", "",
              "`faults.crash_points` arms points where a process kills itself (SIGKILL) at "
              "the N-th hit (the plan draws N) or with `crash_point_probability`: `*` for "
              "every point, an engine's own point name, or `role:NAME` for the window engines "
              "of this kind share (an adapter maps its points to roles); a trailing `?` makes "
              "a name optional.", "", "| role | what holds when a process dies there |",
              "|---|---|"]
    lines += [f"| `{role}` | {text} |" for role, text in crashpoints.ROLES.items()]
    lines += ["", "## The reference engine's points", "", "```python"]
    lines += crashpoints_source()
    lines += ["```", "", "## Aimed faults", "",
              "`[[aim]]` tables fire a fault at a named point for a chosen job, instead of at "
              "a random time, to reach the narrow windows where lease bugs live.", "",
              *_aim_text(aim.__doc__ or ""), ""]
    return "\n".join(lines).rstrip() + "\n"


def _aim_text(doc: str) -> list[str]:
    paragraphs = doc.split("\n\n")
    return [" ".join(paragraphs[1].split())] if len(paragraphs) > 1 else []

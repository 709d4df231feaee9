"""The copies of the checkout a score campaign mutates, one per cosmic-ray worker: what the
harness needs to run an engine, copied and refreshed; nothing in the checkout itself is ever
mutated."""
from __future__ import annotations

import filecmp
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The copy cosmic-ray mutates: what the harness needs to run an engine, nothing else.
COPIED = ("engine", "chaos", "scenarios", "examples", "pyproject.toml")
#: What `--again` refreshes in a copy: all of it but the engine, which holds the mutants.
HARNESS = ("chaos", "scenarios", "examples")


#: Imported at start-up by every Python process whose path has the copy first (the test
#: command, the simulation, and the real workers and senders of `--run`).
SITECUSTOMIZE = """\
# Written by chaos.score into a campaign's copy, never into the checkout. cosmic-ray's
# ExceptionReplacer names CosmicRayTestingException in the mutated code without defining it
# anywhere the mutant's process can see: an except clause that names it would raise
# NameError when evaluated, so that a tuple like (CosmicRayTestingException, ValueError)
# stopped catching the ValueError it still names. Defined here, the mutant means what it
# says: an exception type nothing raises.
import builtins

from cosmic_ray.exceptions import CosmicRayTestingException

builtins.CosmicRayTestingException = CosmicRayTestingException
"""


def write_sitecustomize(copy: str) -> None:
    with open(os.path.join(copy, "sitecustomize.py"), "w", encoding="utf-8") as fh:
        fh.write(SITECUSTOMIZE)


class StaleCampaign(Exception):
    """--again on a module whose text changed since its campaign: its mutants are elsewhere."""


def refresh_engine(workdir: str, modules: list[str]) -> None:
    """--again: the engine the survivors meet is the checkout's as it is now (a fix elsewhere
    in the engine would otherwise go unseen, and a check it needs would kill every mutant),
    but for the modules under judgment, whose text the mutants' positions are in: one that
    changed since the campaign is refused."""
    changed = [m for m in modules if not filecmp.cmp(os.path.join(ROOT, m),
                                                      os.path.join(workdir, m), shallow=False)]
    if changed:
        raise StaleCampaign(f"{', '.join(changed)} changed since the campaign in {workdir}: its "
                            "mutants are at the old text; start a fresh campaign for "
                            f"{'them' if len(changed) > 1 else 'it'}")
    copy_checkout(workdir, ("engine",))


def copy_checkout(dst: str, names: tuple[str, ...] = COPIED) -> None:
    """Copy `names` of the checkout into `dst`, replacing what is there."""
    for name in names:
        src, target = os.path.join(ROOT, name), os.path.join(dst, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        if os.path.isdir(src):
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, target)

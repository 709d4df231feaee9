"""The documentation's reference pages, generated from the code so that they cannot drift
from it: `python -m chaos.docs --write` rewrites them, `--check` lists the stale ones (exit
1), and a test fails when one is stale. The site itself is built by `make docs`
(MkDocs, `mkdocs.yml`)."""
from __future__ import annotations

import os
from typing import Callable

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "docs")


def pages() -> dict[str, Callable[[], str]]:
    """Each generated page, by its path under docs/, with the function that writes it."""
    from chaos.docs.history_page import reference_page
    from chaos.docs import cli_page, faults_page, invariants_page, scenario_page
    return {"cli.md": cli_page.page, "scenario.md": scenario_page.page,
            "invariants.md": invariants_page.page, "faults.md": faults_page.page,
            "history.md": reference_page}


def stale(docs: str = DOCS) -> list[str]:
    """The generated pages whose file under `docs` differs from what the code gives now."""
    found = []
    for name, make in pages().items():
        path = os.path.join(docs, name)
        try:
            with open(path, encoding="utf-8") as fh:
                if fh.read() == make():
                    continue
        except FileNotFoundError:
            pass
        found.append(path)
    return found


def write(docs: str = DOCS) -> list[str]:
    """Write every generated page under `docs`; returns their paths."""
    written = []
    for name, make in pages().items():
        path = os.path.join(docs, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(make())
        written.append(path)
    return written

"""The documentation site: its generated reference pages match the code, every scenario field
is described, and the site builds with MkDocs in strict mode (a broken link or a page left out
of the navigation fails it)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields

import pytest

from chaos import docs
from chaos.docs.scenario_page import comments
from chaos.spec.scenario import Expect, Faults, Run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_generated_page_matches_the_code():
    assert docs.stale() == [], "stale pages: run `python -m chaos.docs --write`"


@pytest.mark.parametrize("table", [Run, Faults, Expect], ids=lambda t: t.__name__)
def test_every_scenario_field_says_what_it_is(table):
    described, _ = comments(table)
    assert [f.name for f in fields(table) if not described.get(f.name)] == []


def test_a_generated_page_edited_by_hand_is_stale(tmp_path):
    docs.write(str(tmp_path))
    assert docs.stale(str(tmp_path)) == []
    with open(tmp_path / "faults.md", "a", encoding="utf-8") as fh:
        fh.write("an edit by hand\n")
    assert docs.stale(str(tmp_path)) == [str(tmp_path / "faults.md")]


def test_the_site_builds_strictly(tmp_path):
    # not --quiet: it hides the warnings, and strict mode fails only on the ones it counts
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                            "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "invariants" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    import shutil
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    with open(tmp_path / "docs" / "index.md", "a", encoding="utf-8") as fh:
        fh.write("\nSee [a page that is not there](nowhere.md).\n")
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as fh:
        config = fh.read()
    (tmp_path / "mkdocs.yml").write_text(config)
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                            str(tmp_path / "site")], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert built.returncode != 0 and "nowhere.md" in built.stderr, built.stderr


def fenced_after(path: str, marker: str) -> str:
    """The first fenced block after the line that starts with `marker` in `path`."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        text = fh.read()
    return text[text.index(marker):].split("```", 2)[1]


def test_the_readme_and_the_durability_page_show_the_same_settings_table():
    # the bench prints one table; the README shows it, the how-to explains it: never two
    marker = "What each setting lost"
    assert fenced_after("README.md", marker) == fenced_after("docs/how-to/durability.md", marker)


def test_the_readme_stays_short_and_links_only_pages_that_exist():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    assert len(text.splitlines()) < 250
    import re
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, target)), target

"""The package's metadata installs without deprecation notices: `license` is an SPDX string,
which setuptools reads from 77 on (the table form is deprecated and printed a notice per
build step), and rich, which draws the terminal's tables and bars, is a dependency."""
from __future__ import annotations

import os
import re
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return tomllib.load(fh)


def test_the_license_is_an_spdx_string_and_the_build_needs_a_setuptools_that_reads_it():
    meta = pyproject()
    assert meta["project"]["license"] == "MIT"
    setuptools = next(r for r in meta["build-system"]["requires"] if r.startswith("setuptools"))
    floor = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools)
    assert floor and int(floor.group(1)) >= 77, setuptools


def test_rich_is_a_dependency_with_a_lower_bound():
    dependencies = pyproject()["project"]["dependencies"]
    assert any(re.fullmatch(r"rich>=\d+(\.\d+)*", r) for r in dependencies), dependencies

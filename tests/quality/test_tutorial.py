"""docs/tutorial.md, run as written: every code block of the tutorial is executed here, in
order, so the page cannot drift from what ninelives does (issue 31).

The page's convention, strict: a block this test cannot run fails it; nothing is skipped.

- A ```python or ```toml block opens with a comment naming its file (`# tinyflow/store.py`):
  it is written to that path in a fresh temporary folder, the reader's folder.
- A ```console block holds commands, each on a line that starts with `$ `, run by bash in
  that folder one after the other; the lines after a command, up to the next one, are what
  it prints (stdout and stderr together). Every line shown must be printed, in that order,
  and no other line, except that a line `...` stands for any number of lines, and `...`
  inside a line for any text there. A command that ends with the comment `# exit N` must
  exit with N; any other must exit 0. A command `export NAME=VALUE` sets NAME for the
  commands after it, as in a shell.
- `ninelives` is this checkout's: the running interpreter's folder comes first on PATH.
  PYTHONPATH starts empty: the page must set what the reader has to set.
- Any other block (another language, no language, a file block with no path) is a failure.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
FILE_LANGUAGES = ("python", "toml")
PROMPT = "$ "
ELLIPSIS = "..."
EXIT = re.compile(r"\s+# exit (\d+)$")
#: seconds one command may take before it counts as hung (its whole process group is ended)
COMMAND_TIMEOUT = 120


@dataclass
class Block:
    language: str
    lines: list[str]
    line: int  # where the block opens on the page, 1-based


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)
    exit: int = 0
    line: int = 0


def blocks(text: str) -> list[Block]:
    """The page's fenced blocks, in order. Raises AssertionError for a fence left open."""
    found, current = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current = Block(line[3:].strip(), [], number)
            else:
                assert line.strip() == "```", f"line {number}: a fence closes with a language"
                found.append(current)
                current = None
        elif current is not None:
            current.lines.append(line)
    assert current is None, f"the block opened on line {current.line} is never closed"
    return found


def commands(block: Block) -> list[Command]:
    """A console block's commands with their expected output and exit code."""
    assert block.lines and block.lines[0].startswith(PROMPT), \
        f"the console block on line {block.line} does not open with a `$ ` command"
    found: list[Command] = []
    for offset, line in enumerate(block.lines, 1):
        if line.startswith(PROMPT):
            text = line[len(PROMPT):]
            code = EXIT.search(text)
            found.append(Command(EXIT.sub("", text), exit=int(code.group(1)) if code else 0,
                                 line=block.line + offset))
        else:
            found[-1].expected.append(line)
    return found


def file_path(block: Block) -> str:
    """The path a file block names on its first line. Raises AssertionError without one."""
    first = block.lines[0] if block.lines else ""
    match = re.fullmatch(r"# ([\w./-]+\.(?:py|toml))", first)
    assert match, (f"the {block.language} block on line {block.line} does not open with a "
                   f"comment naming its file (`# tinyflow/store.py`): {first!r}")
    assert not match.group(1).startswith("/") and ".." not in match.group(1), first
    return match.group(1)


def pattern(line: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in line.rstrip().split(ELLIPSIS)))


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether `actual` is `expected` with its ellipses filled in (see the module docstring)."""
    patterns = [None if e.strip() == ELLIPSIS else pattern(e) for e in expected]

    @lru_cache(maxsize=None)
    def at(i: int, j: int) -> bool:
        if i == len(patterns):
            return j == len(actual)
        if patterns[i] is None:  # any number of lines
            return at(i + 1, j) or (j < len(actual) and at(i, j + 1))
        return j < len(actual) and bool(patterns[i].fullmatch(actual[j])) and at(i + 1, j + 1)

    return at(0, 0)


def run(command: Command, folder: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run one command in bash; (exit code, the lines it printed). A command that outlives
    COMMAND_TIMEOUT has its whole process group killed, and fails the test."""
    proc = subprocess.Popen(["bash", "-c", command.text], cwd=folder, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"line {command.line}: `{command.text}` ran past {COMMAND_TIMEOUT} s")
    return proc.returncode, [line.rstrip() for line in out.rstrip("\n").splitlines()]


def exported(command: Command, folder: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment after an `export` command, as bash expands it."""
    out = subprocess.run(["bash", "-c", f"{command.text} && env -0"], cwd=folder, env=env,
                         capture_output=True, text=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def reader_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    assert (Path(sys.executable).parent / "ninelives").exists(), \
        "no ninelives console script beside the interpreter: install the checkout (make)"
    page = blocks(PAGE.read_text())
    assert page, f"{PAGE} has no code block"
    env, ran, written = reader_environment(), 0, 0
    for block in page:
        if block.language in FILE_LANGUAGES:
            path = tmp_path / file_path(block)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(block.lines) + "\n")
            written += 1
            continue
        assert block.language == "console", (
            f"the block on line {block.line} is {block.language or 'unmarked'!r}: the page's "
            f"blocks are {', '.join(FILE_LANGUAGES)} files or console commands")
        for command in commands(block):
            ran += 1
            if command.text.startswith("export "):
                env = exported(command, tmp_path, env)
                continue
            code, printed = run(command, tmp_path, env)
            shown = "\n".join(printed)
            assert code == command.exit, (f"line {command.line}: `{command.text}` exited "
                                          f"{code}, the page says {command.exit}:\n{shown}")
            assert matches(command.expected, printed), (
                f"line {command.line}: `{command.text}` printed what the page does not show."
                f"\n--- the page:\n" + "\n".join(command.expected) + f"\n--- printed:\n{shown}")
    assert written and ran, f"the page wrote {written} files and ran {ran} commands"


# -- the convention's own rules, checked without running anything -------------------------

def test_ellipses_match_lines_and_text_and_nothing_else() -> None:
    assert matches(["a ... c", "...", "z"], ["a b c", "x", "y", "z"])
    assert matches(["a", "...", "z"], ["a", "z"])
    assert not matches(["a", "z"], ["a", "b", "z"])        # an unshown line fails
    assert not matches(["a", "b"], ["b", "a"])             # so does another order
    assert not matches(["a ... c"], ["a b d"])
    assert not matches(["x(1)"], ["x1"])                   # shown text is literal


def test_a_block_that_cannot_be_run_is_refused() -> None:
    with pytest.raises(AssertionError, match="naming its file"):
        file_path(Block("python", ["import os"], 3))
    with pytest.raises(AssertionError, match="does not open with"):
        commands(Block("console", ["ninelives doctor"], 7))
    with pytest.raises(AssertionError, match="never closed"):
        blocks("```console\n$ true\n")
    parsed = commands(Block("console", ["$ ninelives run x  # exit 1", "out"], 1))
    assert (parsed[0].text, parsed[0].exit, parsed[0].expected) == ("ninelives run x", 1, ["out"])

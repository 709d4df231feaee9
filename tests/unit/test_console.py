"""What the terminal shows: on a terminal rich wraps a table's free text at words and draws
progress bars; anywhere else the same tables and progress are plain lines, with no escape
codes, no bars and no word cut in two."""
from __future__ import annotations

import io
import re
import time

from rich.console import Console

from chaos.reports.console import Column, Progress, plural, shorten, table, terminal
from chaos.reports.report_text import verdict_table
from timed import wait_until

ANSI = re.compile(r"\x1b\[")
REASON = ("no operator action was reported done, nor refused where the engine says it "
          "applies, in this run, and more words so that the reason outgrows any column")
COLUMNS = [Column("invariant"), Column("verdict"), Column("checked", "right"),
           Column("reason", wraps=True)]
ROWS = [["operator-moves", "UNKNOWN", 0, REASON], ["all-jobs-settle", "pass", 82, ""]]


def a_terminal(width: int = 60) -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=width)


def test_a_stream_that_is_no_terminal_gets_no_rich_console():
    assert terminal(io.StringIO()) is None
    assert terminal(a_terminal().file) is None  # a StringIO, whoever wraps it


def test_a_plain_table_is_aligned_lines_with_no_escape_codes_and_no_word_cut():
    text = table(COLUMNS, ROWS, console=None)
    assert not ANSI.search(text)
    head, unknown, passing = text.splitlines()
    assert head.split() == ["invariant", "verdict", "checked", "reason"]
    assert head.index("verdict") == unknown.index("UNKNOWN") == passing.index("pass")
    end = head.index("checked") + len("checked")  # counts are right-aligned under it
    assert unknown[end - 1] == "0" and passing[end - 2:end] == "82"
    reason = unknown.split("  ")[-1]
    assert reason.endswith(" ...") and REASON.startswith(reason[:-4])
    assert REASON[len(reason) - 4] == " "  # cut between two words


def test_on_a_terminal_the_reason_wraps_at_words_within_the_width():
    console = a_terminal(60)
    text = table(COLUMNS, ROWS, console=console)
    plain = ANSI.sub("", re.sub(r"\x1b\[[0-9;]*m", "", text))
    lines = plain.splitlines()
    assert all(len(line) <= 60 for line in lines)
    assert len(lines) > 4  # the reason took several lines
    words = " ".join(lines).split()
    for word in REASON.split():
        assert word in words  # every word whole, none cut at the edge


def test_shorten_keeps_short_text_and_cuts_a_single_long_word_only_when_it_must():
    assert shorten("a b c", 10) == "a b c"
    assert shorten("x" * 30, 10) == "x" * 6 + " ..."
    assert shorten("alpha beta gamma delta", 14) == "alpha beta ..."
    assert shorten("alpha beta gamma", 13) == "alpha ..."


def test_plural_counts():
    assert (plural(1, "job"), plural(2, "job"), plural(0, "outbox row")) == \
        ("1 job", "2 jobs", "0 outbox rows")


def test_the_verdict_table_is_plain_when_stdout_is_no_terminal(capsys):
    report = {"verdicts": [{"name": "lease-kept", "verdict": "fail", "checked": 3,
                            "error_count": 1, "reason": REASON}]}
    text = verdict_table(report)  # stdout is captured here: no terminal
    assert not ANSI.search(text) and "─" not in text
    assert text.splitlines()[1].split()[:4] == ["lease-kept", "FAIL", "3", "1"]


def test_plain_progress_prints_at_most_one_line_per_interval_and_the_last_state():
    out, now = io.StringIO(), [0.0]
    with Progress("drain", 10, unit="jobs settled", stream=out, every=2.0,
                  clock=lambda: now[0]) as shown:
        for t, done in ((0.0, 1), (0.5, 2), (1.9, 3), (2.0, 4), (3.0, 9)):
            now[0] = t
            shown.update(done, detail=f"{plural(10 - done, 'job')} not finished")
    assert out.getvalue().splitlines() == [
        "  drain: 1/10 jobs settled, 9 jobs not finished",
        "  drain: 4/10 jobs settled, 6 jobs not finished",
        "  drain: 9/10 jobs settled, 1 job not finished"]
    assert not ANSI.search(out.getvalue())


def test_progress_that_counts_nothing_says_what_it_does_and_disabled_progress_is_silent():
    out = io.StringIO()
    with Progress("check", stream=out) as shown:
        shown.update(detail="the invariants over 12 events")
        shown.say("a line of its own")
    with Progress("chaos", 5, unit="s", stream=out, enabled=False) as quiet:
        quiet.update(3, detail="pending 4")
        quiet.say("not shown")
    assert out.getvalue().splitlines() == ["  check: the invariants over 12 events",
                                           "a line of its own"]


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_progress_is_a_bar_with_an_eta_and_lines_go_above_it():
    out = FakeTTY()
    with Progress("sim", 40, unit="schedules", stream=out) as shown:
        shown.update(10, detail="0 failed")
        shown.say("seed 3: FAIL lease-kept")
        shown.update(20)
    text = out.getvalue()
    assert ANSI.search(text) and "━" in text  # drawn by rich
    assert "20/40 schedules" in text and re.search(r"\d:\d\d:\d\d", text)  # the ETA
    assert "seed 3: FAIL lease-kept" in text


class Timed(io.StringIO):
    """A stream that notes when each line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def write(self, text: str) -> int:
        self.times += [time.monotonic()] * text.count("\n")
        return super().write(text)


def test_a_plain_step_busy_in_one_long_call_says_where_it_stands_within_a_second():
    """No update at all (a step blocked in one call, as making 5,000 documents was): the
    first line is out FIRST_LINE seconds in, then again every `every` seconds, and the
    step's end is said when its last line is older than that."""
    out = Timed()
    started = time.monotonic()
    with Progress("submitting", 5000, unit="jobs", stream=out, every=0.6) as shown:
        assert wait_until(lambda: len(out.times) >= 3, 10), out.getvalue()
        shown.update(detail="still making documents")
    first, second, third = out.times[:3]
    assert first - started < 1.0 and 0.4 <= second - first < 1.2 and 0.4 <= third - second < 1.2
    lines = out.getvalue().splitlines()
    assert lines[0] == "  submitting: 0/5000 jobs" and lines[-1].endswith("still making documents")

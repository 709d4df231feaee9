"""What the terminal shows: tables and progress. On a terminal, rich draws them (a table's
free-text column wraps at words to the terminal's width; a bar with an ETA where the total is
known); anywhere else (a CI log, a pipe, a test) they are plain lines: no escape codes, no
bars, a long text shortened at a word.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TextIO

from rich import box
from rich.console import Console
from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

#: Characters a plain table's free-text column keeps (cut at a word, never inside one).
PLAIN_TEXT_LIMIT = 100
#: Seconds between two plain progress lines of one step.
PLAIN_EVERY = 2.0
#: Seconds after a step starts by which its first plain line is out, whatever the step does.
FIRST_LINE = 0.5


@dataclass(frozen=True)
class Column:
    """One column of a table: its head, how its cells align ("left" or "right"), and
    whether it is the free text that wraps on a terminal and is shortened elsewhere."""

    head: str
    align: str = "left"
    wraps: bool = False


def terminal(stream: TextIO | None = None) -> Console | None:
    """A rich console on `stream` (default stdout) when it is a terminal, else None: the
    `console` argument of `table`, so that only a terminal gets rich's drawing."""
    console = Console(file=stream or sys.stdout, highlight=False)
    return console if console.is_terminal else None


#: `console=AUTO`: rich's drawing when stdout is a terminal, plain lines otherwise.
AUTO = "auto"


def table(columns: Sequence[Column], rows: Iterable[Sequence[object]], *,
          console: Console | str | None = AUTO, gap: int = 2) -> str:
    """The rows as a table: drawn by rich for `console` (AUTO: for stdout when it is a
    terminal, see `terminal`), or plain aligned lines with `gap` spaces between columns
    when `console` is None (or AUTO and stdout is no terminal)."""
    if console == AUTO:
        console = terminal()
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if console is not None:
        return _rich(columns, cells, console)
    return _plain(columns, cells, gap)


def _plain(columns: Sequence[Column], rows: list[list[str]], gap: int) -> str:
    rows = [[shorten(c) if col.wraps else c for col, c in zip(columns, row)] for row in rows]
    widths = [max([len(col.head)] + [len(row[i]) for row in rows])
              for i, col in enumerate(columns)]
    lines = []
    for row in [[col.head for col in columns]] + rows:
        parts = [c.rjust(w) if col.align == "right" else c.ljust(w)
                 for col, c, w in zip(columns, row, widths)]
        lines.append((" " * gap).join(parts).rstrip())
    return "\n".join(lines)


def plural(n: int, word: str, words: str | None = None) -> str:
    """"1 job", "3 jobs"; `words` where the plural is not `word` + "s"."""
    return f"{n} {word if n == 1 else words or word + 's'}"


def _number(x: float) -> str:
    """A count or a number of seconds: whole, or to a tenth below ten."""
    return f"{x:.0f}" if float(x).is_integer() or abs(x) >= 10 else f"{x:.1f}"


def shorten(text: str, limit: int = PLAIN_TEXT_LIMIT) -> str:
    """`text` in at most `limit` characters, cut at a word and marked " ..." when it was
    longer (a single word longer than the limit is cut inside it: it has no other place)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 4]
    if " " in cut and text[limit - 4] != " ":
        cut = cut[:cut.rindex(" ")]
    return cut.rstrip() + " ..."


def _rich(columns: Sequence[Column], rows: list[list[str]], console: Console) -> str:
    drawn = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for col in columns:
        drawn.add_column(col.head, justify="right" if col.align == "right" else "left",
                         no_wrap=not col.wraps, overflow="fold", ratio=1 if col.wraps else None)
    for row in rows:
        drawn.add_row(*row)
    with console.capture() as captured:
        console.print(drawn)
    return captured.get().rstrip("\n")


class Progress:
    """The progress of one long step, on stderr: on a terminal a rich bar (with an ETA when
    the total is known), elsewhere a plain line at most every `every` seconds and one when
    the step ends. Use as a context manager, and `update` as the step goes on.

    A plain step also says where it stands on its own: its first line is out FIRST_LINE
    seconds after it starts, and the line again every `every` seconds without news, even
    while the step is busy in one long call (a user never waits in silence for more than a
    second at a step's start). A thread does this; `close` stops and joins it. With a clock
    passed in (a test's), there is no such thread: the caller drives time.
    """

    def __init__(self, what: str, total: float | None = None, *, unit: str = "",
                 stream: TextIO | None = None, every: float = PLAIN_EVERY,
                 enabled: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.enabled, self.clock = enabled, clock
        self.stream = stream or sys.stderr
        self.done: float = 0
        self.detail = ""
        self._printed_at: float | None = None
        self._dirty = False
        self._bar: RichProgress | None = None
        self._task = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None
        self._ticker_ran = False
        console = terminal(self.stream) if enabled else None
        if console is not None:
            counted = (BarColumn(), TextColumn("{task.fields[count]}"), TimeRemainingColumn()) \
                if self.counted else (SpinnerColumn(),)
            self._bar = RichProgress(TextColumn("[bold]{task.description}"), *counted,
                                     TextColumn("{task.fields[detail]}", markup=False),
                                     console=console)

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total, count=self.count(),
                                            detail="")
        elif self.enabled and self.clock is time.monotonic:
            self._ticker = threading.Thread(target=self._tick, name=f"progress {self.what}")
            self._ticker.start()
        return self

    def _tick(self) -> None:
        """The plain line FIRST_LINE seconds in, and again whenever `every` seconds passed
        without one."""
        wait = FIRST_LINE
        while not self._closed.wait(wait):
            with self._lock:
                since = None if self._printed_at is None else self.clock() - self._printed_at
                if since is None or since >= self.every - 0.05:
                    try:
                        self._print()
                    except (OSError, ValueError):  # no stream to say it on: nothing to do
                        return
                    since = 0.0
            wait = max(0.05, self.every - since)

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def counted(self) -> bool:
        """Whether the step counts something (a total, or a unit), or only says what it does."""
        return self.total is not None or bool(self.unit)

    def count(self) -> str:
        """"12/30 s", "5 jobs": what is done, of how much when known ("" if not counted)."""
        if not self.counted:
            return ""
        unit = f" {self.unit}" if self.unit else ""
        done = _number(self.done)
        return f"{done}/{_number(self.total)}{unit}" if self.total is not None else f"{done}{unit}"

    def line(self) -> str:
        """The plain line for the step as it stands."""
        return f"  {self.what}: " + (", ".join(p for p in (self.count(), self.detail) if p)
                                     or "under way")

    def update(self, done: float | None = None, *, total: float | None = None,
               detail: str | None = None) -> None:
        """The step has done `done` (of `total`, when it changed); `detail` says what it
        waits for or how things stand."""
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if detail is not None:
            self.detail = detail
        self._dirty = True
        if not self.enabled:
            return
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, total=self.total,
                             count=self.count(), detail=self.detail)
            return
        with self._lock:
            now = self.clock()
            if self._printed_at is None or now - self._printed_at >= self.every:
                self._print()

    def say(self, text: str) -> None:
        """A line of its own (a finished run, a warning), above the bar on a terminal."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            with self._lock:
                print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """End the step: the bar stays as it ended; a plain log gets the last state."""
        self._closed.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker, self._ticker_ran = None, True
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.enabled and (self._dirty or self._quiet_for(FIRST_LINE)):
            self._print()  # as it ended: the next step's first line is timed from here

    def _quiet_for(self, seconds: float) -> bool:
        """Whether the step, kept by the thread that says where it stands, has printed
        nothing for `seconds` (so its last line is older than its end)."""
        return self._ticker_ran and self._printed_at is not None and \
            self.clock() - self._printed_at >= seconds

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self._printed_at, self._dirty = self.clock(), False

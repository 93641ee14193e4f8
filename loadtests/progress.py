"""Progress of the long commands (cache_bench, eval_recall, soak, locust_compare), on stderr.

On a terminal (or with --progress) a bar redrawn in place: label, bar, done/total, rate, time left. Elsewhere
(CI logs, files) plain lines, at most one per tenth of the work and every two seconds, so a log stays readable. stdout stays for results.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

WIDTH = 28
PLAIN_EVERY_S = 2.0  # plain lines: at most one per tenth of the work and per this many seconds (and the last)


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action="store_true",
                        help="draw progress bars on stderr even when it is not a terminal (plain lines otherwise)")


def bars_wanted(forced: bool = False, stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    return forced or bool(getattr(stream, "isatty", lambda: False)())


class Progress:
    """`with Progress(60, "chat: proxy", bars=...) as p: ... p.advance()` (or `p.update(done)`)."""

    def __init__(self, total: int | None, label: str, bars: bool | None = None, stream: TextIO | None = None,
                 unit: str = "", clock=time.monotonic) -> None:
        self.total, self.label, self.unit = total, label, unit
        self.stream = stream or sys.stderr
        self.bars = bars_wanted(stream=self.stream) if bars is None else bars
        self.clock = clock
        self.started = clock()
        self.done = 0
        self._last_step = -1
        self._last_draw = 0.0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = done
        if self.bars:
            now = self.clock()
            if now - self._last_draw >= 0.1 or (self.total and done >= self.total):
                self._last_draw = now
                self.stream.write("\r" + self.line())
                self.stream.flush()
        elif self.total:
            step = 10 * done // self.total
            now = self.clock()
            if step != self._last_step and step > 0 and (now - self._last_draw >= PLAIN_EVERY_S or done >= self.total):
                self._last_step, self._last_draw = step, now
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.done / elapsed
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            return f"{self.label}: {self.done}{unit} ({rate:.1f}/s, {elapsed:.0f}s)"
        share = min(1.0, self.done / self.total)
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        if self.bars:
            filled = int(WIDTH * share)
            bar = "#" * filled + "." * (WIDTH - filled)
            return f"{self.label} [{bar}] {self.done}/{self.total}{unit} {rate:.1f}/s ~{left:.0f}s left "
        return f"{self.label}: {self.done}/{self.total}{unit} ({100 * share:.0f}%, {rate:.1f}/s, ~{left:.0f}s left)"

    def close(self) -> None:
        if self.bars:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()
        elif not self.total or self._last_step < 10:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
        self._last_step = 10


class Silent(Progress):
    """No output: what library callers (tests) get when they ask for no progress."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(None, "", bars=False)

    def update(self, done: int) -> None:
        self.done = done

    def close(self) -> None:
        pass


def progress(total: int | None, label: str, bars: bool | None, unit: str = "") -> Progress:
    """A bar (bars True), plain lines (False), or nothing (None: a library call)."""
    return Silent() if bars is None else Progress(total, label, bars=bars, unit=unit)


def seconds_of(duration: str) -> int:
    """Locust's run time ('90', '30s', '3m', '1h30m') in seconds."""
    total, number = 0, ""
    for char in duration.strip():
        if char.isdigit():
            number += char
        else:
            total += int(number or 0) * {"s": 1, "m": 60, "h": 3600}[char]
            number = ""
    return total + int(number or 0)

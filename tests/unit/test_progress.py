"""loadtests/progress.py: a bar redrawn in place on a terminal, plain lines (one per tenth) elsewhere."""

from __future__ import annotations

import io

from loadtests.progress import Progress, bars_wanted


class Clock:
    def __init__(self, step: float = 0.5) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal_one_per_tenth() -> None:
    out = io.StringIO()
    with Progress(50, "chat: proxy", stream=out, unit="requests", clock=Clock(3.0)) as p:
        for _ in range(50):
            p.advance()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 10
    assert lines[0].startswith("chat: proxy: 5/50 requests (10%") and lines[-1].startswith("chat: proxy: 50/50 requests (100%")


def test_a_quick_loop_off_a_terminal_prints_its_last_line_only() -> None:
    out = io.StringIO()
    with Progress(50, "search", stream=out, clock=Clock(0.01)) as p:
        for _ in range(50):
            p.advance()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]]
    assert out.getvalue().startswith("search: 50/50 (100%")


def test_a_bar_redrawn_in_place_on_a_terminal() -> None:
    out = Tty()
    assert bars_wanted(stream=out) and not bars_wanted(stream=io.StringIO()) and bars_wanted(True, io.StringIO())
    with Progress(4, "soak", stream=out, clock=Clock()) as p:
        for _ in range(4):
            p.advance()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert "\rsoak [" + "#" * 28 + "] 4/4" in text
    assert "soak [" + "#" * 7 + "." * 21 + "] 1/4" in text


def test_without_a_total_it_counts() -> None:
    out = io.StringIO()
    with Progress(None, "users", stream=out, clock=Clock()) as p:
        p.update(7)
    assert out.getvalue().startswith("users: 7 (")

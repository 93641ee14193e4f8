"""loadtests/turn_kinds.py runs end to end: the emulator, a pass-through and a managed proxy started, a short chat sent
turn by turn to the three, every turn sorted and reported."""

from __future__ import annotations

import re

from loadtests import turn_kinds


def test_a_short_chat_is_measured_turn_by_turn(capsys):
    assert turn_kinds.main(["--turns", "40", "--rounds", "1", "--window", "4096"]) == 0
    out = capsys.readouterr().out
    counts = [int(n) for n in re.findall(r"^\| (?:plain|push|epoch|epoch\+push|recall|push\+recall) \| (\d+) \|", out,
                                         re.MULTILINE)]
    assert sum(counts) == 40, out  # every turn sorted into one kind
    assert re.search(r"^\| push \| \d+ \|", out, re.MULTILINE), out  # facts asked back: pushed at a 4k window
    assert re.search(r"^\| managed \| [+-]\d+\.\d\d ms \| [+-]\d+\.\d\d ms \|$", out, re.MULTILINE), out
    assert "managed over pass-through: p50" in out

"""The benchmarks' CPU accounting counts a server's descendants that open a session of their own (PostgreSQL's
backends do), not only the members of its process group."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from loadtests.overhead import group_cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# The parent (leader of a new group) starts a child in a session of its own that burns CPU, then both wait.
_PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass\\ntime.sleep(30)"],
                 start_new_session=True)
time.sleep(30)
"""


def test_a_descendant_in_its_own_session_is_counted() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        seconds = 0.0
        while time.monotonic() < deadline:
            seconds = group_cpu_seconds(parent.pid)
            if seconds >= 0.5:
                break
            time.sleep(0.1)
        assert seconds >= 0.5  # the parent alone sleeps: nearly all of this is the child's
    finally:
        for line in subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", line])
        parent.kill()
        parent.wait()


def test_the_measuring_waits_for_a_busy_server_to_go_idle() -> None:
    """idle_within (a long chat's measured turns start once the unmeasured turns' background work is done): busy
    readings keep it waiting, two quiet ones in a row end the wait, and the limit bounds it."""
    from loadtests.turn_overhead import idle_within

    readings = iter([0.0, 0.1, 0.2, 0.3, 0.3, 0.3, 0.3])  # three busy steps, then quiet
    calls: list[float] = []

    def cpu() -> float:
        calls.append(0.0)
        return next(readings)

    idle_within(cpu, limit_s=5.0, step_s=0.01)
    assert len(calls) == 6  # the first reading, three busy, two quiet
    busy = iter(float(i) for i in range(10_000))
    assert idle_within(lambda: next(busy), limit_s=0.05, step_s=0.01) < 1.0  # always busy: the limit ends it


@pytest.mark.parametrize("workload", ["team", "chat"])
def test_no_two_chats_share_a_page_text_while_their_words_are_the_same(workload: str) -> None:
    """Rounds and cells reuse one proxy, which keeps page vectors by the digest of a page's text: each chat's
    messages differ by a mark of punctuation, which the search's terms do not see, so every cell embeds its own."""
    from loadtests.turn_overhead import cell_mark, chat_bodies, probe_chat_bodies
    from memci_proxy.recall.lexical.text import tokenize

    make = chat_bodies if workload == "team" else probe_chat_bodies
    # (the system message, and the team chat's first message, name the chat)
    first, second = (json.loads(make(tag, 4)[-1])["messages"][2:] for tag in ("round 0 chat", "round 1 chat"))
    assert cell_mark("round 0 chat") != cell_mark("round 1 chat") and tokenize(cell_mark("round 0 chat")) == []
    assert len(first) == len(second) > 2
    for a, b in zip(first, second, strict=True):
        assert a["content"] != b["content"]
        assert tokenize(json.dumps(a["content"])) == tokenize(json.dumps(b["content"]))

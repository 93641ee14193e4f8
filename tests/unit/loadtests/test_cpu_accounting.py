"""The benchmarks' CPU accounting counts a server's descendants that open a session of their own (PostgreSQL's
backends do), not only the members of its process group."""

from __future__ import annotations

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

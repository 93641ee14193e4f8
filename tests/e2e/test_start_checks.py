"""Starting a server: a taken port is a clear failure at once (not a second server sharing the port's connections),
and `ready on` is printed only once /ready answers 200."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from memci_proxy.settings import Settings
from tests.e2e.proxyproc import REPO, ProxyProcess, stop_group


def run(*command: str, timeout: float = 30.0) -> tuple[int, str]:
    """(exit status, stderr) of a command that must end by itself; one that serves instead is stopped (its whole
    process group) and fails the test."""
    proc = subprocess.Popen([sys.executable, "-m", *command], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        raise AssertionError(f"{command} started instead of failing on a taken port") from None
    return proc.returncode, stderr


def test_serve_and_emulate_on_a_taken_port_fail_at_once(emulator):
    port = str(emulator.port)
    for args in (("emulate", "--port", port), ("serve", "--port", port, "--upstream", emulator.base_url)):
        status, stderr = run("memci_proxy.cli", *args)
        assert status == 1, (args, status, stderr[-2000:])
        assert f"cannot listen on 127.0.0.1:{port}" in stderr and "another process" in stderr, stderr
    assert httpx.get(emulator.url + "/health", timeout=5).status_code == 200  # the first one serves on, alone
    status, stderr = run("memci_proxy.emulator", "--port", port)
    assert status != 0 and "cannot listen" in stderr, stderr


def test_ready_on_is_printed_once_ready_answers_200(emulator):
    """The packaged embedding model loads in the background after the start: the line waits for it."""
    home = Path(tempfile.mkdtemp(prefix="memci-e2e-ready-"))
    proxy = ProxyProcess(emulator.base_url, home, {"MEMCI_EMBEDDINGS_LOCAL": Settings().embeddings_local})
    proxy.start()
    try:
        deadline = time.monotonic() + 120
        while "ready on" not in proxy.log():
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.02)
        r = httpx.get(proxy.url + "/ready", timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["checks"]["embeddings"]["state"] == "loaded"
    finally:
        proxy.stop()

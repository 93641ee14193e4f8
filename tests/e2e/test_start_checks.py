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


def serving_processes(group: int) -> list[int]:
    """The processes of a process group that run `memci_proxy.cli serve`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            in_group = int(stat.read_text().rsplit(")", 1)[1].split()[2]) == group
            serving = b"memci_proxy.cli\0serve" in (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if in_group and serving:
            found.append(int(stat.parent.name))
    return found


def test_two_server_workers_start_on_a_fresh_home_and_serve_one_conversation(emulator, client_for):
    """Both workers start the embedded PostgreSQL at once on a new home: one creates the database, the other joins
    it (the two used to race into the catalog's unique index and one worker died). Without Redis each worker keeps
    its own hot state, so the turns of one conversation that alternate between them all answer."""
    home = Path(tempfile.mkdtemp(prefix="memci-e2e-workers-"))
    proxy = ProxyProcess(emulator.base_url, home, {"MEMCI_WORKERS": "2"}).start()
    try:
        client = client_for(proxy)
        messages = [{"role": "system", "content": "You are terse."}]
        for turn in range(12):
            messages.append({"role": "user", "content": f"Question {turn}: what is next on the list?"})
            answer = client.chat.completions.create(model="memci-emulator", messages=messages, max_tokens=16)
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        assert "Unexpected exit from worker" not in proxy.log(), proxy.log()
        assert len(serving_processes(proxy.proc.pid)) == 3, proxy.log()  # the supervisor and its two workers
    finally:
        proxy.stop()

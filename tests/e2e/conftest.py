"""End-to-end fixtures: the official openai SDK -> a proxy process -> an emulator process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.proxyproc import REPO, LocalServer, ProxyProcess, free_port, wait_http


class EmulatorProcess(LocalServer):
    def __init__(self, args: list[str] | None = None, home: Path | None = None):
        self.port = free_port()
        self.args = args or []
        self.proc: subprocess.Popen | None = None

    def start(self) -> "EmulatorProcess":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memci_proxy.emulator", "--port", str(self.port), *self.args],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        wait_http(self.url + "/health", self.proc, 30)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
            self.proc = None

    def reset(self) -> None:
        httpx.post(self.url + "/emulator/reset", timeout=5).raise_for_status()

    def requests(self, n: int = 1) -> list[dict]:
        r = httpx.get(self.url + "/emulator/requests", params={"n": n}, timeout=5)
        r.raise_for_status()
        data = r.json()
        return data["data"]

    def turn_requests(self, n: int = 1) -> list[dict]:
        """The latest ``n`` requests that are not the proxy's memory jobs (a summary job queued at an epoch may reach
        the upstream after the turn that follows it)."""
        from memci_proxy.workers.prefix import is_job_body

        return [r for r in self.requests(n + 50) if not is_job_body(r.get("body"))][-n:]

    def stats(self) -> dict:
        return httpx.get(self.url + "/emulator/stats", timeout=5).json()


@pytest.fixture(scope="session")
def emulator() -> Iterator[EmulatorProcess]:
    emu = EmulatorProcess().start()
    yield emu
    emu.stop()


@dataclass
class EmulatorAndProxy:
    emulator: EmulatorProcess
    proxy: ProxyProcess


@pytest.fixture(scope="module")
def emulator_and_proxy() -> Iterator[Callable[..., EmulatorAndProxy]]:
    """Factory of the usual end-to-end setup: an emulator with a context window and a proxy in front of it, the
    proxy's home in a fresh directory; everything it started is stopped at the end of the module.

        pair = emulator_and_proxy(window=4096, env={"MEMCI_ADMIN_KEY": "k"}, emulator_args=["--per-uncached-token",
                                  "0.01"])  # window=None: the emulator's default; emulator=: reuse one
    """
    started: list[tuple[EmulatorAndProxy, bool]] = []
    homes: list[Path] = []

    def make(window: int | None = 4096, env: dict[str, str] | None = None, emulator_args: Sequence[str] = (),
             emulator: EmulatorProcess | None = None) -> EmulatorAndProxy:
        own = emulator is None
        if emulator is None:
            emulator = EmulatorProcess([*(["--max-model-len", str(window)] if window else []), *emulator_args]).start()
        # Not under pytest's tmp tree: concurrent pytest sessions prune each other's numbered directories.
        home = Path(tempfile.mkdtemp(prefix="memci-e2e-home-"))
        homes.append(home)
        try:
            proxy = ProxyProcess(emulator.base_url, home, env).start()
        except BaseException:
            if own:
                emulator.stop()
            raise
        pair = EmulatorAndProxy(emulator, proxy)
        started.append((pair, own))
        return pair

    yield make
    for pair, own in reversed(started):
        pair.proxy.stop()
        if own:
            pair.emulator.stop()
    for home in homes:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def emu(pair: EmulatorAndProxy) -> EmulatorProcess:
    """The emulator of a module's ``pair`` fixture (one ``emulator_and_proxy()`` pair per module)."""
    return pair.emulator


@pytest.fixture(scope="module")
def proxy(pair: EmulatorAndProxy) -> ProxyProcess:
    """The proxy of a module's ``pair`` fixture."""
    return pair.proxy


@pytest.fixture(scope="session")
def passthrough_proxy(emulator, tmp_path_factory) -> Iterator[ProxyProcess]:
    p = ProxyProcess(emulator.base_url, tmp_path_factory.mktemp("pt"), {"MEMCI_MANAGE_CONTEXT": "false"}).start()
    yield p
    p.stop()


@pytest.fixture
def client_for():
    clients: list[openai.OpenAI] = []

    def make(proxy: ProxyProcess, **kw) -> openai.OpenAI:
        c = openai.OpenAI(base_url=proxy.base_url, api_key=kw.pop("api_key", "sk-test"), max_retries=0, timeout=30, **kw)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()

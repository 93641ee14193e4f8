"""Servers of the cache benchmark and the load tests: a fresh emulator, a proxy in front of it, or a real server.

``Upstream`` is what the benchmark measures through: the emulator's request log (what the upstream really
received, per request, with its own cached-token count) or, for a real server, nothing (the responses'
usage is then the measurement).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from loadtests.replicas import metric_sum

REPO = Path(__file__).resolve().parents[1]
# The proxy's source tree (default: this checkout). Point it at an exported commit to benchmark that commit.
PROXY_SRC = Path(os.environ.get("MEMCI_BENCH_PROXY_SRC") or REPO)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server subprocess in its own process group, started in ``cwd`` and stopped by its id."""

    def __init__(self, name: str, cmd: list[str], health_url: str, env: dict[str, str], log_dir: Path,
                 cwd: Path = REPO) -> None:
        self.name, self.cmd, self.health_url, self.cwd = name, cmd, health_url, cwd
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("MEMCI_")}, **env}
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.health_url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def tracebacks(self) -> int:
        try:
            return self.log_path.read_text(errors="replace").count("Traceback (most recent call last)")
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass

__all__ = ["Server", "free_port", "Upstream", "emulator_upstream", "external_upstream", "proxy_server", "flush_sglang_cache",
           "empty_when_idle", "counters"]


class Upstream:
    def __init__(self, base_url: str, is_emulator: bool) -> None:
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url.removesuffix("/v1")
        self.is_emulator = is_emulator
        self.http = httpx.Client(timeout=30)

    def mark(self) -> int | None:
        """How many chat requests the emulator has answered (None for a real server)."""
        return self.totals()["requests"] if self.is_emulator else None

    def since(self, mark: int | None) -> list[dict] | None:
        """The emulator's log entries of the requests answered after ``mark`` (oldest first)."""
        if mark is None:
            return None
        count = self.totals()["requests"] - mark
        if count <= 0:
            return []
        r = self.http.get(self.root + "/emulator/requests", params={"n": count})
        r.raise_for_status()
        return [e for e in r.json()["data"] if e.get("cached_tokens") is not None]

    def totals(self) -> dict | None:
        if not self.is_emulator:
            return None
        r = self.http.get(self.root + "/emulator/stats")
        r.raise_for_status()
        return r.json()

    def close(self) -> None:
        self.http.close()


@contextlib.contextmanager
def emulator_upstream(window: int, workdir: Path, extra_args: tuple[str, ...] = ()) -> Iterator[Upstream]:
    """A fresh emulator process with context length ``window``."""
    port = free_port()
    server = Server(f"emulator-{port}", [sys.executable, "-m", "memci_proxy.emulator", "--port", str(port),
                                         "--max-model-len", str(window), *extra_args],
                    f"http://127.0.0.1:{port}/health", {"PYTHONPATH": str(PROXY_SRC)}, workdir, cwd=PROXY_SRC)
    server.start(timeout=60)
    upstream = Upstream(f"http://127.0.0.1:{port}/v1", is_emulator=True)
    try:
        yield upstream
    finally:
        upstream.close()
        server.stop()


def flush_sglang_cache(root: str) -> bool:
    """Empty SGLang's radix cache (``POST /flush_cache``; older releases answer GET). True when it said 200."""
    for method in ("POST", "GET"):
        try:
            if httpx.request(method, root + "/flush_cache", timeout=30).status_code == 200:
                return True
        except httpx.HTTPError:
            return False
    return False


def empty_when_idle(root: str, patience_s: float = 120.0) -> bool:
    """Empty SGLang's radix cache once it is idle: it refuses ``/flush_cache`` while requests run (a previous target's
    memory jobs, a peer's background calls), so ask again each second until it answers 200 or ``patience_s`` ran
    out."""
    deadline = time.monotonic() + patience_s
    while not flush_sglang_cache(root):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def counters(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The sums of some counters (every label set) in a /metrics text; missing ones are 0."""
    text = httpx.get(url, timeout=30).text
    return {name: metric_sum([text], name) for name in names}


@contextlib.contextmanager
def external_upstream(base_url: str) -> Iterator[Upstream]:
    """A real server (SGLang): its prefix cache is flushed first, so each strategy starts cold."""
    upstream = Upstream(base_url, is_emulator=False)
    if not flush_sglang_cache(upstream.root):
        print(f"warning: {upstream.root}/flush_cache did not answer 200; the cache is not empty", file=sys.stderr)
    try:
        yield upstream
    finally:
        upstream.close()


@contextlib.contextmanager
def proxy_server(upstream_base_url: str, home: Path, env: dict[str, str] | None = None,
                 src: Path | None = None) -> Iterator[str]:
    """A ``memci-proxy serve`` process (embedded PostgreSQL under ``home``), run from the source tree ``src``
    (default ``PROXY_SRC``); yields its /v1 base URL."""
    src = src or PROXY_SRC
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    server = Server(f"proxy-{port}", [sys.executable, "-m", "memci_proxy.cli", "serve", "--host", "127.0.0.1", "--port",
                                      str(port), "--upstream", upstream_base_url],
                    f"http://127.0.0.1:{port}/health",
                    {"MEMCI_HOME": str(home), "MEMCI_CONFIG": "", "MEMCI_LOG_LEVEL": "warning", "DATABASE_URL": "",
                     "REDIS_URL": "", "PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1", **(env or {})}, home,
                    cwd=src)
    server.start(timeout=120)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()
        if server.tracebacks():
            print(f"warning: the proxy logged tracebacks; see {server.log_path}", file=sys.stderr)

"""Run the proxy as a real process (the public interface), for end-to-end tests."""

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

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Stop a process started in its own session, and its children (SIGKILL after 15 s)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


class LocalServer:
    """An OpenAI-compatible server run as a local process on a free port."""

    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


class LoggedServer(LocalServer):
    """A server run as a process in its own session, its output (stdout and stderr) appended to `log_path`."""

    log_path: Path

    def spawn(self, command: list[str], ready_url: str, timeout: float, what: str, **popen: object) -> None:
        """Start `command` and wait until `ready_url` answers 200; stopped, with its log's end raised, if not."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     **popen)  # type: ignore[call-overload]
        try:
            wait_http(ready_url, self.proc, timeout)
        except Exception:
            self.stop()
            raise RuntimeError(f"{what} did not start:\n{self.log()[-3000:]}") from None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            stop_group(self.proc, sig)
            self.proc = None


class ProxyProcess(LoggedServer):
    def __init__(self, upstream_url: str, home: Path, env: dict[str, str] | None = None, port: int | None = None):
        self.port = port or free_port()
        self.upstream_url = upstream_url
        self.home = home
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None
        self.log_path = home / f"proxy-{self.port}.log"

    def start(self, timeout: float = 180.0) -> "ProxyProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCI_")}
        # Background summary jobs call the upstream too; tests that read the upstream's last request turn them on
        # only when they test them. The packaged embedding model costs each process seconds of CPU to load: the
        # tests of search (and of the defaults as a whole: the README's and the wheel's) turn it on.
        env.update({"MEMCI_HOME": str(self.home), "MEMCI_CONFIG": "", "PYTHONUNBUFFERED": "1",
                    "MEMCI_MEMORY_WORKERS": "false", "MEMCI_EMBEDDINGS_LOCAL": "off"})
        env.update(self.extra_env)
        self.home.mkdir(parents=True, exist_ok=True)
        self.spawn([sys.executable, "-m", "memci_proxy.cli", "serve", "--port", str(self.port), "--upstream",
                    self.upstream_url], self.url + "/health", timeout, "proxy", cwd=REPO, env=env)
        return self

    def log(self) -> str:
        return super().log()[-5000:]

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


@contextlib.contextmanager
def running_proxy(upstream_url: str, home: Path, env: dict[str, str] | None = None) -> Iterator[ProxyProcess]:
    p = ProxyProcess(upstream_url, home, env).start()
    try:
        yield p
    finally:
        p.stop()

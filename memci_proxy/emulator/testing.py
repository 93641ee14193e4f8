"""Helpers for tests: run the emulator in a subprocess on a free port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from memci_proxy.emulator.config import EmulatorConfig

_REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def command_line(config: EmulatorConfig) -> list[str]:
    return [
        sys.executable,
        "-m",
        "memci_proxy.emulator",
        "--host", config.host,
        "--port", str(config.port),
        "--model", config.model,
        "--max-model-len", str(config.max_model_len),
        "--cache-tokens", str(config.cache_capacity_tokens),
        "--per-uncached-token", repr(config.per_uncached_token_s),
        "--per-cached-token", repr(config.per_cached_token_s),
        "--per-output-token", repr(config.per_output_token_s),
        "--embedding-dim", str(config.embedding_dim),
        "--answer-tokens", str(config.default_answer_tokens),
        *([] if config.strict_context else ["--lenient-context"]),
        *[arg for shape in config.refuse for arg in ("--refuse", shape)],
    ]  # fmt: skip


def wait_until_healthy(root_url: str, process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the emulator exited with code {process.returncode} before answering /health")
        try:
            with urllib.request.urlopen(root_url + "/health", timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the emulator did not answer {root_url}/health within {timeout_s} s")
        time.sleep(0.05)


@contextlib.contextmanager
def running_emulator(
    config: EmulatorConfig | None = None, port: int = 0, startup_timeout_s: float = 20.0
) -> Iterator[str]:
    """Start ``python -m memci_proxy.emulator`` on a free port (or ``port``); yield ``http://HOST:PORT/v1``.

    The subprocess has its own interpreter and event loop. It is stopped (SIGTERM, then SIGKILL) on exit.
    """
    config = config or EmulatorConfig()
    chosen_port = port or free_port(config.host)
    config = replace(config, port=chosen_port)
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), environment.get("PYTHONPATH", "")]))
    log_file = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks on it
    process = subprocess.Popen(
        command_line(config),
        cwd=str(_REPO_ROOT),
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    root_url = f"http://{config.host}:{chosen_port}"
    try:
        try:
            wait_until_healthy(root_url, process, startup_timeout_s)
        except (RuntimeError, TimeoutError) as error:
            process.kill()
            process.wait(timeout=5)
            log_file.seek(0)
            output = log_file.read().decode(errors="replace")[-4000:]
            raise RuntimeError(f"{error}\n{output}") from None
        yield root_url + "/v1"
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        log_file.close()

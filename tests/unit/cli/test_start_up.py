"""Start-up's own logic: the libraries' chatter only at debug, the `ready on` URL, the start warning about the
upstream (the CLI's whole output in a fresh home is checked in tests/e2e/test_operations.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from memci_proxy.app import listening_url, warn_about_the_upstream
from memci_proxy.log_setup import CHATTY, configure_logging
from memci_proxy.upstream.route_check import judge, unreachable

REPO = Path(__file__).resolve().parents[3]


def test_initdb_and_migration_loggers_speak_only_at_debug() -> None:
    try:
        configure_logging("info")
        assert all(not logging.getLogger(name).isEnabledFor(logging.INFO) for name in CHATTY)
        assert logging.getLogger("pgserver").isEnabledFor(logging.WARNING)
        assert logging.getLogger("memci").isEnabledFor(logging.INFO)
        configure_logging("debug")
        assert all(logging.getLogger(name).isEnabledFor(logging.DEBUG) for name in CHATTY)
    finally:
        configure_logging("warning")


def test_the_xdg_warning_is_filtered_for_every_command() -> None:
    """platformdirs' warning, as it is raised, is silenced by importing the package (what every command does), and
    no other warning is."""
    code = ("import warnings, memci_proxy; "
            "warnings.warn('XDG_RUNTIME_DIR is not set, falling back to /tmp/runtime-0', RuntimeWarning); "
            "warnings.warn('another warning', RuntimeWarning)")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "XDG_RUNTIME_DIR" not in run.stderr and "another warning" in run.stderr


def test_the_ready_url() -> None:
    assert listening_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"
    assert listening_url("0.0.0.0", 8080) == "http://127.0.0.1:8080 (listening on all interfaces)"
    assert listening_url("::1", 8080) == "http://[::1]:8080"


async def test_the_start_warns_once_per_upstream_worker_that_does_not_serve_chat(caplog) -> None:
    class Watch:
        async def verdicts(self):
            return [judge("http://a/v1", 400), judge("http://b:8000", 404), unreachable("http://c/v1", "refused")]

    caplog.set_level(logging.WARNING, logger="memci")
    await warn_about_the_upstream(Watch())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2
    assert "did you mean http://b:8000/v1?" in lines[0] and "unreachable: refused" in lines[1]


def test_version_is_the_installed_packages() -> None:
    from importlib.metadata import version

    run = subprocess.run([sys.executable, "-m", "memci_proxy.cli", "--version"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"memci-proxy {version('memci-proxy')}"

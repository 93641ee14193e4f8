"""A fresh install of the project, offline and quick, for the tests that install it as a user does
(test_wheel.py, test_readme.py).

The source is copied without tests, virtualenvs or build output. A new virtualenv reaches the dependencies
through a .pth line naming this interpreter's site-packages: pip then finds them installed and builds only the
project itself (no index, no build isolation: setuptools and wheel are test extras). A .pth line adds a
directory to sys.path without running the .pth files inside it, so this checkout's editable install stays out
of reach of the new environment's console scripts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import site
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.e2e.proxyproc import REPO, wait_http

SOURCE_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                       ".pytest_cache", ".hypothesis", ".memci", "tests", "loadtests")
# pip without an index and without build isolation (PIP_NO_BUILD_ISOLATION=0 turns isolation off: pip reads
# the variable as the negation of the flag).
OFFLINE_PIP = {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def copy_source(dest: Path) -> Path:
    shutil.copytree(REPO, dest, ignore=SOURCE_IGNORE)
    return dest


def base_python() -> str:
    """The interpreter this test venv was made from (its python3 has the same version and ABI)."""
    return getattr(sys, "_base_executable", sys.executable)


def purelib(env_dir: Path) -> Path:
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def link_dependencies(env_dir: Path) -> None:
    (purelib(env_dir) / "memci_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")


def new_venv(env_dir: Path, with_pip: bool = False) -> Path:
    """A virtualenv that sees this one's dependencies (but not its `memci_proxy`)."""
    subprocess.run([base_python(), "-m", "venv", *([] if with_pip else ["--without-pip"]), str(env_dir)], check=True)
    link_dependencies(env_dir)
    return env_dir


def python3_on_path(bin_dir: Path) -> Path:
    """A directory holding `python3` = the base interpreter, to put first on PATH for commands that say python3."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "python3"
    if not link.exists():
        link.symlink_to(base_python())
    return bin_dir



@contextlib.contextmanager
def running(argv: Sequence[str], cwd: Path, env: dict[str, str], log: Path, health: Sequence[str],
            timeout: float = 180) -> Iterator[None]:
    """Run argv in its own process group until the block ends; first wait until every health URL answers 200."""
    with log.open("ab") as out:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        try:
            for url in health:
                wait_http(url, proc, timeout)
        except Exception:
            raise AssertionError(f"{argv} did not start:\n{log.read_text(errors='replace')[-4000:]}") from None
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

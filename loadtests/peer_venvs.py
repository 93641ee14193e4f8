"""The peers' own virtualenvs for ``peers.py``: each peer proxy (LiteLLM, Headroom) installed from PyPI at a pinned
version into a virtualenv of its own under a cache directory, created on first use and reused after; never in the
project's environment, never a project dependency.

A peer that cannot be installed is reported with the reason (the end of pip's output), so the benchmark skips it
instead of failing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memci-peers"
INSTALL_TIMEOUT_S = 1800


@dataclass(frozen=True)
class PeerPackage:
    name: str  # the peer's name in the benchmark (and its virtualenv's: <name>-venv)
    requirement: str  # what pip installs, pinned
    distribution: str  # whose version is read back
    executable: str  # the console script that serves the proxy


PEERS = {
    "litellm": PeerPackage("litellm", "litellm[proxy]==1.98.1", "litellm", "litellm"),
    "headroom": PeerPackage("headroom", "headroom-ai[proxy]==0.42.0", "headroom-ai", "headroom"),
}


@dataclass
class PeerInstall:
    package: PeerPackage
    venv: Path
    executable: Path | None = None  # None: not usable (see reason)
    version: str = ""
    reason: str = ""


def installed_version(venv: Path, distribution: str) -> str:
    """The distribution's version inside the virtualenv, '' when it is not installed there."""
    python = venv / "bin" / "python"
    if not python.exists():
        return ""
    out = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() if out.returncode == 0 else ""


def pinned_version(requirement: str) -> str:
    return requirement.split("==", 1)[1] if "==" in requirement else ""


def ensure_peer(package: PeerPackage, cache_dir: Path, install: bool = True, log=None) -> PeerInstall:
    """The peer's virtualenv at ``cache_dir/<name>-venv`` with the pinned version in it: reused when present,
    otherwise created and installed (unless ``install`` is False). Never raises for a failed install."""
    log = log or (lambda message: print(message, file=sys.stderr))
    venv = cache_dir / f"{package.name}-venv"
    result = PeerInstall(package, venv)
    want = pinned_version(package.requirement)
    have = installed_version(venv, package.distribution)
    if have and (not want or have == want) and (venv / "bin" / package.executable).exists():
        result.executable, result.version = venv / "bin" / package.executable, have
        return result
    if not install:
        result.reason = f"not installed in {venv} (and --no-install given)"
        return result
    log(f"installing {package.requirement} into {venv} (once; reused after)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        if not (venv / "bin" / "python").exists():
            _run([sys.executable, "-m", "venv", str(venv)], 300)
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              package.requirement], INSTALL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        result.reason = f"install of {package.requirement} failed: {exc}"
        return result
    have = installed_version(venv, package.distribution)
    if not have or not (venv / "bin" / package.executable).exists():
        result.reason = f"{package.requirement} installed but {package.executable} or its version is missing in {venv}"
        return result
    result.executable, result.version = venv / "bin" / package.executable, have
    return result


def _run(cmd: list[str], timeout: float) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        lines = [line for line in (out.stderr + out.stdout).splitlines()
                 if line.strip() and "is ignored: it is neither a file nor a directory" not in line]
        raise RuntimeError(f"exit {out.returncode}: " + " | ".join(lines[-3:]))

"""scripts/prebuild-engines.sh starts a real engine's build in the background under a lock; a test that needs the
engine (tests/e2e/real_engine.py, build) waits for that build instead of starting a second one beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.real_engine import build, build_lock

REPO = Path(__file__).resolve().parents[2]
PREBUILD = REPO / "scripts" / "prebuild-engines.sh"

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")


def fake_engine(directory: Path) -> Path:
    """A build script that logs its start and end around a second of work, then prints its directory last."""
    script = directory / "fake-engine.sh"
    log = directory / "builds.log"
    script.write_text(f'echo start >> "{log}"\nsleep 1\necho end >> "{log}"\necho building >&2\necho "{directory}"\n')
    return script


def prebuild(tmp_path: Path, script: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(PREBUILD)], capture_output=True, text=True, timeout=30,
        env={**os.environ, "TMPDIR": str(tmp_path), "MEMCI_REAL_LLM_SCRIPT": str(script),
             "MEMCI_REAL_SGLANG_SCRIPT": str(tmp_path / "absent.sh"), **env},
    )


def test_a_test_waits_for_the_build_started_in_the_background(tmp_path, monkeypatch):
    script = fake_engine(tmp_path)
    started = time.monotonic()
    done = prebuild(tmp_path, script)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 1.0, "the script returns at once; the build goes on in the background"
    assert "building llm in the background" in done.stdout
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    deadline = time.monotonic() + 5
    while not (tmp_path / "builds.log").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # the background build has taken its lock
    assert build(script) == tmp_path
    # the test's own run of the script came after the background build had ended, not beside it
    assert (tmp_path / "builds.log").read_text().split() == ["start", "end", "start", "end"]
    assert build_lock(script).parent == tmp_path
    assert "building" in (tmp_path / "memci-build-llm.log").read_text()


def test_prebuild_can_be_turned_off_and_skips_absent_scripts(tmp_path):
    script = fake_engine(tmp_path)
    done = prebuild(tmp_path, script, MEMCI_PREBUILD_ENGINES="0")
    assert done.returncode == 0 and done.stdout == ""
    done = prebuild(tmp_path, tmp_path / "not-there.sh")
    assert done.returncode == 0 and "llm" not in done.stdout and "sglang" not in done.stdout
    time.sleep(0.2)
    assert not (tmp_path / "builds.log").exists()

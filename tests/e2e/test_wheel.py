"""`pip install .` without -e gives a working proxy: the wheel is built from a copy of the repository, installed in
a fresh virtualenv, and its own `memci-proxy` migrates the embedded database, serves, and answers the openai SDK
through the emulator, from a directory with no checkout in sight.

Offline and quick: the wheel is built with --no-build-isolation (setuptools and wheel are test extras) and installed
with --no-deps into a virtualenv that reaches the dependencies through a .pth line (tests/e2e/fresh_install.py);
the test checks that `memci_proxy` is the wheel's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.fresh_install import copy_source, new_venv, running
from tests.e2e.proxyproc import free_port

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """A fresh virtualenv with the built wheel installed; yields its directory."""
    work = Path(tempfile.mkdtemp(prefix="memci-wheel-"))
    try:
        source = copy_source(work / "src")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(work / "dist"), str(source)], check=True, cwd=work)
        wheels = list((work / "dist").glob("memci_proxy-*.whl"))
        assert len(wheels) == 1, wheels
        shutil.rmtree(source)  # nothing of the checkout is left next to the install
        env_dir = new_venv(work / "venv")
        subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", str(wheels[0])], check=True, cwd=work)
        yield env_dir
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(env_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    result = subprocess.run([str(env_dir / "bin" / "memci-proxy"), *args], cwd=env_dir, env=env, timeout=timeout,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCI_") and k not in ("PYTHONPATH",
                                                                                           "DATABASE_URL", "REDIS_URL")}
    env.update({"MEMCI_HOME": str(home), "PYTHONUNBUFFERED": "1", "MEMCI_MEMORY_WORKERS": "false"})
    return env


def started(env_dir: Path, args: list[str], health: str, env: dict[str, str], log: Path):
    return running([str(env_dir / "bin" / "memci-proxy"), *args], env_dir, env, log, [health])


def test_the_installed_package_is_the_wheel_with_its_data(installed: Path) -> None:
    python = installed / "bin" / "python"
    code = ("import memci_proxy, memci_proxy.package_data as p, memci_proxy.settings as s, memci_proxy.store.sql.migrate as m;"
            "print(memci_proxy.__file__); print(p.is_checkout()); print(s.DEFAULT_CONFIG_FILE); print(m.MIGRATIONS_DIR)")
    out = subprocess.run([str(python), "-c", code], cwd=installed, capture_output=True, text=True, check=True,
                         env=clean_env(installed / "home")).stdout.split("\n")
    module, checkout, config, migrations = out[:4]
    assert module.startswith(str(installed)), module
    assert checkout == "False"
    assert config.startswith(str(installed)) and Path(config).is_file()
    assert migrations.startswith(str(installed)) and (Path(migrations) / "env.py").is_file()
    assert len(list((Path(migrations) / "versions").glob("*.py"))) >= 6


def test_the_wheel_migrates_serves_and_answers_the_sdk(installed: Path) -> None:
    home = installed / "home"
    env = clean_env(home)
    migrated = run(installed, "migrate", env=env, timeout=180)
    assert "migrated embedded database" in migrated and "to head" in migrated

    emulator_port, proxy_port = free_port(), free_port()
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    with started(installed, ["emulate", "--port", str(emulator_port), "--max-model-len", "4096"],
                 emulator_url + "/health", env, installed / "emulator.log"):
        serve_env = {**env, "MEMCI_ADMIN_KEY": "admin-secret"}
        with started(installed, ["serve", "--port", str(proxy_port), "--upstream", emulator_url + "/v1"],
                     f"http://127.0.0.1:{proxy_port}/health", serve_env, installed / "proxy.log"):
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="sk-test", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model="emulated", messages=[{"role": "user", "content": "Hello from the wheel"}])
            reply = raw.parse()
            assert reply.choices[0].message.content
            conversation = raw.headers["x-memci-conversation-id"]
            view = httpx.get(f"http://127.0.0.1:{proxy_port}/memci/conversations/{conversation}/prompt",
                             headers={"Authorization": "Bearer admin-secret"}, timeout=10)
            assert view.status_code == 200, view.text
            assert view.json()["messages"][-1]["content"].startswith("Hello from the wheel")
            # the turn is stored in the database the wheel's migrations made (written behind the answer)
            deadline = time.monotonic() + 20
            while True:
                stored = httpx.get(f"http://127.0.0.1:{proxy_port}/memci/conversations/{conversation}",
                                   headers={"Authorization": "Bearer sk-test"}, timeout=10)
                if stored.status_code == 200 and stored.json()["messages"] or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert stored.status_code == 200, stored.text
            assert stored.json()["messages"][0]["message"]["content"] == "Hello from the wheel"

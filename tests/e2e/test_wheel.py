"""`pip install .` without -e gives a working proxy: the wheel is built from a copy of the repository, installed in
a fresh virtualenv, and its own `memci-proxy` migrates the embedded database, serves, and answers the openai SDK
through the emulator, from a directory with no checkout in sight.

Offline and quick: the wheel is built with --no-build-isolation (setuptools and wheel are test extras) and installed
with --no-deps; the new virtualenv reaches the dependencies through a .pth line naming this interpreter's
site-packages (a .pth line adds a directory to sys.path without running the .pth files inside it, so this
checkout's editable install stays out of reach; the test checks that `proxy` is the wheel's).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.proxyproc import REPO, free_port, wait_http

pytestmark = pytest.mark.slow

SOURCE_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                       ".pytest_cache", ".hypothesis", ".memci", "tests", "loadtests", "docs")


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """A fresh virtualenv with the built wheel installed; yields its directory."""
    work = Path(tempfile.mkdtemp(prefix="memci-wheel-"))
    try:
        source = work / "src"
        shutil.copytree(REPO, source, ignore=SOURCE_IGNORE)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(work / "dist"), str(source)], check=True, cwd=work)
        wheels = list((work / "dist").glob("memci_proxy-*.whl"))
        assert len(wheels) == 1, wheels
        shutil.rmtree(source)  # nothing of the checkout is left next to the install
        env_dir = work / "venv"
        venv.create(env_dir, with_pip=False)
        python = env_dir / "bin" / "python"
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--no-index", str(wheels[0])], check=True, cwd=work)
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        (Path(purelib) / "memci_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
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


@contextlib.contextmanager
def started(env_dir: Path, args: list[str], health: str, env: dict[str, str], log: Path) -> Iterator[None]:
    with log.open("ab") as out:
        proc = subprocess.Popen([str(env_dir / "bin" / "memci-proxy"), *args], cwd=env_dir, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_http(health, proc, 180)
        except Exception:
            raise AssertionError(f"{args[0]} did not start:\n{log.read_text(errors='replace')[-4000:]}") from None
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def test_the_installed_package_is_the_wheel_with_its_data(installed: Path) -> None:
    python = installed / "bin" / "python"
    code = ("import proxy, proxy.package_data as p, proxy.settings as s, proxy.store.sql.migrate as m;"
            "print(proxy.__file__); print(p.is_checkout()); print(s.DEFAULT_CONFIG_FILE); print(m.MIGRATIONS_DIR)")
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

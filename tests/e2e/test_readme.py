"""The README's own steps, run from its code blocks in the README's order as a new user runs them, from a fresh copy
of the repository: install, the emulator and the proxy in front of it, doctor, the SDK snippet's first answer, and
inspect's view of what the proxy sent upstream; no step fails and none needs undoing (nothing is started against an
upstream that does not exist yet). Only the ports are substituted (and the conversation id that the snippet prints, where the README
says to paste it); pip runs offline (tests/e2e/fresh_install.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from tests.e2e.fresh_install import OFFLINE_PIP, copy_source, new_venv, python3_on_path, running
from tests.e2e.proxyproc import REPO, free_port

BLOCK = re.compile(r"<!-- readme-test: (?P<name>[\w-]+) -->\s*```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)
STEPS = ["install", "emulator-and-serve", "doctor", "sdk", "inspect"]
SH_BLOCK = re.compile(r"```sh\n(?P<code>.*?)```", re.S)
# Commands that need an upstream (or a proxy in front of one) to be running.
NEEDS_UPSTREAM = re.compile(r"memci-proxy (?:serve|doctor|inspect)\b|OpenAI\(base_url=")


def readme_blocks() -> dict[str, tuple[str, str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return {m["name"]: (m["lang"], m["code"]) for m in BLOCK.finditer(text)}


def test_the_readme_marks_every_step_it_runs() -> None:
    blocks = readme_blocks()
    assert list(blocks) == STEPS, "the README's tested blocks, in the order a new user runs them"
    assert {lang for lang, _ in blocks.values()} == {"sh", "python"}
    assert "pip install ." in blocks["install"][1] and "-e ." not in blocks["install"][1]


def test_the_quick_start_starts_the_emulator_before_anything_needs_an_upstream() -> None:
    """From the README's first line on, no command needs an upstream before the emulator's block starts one, and
    that block starts the emulator before the proxy; installing starts nothing."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    emulator = text.index("memci-proxy emulate")
    first_need = NEEDS_UPSTREAM.search(text)
    assert first_need is not None and first_need.start() > emulator, text[: first_need.start()][-300:]
    lines = readme_blocks()["emulator-and-serve"][1].strip().splitlines()
    assert "memci-proxy emulate" in lines[0] and lines[0].rstrip().endswith("&")
    assert "memci-proxy serve --upstream http://127.0.0.1:30000/v1" in lines[-1]
    assert not re.search(r"memci-proxy (?:serve|emulate)", readme_blocks()["install"][1])
    first_sh = SH_BLOCK.search(text)
    assert first_sh is not None and first_sh["code"] == readme_blocks()["install"][1]


AGENT_SETUP = re.compile(r"<!-- agent-setup: (?P<name>[\w-]+) -->\s*```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)


def test_the_agent_setups_name_the_settings_that_matter() -> None:
    """Claude Code and Codex are not installed here: their setups are checked as written (the TOML parses, the
    shell exports the settings), and the request shape they produce runs end to end in tests/e2e/test_answer_room.py
    (a Claude-Code-shaped agent asking max_tokens 32000 on a 32k window) and test_responses_api.py."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    setups = {m["name"]: (m["lang"], m["code"]) for m in AGENT_SETUP.finditer(text)}
    assert list(setups) == ["claude-code", "codex"]
    lang, code = setups["claude-code"]
    exported = dict(re.findall(r"\b([A-Z_]+)=(\S+)", code))
    assert lang == "sh" and exported["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8080"
    assert exported["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert int(exported["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) <= 32768 // 4  # a quarter of the default window
    lang, code = setups["codex"]
    config = tomllib.loads(code)
    provider = config["model_providers"][config["model_provider"]]
    assert lang == "toml" and provider["base_url"] == "http://127.0.0.1:8080/v1" and provider["wire_api"] == "responses"
    assert config["model_context_window"] >= 1_000_000


@pytest.mark.slow
def test_the_readme_steps_work_from_a_fresh_clone() -> None:
    work = Path(tempfile.mkdtemp(prefix="memci-readme-"))
    try:
        run_the_readme(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_the_readme(work: Path) -> None:
    clone = copy_source(work / "clone")
    new_venv(clone / ".venv", with_pip=True)  # the README's `python3 -m venv .venv` then finds it in place
    emulator_port, proxy_port = free_port(), free_port()
    blocks = {name: code.replace("30000", str(emulator_port)).replace("8080", str(proxy_port))
              for name, (_, code) in readme_blocks().items()}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MEMCI_", "PIP_")) and k not in ("DATABASE_URL", "REDIS_URL", "VIRTUAL_ENV", "PYTHONPATH")}
    env.update(OFFLINE_PIP)
    env.update({"PATH": f"{python3_on_path(work / 'bin')}:{env.get('PATH', '')}", "MEMCI_HOME": str(work / "home"),
                "MEMCI_PORT": str(proxy_port)})  # the proxy's default port, 8080, may be taken on this machine
    proxy_url, emulator_url = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{emulator_port}"

    def sh(name: str, extra: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", blocks[name]], cwd=clone, env={**env, **(extra or {})},
                              capture_output=True, text=True, timeout=timeout)

    # 1. install: nothing is started
    install = sh("install", timeout=600)
    assert install.returncode == 0, (install.stdout + install.stderr)[-3000:]
    assert (clone / ".venv" / "bin" / "memci-proxy").exists()

    # 2. the emulator and the proxy with an admin key
    with running(["bash", "-c", blocks["emulator-and-serve"]], clone, env, work / "serve.log",
                 [emulator_url + "/health", proxy_url + "/health"]):
        # 3. doctor
        doctor = sh("doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "reports cached_tokens" in doctor.stdout and "doctor: all checks passed" in doctor.stdout
        assert "admin API on" in doctor.stdout  # the key the serve above it set
        deadline = time.monotonic() + 120  # `ready on` waits for the packaged embedding model to load
        while f"ready on {proxy_url}" not in (serve_log := (work / "serve.log").read_text(errors="replace")):
            assert time.monotonic() < deadline, serve_log[-3000:]
            time.sleep(0.2)
        assert "XDG_RUNTIME_DIR" not in serve_log

        # 4. the SDK snippet: the first answer, and the conversation id it prints
        snippet = work / "snippet.py"
        snippet.write_text(blocks["sdk"], encoding="utf-8")
        sdk = subprocess.run([str(clone / ".venv" / "bin" / "python"), str(snippet)], cwd=clone, env=env,
                             capture_output=True, text=True, timeout=60)
        assert sdk.returncode == 0, sdk.stderr
        lines = sdk.stdout.strip().splitlines()
        assert len(lines) >= 2 and lines[0].strip(), sdk.stdout
        assert lines[-1].startswith("conversation: ")
        conversation = lines[-1].removeprefix("conversation: ").strip()

        # 5. what the proxy sent upstream
        assert "CONVERSATION=..." in blocks["inspect"]
        blocks["inspect"] = blocks["inspect"].replace("CONVERSATION=...", f"CONVERSATION={conversation}")
        inspect = sh("inspect")
        assert inspect.returncode == 0, inspect.stderr
        assert f"conversation {conversation}" in inspect.stdout
        assert "[0] system  B1" in inspect.stdout and "You are helpful." in inspect.stdout
        assert "Hello! What can you do?" in inspect.stdout

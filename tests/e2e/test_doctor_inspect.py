"""`memci-proxy doctor` and `memci-proxy inspect`, run as a user runs them: processes against the emulator and a
running proxy (the official openai SDK makes the conversation inspect prints)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.proxyproc import REPO, free_port

ADMIN = "admin-secret"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMCI_") and k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run([sys.executable, "-m", "memci_proxy.cli", *args], cwd=REPO, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(window=4096, env={"MEMCI_ADMIN_KEY": ADMIN})


def test_doctor_passes_and_explains_against_the_emulator(pair, tmp_path) -> None:
    result = cli("doctor", "--upstream", pair.emulator.base_url, env={"MEMCI_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "max_model_len 4096" in out
    assert "reports cached_tokens" in out
    assert "engine the memci-proxy emulator, a radix prefix cache" in out
    assert "counts tokens at /tokenize" in out
    assert "context window 4,096 tokens (the upstream's max_model_len)" in out
    assert "prompt budget" in out and "compaction epoch when the prompt passes" in out
    assert out.rstrip().endswith("doctor: all checks passed")


def test_doctor_checks_the_embedded_database_a_running_proxy_shares(pair, client_for) -> None:
    result = cli("doctor", "--upstream", pair.emulator.base_url, env={"MEMCI_HOME": str(pair.proxy.home)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"database embedded PostgreSQL under {pair.proxy.home / 'pg'}: reachable, schema at" in result.stdout
    # doctor released its handle only: the server the proxy shares still runs, and the proxy still answers
    client = client_for(pair.proxy)
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "still there?"}])
    assert answer.choices[0].message.content


def test_doctor_checks_an_external_database_and_redis(pair, migrated_db_url, redis_url, tmp_path) -> None:
    env = {"MEMCI_HOME": str(tmp_path), "DATABASE_URL": migrated_db_url, "REDIS_URL": redis_url}
    result = cli("doctor", "--upstream", pair.emulator.base_url, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reachable, schema at" in result.stdout
    assert "replicas share hot state" in result.stdout


@pytest.mark.parametrize("broken", ["upstream", "database", "redis"])
def test_doctor_fails_with_a_non_zero_status(pair, tmp_path, broken) -> None:
    dead = f"127.0.0.1:{free_port()}"
    upstream = f"http://{dead}/v1" if broken == "upstream" else pair.emulator.base_url
    env = {"MEMCI_HOME": str(tmp_path)}
    if broken == "database":
        env["DATABASE_URL"] = f"postgresql://memci:memci@{dead}/memci"
    if broken == "redis":
        env["REDIS_URL"] = f"redis://{dead}/0"
    result = cli("doctor", "--upstream", upstream, env=env)
    assert result.returncode == 1, result.stdout
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].split()[1].startswith(broken), result.stdout
    assert result.stdout.rstrip().endswith("doctor: FAILED")


def test_inspect_prints_the_last_prompt_with_its_blocks(pair, client_for) -> None:
    client = client_for(pair.proxy)
    messages = [{"role": "system", "content": "You are terse."}]
    conversation = None
    for turn in range(3):
        messages.append({"role": "user", "content": f"question number {turn}"})
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages)
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        conversation = raw.headers["x-memci-conversation-id"]

    plain = cli("inspect", conversation, "--url", pair.proxy.url, "--admin-key", ADMIN, "--no-color")
    assert plain.returncode == 0, plain.stderr
    assert "\x1b[" not in plain.stdout
    assert f"conversation {conversation}" in plain.stdout
    assert "[0] system  B1" in plain.stdout and "You are terse." in plain.stdout
    assert "question number 2" in plain.stdout and "B6" in plain.stdout

    coloured = cli("inspect", conversation, "--url", pair.proxy.url, "--color", env={"MEMCI_ADMIN_KEY": ADMIN})
    assert coloured.returncode == 0, coloured.stderr
    assert "\x1b[34mYou are terse." in coloured.stdout  # B1 in blue

    wrong_key = cli("inspect", conversation, "--url", pair.proxy.url, "--admin-key", "nope")
    assert wrong_key.returncode == 1 and "401" in wrong_key.stderr
    unknown = cli("inspect", "no-such-conversation", "--url", pair.proxy.url, "--admin-key", ADMIN)
    assert unknown.returncode == 1 and "404" in unknown.stderr
    no_key = cli("inspect", conversation, "--url", pair.proxy.url)
    assert no_key.returncode == 2 and "admin key" in no_key.stderr

"""What an operator sees, against real processes (the proxy's CLI, the emulator upstream, the official openai SDK):
`/ready` and `doctor` agree on the route chat uses; every upstream failure is a WARNING line and a count; start-up
says `ready on ...` and warns about the upstream, without initdb, migration or XDG noise; the page counts of the
headers, `inspect` and the conversations API agree."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.proxyproc import REPO, ProxyProcess, free_port, wait_http

ADMIN = "admin-secret"
SECRET = "zanzibar-7731"  # a word of message content that no log line may hold


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MEMCI_") and k not in ("DATABASE_URL", "REDIS_URL", "XDG_RUNTIME_DIR")}
    return subprocess.run([sys.executable, "-m", "memci_proxy.cli", *args], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=timeout)


def metric(proxy: ProxyProcess, name: str, **labels: str) -> float:
    text = httpx.get(proxy.url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def homes():
    made: list[Path] = []

    def make() -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="memci-e2e-ops-")))
        return made[-1]

    yield make
    for home in made:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    # Contents entries evicted two rounds after their archive: a short chat has pages in every state.
    return emulator_and_proxy(window=4096, env={"MEMCI_ADMIN_KEY": ADMIN, "MEMCI_EVICT_AFTER_ROUNDS_UNRECALLED": "2"})


def started(upstream: str, home: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> ProxyProcess:
    """The CLI's `serve` in a fresh home, XDG_RUNTIME_DIR unset, its whole output in proxy.log_path."""
    proxy = ProxyProcess(upstream, home, {"MEMCI_ADMIN_KEY": ADMIN, **(env or {})})
    os.environ.pop("XDG_RUNTIME_DIR", None)  # ProxyProcess copies this process's environment
    if args:  # extra serve flags: run the command line itself
        proxy.home.mkdir(parents=True, exist_ok=True)
        env_all = {k: v for k, v in os.environ.items() if not k.startswith("MEMCI_")}
        env_all.update({"MEMCI_HOME": str(home), "MEMCI_CONFIG": "", "PYTHONUNBUFFERED": "1",
                        "MEMCI_MEMORY_WORKERS": "false", "MEMCI_EMBEDDINGS_LOCAL": "off", **proxy.extra_env})
        with proxy.log_path.open("ab") as log:
            proxy.proc = subprocess.Popen(
                [sys.executable, "-m", "memci_proxy.cli", "serve", "--port", str(proxy.port), "--upstream", upstream, *args],
                cwd=REPO, env=env_all, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(proxy.url + "/health", proxy.proc, 180)
        return proxy
    return proxy.start()


def eventually(condition, timeout: float = 5.0) -> None:
    """Wait for ``condition()``; fail here, not at a later assertion, when it does not come true in time."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not true within {timeout:g} s"
        time.sleep(0.05)


def output_of(proxy: ProxyProcess) -> str:
    time.sleep(0.3)  # the last lines of a running process
    return proxy.log_path.read_text(errors="replace")


# --- 9: /ready and doctor check the route chat uses ---------------------------------------------------------------
def test_ready_and_doctor_agree_on_an_upstream_url_without_v1(pair, homes) -> None:
    no_v1 = pair.emulator.url  # http://127.0.0.1:PORT: the emulator serves /v1/chat/completions only
    proxy = started(no_v1, homes(), {"MEMCI_MANAGE_CONTEXT": "false"})
    try:
        hint = f"the upstream has no /chat/completions under {no_v1} (HTTP 404) — did you mean {no_v1}/v1?"
        ready = httpx.get(proxy.url + "/ready", timeout=10)
        assert ready.status_code == 503, ready.text
        assert ready.json()["checks"]["upstream"]["message"] == hint
        client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
        with pytest.raises(openai.NotFoundError):  # what /ready now announces
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        doctor = cli("doctor", "--upstream", no_v1, env={"MEMCI_HOME": str(homes())})
        assert doctor.returncode == 1
        assert f"FAIL  upstream {no_v1}: {hint}" in doctor.stdout.splitlines()
        assert f"WARNING memci: {hint}" in output_of(proxy)  # and said at start
    finally:
        proxy.stop()
    good = httpx.get(pair.proxy.url + "/ready", timeout=10)
    assert good.status_code == 200 and good.json()["checks"]["upstream"]["ok"] is True
    assert cli("doctor", "--upstream", pair.emulator.base_url, env={"MEMCI_HOME": str(homes())}).returncode == 0


# --- 10: upstream failures are seen -----------------------------------------------------------------------------------
def _warnings(proxy: ProxyProcess) -> list[str]:
    return [line for line in output_of(proxy).splitlines() if "WARNING memci.upstream: upstream failure" in line]


@pytest.mark.parametrize("marker", ["[[cut:3]]", "[[abort:3]]"])
def test_a_cut_stream_is_a_warning_a_count_and_not_a_200(pair, marker) -> None:
    proxy = pair.proxy
    before = (metric(proxy, "memci_upstream_errors_total", kind="stream_cut"),
              metric(proxy, "memci_requests_total", route="chat", status="stream_cut"),
              metric(proxy, "memci_requests_total", route="chat", status="200"), len(_warnings(proxy)))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", stream=True, messages=[{"role": "user", "content": f"{SECRET} {marker} tell me a story"}])
    conversation = raw.headers["x-memci-conversation-id"]
    with pytest.raises(openai.APIError):
        for _ in raw.parse():
            pass
    # the SDK raises at the error event; the proxy counts the stream once it has sent its end
    eventually(lambda: metric(proxy, "memci_requests_total", route="chat", status="stream_cut") == before[1] + 1)
    assert metric(proxy, "memci_upstream_errors_total", kind="stream_cut") == before[0] + 1
    assert metric(proxy, "memci_requests_total", route="chat", status="stream_cut") == before[1] + 1
    assert metric(proxy, "memci_requests_total", route="chat", status="200") == before[2]
    new = _warnings(proxy)[before[3]:]
    assert len(new) == 1 and "stream_cut, status 200, route chat" in new[0]
    assert f"conversation {conversation}" in new[0]
    assert SECRET not in output_of(proxy)


def test_an_error_status_from_the_upstream_is_a_warning_and_a_count(pair) -> None:
    proxy = pair.proxy
    before = metric(proxy, "memci_upstream_errors_total", kind="http_5xx"), len(_warnings(proxy))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{SECRET} [[status:500]]"}])
    assert metric(proxy, "memci_upstream_errors_total", kind="http_5xx") == before[0] + 1
    new = _warnings(proxy)[before[1]:]
    assert len(new) == 1 and "http_5xx, status 500, route chat, conversation " in new[0]
    assert SECRET not in output_of(proxy)


def test_an_unreachable_upstream_warns_at_start_and_on_each_request(homes) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    proxy = started(dead, homes())
    try:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model="m", stream=stream,
                                               messages=[{"role": "user", "content": f"{SECRET} hello"}])
            assert caught.value.status_code == 502
        assert metric(proxy, "memci_upstream_errors_total", kind="unreachable") == 2
        assert metric(proxy, "memci_requests_total", route="chat", status="502") == 2
        out = output_of(proxy)
        assert re.search(rf"WARNING memci: the upstream {re.escape(dead)} is unreachable: .*the proxy runs", out), out
        failures = _warnings(proxy)
        assert len(failures) == 2 and all("unreachable, status 502, route chat" in line for line in failures)
        assert SECRET not in out
        assert httpx.get(proxy.url + "/ready", timeout=10).status_code == 503
    finally:
        proxy.stop()


# --- 11: a quiet start ----------------------------------------------------------------------------------------------
def test_a_first_start_says_ready_and_little_else(pair, homes) -> None:
    proxy = started(pair.emulator.base_url, homes())
    try:
        out = output_of(proxy)
    finally:
        proxy.stop()
    assert f"INFO memci: ready on {proxy.url}" in out
    for noise in ("initdb", "pg_ctl", "Running upgrade", "alembic", "XDG_RUNTIME_DIR", "RuntimeDirWarning"):
        assert noise not in out, out
    assert "WARNING memci: " not in out.replace("WARNING memci.store", "")  # the upstream is fine: no warning
    assert len(out.splitlines()) <= 12, out


def test_debug_shows_initdb_and_the_migrations(pair, homes) -> None:
    proxy = started(pair.emulator.base_url, homes(), args=("--log-level", "debug"))
    try:
        out = output_of(proxy)
    finally:
        proxy.stop()
    assert "initdb" in out and "Running upgrade" in out and f"ready on {proxy.url}" in out
    assert "XDG_RUNTIME_DIR" not in out


def test_no_command_prints_the_xdg_warning(pair, homes) -> None:
    home = homes()
    env = {"MEMCI_HOME": str(home)}
    migrate = cli("migrate", env=env)
    assert migrate.returncode == 0, migrate.stderr
    assert "Running upgrade" not in migrate.stdout + migrate.stderr
    runs = [migrate, cli("doctor", "--upstream", pair.emulator.base_url, env=env),  # joins the embedded database
            cli("inspect", "nothing", "--url", pair.proxy.url, "--admin-key", ADMIN, env=env),
            cli("settings", env=env), cli("metrics", env=env)]
    port = free_port()
    emulate = subprocess.run(["timeout", "-s", "INT", "4", sys.executable, "-m", "memci_proxy.cli", "emulate", "--port",
                              str(port)], cwd=REPO, capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"})
    for run in [*runs, emulate]:
        assert "XDG_RUNTIME_DIR" not in run.stdout + run.stderr, run.args


# --- 12: one vocabulary of page states --------------------------------------------------------------------------------
def test_headers_inspect_and_the_conversations_api_count_the_same_pages(pair) -> None:
    client = openai.OpenAI(base_url=pair.proxy.base_url, api_key="sk-pages", max_retries=0)
    messages = [{"role": "system", "content": "You are terse."}]
    headers = {}
    for turn in range(40):
        messages.append({"role": "user", "content": f"Turn {turn}: " + " ".join(f"w{turn}x{i}" for i in range(120))})
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=40)
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        headers = {k: int(raw.headers[f"x-memci-pages-{k}"]) for k in ("active", "archived", "evicted")}
        if 0 < headers["evicted"] < headers["archived"]:  # pages in every state
            break
    assert 0 < headers["evicted"] < headers["archived"], headers
    listed = headers["archived"] - headers["evicted"]
    conversation = raw.headers["x-memci-conversation-id"]
    shown = cli("inspect", conversation, "--url", pair.proxy.url, "--admin-key", ADMIN, "--no-color",
                env={"MEMCI_HOME": "/nonexistent"})
    assert shown.returncode == 0, shown.stderr
    assert (f"pages: {headers['active']} active, {headers['archived']} archived ({listed} on the contents page, "
            f"{headers['evicted']} evicted)" in shown.stdout), shown.stdout
    assert "evicted: archived, then dropped from the contents page" in shown.stdout
    for _ in range(50):  # the conversations API reads the store: the last turn is written behind the answer
        stored = httpx.get(f"{pair.proxy.url}/memci/conversations/{conversation}", timeout=10,
                           headers={"Authorization": "Bearer sk-pages"}).json()
        states = [p["state"] for p in stored["pages"]]
        counts = {k: states.count(k) for k in ("active", "archived", "evicted")}
        if counts == {"active": headers["active"], "archived": listed, "evicted": headers["evicted"]}:
            break
        time.sleep(0.1)
    assert counts == {"active": headers["active"], "archived": listed, "evicted": headers["evicted"]}

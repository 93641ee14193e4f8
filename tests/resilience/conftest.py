"""Fault-injection fixtures: a Redis and a PostgreSQL that tests can stop and start, the emulator, proxy processes,
and a small chat client that remembers what it sent (to check afterwards that no message was lost).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import EmulatorProcess
from tests.e2e.proxyproc import ProxyProcess, free_port

WINDOW = 8192
MAX_TOKENS = 128
FILLER = "river stone cloud maple lantern orbit copper meadow signal harbor velvet ember".split()


# --- Redis ----------------------------------------------------------------------------------------
class RedisProcess:
    """A redis-server on a fixed loopback port: kill() it and start() it again on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisProcess":
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.exceptions.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_connect_timeout=0.5)


@pytest.fixture
def redis_proc() -> Iterator[RedisProcess]:
    r = RedisProcess().start()
    try:
        yield r
    finally:
        r.kill()


# --- PostgreSQL -----------------------------------------------------------------------------------
class PostgresProcess:
    """An embedded PostgreSQL of its own (pgserver), which stop() shuts down (fast mode) and start() brings back."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="memci-resilience-pg-"))
        self.server: Any = None
        self.uri = ""

    def start(self) -> "PostgresProcess":
        import pgserver

        if self.server is None:
            self.server = pgserver.get_server(self.base / "data", cleanup_mode="delete")
        else:
            self.server.ensure_postgres_running()
        self.uri = self.server.get_uri()
        return self

    def stop(self) -> None:
        from pgserver._commands import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata, user=self.server.system_user)

    def create_database(self, name: str) -> str:
        """A new database; returns its libpq URL."""
        import psycopg

        with psycopg.connect(self.uri, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def url(self, database: str) -> str:
        from memci_proxy.store.sql.urls import to_libpq_url, with_database

        return with_database(to_libpq_url(self.uri), database)

    def close(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.cleanup()
            self.server = None
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_proc() -> Iterator[PostgresProcess]:
    p = PostgresProcess().start()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def module_db_url(postgres_server, migrated_template) -> Iterator[str]:
    """A migrated database of the session's PostgreSQL for one test module (a module-scoped proxy's)."""
    name = f"memci_m{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    postgres_server.create_database(name, template=migrated_template)
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


# --- emulator and proxies ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emulator_8k() -> Iterator[EmulatorProcess]:
    emu = EmulatorProcess(["--max-model-len", str(WINDOW)]).start()
    yield emu
    emu.stop()


@pytest.fixture
def home() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="memci-resilience-home-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def start_proxy(emulator_8k) -> Iterator[Any]:
    started: list[ProxyProcess] = []

    def start(home: Path, env: dict[str, str] | None = None, port: int | None = None,
              upstream: str | None = None) -> ProxyProcess:
        p = ProxyProcess(upstream or emulator_8k.base_url, home, env, port=port).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


# --- a client that remembers -------------------------------------------------------------------------
def word_of(n: int) -> str:
    """A word the tokenizers keep whole and no generated text contains: letters only."""
    letters = "bcdfghjklmnpqrstvwxz"
    out = ""
    n += 1
    while n:
        n, r = divmod(n, len(letters))
        out += letters[r]
    return "zq" + out + "qz"


class Chat:
    """One conversation over raw HTTP: the history the client resends, and the unique word of each user turn."""

    def __init__(self, base_url: str, name: str, api_key: str = "sk-resilience", system: str = "You are terse.") -> None:
        self.base_url = base_url
        self.name = name
        self.api_key = api_key
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self.words: list[str] = []
        self.conversation_id: str | None = None

    def user_text(self, turn: int, extra: str = "", length: int = 80, pad: int = 0) -> str:
        """A user message with a word of its own; ``pad`` filler words make the conversation reach its epochs
        sooner."""
        word = word_of(zlib.crc32(f"{self.name}/{turn}".encode()) & 0xFFFFFF)
        self.words.append(word)
        filler = " ".join(FILLER[(turn + i) % len(FILLER)] for i in range(pad))
        return f"Turn {turn} of {self.name}: remember {word}. {filler} Tell me more. [[len:{length}]] {extra}".strip()

    def body(self, text: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
        messages = [*self.messages, {"role": "user", "content": text}]
        body: dict[str, Any] = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS, **extra}
        if stream:
            body["stream"] = True
        return body

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def send(self, client: httpx.Client, text: str, timeout: float = 60.0, **extra: Any) -> httpx.Response:
        """A non-streaming turn; on 200 the exchange joins the history."""
        r = client.post(self.base_url + "/v1/chat/completions", json=self.body(text, **extra),
                        headers=self.headers(), timeout=timeout)
        if r.status_code == 200:
            self.accept(text, r.json()["choices"][0]["message"]["content"] or "")
            self.conversation_id = r.headers.get("x-memci-conversation-id", self.conversation_id)
        return r

    def accept(self, text: str, answer: str) -> None:
        self.messages.append({"role": "user", "content": text})
        self.messages.append({"role": "assistant", "content": answer})


def last_chat_prompt(emulator: EmulatorProcess, chat: Chat) -> list[dict[str, Any]]:
    """The messages of the newest upstream request of this conversation (background jobs, e.g. summaries, also
    call the upstream)."""
    for item in reversed(emulator.requests(50)):
        messages = item["body"].get("messages") or []
        if chat.words and chat.words[-1] in str(messages[-1:]):
            return messages
    raise AssertionError(f"no upstream request of {chat.name} in the emulator's log")


def assert_openai_error(r: httpx.Response) -> None:
    body = r.json()
    assert isinstance(body.get("error"), dict), body
    assert isinstance(body["error"].get("message"), str), body


def stored_user_texts(db_url: str, conversation_id: str, at_least: int = 0, timeout: float = 10.0) -> list[str]:
    """Every user message PostgreSQL holds for a conversation, in order. ``at_least``: wait (up to ``timeout``) until
    that many are stored, since answered turns are written behind the answer."""
    import psycopg

    from memci_proxy.store.sql.urls import to_libpq_url

    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(to_libpq_url(db_url)) as conn:
            rows = conn.execute(
                "SELECT message FROM entries WHERE conversation_id = %s AND role = 'user' ORDER BY seq",
                (conversation_id,),
            ).fetchall()
        if len(rows) >= at_least or time.monotonic() > deadline:
            return [r[0].get("content") for r in rows]
        time.sleep(0.05)


def search_finds(proxy_url: str, chat: Chat, word: str) -> bool:
    r = httpx.post(proxy_url + "/memci/search", headers=chat.headers(), timeout=30,
                   json={"query": word, "conversation_id": chat.conversation_id, "k": 3})
    if r.status_code != 200:
        return False
    return any(word in (hit.get("excerpt") or "") for hit in r.json().get("hits", []))


def metric_value(proxy_url: str, name: str, labels: str = "") -> float:
    """Sum of a metric's samples whose line starts with name (and contains labels)."""
    text = httpx.get(proxy_url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (not labels or labels in line) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name:
                total += float(value)
    return total


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default

"""Several upstream workers: two emulator processes behind one proxy (`--upstream a,b`).

Each conversation sticks to one worker (rendezvous hashing on its id, or on tenant + first message when the
proxy only passes requests through); killing a worker moves its conversations to the other one.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import EmulatorProcess
from tests.e2e.proxyproc import ProxyProcess

CONVERSATIONS = 12
TURNS = 3


@pytest.fixture
def workers():
    started = [EmulatorProcess().start(), EmulatorProcess().start()]
    yield started
    for emu in started:
        emu.stop()


def owner_of(workers: list[EmulatorProcess], marker: str) -> set[int]:
    """Indexes of the workers whose request log holds a request of the conversation tagged ``marker``."""
    found = set()
    for i, emu in enumerate(workers):
        if emu.proc is None:
            continue
        for entry in emu.requests(200):
            if marker in str(entry["body"].get("messages")):
                found.add(i)
    return found


def talk(client: openai.OpenAI, history: list[dict], text: str):
    history.append({"role": "user", "content": text})
    reply = client.chat.completions.with_raw_response.create(model="m", messages=history, max_tokens=8)
    completion = reply.parse()
    history.append({"role": "assistant", "content": completion.choices[0].message.content})
    return reply


@pytest.mark.parametrize("manage_context", ["false", "true"])
def test_each_conversation_sticks_to_one_worker_and_moves_when_it_dies(workers, tmp_path, manage_context):
    upstream = ",".join(w.base_url for w in workers)
    env = {"MEMCI_MANAGE_CONTEXT": manage_context, "MEMCI_INTENT_REWRITE_ENABLED": "false",
           "MEMCI_UPSTREAM_DOWN_SECONDS": "60"}
    proxy = ProxyProcess(upstream, tmp_path / "p", env).start()
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-workers", max_retries=0, timeout=30)
    try:
        histories = {f"conv{i:02d}": [] for i in range(CONVERSATIONS)}
        for turn in range(TURNS):
            for name, history in histories.items():
                talk(client, history, f"{name} turn {turn}")
        owners = {name: owner_of(workers, f"{name} turn 0") for name in histories}
        assert all(len(o) == 1 for o in owners.values()), owners  # every turn of a conversation on one worker
        assert {next(iter(o)) for o in owners.values()} == {0, 1}  # and both workers serve some

        victim = next(iter(owners["conv00"]))
        survivor = 1 - victim
        moved = [name for name, o in owners.items() if o == {victim}]
        workers[victim].stop()
        for name in moved:
            reply = talk(client, histories[name], f"{name} after the failure")
            assert reply.http_response.status_code == 200
        for name in moved:
            talk(client, histories[name], f"{name} still on the survivor")
        log = str([e["body"].get("messages") for e in workers[survivor].requests(200)])
        assert all(f"{name} still on the survivor" in log for name in moved)

        metrics = httpx.get(proxy.url + "/metrics").text
        assert "memci_upstream_workers_down 1.0" in metrics
        assert f'memci_upstream_worker_requests_total{{outcome="connect_error",worker="{workers[victim].base_url}"}} 1.0' in metrics
    finally:
        client.close()
        proxy.stop()


def test_summary_jobs_go_to_the_worker_that_cached_the_conversation(workers, tmp_path):
    """With several workers, a summary job on the pre-epoch prompt goes where that prompt is cached: the worker
    the conversation is routed to."""
    from memci_proxy.workers.prefix import JOB_MARKER

    upstream = ",".join(w.base_url for w in workers)
    env = {"MEMCI_MEMORY_WORKERS": "true", "MEMCI_CONTEXT_WINDOW": "4096", "MEMCI_INTENT_REWRITE_ENABLED": "false"}
    proxy = ProxyProcess(upstream, tmp_path / "p", env).start()
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-workers", max_retries=0, timeout=30)
    histories: dict[str, list[dict]] = {}

    def say(name: str, turn: int) -> None:
        history = histories.setdefault(name, [])
        history.append({"role": "user", "content": f"{name} note {turn} : the crate {turn} holds item {turn * 7}. "
                                                   "[[len:120]]"})
        answer = client.chat.completions.create(model="m", messages=history, max_tokens=160)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})

    def jobs_of(name: str) -> dict[int, list[dict]]:
        return {i: [e for e in w.requests(200) if str(e["body"]["messages"][-1].get("content")).startswith(JOB_MARKER)
                    and f"{name} note 0 " in str(e["body"]["messages"])] for i, w in enumerate(workers)}

    try:
        owned: dict[int, str] = {}  # one conversation per worker (new ones until both workers have one)
        for i in range(16):
            say(f"conv{i:02d}", 0)
            (owner,) = owner_of(workers, f"conv{i:02d} note 0 ")
            owned.setdefault(owner, f"conv{i:02d}")
            if len(owned) == 2:
                break
        assert len(owned) == 2, "every conversation went to one worker"
        for turn in range(1, 60):
            for name in owned.values():
                say(name, turn)
            if all(any(jobs_of(name).values()) for name in owned.values()):
                break
        for owner, name in owned.items():
            jobs = jobs_of(name)
            assert owner_of(workers, f"{name} note {turn} ") == {owner}
            assert jobs[owner], f"{name}: no summary job on its worker"
            assert not jobs[1 - owner], f"{name}: a summary job went to the other worker"
            assert all(j["cached_tokens"] >= 0.8 * j["prompt_tokens"] for j in jobs[owner])
    finally:
        client.close()
        proxy.stop()

"""Summaries by the model end to end: openai SDK -> proxy -> emulator, the emulator also being the summariser.

The summary of archived pages is made in the background (in-process queue) and reaches the leading system
message only at compaction epochs: between epochs the system message stays byte for byte the same.
"""

from __future__ import annotations

import json
import time

import pytest

from memci_proxy.workers.prefix import JOB_MARKER as PREFIX_JOB_MARKER
from tests.e2e.conftest import EmulatorProcess

WINDOW = 4096
SUMMARY_HEADING = "## Conversation summary"


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW, {"MEMCI_CONTEXT_WINDOW": str(WINDOW), "MEMCI_SUMMARY_CACHE_TTL_S": "0",
                                       "MEMCI_MEMORY_WORKERS": "true"})


@pytest.fixture(scope="module")
def emulator_4k(pair):
    return pair.emulator


@pytest.fixture(scope="module")
def proxy_with_memory(pair):
    return pair.proxy


def _chat_request(emulator: EmulatorProcess, text: str) -> dict:
    """The last request the proxy sent for the client's turn (summariser calls are skipped). The turn's message may
    also carry the proxy's blocks at its start (when it is the first active message)."""
    for item in reversed(emulator.requests(50)):
        messages = item["body"]["messages"]
        last = messages[-1].get("content")
        if isinstance(last, str) and last.endswith(text) and not _is_prefix_job(item):
            return item["body"]
    raise AssertionError(f"no upstream request for {text!r}")


def test_summary_reaches_the_prompt_only_at_epochs(proxy_with_memory, emulator_4k, client_for):
    client = client_for(proxy_with_memory)
    messages: list[dict] = [{"role": "system", "content": "You are a patient tutor."}]
    systems: list[tuple[bool, str]] = []
    for turn in range(80):
        text = f"Question {turn}: explain idea number {turn} of the billing design. [[len:120]]"
        messages.append({"role": "user", "content": text})
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=200)
        answer = raw.parse().choices[0].message.content
        messages.append({"role": "assistant", "content": answer})
        # the proxy's blocks (summary, contents page) lead the message after the client's system prompt
        system = json.dumps(_chat_request(emulator_4k, text)["messages"][1]["content"])
        systems.append((raw.headers["x-memci-epoch"] == "true", system))
        if sum(SUMMARY_HEADING in s for _, s in systems) >= 3 and systems[-1][0]:
            break
        time.sleep(0.05)  # the background summary job runs meanwhile
    with_summary = [i for i, (_, s) in enumerate(systems) if SUMMARY_HEADING in s]
    assert with_summary, "no summary reached the prompt"
    first = with_summary[0]
    assert systems[first][0], "the summary appeared outside an epoch"
    for i in range(1, len(systems)):
        epoch, system = systems[i]
        if not epoch:
            assert system == systems[i - 1][1], f"turn {i}: the system message changed without an epoch"
    # The summary is the model's text, not the extractive contents lines.
    summary = systems[-1][1].split(SUMMARY_HEADING, 1)[1]
    assert "Question 0" not in summary.split("##", 1)[0]


def _is_prefix_job(item: dict) -> bool:
    last = item["body"]["messages"][-1].get("content")
    return isinstance(last, str) and last.startswith(PREFIX_JOB_MARKER)


def test_summary_jobs_reuse_the_cached_pre_epoch_prompt(proxy_with_memory, emulator_4k, client_for):
    """A summary job is the conversation's pre-epoch prompt, as the upstream received it, plus one instruction
    message: the emulator's radix cache reports it almost wholly cached."""
    client = client_for(proxy_with_memory)
    messages: list[dict] = [{"role": "system", "content": "You are a careful archivist."}]
    jobs: list[dict] = []
    for turn in range(80):
        text = f"Archive note {turn}: the shelf code of box {turn} is S{turn:03d}-Q. [[len:100]]"
        messages.append({"role": "user", "content": text})
        if turn % 2:
            stream = client.chat.completions.create(model="m", messages=messages, max_tokens=160, stream=True)
            answer = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        else:
            answer = client.chat.completions.create(model="m", messages=messages, max_tokens=160).choices[0].message.content
        messages.append({"role": "assistant", "content": answer})
        jobs = [r for r in emulator_4k.requests(200) if _is_prefix_job(r) and "archivist" in json.dumps(r["body"])]
        if len(jobs) >= 2:
            break
    deadline = time.monotonic() + 10
    while not jobs and time.monotonic() < deadline:
        time.sleep(0.2)
        jobs = [r for r in emulator_4k.requests(200) if _is_prefix_job(r) and "archivist" in json.dumps(r["body"])]
    assert jobs, "no summary job on the cached prefix"
    log = emulator_4k.requests(200)
    turns = [r["body"] for r in log if not _is_prefix_job(r) and r["body"]["messages"][0]["role"] == "system"
             and "archivist" in r["body"]["messages"][0]["content"]]
    for job in jobs:
        body = job["body"]
        # mostly cached: everything but the instruction (and the template's few tokens around it)
        assert job["cached_tokens"] >= 0.8 * job["prompt_tokens"], job
        assert job["prompt_tokens"] - job["cached_tokens"] < 200
        # the prompt of a client turn as the upstream received it, plus exactly one user message
        base = next((t for t in turns if t["messages"] == body["messages"][:-1]), None)
        assert base is not None, "the job's messages are not a turn's prompt"
        assert body["tools"] == base["tools"] and body["model"] == base["model"]
        assert body["messages"][-1]["role"] == "user" and body["stream"] is False
        # with the key the conversation's requests carried upstream (an upstream that wants one gets it)
        assert job.get("headers", {}).get("authorization") == "Bearer sk-test"
        # that prompt held pages the next prompt (the epoch's) no longer holds
        after = turns[turns.index(base) + 1] if turns.index(base) + 1 < len(turns) else None
        assert after is not None and body["messages"][1] not in after["messages"]


def test_with_an_idle_delay_the_jobs_wait_for_a_quiet_conversation(emulator_and_proxy, client_for):
    idle = emulator_and_proxy(WINDOW, {"MEMCI_CONTEXT_WINDOW": str(WINDOW), "MEMCI_MEMORY_WORKERS": "true",
                                       "MEMCI_SUMMARY_IDLE_S": "3"})
    client = client_for(idle.proxy)
    messages: list[dict] = [{"role": "system", "content": "You are a quiet librarian."}]

    def jobs() -> list[dict]:
        return [r for r in idle.emulator.requests(200) if _is_prefix_job(r) or r["body"]["messages"][0]["content"]
                .startswith("Summarise")]

    epoch_at = None
    for turn in range(80):
        messages.append({"role": "user", "content": f"Shelf note {turn}: row {turn} holds volume {turn * 3}. [[len:100]]"})
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=160)
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        if raw.headers["x-memci-epoch"] == "true":
            epoch_at = turn
            break
    assert epoch_at is not None, "no epoch"
    for turn in range(epoch_at + 1, epoch_at + 4):  # the conversation goes on: its jobs wait
        messages.append({"role": "user", "content": f"Shelf note {turn}: quick one. [[len:20]]"})
        client.chat.completions.create(model="m", messages=messages, max_tokens=40)
        messages.append({"role": "assistant", "content": "ok"})
        time.sleep(0.5)
    assert jobs() == []
    deadline = time.monotonic() + 15  # quiet now: the jobs run about 3 s after the last turn
    while not jobs() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert jobs(), "the jobs did not run once the conversation was idle"
    assert all(j["cached_tokens"] >= 0.8 * j["prompt_tokens"] for j in jobs() if _is_prefix_job(j))

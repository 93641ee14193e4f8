"""First-sight offload in the managed turn: the offloaded output is stored before the first prompt that omits it goes
upstream; X-Memci-Offload: off sends it in full; the metrics count it."""

from __future__ import annotations

import json

import pytest

from memci_proxy.wire.errors import ProxyError
from turn_fakes import ChatUpstream, MemoryRepository, answer_of, call_of, make_service

LOG = "".join(f"test_{i} PASSED\n" for i in range(4000))


def _agent_messages(turn: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "run the tests"}]
    for i in range(turn):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"run {i}\n" + LOG}]
    return messages


async def test_an_offloaded_output_is_stored_before_the_prompt_that_omits_it() -> None:
    repo = MemoryRepository()
    unstored: list[int] = []

    def check(body: dict) -> None:
        for m in body["messages"]:
            if m.get("role") == "tool" and m["content"].startswith("[Tool output stored in full as page"):
                stored = [e.message["content"] for c in repo.conversations.values() for e in c.entries.values()
                          if e.message.get("role") == "tool"]
                if not any(s.startswith(m["content"].split("\n")[1]) and len(s) > 50_000 for s in stored):
                    unstored.append(len(body["messages"]))

    upstream = ChatUpstream(on_request=check)
    service = make_service(upstream, repo, context_window=8192, write_behind_max_lag_ms=60_000)
    for turn in range(1, 4):
        answer = await service.handle(call_of(_agent_messages(turn)))
        out = await answer_of(answer)
        assert out["choices"][0]["message"]["content"]
    sent = upstream.requests[-1]["messages"]
    previews = [m["content"] for m in sent if m.get("role") == "tool"]
    assert len(previews) == 3 and all("recall: page=" in p for p in previews)
    assert len(json.dumps(sent)) < 20_000  # three outputs of ~70 KB each
    assert unstored == []
    # the same preview bytes on every turn
    first = [m["content"] for m in upstream.requests[0]["messages"] if m.get("role") == "tool"]
    assert previews[0] == first[0]
    metrics = service.metrics
    assert metrics.offloaded_outputs.labels("tool")._value.get() == 3
    assert metrics.offload_tokens_saved._value.get() > 3 * 15_000
    await service.close()


async def test_offload_off_per_request_and_a_bad_header() -> None:
    upstream = ChatUpstream()
    service = make_service(upstream, MemoryRepository(), context_window=100_000)
    answer = await service.handle(call_of(_agent_messages(1), headers={"Authorization": "Bearer sk-u",
                                                                       "X-Memci-Offload": "off"}))
    await answer_of(answer)
    assert upstream.requests[-1]["messages"][-1]["content"] == "run 0\n" + LOG
    with pytest.raises(ProxyError) as bad:
        call_of(_agent_messages(1), headers={"Authorization": "Bearer sk-u", "X-Memci-Offload": "maybe"})
    assert bad.value.status == 400 and "X-Memci-Offload" in str(bad.value)
    await service.close()

"""A managed chat holding U+0000 is answered and stored like any other (the SQL store escapes what PostgreSQL
cannot hold: memci_proxy.store.sql.pgtext); the upstream gets the client's exact text."""

from __future__ import annotations

import json
from typing import Any

from memci_proxy.turn.call import ChatCall, chat_call
from memci_proxy.wire.validate import parse_chat_body
from turn_fakes import ChatUpstream, MemoryRepository, answer_of, make_service


def routed(messages: list[dict[str, Any]]) -> ChatCall:
    """A call as the chat route builds it."""
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 64}).encode()
    data, fields = parse_chat_body(body)
    return chat_call({"Authorization": "Bearer sk-unit"}, data, body, fields["messages"])


async def test_a_nul_in_a_new_message_is_answered_and_stored():
    repo = MemoryRepository()
    upstream = ChatUpstream()
    service = make_service(upstream, repo)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be terse."}]
    for i in range(3):
        messages.append({"role": "user", "content": f"question {i} " + "word " * 40})
        answer = await service.handle(routed(list(messages)))
        messages.append({"role": "assistant", "content": (await answer_of(answer))["choices"][0]["message"]["content"]})
    cid = answer.headers["X-Memci-Conversation-Id"]

    messages.append({"role": "user", "content": "a\x00b"})
    answer = await service.handle(routed(list(messages)))
    assert answer.status == 200 and answer.headers["X-Memci-Conversation-Id"] == cid
    assert upstream.requests[-1]["messages"][-1]["content"] == "a\x00b"
    await service.flush(cid)
    assert repo.user_texts(cid)[-1] == "a\x00b"
    await service.close()

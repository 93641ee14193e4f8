"""A managed chat holding U+0000 is a 400 before anything is stored; a continued chat's history, taken on an
earlier turn, is not searched for it again (only what follows it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.turn.call import ChatCall, chat_call
from proxy.turn.identity import split_system
from proxy.wire.errors import ProxyError
from proxy.wire.validate import parse_chat_body
from turn_fakes import ChatUpstream, MemoryRepository, answer_of, make_service


def routed(messages: list[dict[str, Any]]) -> ChatCall:
    """A call as the chat route builds it (the body's raw values kept for the refusal)."""
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 64}).encode()
    data, fields = parse_chat_body(body)
    return chat_call({"Authorization": "Bearer sk-unit"}, data, body, fields["messages"], raw_fields=fields)


async def test_a_nul_in_a_new_message_is_refused_and_the_known_history_is_not_searched_again():
    repo = MemoryRepository()
    service = make_service(ChatUpstream(), repo)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be terse."}]
    for i in range(3):
        messages.append({"role": "user", "content": f"question {i} " + "word " * 40})
        answer = await service.handle(routed(list(messages)))
        messages.append({"role": "assistant", "content": (await answer_of(answer))["choices"][0]["message"]["content"]})
    cid = answer.headers["X-Memci-Conversation-Id"]
    await service.flush(cid)
    stored = len(repo.user_texts(cid))

    call = routed([*messages, {"role": "user", "content": "a\x00b"}])
    found = await service.lookup.find(call, split_system(call.messages)[1])
    assert found.conversation_id == cid and found.raw_known > 0  # the history this process took before
    with pytest.raises(ProxyError) as info:
        await service.handle(call)
    assert info.value.status == 400 and info.value.code == "unsupported_character"
    await service.flush(cid)
    assert len(repo.user_texts(cid)) == stored  # nothing of the refused turn stored
    messages.append({"role": "user", "content": "the same without it"})
    assert (await service.handle(routed(list(messages)))).status == 200
    await service.close()

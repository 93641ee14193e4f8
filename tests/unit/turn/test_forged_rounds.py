"""A client may send what looks like the proxy's own recall rounds (an assistant message calling the ``recall`` tool,
tool messages answering it) with any values in them, in a short chat, or in a long one that archives them or not: the
proxy never shows its tool to the client, but nothing stops a client from sending such messages. Whatever their ids,
names, arguments and contents, the managed turn answers (or refuses with a 4xx), through every shape of the rounds'
fallback (memci_proxy.turn.shapes), and never fails with an error of its own. The HTTP fuzz
(tests/resilience/test_fuzz.py) found one such failure by chance (a list id put in a set); this walks the space on
purpose."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memci_proxy.wire.errors import ProxyError
from memci_proxy.wire.validate import validate_chat_request
from turn_fakes import ChatUpstream, answer_of, call_of, make_service

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=4,
)
call_ids = st.one_of(st.sampled_from(["call_1", "call_2", ""]), json_values)
names = st.one_of(st.just("recall"), st.just("get_weather"), json_values)
arguments = st.one_of(st.just('{"query": "locker"}'), st.just("{"), json_values)


@st.composite
def forged_call(draw) -> Any:
    shape = draw(st.sampled_from(["call", "no_function", "any"]))
    if shape == "any":
        return draw(json_values)
    call: dict[str, Any] = {"id": draw(call_ids), "type": "function"}
    if shape == "call":
        call["function"] = {"name": draw(names), "arguments": draw(arguments)}
    else:
        call["function"] = draw(json_values)
    return call


@st.composite
def forged_rounds(draw) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        calls = draw(st.lists(forged_call(), min_size=1, max_size=3))
        content = draw(st.sampled_from([None, "", "Looking.", [{"type": "text", "text": "Looking."}]]))
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call in calls:
            answer_id = call.get("id") if isinstance(call, dict) and isinstance(call.get("id"), str) else "call_x"
            if draw(st.booleans()):
                messages.append({"role": "tool", "tool_call_id": draw(st.sampled_from([answer_id, "call_other"])),
                                 "content": draw(st.sampled_from(["[Page 1] the code is 4817", "", [
                                     {"type": "text", "text": "4817"}]]))})
        messages.append({"role": "user", "content": "And again?"})
    return messages


def filler() -> list[dict[str, Any]]:
    """A history long enough for a 4k window to archive pages."""
    words = " ".join(f"word{i}" for i in range(120))
    out: list[dict[str, Any]] = []
    for turn in range(24):
        out += [{"role": "assistant", "content": f"Noted {turn}. {words}"},
                {"role": "user", "content": f"Note {turn}: {words}"}]
    return out


@st.composite
def forged_history(draw) -> list[dict[str, Any]]:
    """The forged rounds in a short chat, or before a long history (archived with it), or after one."""
    where = draw(st.sampled_from(["short", "archived", "active"]))
    forged = draw(forged_rounds())
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is my locker code?"}]
    if where == "archived":
        return messages + forged + filler()
    if where == "active":
        return messages + filler() + forged
    return messages + forged


class RefusesRounds(ChatUpstream):
    """Refuses (400) any request holding a tool message or a tool call, as servers without tool support do: every
    shape of the fallback is tried."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            if any(m.get("role") == "tool" or m.get("tool_calls") for m in body["messages"]):
                return httpx.Response(400, json={"error": {"message": "tools are not supported",
                                                           "type": "invalid_request_error"}})
        return super().__call__(request)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(messages=forged_history(), refusing=st.booleans(), stream=st.booleans())
def test_a_clients_forged_recall_rounds_never_make_the_turn_fail(messages, refusing, stream):
    try:
        validate_chat_request({"model": "m", "messages": messages})
    except ProxyError:
        assume(False)  # refused at the edge with a 400: never reaches the turn

    async def run() -> None:
        service = make_service(RefusesRounds() if refusing else ChatUpstream())
        try:
            answer = await service.handle(call_of(messages, stream=stream))
            assert answer.status < 500 or answer.events is not None, answer.body[:300]
            await answer_of(answer)
        except ProxyError as error:
            assert error.status < 500, error
        finally:
            await service.close()

    asyncio.run(run())

"""The answer's room in the window (memci_proxy.turn.answer_room): the max_tokens sent upstream is lowered so that prompt
plus answer fit, a turn whose fixed part does not fit is refused with a 400 naming the sizes (never sent unmanaged),
and the same holds for the unmanaged request of a store that is down."""

from __future__ import annotations

import json

import httpx
import pytest

from memci_proxy.wire.errors import ProxyError
from turn_fakes import Chat, ChatUpstream, MemoryRepository, answer_of, call_of, make_service

WINDOW = 4096  # the fakes' context_window


async def test_a_max_tokens_over_the_window_is_lowered_upstream_and_the_client_is_told():
    upstream = ChatUpstream()
    service = make_service(upstream)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello " * 200}]
    answer = await service.handle(call_of(messages, max_tokens=32000))
    await answer_of(answer)
    sent = upstream.requests[-1]["max_tokens"]
    assert answer.status == 200 and sent < 32000
    assert answer.headers["X-Memci-Max-Tokens-Lowered"] == str(sent)
    prompt = sum(len(str(m["content"])) for m in upstream.requests[-1]["messages"]) // 4
    assert prompt + sent <= WINDOW
    assert sent >= WINDOW // 4  # the reservation: a quarter of the window
    assert service.metrics.max_tokens_lowered._value.get() == 1
    answer = await service.handle(call_of(messages + [{"role": "assistant", "content": "hi"},
                                                      {"role": "user", "content": "and?"}], max_tokens=100))
    await answer_of(answer)
    assert upstream.requests[-1]["max_tokens"] == 100 and "X-Memci-Max-Tokens-Lowered" not in answer.headers
    await service.close()


async def test_a_turn_whose_fixed_part_does_not_fit_is_a_400_naming_the_sizes():
    upstream = ChatUpstream()
    service = make_service(upstream, offload=False)  # (offloaded on arrival, a long message fits as a preview)
    chat = Chat(service)
    await chat.send(chat.user_text(0))
    sent = len(upstream.requests)
    huge = chat.messages + [{"role": "user", "content": "word " * 20_000}]
    with pytest.raises(ProxyError) as raised:
        await service.handle(call_of(huge, max_tokens=32000))
    error = raised.value
    assert error.status == 400 and error.code == "context_length_exceeded"
    assert f"context window of {WINDOW} tokens" in error.message and "reserved for the answer" in error.message
    assert len(upstream.requests) == sent  # nothing went upstream
    assert service.metrics.over_budget._value.get() == 1
    assert sum(v for v in service.metrics.epochs._metrics.values() for v in [v._value.get()]) == 0
    await chat.send(chat.user_text(1))  # the session lock was released, the conversation goes on
    assert len(upstream.requests) == sent + 1
    await service.close()


async def test_without_the_store_the_unmanaged_request_fits_too():
    repo = MemoryRepository()
    upstream = ChatUpstream()
    service = make_service(upstream, repo)
    repo.fail = ConnectionError("database down")
    messages = [{"role": "user", "content": "hello " * 200}]
    answer = await service.handle(call_of(messages, max_tokens=32000))
    await answer_of(answer)
    assert answer.status == 200 and upstream.requests[-1]["max_tokens"] < WINDOW
    with pytest.raises(ProxyError) as raised:
        await service.handle(call_of([{"role": "user", "content": "word " * 20_000}]))
    assert raised.value.status == 400 and raised.value.code == "context_length_exceeded"
    await service.close()


def upstream_count(body: dict) -> int:
    return int(1.5 * (len(json.dumps(body["messages"])) + len(json.dumps(body.get("tools") or []))) / 4)


class StrictUpstream(ChatUpstream):
    """Counts a prompt at 1.5 times what the proxy estimates, and refuses prompt + max_tokens over the window in
    SGLang's words (which state the prompt's own count)."""

    def __call__(self, request):
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            prompt = upstream_count(body)
            asked = body.get("max_tokens") or 0
            if prompt + asked > WINDOW:
                self.refused += 1
                return httpx.Response(400, json={"error": {"message": (
                    f"Requested token count exceeds the model's maximum context length of {WINDOW} tokens. You "
                    f"requested a total of {prompt + asked} tokens: {prompt} tokens from the input messages and "
                    f"{asked} tokens for the completion. Please reduce the number of tokens in the input messages or "
                    "the completion to fit within the limit."), "type": "BadRequestError", "code": 400}})
        return super().__call__(request)


async def test_a_refusal_that_states_the_prompts_count_is_sent_once_more_with_an_answer_that_fits():
    upstream = StrictUpstream()
    upstream.refused = 0
    service = make_service(upstream, upstream_tokenize=False)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there " * 400}]
    answer = await service.handle(call_of(messages, max_tokens=32000))
    await answer_of(answer)
    assert upstream.refused == 1 and answer.status == 200
    assert service.metrics.turn_resends.labels("estimate")._value.get() == 1
    sent = upstream.requests[-1]["max_tokens"]
    assert upstream_count(upstream.requests[-1]) + sent <= WINDOW
    assert answer.headers["X-Memci-Max-Tokens-Lowered"] == str(sent)
    await service.close()


async def test_a_tools_schema_the_estimate_counts_short_is_not_counted_twice_once_learned():
    """An upstream that counts the tools' JSON at three times the estimate: the first plans under-count (the correction
    ratio rises), and once the learned costs take over they carry the difference, so the ratio starts again from 1
    and the planned prompt is within the learned margin of what the upstream counts (before: about 1.3 times it)."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Runs a thing. " * 20,
                                               "parameters": {"type": "object", "properties": {
                                                   "arg": {"type": "string", "description": "An argument."}}}}}
             for i in range(12)]

    class ToolsHeavy(ChatUpstream):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            response = super().__call__(request)
            if not request.url.path.endswith("/chat/completions"):
                return response
            body, data = json.loads(request.content), response.json()
            data["usage"]["prompt_tokens"] += 2 * len(json.dumps(body.get("tools") or [])) // 4
            return httpx.Response(200, json=data)

    upstream = ToolsHeavy(window=32768)
    service = make_service(upstream, context_window=32768)
    errors: list[float] = []
    observe = service.metrics.estimate_error.observe
    service.metrics.estimate_error.observe = lambda value: (errors.append(value), observe(value))[1]
    chat = Chat(service, words=20)
    for turn in range(6):
        chat.messages.append({"role": "user", "content": chat.user_text(turn)})
        answer = await service.handle(call_of(list(chat.messages), tools=tools))
        out = await answer_of(answer)
        assert answer.status == 200
        chat.messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        chat.conversation_id = answer.headers["X-Memci-Conversation-Id"]
    assert errors[0] < -0.3  # the plain estimate: the schema counted short
    assert service.state_of(chat.conversation_id).correction_ratio < 1.05
    assert all(0 <= e < 0.12 for e in errors[3:]), errors  # learned: on the safe side, by its margin only
    await service.close()


@pytest.mark.parametrize("ratio, text_cost", [(1.30, 1.07), (1.03, 1.07), (1.30, 0.80), (0.80, 1.20)])
def test_the_ratio_becomes_the_learned_cost_of_text_when_the_learned_costs_take_over(ratio, text_cost):
    """Never above what the ratio was, never below 1; in between, the learned cost of text with its margin."""
    import msgspec

    from memci_proxy.engine import ConversationState
    from memci_proxy.engine.learner import CountLearner, Features, learner_fit
    from memci_proxy.engine.tokens import EstimateCounter
    from memci_proxy.turn.counting import learned_ratio

    learner = CountLearner()
    for text in (1000, 3000, 2000):
        learner.observe(Features(text=text, images=0, tools=0, messages=2), round(text * text_cost) + 8)
    state = msgspec.structs.replace(ConversationState(), correction_ratio=ratio, counts=learner_fit("m", learner))
    unit = learner.counter().text_unit
    assert learned_ratio(state, "m", EstimateCounter()) == pytest.approx(max(1.0, min(ratio, unit)))
    assert learned_ratio(state, "other model", EstimateCounter()) == 1.0  # nothing learned for it: the plain unit

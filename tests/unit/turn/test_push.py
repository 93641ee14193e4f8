"""The proactive recall round in the turn service: sent after the latest user message, stored while that request is
upstream and before its answer is seen, spliced back byte for byte on the next turn; nothing pushed when the search finds nothing or the push is off."""

from __future__ import annotations

import json

import pytest

from memci_proxy.engine import ConversationState
from turn_fakes import Chat, ChatUpstream, MemoryRepository, call_of, make_service


async def _past_an_epoch(chat: Chat) -> None:
    i = 0
    while int(chat.last_headers.get("X-Memci-Pages-Archived", 0)) == 0:
        await chat.send(chat.user_text(i))
        i += 1
        assert i < 80, "no epoch"
    await chat.send(chat.user_text(i))


def _pushes(service, outcome: str) -> float:
    return service.metrics.registry.get_sample_value("memci_recall_pushes_total", {"outcome": outcome}) or 0.0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_look_up_gets_a_recall_round_kept_for_later_turns(stream: bool) -> None:
    repo = MemoryRepository()
    stored_before: list[bool] = []

    def check(body: dict) -> None:
        last = body["messages"][-1]
        if last["role"] == "tool" and last["tool_call_id"].startswith("call_"):
            state = ConversationState.from_bytes(repo.conversations[chat.conversation_id].state)
            stored_before.append(any(g.messages[-1] == last for g in state.hidden))

    upstream = ChatUpstream(on_request=check)
    service = make_service(upstream, repo, write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    await _past_an_epoch(chat)
    before = len(upstream.requests)
    repo.delay = 0.05  # the round's write is slower than the upstream: it is under way while the request is upstream
    answer = await service.handle(call_of([*chat.messages, {"role": "user", "content": "Remind me what I said about "
                                                                                           "code0000?"}], stream))
    first = await anext(answer.events) if stream else None
    stored = ConversationState.from_bytes(repo.conversations[chat.conversation_id].state)
    assert any(g.messages[-1]["role"] == "tool" and "code0000" in g.messages[-1]["content"] for g in stored.hidden)
    out = [first, *[event async for event in answer.events]] if stream else json.loads(answer.body)
    repo.delay = 0.0
    chat.messages += [{"role": "user", "content": "Remind me what I said about code0000?"},
                      {"role": "assistant", "content": "streamed" if stream else out["choices"][0]["message"]["content"]}]
    assert len(upstream.requests) == before + 1  # one upstream request: the round went with it
    sent = upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent[-3:]] == ["user", "assistant", "tool"]
    call = sent[-2]["tool_calls"][0]
    assert call["function"]["name"] == "recall" and "code0000" in json.loads(call["function"]["arguments"])["query"]
    assert "code0000" in sent[-1]["content"]
    assert len(stored_before) == 1  # (stored before the answer was seen: above)
    text = b"".join(out).decode() if stream else json.dumps(out)
    assert "Tool result:" in text and '"tool_calls"' not in text  # an ordinary answer
    assert _pushes(service, "pushed") == 1
    await chat.send(chat.user_text(500))
    nxt = upstream.requests[-1]["messages"]
    assert json.dumps(nxt[: len(sent)]) == json.dumps(sent)  # the next prompt starts with the whole pushed one
    await service.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_search_that_finds_nothing_adds_no_round_and_is_counted(stream: bool) -> None:
    upstream = ChatUpstream()
    service = make_service(upstream)
    chat = Chat(service)
    await _past_an_epoch(chat)
    before = _pushes(service, "no_match")
    out = await chat.send("Remind me what I said about zebra4242?", stream=stream)
    text = b"".join(out).decode() if stream else json.dumps(out)
    assert '"tool_calls"' not in text and "stop" in text  # an ordinary answer
    assert upstream.requests[-1]["messages"][-1]["role"] == "user"
    assert _pushes(service, "no_match") == before + 1 and _pushes(service, "pushed") == 0
    await chat.send(chat.user_text(300))
    await chat.send("What about code0300 and code0000?")  # code0300 is in the active pages, code0000 archived
    assert upstream.requests[-1]["messages"][-1]["role"] == "tool"
    await chat.send("And code0300 again, what was it?")  # held by an active page only: nothing to weigh
    assert upstream.requests[-1]["messages"][-1]["role"] == "user"
    assert _pushes(service, "no_match") == before + 3 and _pushes(service, "pushed") == 1
    await service.close()


async def test_ordinary_turns_are_weighed_and_not_pushed() -> None:
    upstream = ChatUpstream()
    service = make_service(upstream)
    chat = Chat(service)
    await _past_an_epoch(chat)
    for i in range(100, 110):
        await chat.send(chat.user_text(i))
    assert _pushes(service, "pushed") == 0 and _pushes(service, "no_match") >= 10
    await chat.send("Which code did I mention on turn 3, code0003?")  # no look-up phrasing needed
    assert upstream.requests[-1]["messages"][-1]["role"] == "tool" and _pushes(service, "pushed") == 1
    await service.close()


@pytest.mark.parametrize("overrides,headers", [({"memory_push": "off"}, None),
                                               ({}, {"Authorization": "Bearer sk-unit", "X-Memci-Memory": "off"})])
async def test_no_round_when_the_push_is_off(overrides: dict, headers: dict | None) -> None:
    upstream = ChatUpstream()
    service = make_service(upstream, **overrides)
    chat = Chat(service, headers=headers)
    await _past_an_epoch(chat)
    await chat.send("Remind me what I said about code0000?")
    assert upstream.requests[-1]["messages"][-1]["role"] == "user"
    assert _pushes(service, "pushed") == 0
    await service.close()


async def test_the_admin_view_accounts_for_the_push() -> None:
    upstream = ChatUpstream()
    service = make_service(upstream)
    chat = Chat(service)
    await _past_an_epoch(chat)
    await chat.send("Remind me what I said about code0000?")
    prompt = service.last_prompts.get(chat.conversation_id)
    assert prompt.accounting["tokens_pushed"] > 0
    assert ("push", len(prompt.messages) - 2, len(prompt.messages)) in prompt.blocks
    await service.close()


async def test_epochs_are_accounted_in_metrics_and_the_admin_view() -> None:
    upstream = ChatUpstream()
    service = make_service(upstream)
    chat = Chat(service)
    i = 0
    while chat.last_headers.get("X-Memci-Epoch") != "true":
        await chat.send(chat.user_text(i))
        i += 1
        assert i < 80, "no epoch"
    epoch = service.last_prompts.get(chat.conversation_id).accounting
    assert epoch["tokens_shed"] > 0 and epoch["tokens_prefilled"] > 0 and epoch["tokens_pushed"] == 0
    await chat.send(chat.user_text(i))
    after = service.last_prompts.get(chat.conversation_id).accounting
    assert after["tokens_shed"] == 0 and 0 < after["tokens_prefilled"] < epoch["tokens_prefilled"]
    registry = service.metrics.registry
    assert registry.get_sample_value("memci_epoch_tokens_shed_count") == 1
    assert registry.get_sample_value("memci_epoch_tokens_shed_sum") == epoch["tokens_shed"]
    assert registry.get_sample_value("memci_epoch_tokens_prefilled_sum") == epoch["tokens_prefilled"]
    await service.close()


def test_push_room_is_planned_only_for_messages_whose_archived_match_the_active_pages_lack() -> None:
    from memci_proxy.engine.config import EngineConfig
    from memci_proxy.recall.lexical.bm25 import BM25Index
    from memci_proxy.turn.push import PUSH_HIGH_WATERMARK, latest_user_text, need_of, with_push_room

    index = BM25Index()
    index.add("1", "user: We chose the blue logo and the budget is 4200 euros for the print run.")
    for i in range(2, 40):
        index.add(str(i), f"user: small talk number {i} about the weather")
    state = ConversationState()
    state.first_active_page = 1

    def wanted(messages: list[dict]) -> bool:
        return need_of(index, latest_user_text(messages), state, messages).wanted

    asked = [{"role": "user", "content": "The weather again."}, {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": "How much was the print budget?"}]
    assert latest_user_text(asked) == asked[-1]["content"]
    assert latest_user_text([*asked, {"role": "assistant", "content": "What was the budget?"}]) is None
    assert wanted(asked)
    assert not wanted([*asked[:-1], {"role": "user", "content": "What should I cook tonight?"}])
    # the words it matched are in the active pages: the prompt answers it, no round to make room for
    assert not wanted([{"role": "user", "content": "the print budget, blue logo"}, *asked[1:]])
    # a count: every mention answers it, those of the archive too, where the active pages name what it counts
    counted = [{"role": "user", "content": "The blue logo again, for the print run."}, asked[1],
               {"role": "user", "content": "How many times did we change the blue logo?"}]
    assert wanted(counted)
    assert not wanted([*counted[:-1], {"role": "user", "content": "Which blue logo did we choose?"}])
    config = EngineConfig()
    assert with_push_room(config).high_watermark == PUSH_HIGH_WATERMARK < config.high_watermark
    assert with_push_room(config).low_watermark == config.low_watermark
    high_floor = EngineConfig(low_watermark=0.85, high_watermark=0.95)
    assert with_push_room(high_floor).high_watermark == pytest.approx(0.90)  # still above where an epoch goes


async def test_a_look_up_near_the_top_of_the_budget_gets_an_epoch_and_its_round() -> None:
    """Without the room planned for it the push would answer "no room" until the next epoch."""
    from memci_proxy.turn.push import PUSH_HIGH_WATERMARK

    upstream = ChatUpstream()
    service = make_service(upstream, MemoryRepository())
    plans = []
    plan_once = service._plan_once

    async def recording(*args, **kwargs):
        turn = await plan_once(*args, **kwargs)
        plans.append(turn.plan)
        return turn

    service._plan_once = recording
    chat = Chat(service)
    await _past_an_epoch(chat)
    turn = 1000
    # up to where the prompt is above the push's ceiling and below the high watermark, with no epoch
    while plans[-1].estimated_tokens <= (PUSH_HIGH_WATERMARK + 0.03) * plans[-1].budget:
        await chat.send(chat.user_text(turn))
        turn += 1
        assert turn < 1100
    assert not plans[-1].epoch and plans[-1].estimated_tokens < 0.95 * plans[-1].budget
    await chat.send("Remind me what I said about code0000?")
    assert plans[-1].epoch and chat.last_headers["X-Memci-Epoch"] == "true"
    sent = upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent[-3:]] == ["user", "assistant", "tool"] and "code0000" in sent[-1]["content"]
    assert _pushes(service, "pushed") == 1 and _pushes(service, "no_room") == 0
    await service.close()


def test_a_page_an_earlier_round_brought_back_into_the_prompt_is_not_pushed_again() -> None:
    from memci_proxy.engine import EstimateCounter
    from memci_proxy.engine.feedback import add_hidden
    from memci_proxy.engine.state import ACTIVE, ARCHIVED, PageRecord
    from memci_proxy.recall.lexical.bm25 import BM25Index
    from memci_proxy.turn.push import need_of

    index = BM25Index()
    index.add("1", "user: We chose the blue logo and the budget is 4200 euros for the print run.")
    for i in range(2, 40):
        index.add(str(i), f"user: small talk number {i} about the weather")
    messages = [{"role": "user", "content": "The weather again."}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "How much was the print budget?"}]
    state = ConversationState(pages=[PageRecord(number=1, part=1, start=0, end=0, tokens=0, status=ARCHIVED),
                                     PageRecord(number=2, part=1, start=0, end=3, tokens=30, status=ACTIVE)],
                              first_active_page=1, hash_blob=b"\0" * 48, tokens=[10, 10, 10])
    assert need_of(index, messages[-1]["content"], state, messages).wanted
    pushed = [{"role": "assistant", "content": "", "tool_calls": [{"id": "p", "type": "function", "function": {
        "name": "recall", "arguments": '{"query": "print budget"}'}}]},
        {"role": "tool", "tool_call_id": "p", "content": "[Page 1] user: ... the budget is 4200 euros for the print run."}]
    state = add_hidden(state, 0, pushed, EstimateCounter())
    assert need_of(index, messages[-1]["content"], state, messages).reason == "in_prompt"


def test_look_ups_and_questions_plan_room_and_a_narrow_match_does_not() -> None:
    from memci_proxy.recall.push.salience import NOTHING
    from memci_proxy.turn.push import PUSH_HIGH_WATERMARK, QUESTION_HIGH_WATERMARK, Need

    narrow, full = Need("q?", NOTHING, "question", "narrow"), Need("q?", NOTHING, "question", "pushed")
    assert narrow.wanted and not narrow.room_wanted
    assert full.wanted and full.room_wanted
    look_up = Need("remind me", NOTHING, "look_up", "pushed")
    assert look_up.room_wanted
    assert look_up.room_ceiling == PUSH_HIGH_WATERMARK < full.room_ceiling == QUESTION_HIGH_WATERMARK
    assert not Need("I like tea.", NOTHING, "", "pushed").room_wanted


async def test_a_question_spanning_sessions_gets_each_page_holding_what_it_names_and_no_other() -> None:
    upstream = ChatUpstream()
    service = make_service(upstream, MemoryRepository(), write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    said = {2: "I went kayaking on the lake with Mira today.", 9: "Another kayaking trip, this time down the river.",
            15: "A third kayaking morning, windy but fun."}
    for i in range(20):
        await chat.send(said.get(i, chat.user_text(i)))
    await _past_an_epoch(chat)
    await chat.send("How many times did I go kayaking?")
    sent = upstream.requests[-1]["messages"]
    assert sent[-1]["role"] == "tool"
    shown = sent[-1]["content"].splitlines()[1:]
    assert all("kayaking" in line for line in shown)  # no page that shares only the question's other words
    assert all(text.split(",")[0] in sent[-1]["content"] for text in said.values())  # each session, not the best
    await service.close()


async def test_the_round_searches_the_subject_the_message_names_not_its_look_up_phrasing() -> None:
    """The round's pages are found by all the message's words, the subject included where the active pages name it
    too ("Alex"), the look-up phrasing ("earlier", "told") weighing nothing; as many pages as the rare words that
    matched find."""
    upstream = ChatUpstream()
    service = make_service(upstream, MemoryRepository(), write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    said = {3: "Alex was born when I was eleven; he is my little brother.",
            8: "Earlier I told you about the harbour, what was it called again?"}
    for i in range(20):
        await chat.send(said.get(i, chat.user_text(i)))
    await _past_an_epoch(chat)
    await chat.send("Alex called me today about his new job.")
    await chat.send("Earlier I told you how old I was when Alex was born. What was it?")
    sent = upstream.requests[-1]["messages"]
    assert sent[-1]["role"] == "tool"
    query = json.loads(sent[-2]["tool_calls"][0]["function"]["arguments"])["query"]
    assert "Alex" in query and "Earlier" not in query and "told" not in query, query
    assert "eleven" in sent[-1]["content"]
    assert "harbour" not in sent[-1]["content"]  # the earlier question put the same way
    await service.close()


async def test_a_wanted_push_starts_its_query_vectors_when_the_message_is_weighed() -> None:
    from memci_proxy.turn.push import push_queries

    service = make_service(ChatUpstream())
    chat = Chat(service)
    await _past_an_epoch(chat)
    started: list[list[str]] = []
    service.resolver.embed_queries_soon = lambda queries: started.append(list(queries))
    state = service.state_of(chat.conversation_id)
    messages = [*chat.messages, {"role": "user", "content": "Remind me what I said about code0000?"}]
    need = await service.push.weigh("t", chat.conversation_id, state, messages)
    assert need is not None and need.wanted
    assert started == [[push_queries(need)[1]]]  # before the turn is planned: computed while it is
    await service.push.weigh("t", chat.conversation_id, state, [*chat.messages, {"role": "user", "content": "ok"}])
    assert len(started) == 1  # nothing wanted, nothing embedded
    await service.close()


async def test_the_push_ranks_both_its_searches_by_the_vector_of_all_the_messages_words() -> None:
    """The matched words decide how many pages, all the words which; one vector (the latter's, started when the
    message is weighed, which an epoch does not change) ranks the candidates of both."""
    from memci_proxy.turn.push import push_queries

    upstream = ChatUpstream()
    service = make_service(upstream)
    chat = Chat(service)
    await _past_an_epoch(chat)
    searched: list[tuple[str, str]] = []
    search = service.resolver.search

    async def spy(ctx, query, k, *args, vector_text=None, **kwargs):
        searched.append((query, vector_text or query))
        return await search(ctx, query, k, *args, vector_text=vector_text, **kwargs)

    service.resolver.search = spy
    question = "Remind me what I said about code0000, and about the weekend trip to the harbour?"
    state = service.state_of(chat.conversation_id)
    need = await service.push.weigh("t", chat.conversation_id, state,
                                    [*chat.messages, {"role": "user", "content": question}])
    assert need is not None and need.wanted
    matched, query = push_queries(need)
    await chat.send(question)
    assert upstream.requests[-1]["messages"][-1]["role"] == "tool"  # pushed
    assert [q for q, _ in searched] == [matched, query] and matched != query
    assert {vector for _, vector in searched} == {query}
    await service.close()


async def test_a_client_gone_while_the_round_is_written_still_ends_the_turn() -> None:
    import asyncio

    repo = MemoryRepository()
    upstream = ChatUpstream()
    service = make_service(upstream, repo, write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    await _past_an_epoch(chat)
    question = {"role": "user", "content": "Remind me what I said about code0000?"}
    repo.delay = 0.2  # the answer is back long before the round's write
    handling = asyncio.ensure_future(service.handle(call_of([*chat.messages, question])))
    await asyncio.sleep(0.1)
    assert not handling.done()  # the answer waits for the write
    handling.cancel()  # the client goes away
    with pytest.raises(asyncio.CancelledError):
        await handling
    repo.delay = 0.0
    await asyncio.sleep(0.2)
    stored = ConversationState.from_bytes(repo.conversations[chat.conversation_id].state)
    assert any(g.messages[-1]["role"] == "tool" and "code0000" in g.messages[-1]["content"] for g in stored.hidden)
    chat.messages += [question, {"role": "assistant", "content": "gone"}]
    out = await asyncio.wait_for(chat.send(chat.user_text(501)), 2.0)  # the lock was released: no wait, no 409
    assert out["choices"][0]["message"]["content"]
    await service.close()

"""The managed turn in-process: the turn service against an upstream over httpx.MockTransport and an in-memory
repository. The durability contract (docs/architecture.md) is checked where it applies: before omission, behind the
answer, after a crash; and the snapshot version rules across two replicas without Redis."""

from __future__ import annotations

import asyncio
import json

import pytest

from memci_proxy.engine import ConversationState
from memci_proxy.store.ports import STALE, SnapshotBase, StaleState, TurnWrite
from memci_proxy.store.hot.memory import InProcessHotState
from memci_proxy.turn.identity import continues, split_system
from memci_proxy.turn.prompts import LastPrompt, LastPrompts
from turn_fakes import Chat, ChatUpstream, MemoryRepository, answer_of, call_of, make_service


def prompt_text(body: dict) -> str:
    return json.dumps(body["messages"], ensure_ascii=False)


async def test_what_leaves_the_prompt_is_stored_before_the_request_that_omits_it():
    repo = MemoryRepository()
    chat_ref: list[Chat] = []
    omitted_unstored: list[str] = []

    def check(body: dict) -> None:
        chat = chat_ref[0]
        if chat.conversation_id is None:
            return
        sent = prompt_text(body)
        stored = set(repo.user_texts(chat.conversation_id)) if chat.conversation_id in repo.conversations else set()
        for m in chat.messages:
            if m["role"] == "user" and m["content"] not in sent and m["content"] not in stored:
                omitted_unstored.append(m["content"][:20])

    upstream = ChatUpstream(on_request=check)
    service = make_service(upstream, repo, write_behind_max_lag_ms=60_000)  # nothing written behind meanwhile
    chat = Chat(service)
    chat_ref.append(chat)
    budget = service._config(4096).budget(64)
    for i in range(30):
        await chat.send(chat.user_text(i))
        assert len(prompt_text(upstream.requests[-1])) / 4 < budget * 1.1
    assert int(chat.last_headers["X-Memci-Pages-Archived"]) > 0
    assert omitted_unstored == []
    await service.close()
    assert repo.user_texts(chat.conversation_id) == [chat.user_text(i) for i in range(30)]


async def test_per_turn_appends_are_written_behind_the_answer_in_one_batch():
    repo = MemoryRepository()
    service = make_service(ChatUpstream(), repo, write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    for i in range(4):
        await chat.send(chat.user_text(i))
    await asyncio.sleep(0)  # the after-answer step of the last turn
    cid = chat.conversation_id
    assert repo.user_texts(cid) == [chat.user_text(0)]  # the first turn is stored at once (its identity)
    transactions = repo.transactions
    await service.flush(cid)
    assert repo.user_texts(cid) == [chat.user_text(i) for i in range(4)]
    assert repo.transactions == transactions + 1  # three turns, one write
    await service.close()


async def test_shutdown_writes_every_queued_turn():
    repo = MemoryRepository()
    service = make_service(ChatUpstream(), repo, write_behind_max_lag_ms=60_000)
    chats = [Chat(service, system=f"Chat {n}.") for n in range(5)]
    for i in range(3):
        for chat in chats:
            await chat.send(chat.user_text(i))
    await service.close()
    for chat in chats:
        assert repo.user_texts(chat.conversation_id) == [chat.user_text(i) for i in range(3)]


async def test_a_slow_store_holds_new_turns_back():
    repo = MemoryRepository()
    service = make_service(ChatUpstream(), repo, write_behind_max_lag_ms=0, write_behind_max_pending=1)
    chats = [Chat(service, system=f"Chat {n}.") for n in range(3)]
    for chat in chats:
        await chat.send(chat.user_text(0))  # stored at once: the first turn
    repo.delay = 0.2
    await asyncio.gather(*(chat.send(chat.user_text(1)) for chat in chats))
    await service.close()
    assert service.metrics.write_waits._value.get() >= 1
    for chat in chats:
        assert repo.user_texts(chat.conversation_id) == [chat.user_text(0), chat.user_text(1)]


async def _chat_past_an_epoch(service, extra_turns: int = 0) -> Chat:
    """A chat just past its first compaction epoch (and ``extra_turns`` more)."""
    chat = Chat(service)
    i = 0
    while int(chat.last_headers.get("X-Memci-Pages-Archived", 0)) == 0:
        await chat.send(chat.user_text(i))
        i += 1
        assert i < 80, "no epoch"
    for _ in range(extra_turns):
        await chat.send(chat.user_text(i))
        i += 1
    chat.turns = i
    return chat


async def test_an_epoch_stores_the_turns_queued_before_it_in_its_own_write():
    repo = MemoryRepository()
    service = make_service(ChatUpstream(), repo, write_behind_max_lag_ms=60_000)  # nothing written behind meanwhile
    chat = Chat(service)
    i = 0
    while True:
        before = repo.transactions
        await chat.send(chat.user_text(i))
        i += 1
        if chat.last_headers.get("X-Memci-Epoch") == "true" and i > 1:
            break
        assert i < 80, "no epoch"
    assert repo.transactions == before + 1  # the queued turns and the epoch: one write
    assert repo.user_texts(chat.conversation_id) == [chat.user_text(n) for n in range(i)]
    assert service.states.writer.newest(chat.conversation_id) is None
    await service.close()


class _EpochFailsOnce(MemoryRepository):
    """A store that refuses the first write of an epoch (the one holding a contents page)."""

    failed = 0

    async def save_turns(self, writes: list[TurnWrite]) -> list[str]:
        if not self.failed and any(w.contents is not None and w.entries and min(e.seq for e in w.entries) > 1
                                   for w in writes):
            self.failed += 1
            raise ConnectionError("database down for a moment")
        return await super().save_turns(writes)


async def test_an_epoch_whose_write_fails_keeps_the_turns_queued_before_it():
    repo = _EpochFailsOnce()
    service = make_service(ChatUpstream(), repo, write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    i = 0
    while not repo.failed:
        await chat.send(chat.user_text(i))
        i += 1
        assert i < 80, "no epoch"
    assert service.states.writer.newest(chat.conversation_id) is not None  # given back to the queue
    for _ in range(3):
        await chat.send(chat.user_text(i))
        i += 1
    await service.close()
    assert repo.user_texts(chat.conversation_id) == [chat.user_text(n) for n in range(i)]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_recall_exchange_is_stored_before_the_next_round_or_alongside_it(stream):
    """A stream relays each round's events as they come: the exchange is stored before the next round. A whole
    answer's next round goes upstream while the exchange is stored; the answer is handed over after the write."""
    repo = MemoryRepository()
    seen: list[bool] = []

    def check(body: dict) -> None:
        if body["messages"][-1]["role"] == "tool":
            stored = repo.conversations[chat.conversation_id]
            state = ConversationState.from_bytes(stored.state)
            seen.append(bool(stored.hidden) and any(g.messages[-1]["role"] == "tool" for g in state.hidden))

    upstream = ChatUpstream(on_request=check)
    service = make_service(upstream, repo, write_behind_max_lag_ms=60_000)
    chat = await _chat_past_an_epoch(service)
    repo.delay = 0.0 if stream else 0.05  # slower than the upstream: the write is under way while the round is sent
    answer = await service.handle(call_of([*chat.messages, {"role": "user", "content": 'Read page 1. '
                                                                                        '[[recall:{"pages": [1]}]]'}],
                                          stream))
    if not stream:  # (a stream's rounds happen while its events are read)
        stored = ConversationState.from_bytes(repo.conversations[chat.conversation_id].state)
        assert any(g.messages[-1]["role"] == "tool" for g in stored.hidden)  # before the answer is seen
    out = [event async for event in answer.events] if stream else json.loads(answer.body)
    repo.delay = 0.0
    chat.messages += [{"role": "user", "content": 'Read page 1. [[recall:{"pages": [1]}]]'},
                      {"role": "assistant", "content": "streamed" if stream else out["choices"][0]["message"]["content"]}]
    assert seen == ([True] if stream else [False])
    text = b"".join(out).decode() if stream else out["choices"][0]["message"]["content"]
    assert "Tool result:" in text and "code0000" in text
    assert "tool_calls" not in text and "[DONE]" in text if stream else True
    await chat.send(chat.user_text(99))
    spliced = [m for m in upstream.requests[-1]["messages"] if m.get("role") == "tool"]
    assert spliced and "code0000" in spliced[0]["content"]  # the exchange is kept for later turns
    await service.close()


async def test_after_a_crash_with_writes_pending_the_stored_state_and_the_resent_history_go_on():
    repo = MemoryRepository()
    upstream = ChatUpstream()
    first = make_service(upstream, repo, write_behind_max_lag_ms=60_000)
    chat = await _chat_past_an_epoch(first, 4)
    cid, turns = chat.conversation_id, chat.turns
    assert len(repo.user_texts(cid)) < turns  # turns after the last epoch are still queued
    first.states.writer._task.cancel()  # the process dies: its queue is gone
    second = make_service(upstream, repo)
    chat.service = second
    await chat.send(chat.user_text(turns))
    assert chat.conversation_id == cid
    budget = second._config(4096).budget(64)
    assert len(prompt_text(upstream.requests[-1])) / 4 < budget * 1.1
    await second.flush(cid)
    assert repo.user_texts(cid) == [chat.user_text(i) for i in range(turns + 1)]
    archived = [p for p in repo.conversations[cid].pages.values() if p.state != "active"]
    assert archived
    for page in archived:  # every archived page reads back through the recall tool
        out = await chat.send(f'Read page {page.number}. [[recall:{{"pages": ["{page.number}"]}}]]')
        text = out["choices"][0]["message"]["content"]
        assert "Tool result:" in text and "code" in text and "not found" not in text.lower(), (page.number, text)
    await second.close()


async def test_two_replicas_without_redis_never_overwrite_each_other():
    repo = MemoryRepository()
    upstream = ChatUpstream()
    a, b = make_service(upstream, repo), make_service(upstream, repo)  # each its own locks and hot state
    chat = Chat(a)
    sent = []
    for i, replica in enumerate([a, b, b, a, a, b, a, b, b, a, b, a]):
        chat.service = replica
        text = chat.user_text(i)
        await chat.send(text)
        sent.append(text)
    await a.close()
    await b.close()
    assert repo.user_texts(chat.conversation_id) == sent
    stale = sum(s.metrics.engine_errors.labels("stale_state")._value.get() for s in (a, b))
    assert stale > 0


async def test_the_same_version_with_other_content_is_stale_state():
    repo = MemoryRepository()
    await repo.create_conversation("t", "c")
    await repo.save_turns([TurnWrite("t", "c", b"one", 1, SnapshotBase(0, None))])
    with pytest.raises(StaleState):
        await repo.save_turn("t", "c", [], [], [], b"two", 1, [])  # no base: the same version is not older
    assert await repo.save_turns([TurnWrite("t", "c", b"two", 2, SnapshotBase(1, "0" * 32))]) == [STALE]
    assert (await repo.load_snapshot("t", "c")) == (b"one", 1)


async def test_a_store_that_is_down_at_an_epoch_gets_a_trimmed_request():
    repo = MemoryRepository()
    upstream = ChatUpstream()
    service = make_service(upstream, repo)
    chat = Chat(service)
    for i in range(8):
        await chat.send(chat.user_text(i))
    repo.fail = ConnectionError("database down")
    budget = service._config(4096).budget(64)
    unmanaged = 0
    for i in range(8, 60):
        answer = await service.handle(call_of(chat.messages + [{"role": "user", "content": chat.user_text(i)}]))
        out = await answer_of(answer)
        assert answer.status == 200
        chat.messages += [{"role": "user", "content": chat.user_text(i)},
                          {"role": "assistant", "content": out["choices"][0]["message"]["content"]}]
        assert len(prompt_text(upstream.requests[-1])) / 4 < budget * 1.1  # never over budget
        unmanaged += "X-Memci-Conversation-Id" not in answer.headers  # nothing archived without the store
        if service.metrics.trimmed_requests._value.get() >= 2:
            break
    else:
        raise AssertionError("never trimmed")
    assert unmanaged >= 2
    repo.fail = None
    await service.close()
    assert repo.user_texts(chat.conversation_id)[:8] == [chat.user_text(i) for i in range(8)]


async def test_plain_forwarding_is_the_exchange_with_zero_rounds():
    upstream = ChatUpstream()
    service = make_service(upstream, recall_enabled=False)
    chat = Chat(service)
    for i in range(3):
        await chat.send(chat.user_text(i))
    assert all("tools" not in body for body in upstream.requests)
    await service.close()
    assert len(upstream.requests) == 3  # (each request is counted at the edge: memci_proxy.api.request_metrics)


def test_a_fork_is_an_edit_of_the_known_history():
    from memci_proxy.engine import EngineConfig, EstimateCounter, TurnInput, plan
    from turn_fakes import settings

    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    raw = json.dumps(messages).encode()
    system, rest = split_system(messages)
    state = plan(None, TurnInput(system=system, messages=rest, raw_messages=raw), EngineConfig.from_settings(settings(), 4096),
                 EstimateCounter()).state
    longer = messages + [{"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    assert continues(state, longer[1:], json.dumps(longer).encode())
    assert continues(state, longer[1:])  # without the raw bytes: by entry hashes
    edited = [*messages[:3], {"role": "user", "content": "C"}]
    assert not continues(state, edited[1:], json.dumps(edited).encode())


def test_the_last_prompts_are_bounded_in_entries_and_bytes():
    prompts = LastPrompts(max_entries=3, max_bytes=5000)
    for i in range(4):
        prompts.put(f"c{i}", LastPrompt([], [], False, 0.0, size=2000))
    assert len(prompts) == 2 and prompts.get("c0") is None and prompts.get("c3") is not None
    assert prompts.bytes <= 5000
    assert prompts.cache_stats().bytes == prompts.bytes
    for i in range(5):
        prompts.put(f"d{i}", LastPrompt([], [], False, 0.0, size=10))
    assert len(prompts) == 3


async def test_the_hot_copy_and_tip_stay_in_sync_with_redis_like_shared_hot_state():
    """Two replicas sharing one hot state (as with Redis): the next turn on either continues from the newest state,
    so both send the prompts one replica would."""
    repo = MemoryRepository()
    hot = InProcessHotState()
    upstream_one, upstream_two = ChatUpstream(), ChatUpstream()
    one = make_service(upstream_one, MemoryRepository())
    a = make_service(upstream_two, repo, hot=hot)
    b = make_service(upstream_two, repo, hot=hot)
    for s in (a, b):
        s.states.shared_hot = True
    single, pair = Chat(one), Chat(a)
    for i in range(14):
        pair.service = (a, b)[i % 2]
        await single.send(single.user_text(i))
        await pair.send(pair.user_text(i))
    assert [r["messages"] for r in upstream_one.requests] == [r["messages"] for r in upstream_two.requests]
    for s in (one, a, b):
        await s.close()
    assert repo.user_texts(pair.conversation_id) == [pair.user_text(i) for i in range(14)]
    assert sum(s.metrics.engine_errors.labels("stale_state")._value.get() for s in (a, b)) == 0


async def test_without_write_behind_every_turn_is_stored_before_its_answer():
    repo = MemoryRepository()
    service = make_service(ChatUpstream(), repo, write_behind=False)
    chat = Chat(service)
    for i in range(3):
        await chat.send(chat.user_text(i))
        assert repo.user_texts(chat.conversation_id) == [chat.user_text(j) for j in range(i + 1)]
    await service.close()


async def test_a_new_conversation_is_told_to_the_memory_workers_so_its_summary_is_not_read():
    class Memory:
        def __init__(self) -> None:
            self.new: list[str] = []
            self.summary_reads: list[str] = []

        def created(self, tenant: str, cid: str) -> None:
            self.new.append(cid)

        async def covering(self, tenant: str, cid: str, through: int, end_user: str = ""):
            from memci_proxy.workers.covering import Covered

            self.summary_reads.append(cid)
            return Covered("", "")

        async def latest_profile(self, tenant: str, conversation_id: str, end_user: str = "") -> str:
            return ""

        def touch(self, tenant: str, cid: str) -> None: ...

        async def notify(self, tenant: str, cid: str, summaries: bool = True) -> None: ...

        def keep_base(self, *args) -> None: ...

    service = make_service(ChatUpstream())
    service.memory = memory = Memory()
    chat = Chat(service)
    await chat.send(chat.user_text(0))
    assert memory.new == [chat.conversation_id] and memory.summary_reads == []
    await service.close()


async def test_an_answer_without_recall_rounds_reaches_the_client_byte_for_byte():
    import httpx

    answer = (b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
              b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
              b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,'
              b'"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0}},"system_fingerprint":"fp"}')

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=answer, headers={"Content-Type": "application/json"})

    service = make_service(upstream)
    got = await service.handle(call_of([{"role": "user", "content": "hello"}]))
    assert got.status == 200 and got.body == answer  # usage details the proxy does not know are kept too
    await service.close()


async def test_the_stored_pages_follow_the_state_though_an_epoch_writes_only_the_changed_ones():
    from memci_proxy.turn.rows import _page_row

    repo = MemoryRepository()
    writes: list[int] = []
    save_turns = repo.save_turns

    async def counting(batch):
        writes.extend(len(w.pages) for w in batch)
        return await save_turns(batch)

    repo.save_turns = counting
    service = make_service(ChatUpstream(), repo)
    chat = await _chat_past_an_epoch(service)
    epochs = 0
    for i in range(60):
        await chat.send(chat.user_text(chat.turns + i) + (' [[recall:{"pages": [1]}]]' if i == 20 else ""))
        epochs += chat.last_headers.get("X-Memci-Epoch") == "true"
        await service.flush(chat.conversation_id)
        state = ConversationState.from_bytes(repo.conversations[chat.conversation_id].state)
        assert repo.conversations[chat.conversation_id].pages == {p.label: _page_row(p) for p in state.pages}
    assert epochs >= 2 and len(state.pages) > 20
    assert max(writes[1:]) < len(state.pages) / 2  # no write re-sends every page
    await service.close()

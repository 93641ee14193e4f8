"""What a turn with a user id costs: no search of a user who has no other conversation yet, and no write of the
asking conversation's own pages before its search (the search leaves it out)."""

from __future__ import annotations

import asyncio

from memci_proxy.engine.state import ConversationState, PageRecord
from memci_proxy.metrics import Metrics
from memci_proxy.turn import across
from memci_proxy.turn.across import UserMemory

QUESTION = "What did I say about the zebracanary festival in Lisbon?"


class Repo:
    def __init__(self) -> None:
        self.pages: dict[tuple[str, str], str] = {}  # (conversation, page) -> text
        self.writes: list[list[tuple[str, str]]] = []
        self.searches = 0

    async def put_user_pages(self, batch):
        self.writes.append([(c, row.number) for _, _, c, row in batch])
        self.pages.update({(c, row.number): row.text for _, _, c, row in batch})

    async def user_page_counts(self, tenant, end_user):
        out: dict[str, int] = {}
        for c, _ in self.pages:
            out[c] = out.get(c, 0) + 1
        return out

    async def user_page_candidates(self, tenant, end_user, conversation_id, tsquery, counted, limit):
        self.searches += 1
        return []

    async def user_page_texts(self, tenant, end_user, pages):
        return []


def chat(turns: int, answered: bool) -> tuple[ConversationState, list[dict]]:
    """A state of ``turns`` pages and the messages a request sends (the last page's answer when ``answered``)."""
    messages: list[dict] = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"{QUESTION} ({n})"})
        if n < turns - 1 or answered:
            messages.append({"role": "assistant", "content": f"The festival, part {n}."})
    pages = []
    for n in range(turns):
        start = 2 * n
        pages.append(PageRecord(n + 1, 1, start, min(start + 2, len(messages)), 10, has_user=True))
    return ConversationState(pages=pages), messages


def outcomes(metrics: Metrics) -> dict[str, float]:
    return {s.labels["outcome"]: s.value for m in metrics.user_memory_pushes.collect() for s in m.samples
            if s.name.endswith("_total")}


async def test_a_users_first_conversation_is_not_searched_and_a_second_one_is():
    repo, metrics = Repo(), Metrics()
    memory = UserMemory(repo, metrics, enabled=True, timeout_s=1.0)
    for turn in range(1, 4):
        state, messages = chat(turn, answered=False)
        assert await memory.weigh("t", "u1", "c1", state, messages) is None
        memory.note("t", "u1", "c1", state, messages, 2 * turn - 2)
    assert repo.searches == 0 and outcomes(metrics).get("alone") == 3
    state, messages = chat(1, answered=False)
    assert await memory.weigh("t", "u1", "c2", state, messages) is None
    assert repo.searches == 1  # c1 has pages: searched, they were written first
    assert {c for c, _ in repo.pages} == {"c1"}
    await memory.close()


async def test_a_search_does_not_wait_for_the_writes_of_its_own_conversation():
    repo = Repo()
    memory = UserMemory(repo, Metrics(), enabled=True, timeout_s=1.0)
    repo.pages[("c0", "1")] = "user: an older conversation about the zebracanary festival"
    for turn in range(1, 3):
        state, messages = chat(turn, answered=False)
        await memory.weigh("t", "u1", "c1", state, messages)
        memory.note("t", "u1", "c1", state, messages, 2 * turn - 2)
    assert repo.searches == 2 and repo.writes == []  # c1's own pages wait: the search leaves them out
    await memory.close()
    assert repo.writes == [[("c1", "1"), ("c1", "2")]]


async def test_pages_being_written_count_for_a_conversation_asking_meanwhile():
    """The pages of the user's first conversation are being written (taken from those waiting, not committed) when a
    second conversation counts the user's pages: they count, so the second is not taken for the user's only one and
    its question, seconds later, searches them (until now it was skipped as "alone" for five seconds)."""
    class SlowWrites(Repo):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()
            self.writing = asyncio.Event()

        async def put_user_pages(self, batch):
            self.writing.set()
            await self.release.wait()
            await super().put_user_pages(batch)

    repo, metrics = SlowWrites(), Metrics()
    memory = UserMemory(repo, metrics, enabled=True, timeout_s=1.0)
    state, messages = chat(1, answered=True)
    memory.note("t", "u1", "c1", state, messages, 0)
    await repo.writing.wait()  # c1's page taken by the flush, not in the repository yet
    state, messages = chat(1, answered=False)
    assert await memory.weigh("t", "u1", "c2", state, messages) is None
    assert repo.searches == 1 and "alone" not in outcomes(metrics)
    repo.release.set()
    await memory.close()
    assert memory._writing == {}


async def test_a_turns_page_is_written_once_with_its_answer():
    repo = Repo()
    memory = UserMemory(repo, Metrics(), enabled=True, timeout_s=1.0)
    for turn in range(1, 4):  # each request: the last answer and a new question
        state, messages = chat(turn, answered=False)
        memory.note("t", "u1", "c1", state, messages, max(0, 2 * turn - 3))
        await asyncio.sleep(2 * across.FLUSH_DELAY_S)  # turns further apart than the writes are gathered
    written = [page for batch in repo.writes for page in batch]
    assert written == [("c1", "1"), ("c1", "2")]  # each once; the third waits for its answer
    assert "part 0" in repo.pages[("c1", "1")] and "part 1" in repo.pages[("c1", "2")]
    await memory.close()
    assert repo.writes[-1] == [("c1", "3")] and "(2)" in repo.pages[("c1", "3")]  # closing writes it as it is


async def test_a_page_whose_answer_does_not_come_is_written_without_it(monkeypatch):
    monkeypatch.setattr(across, "ANSWER_WAIT_S", 0.1)
    monkeypatch.setattr(across, "ANSWER_SWEEP_S", 0.05)
    repo = Repo()
    memory = UserMemory(repo, Metrics(), enabled=True, timeout_s=1.0)
    state, messages = chat(1, answered=False)
    memory.note("t", "u1", "c1", state, messages, 0)
    await asyncio.sleep(across.FLUSH_DELAY_S * 1.5)
    assert repo.writes == []
    await asyncio.sleep(0.1 + across.FLUSH_DELAY_S * 2)
    assert repo.writes == [[("c1", "1")]] and not memory._unanswered and memory._unanswered_rows == 0
    await memory.close()


async def test_another_conversations_question_finds_a_page_still_waiting_for_its_answer():
    repo = Repo()
    memory = UserMemory(repo, Metrics(), enabled=True, timeout_s=1.0)
    state, messages = chat(1, answered=False)
    memory.note("t", "u1", "c1", state, messages, 0)
    state, messages = chat(1, answered=False)
    await memory.weigh("t", "u1", "c2", state, messages)
    assert repo.searches == 1 and repo.writes == [[("c1", "1")]]  # written before the search
    await memory.close()

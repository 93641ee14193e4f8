"""The summary a turn reads: a conversation this process just created has none, so its next turns do not ask the
database for it (one query fewer per new conversation's second turn)."""

from __future__ import annotations

from memci_proxy.workers.runner import MemoryWorker


class CountingRepo:
    def __init__(self) -> None:
        self.summary_reads = 0

    async def get_summary(self, tenant: str, conversation_id: str, kind: str):
        self.summary_reads += 1
        return None


async def test_a_created_conversation_reads_no_summary_from_the_database():
    repo = CountingRepo()
    worker = MemoryWorker(repo, summarizer=None, queue=None)
    worker.created("t", "new")
    assert await worker.latest_summary("t", "new") == ""
    assert repo.summary_reads == 0
    assert await worker.latest_summary("t", "older") == ""  # not created here: read once, then cached
    assert await worker.latest_summary("t", "older") == ""
    assert repo.summary_reads == 1


def test_a_summary_prompt_labels_each_role_once():
    from memci_proxy.workers.text import messages_text

    text = messages_text([{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": None,
                           "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '{"a": 1}'}}]}], 100)
    assert text.splitlines() == ["user: hi", 'assistant called f({"a": 1})']

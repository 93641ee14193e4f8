"""At an epoch that archives pages, the turn service hands the memory workers the last upstream prompt that still
held them: the prompt sent for the turn before the epoch, byte for byte, not the epoch's own (which no longer holds
them). A summary job on it is that prompt plus one message."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec

from memci_proxy.workers.covering import Covered
from memci_proxy.workers.prefix import SUMMARY_INSTRUCTION, SummaryBase, covers, job_body, page_instruction
from turn_fakes import Chat, ChatUpstream, make_service

encode = msgspec.json.Encoder().encode


class RecordingMemory:
    """The memory worker's side the turn calls."""

    def __init__(self) -> None:
        self.bases: list[tuple[str, str, SummaryBase]] = []
        self.notified: list[str] = []
        self.touched = 0

    def keep_base(self, tenant: str, conversation_id: str, base: SummaryBase) -> None:
        self.bases.append((tenant, conversation_id, base))

    def touch(self, tenant: str, conversation_id: str) -> None:
        self.touched += 1

    def created(self, tenant: str, conversation_id: str) -> None: ...

    async def notify(self, tenant: str, conversation_id: str, summaries: bool = True) -> None:
        self.notified.append(conversation_id)

    async def covering(self, tenant: str, conversation_id: str, through: int, end_user: str = "") -> Covered:
        return Covered("", "")

    async def latest_profile(self, tenant: str, conversation_id: str, end_user: str = "") -> str:
        return ""


async def test_the_base_kept_at_an_epoch_is_the_prompt_sent_before_it() -> None:
    upstream = ChatUpstream()
    raw: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            raw.append(request.content)
        return upstream(request)

    service = make_service(handler, write_behind=False)
    memory = service.memory = RecordingMemory()
    chat = Chat(service)
    for i in range(80):
        await chat.send(chat.user_text(i))
        if memory.bases:
            break
    assert memory.bases, "no epoch archived pages"
    assert memory.touched == len(raw)  # every turn
    assert memory.notified == [chat.conversation_id]
    tenant, cid, base = memory.bases[0]
    assert cid == chat.conversation_id
    # the kept prompt is the one the upstream received for the turn before the epoch, to the byte
    assert encode(base.body) == raw[-2]
    before, epoch = json.loads(raw[-2]), json.loads(raw[-1])
    assert chat.last_headers["X-Memci-Epoch"] == "true"
    # the oldest user message left the prompt at the epoch; the kept prompt still holds it
    oldest: dict[str, Any] = chat.messages[1]
    assert covers(before["messages"], [oldest]) and not covers(epoch["messages"], [oldest])
    # the job: the kept prompt's messages byte for byte, and one instruction message after them
    job = job_body(base.body, page_instruction(SUMMARY_INSTRUCTION, oldest, oldest), 200)
    assert encode(job["messages"][:-1]) == encode(before["messages"])
    assert encode(job["tools"]) == encode(before["tools"]) and job["model"] == before["model"]
    assert job["messages"][-1]["role"] == "user" and len(job["messages"]) == len(before["messages"]) + 1
    await service.close()

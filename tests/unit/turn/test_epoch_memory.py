"""The summary an epoch puts into the prompt is the one covering every page archived before it, whenever its job
finished: late jobs make the epoch wait, never change what it renders (replicas, and one proxy run twice, send the
same prompts)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from memci_proxy.workers.covering import Covered
from turn_fakes import Chat, ChatUpstream, make_service

TURNS = 60


class Jobs:
    """The memory workers seen by the turn: the summary of the pages archived up to message N is known as soon as
    it is asked for (``late`` False), or only once the epoch waits for it (``late``), or never (``lost``)."""

    def __init__(self, late: bool = False, lost: bool = False) -> None:
        self.late, self.lost = late, lost
        self.waits: list[int] = []

    async def covering(self, tenant: str, cid: str, through: int, end_user: str = "") -> Covered | None:
        if through < 0:
            return Covered("", "")
        return None if self.late or self.lost else Covered(f"Summary through message {through}.", "")

    async def wait_covering(self, tenant: str, cid: str, through: int, end_user: str = "") -> Covered | None:
        self.waits.append(through)
        return None if self.lost else Covered(f"Summary through message {through}.", "")

    async def latest_profile(self, tenant: str, cid: str, end_user: str = "") -> str:
        return ""

    def created(self, tenant: str, cid: str) -> None: ...

    def touch(self, tenant: str, cid: str) -> None: ...

    async def notify(self, tenant: str, cid: str, summaries: bool = True) -> None: ...

    def keep_base(self, *args: Any) -> None: ...


async def prompts(jobs: Jobs) -> list[list[dict[str, Any]]]:
    upstream, sent = ChatUpstream(), []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            sent.append(json.loads(request.content)["messages"])
        return upstream(request)

    service = make_service(handler, write_behind=False)
    service.memory = jobs
    chat = Chat(service)
    for i in range(TURNS):
        await chat.send(chat.user_text(i))
    await service.close()
    return sent


def summaries(sent: list[list[dict[str, Any]]]) -> list[str]:
    """The summary each prompt shows ('' when none), in order."""
    out = []
    for messages in sent:
        text = json.dumps(messages)
        out.append(text.split("Summary through message ", 1)[1].split(".", 1)[0] if "Summary through" in text else "")
    return out


async def test_a_late_summary_job_makes_the_epoch_wait_and_changes_no_prompt():
    on_time, late = Jobs(), Jobs(late=True)
    first, second = await prompts(on_time), await prompts(late)
    assert first == second
    shown = summaries(first)
    assert len(set(shown) - {""}) >= 2, shown  # two epochs after the first each took the newer summary
    assert late.waits and on_time.waits == []
    # a summary appears at an epoch and stays until the next one: no block for one turn only
    changes = [i for i in range(1, len(shown)) if shown[i] != shown[i - 1]]
    assert all(shown[i] != "" for i in changes)


async def test_a_lost_summary_job_leaves_the_summary_the_state_has():
    lost = Jobs(lost=True)
    assert set(summaries(await prompts(lost))) == {""}
    assert lost.waits  # each epoch waited (at most summary_wait_s in a deployment)

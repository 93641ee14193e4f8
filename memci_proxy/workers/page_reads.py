"""The pages an epoch archived, read once for both of its jobs.

The summary and the profile job of an epoch each read the pages archived after their own watermark, which is the
same message when both are up to date: the second job takes the first one's read instead of reading the pages and
their messages again. Only the other kind of job takes it, only for the same watermark, within ``KEPT_S`` and
before the conversation's next epoch (``drop``): a job retried, or a job after an epoch that archived more, reads
anew. A deleted conversation's read is dropped with it.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.workers.summaries import PageReader, PageText, new_archived_pages

KEPT_S = 60.0  # an epoch's pages read by its first job, kept this long for the second


class EpochPageReads:
    def __init__(self, repo: Any) -> None:
        self.repo = repo
        # conversation -> (job kind, watermark, when, pages)
        self._reads: BoundedLru[tuple[str, str], tuple[str, int, float, list[PageText]]] = BoundedLru(
            "job_pages", 1000, 32 * 2**20,
            size_of=lambda k, v: 256 + sum(2 * len(p.text) + 512 * len(p.rows) for p in v[3]))

    def reader(self, kind: str) -> PageReader:
        """The page reader of a job of ``kind`` (memci_proxy.workers.queue: SUMMARY_JOB, PROFILE_JOB)."""
        return functools.partial(self.read, kind)

    async def read(self, kind: str, tenant: str, conversation_id: str, after_seq: int, message_chars: int
                   ) -> list[PageText]:
        key = (tenant, conversation_id)
        read = self._reads.pop(key)
        if read is not None and read[0] != kind and read[1] == after_seq and time.monotonic() - read[2] < KEPT_S:
            return read[3]
        pages = await new_archived_pages(self.repo, tenant, conversation_id, after_seq, message_chars)
        if pages:
            self._reads.put(key, (kind, after_seq, time.monotonic(), pages))
        return pages

    def drop(self, tenant: str, conversation_id: str) -> None:
        """A new epoch (its pages are not in the read), or the conversation deleted."""
        self._reads.pop((tenant, conversation_id))

    def held(self, tenant: str, conversation_id: str) -> bool:
        return self._reads.peek((tenant, conversation_id)) is not None

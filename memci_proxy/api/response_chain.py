"""The chain behind `previous_response_id`: each stored answer's messages, kept by the proxy itself.

Stored in PostgreSQL (memci_proxy.store.ports.ResponseChains), so a chain survives a restart and is shared by replicas;
the newest chains are also kept in this process (bounded in entries and bytes, memci_proxy.caches), so a conversation
that continues here never reads its chain's messages back: a cached chain is only checked to be still stored (any
replica may have erased its conversation). Erasing a conversation drops the chains it is part of (``forget``).

The answer does not wait for its chain's write (``keep`` queues it; the answers of one moment are written by one
task, at the next tick of the event loop): an id is durable before the client can use it, as far as a client can
tell. On this replica a look-up of an id whose write is still under way waits for that write; another
replica that does not find an id looks again for up to ``MISS_WAIT_S`` (the write lands within milliseconds of the
answer, before a client has read it and sent its next request). Shutdown and erasure wait for the pending writes
(``flush``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from memci_proxy.caches import BoundedLru
from memci_proxy.wire.errors import ProxyError

CACHED_CHAINS = 512
CACHED_BYTES = 64 << 20
MISS_WAIT_S = 0.25  # an id another replica answered a moment ago may still be on its way to the store
MISS_POLL_S = 0.05

log = logging.getLogger("memci.api")

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class _Chain:
    messages: tuple[dict[str, Any], ...]
    ids: tuple[str, ...]  # the answers it is made of, oldest first
    size: int  # bytes of the messages as JSON (what the cache's byte bound counts)


def _size(messages: Iterable[dict[str, Any]]) -> int:
    return sum(len(_encode(m)) for m in messages)


class ResponseChain:
    def __init__(self, store: Any, cached: int = CACHED_CHAINS, cached_bytes: int = CACHED_BYTES,
                 miss_wait_s: float = MISS_WAIT_S) -> None:
        self.store = store  # a memci_proxy.store.ports.ResponseChains, or None (this process only)
        self.miss_wait_s = miss_wait_s
        self._pending: dict[tuple[str, str], asyncio.Future[None]] = {}  # answers whose write is under way
        self._queued: list[tuple[tuple[str, str], tuple[Any, ...]]] = []  # writes not sent yet (one batch)
        self._chains: BoundedLru[tuple[str, str], _Chain] = BoundedLru(
            "response_chains", cached, cached_bytes, size_of=lambda _k, c: c.size + 256)

    @property
    def cache(self) -> BoundedLru[tuple[str, str], _Chain]:
        return self._chains

    async def messages(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        """The messages of the chain ending at ``response_id``; 404 (Responses' shape) when there is none."""
        found = await self._chain(tenant, response_id)
        if found is None:
            raise ProxyError(404, f"Previous response with id '{response_id}' not found.", "invalid_request_error",
                             "previous_response_not_found", "previous_response_id")
        return list(found.messages)

    async def _chain(self, tenant: str, response_id: str) -> _Chain | None:
        key = (tenant, response_id)
        found = self._chains.get(key)
        if self.store is None:
            return found
        if found is not None:
            await self._written(tenant, found.ids)
            if await self.store.all_present(tenant, found.ids):
                return found
            self._chains.pop(key)
        await self._written(tenant, (response_id,))
        links = await self.store.load_links(tenant, response_id)
        waited = 0.0
        while links is None and waited < self.miss_wait_s:  # another replica's answer, its write still on its way
            await asyncio.sleep(MISS_POLL_S)
            waited += MISS_POLL_S
            links = await self.store.load_links(tenant, response_id)
        if links is None:
            return None
        messages = tuple(m for _, added in links for m in added)
        found = _Chain(messages, tuple(i for i, _ in links), _size(messages))
        self._chains.put(key, found)
        return found

    async def keep(self, tenant: str, response_id: str, previous_id: str | None, history: list[dict[str, Any]],
                   added: list[dict[str, Any]], conversation_id: str | None = None) -> None:
        """One answer stored: ``history`` is its previous chain's messages, ``added`` what this turn added. Its write
        to the store is started, not awaited (a look-up here waits for it)."""
        if self.store is not None:
            self._start_write((tenant, response_id), (tenant, response_id, previous_id, added, conversation_id))
        before = self._chains.peek((tenant, previous_id)) if previous_id else None
        if previous_id and before is None:
            return  # the previous chain left the cache: which answers make it up is read back with it
        ids, size = (before.ids, before.size) if before else ((), 0)
        self._chains.put((tenant, response_id), _Chain((*history, *added), (*ids, response_id), size + _size(added)))

    def _start_write(self, key: tuple[str, str], row: tuple[Any, ...]) -> None:
        loop = asyncio.get_running_loop()
        self._pending[key] = loop.create_future()
        self._queued.append((key, row))
        if len(self._queued) == 1:  # the answers of this moment go in one batch, written at the next tick
            loop.call_soon(lambda: loop.create_task(self._write_queued()))

    async def _write_queued(self) -> None:
        batch, self._queued = self._queued, []
        if not batch:
            return
        error: BaseException | None = None
        try:
            for _, row in batch:
                await self.store.put_response(*row)
        except Exception as exc:  # the id is not durable: a later look-up of it finds nothing (404)
            log.exception("could not store %d Responses answers", len(batch))
            error = exc
        for key, _ in batch:
            done = self._pending.pop(key, None)
            if done is not None and not done.done():
                done.set_result(None)
            if error is not None:
                self._chains.pop(key)

    async def _written(self, tenant: str, response_ids: Iterable[str]) -> None:
        """Until the writes under way of these answers are done."""
        waits = [w for w in (self._pending.get((tenant, i)) for i in response_ids) if w is not None]
        if waits:
            await asyncio.gather(*waits)

    async def flush(self) -> None:
        """Until every write under way is done (shutdown, erasure)."""
        if self._queued:
            await self._write_queued()
        if self._pending:
            await asyncio.gather(*list(self._pending.values()))

    def forget(self, tenant: str, response_ids: Iterable[str]) -> None:
        """Erased answers (their conversation deleted): every cached chain holding one of them goes."""
        gone = set(response_ids)
        for key in self._chains:
            chain = self._chains.peek(key)
            if key[0] == tenant and chain is not None and gone.intersection(chain.ids):
                self._chains.pop(key)

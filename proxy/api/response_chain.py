"""The chain behind `previous_response_id`: each stored answer's messages, kept by the proxy itself.

Stored in PostgreSQL (proxy.store.ports.ResponseChains) before the answer that names the new id reaches the
client, so a chain survives a restart and is shared by replicas; the newest chains are also kept in this
process (bounded in entries and bytes, proxy.caches), so a conversation that continues here never reads its
chain's messages back: a cached chain is only checked to be still stored (any replica may have erased its
conversation). Erasing a conversation drops the chains it is part of (``forget``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from proxy.caches import BoundedLru
from proxy.wire.errors import ProxyError

CACHED_CHAINS = 512
CACHED_BYTES = 64 << 20

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class _Chain:
    messages: tuple[dict[str, Any], ...]
    ids: tuple[str, ...]  # the answers it is made of, oldest first
    size: int  # bytes of the messages as JSON (what the cache's byte bound counts)


def _size(messages: Iterable[dict[str, Any]]) -> int:
    return sum(len(_encode(m)) for m in messages)


class ResponseChain:
    def __init__(self, store: Any, cached: int = CACHED_CHAINS, cached_bytes: int = CACHED_BYTES) -> None:
        self.store = store  # a proxy.store.ports.ResponseChains, or None (this process only)
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
            if await self.store.all_present(tenant, found.ids):
                return found
            self._chains.pop(key)
        links = await self.store.load_links(tenant, response_id)
        if links is None:
            return None
        messages = tuple(m for _, added in links for m in added)
        found = _Chain(messages, tuple(i for i, _ in links), _size(messages))
        self._chains.put(key, found)
        return found

    async def keep(self, tenant: str, response_id: str, previous_id: str | None, history: list[dict[str, Any]],
                   added: list[dict[str, Any]], conversation_id: str | None = None) -> None:
        """One answer stored: ``history`` is its previous chain's messages, ``added`` what this turn added."""
        if self.store is not None:
            await self.store.put_response(tenant, response_id, previous_id, added, conversation_id)
        before = self._chains.peek((tenant, previous_id)) if previous_id else None
        if previous_id and before is None:
            return  # the previous chain left the cache: which answers make it up is read back with it
        ids, size = (before.ids, before.size) if before else ((), 0)
        self._chains.put((tenant, response_id), _Chain((*history, *added), (*ids, response_id), size + _size(added)))

    def forget(self, tenant: str, response_ids: Iterable[str]) -> None:
        """Erased answers (their conversation deleted): every cached chain holding one of them goes."""
        gone = set(response_ids)
        for key in self._chains:
            chain = self._chains.peek(key)
            if key[0] == tenant and chain is not None and gone.intersection(chain.ids):
                self._chains.pop(key)

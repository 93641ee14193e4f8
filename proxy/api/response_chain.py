"""The chain behind `previous_response_id`: each stored answer's messages, kept by the proxy itself.

Stored in PostgreSQL (proxy.store.ports.ResponseChains) before the answer that names the new id reaches the
client, so a chain survives a restart and is shared by replicas; the newest chains are also kept in this
process, so a conversation that continues here never reads its chain back.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from proxy.wire.errors import ProxyError

CACHED_CHAINS = 512


class ResponseChain:
    def __init__(self, store: Any, cached: int = CACHED_CHAINS) -> None:
        self.store = store  # a proxy.store.ports.ResponseChains, or None (this process only)
        self.cached = cached
        self._chains: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()

    async def messages(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        """The messages of the chain ending at ``response_id``; 404 (Responses' shape) when there is none."""
        key = (tenant, response_id)
        found = self._chains.get(key)
        if found is None and self.store is not None:
            found = await self.store.load_chain(tenant, response_id)
            if found is not None:
                self._remember(key, found)
        if found is None:
            raise ProxyError(404, f"Previous response with id '{response_id}' not found.", "invalid_request_error",
                             "previous_response_not_found", "previous_response_id")
        self._chains.move_to_end(key)
        return list(found)

    async def keep(self, tenant: str, response_id: str, previous_id: str | None, history: list[dict[str, Any]],
                   added: list[dict[str, Any]]) -> None:
        """One answer stored: ``history`` is its previous chain's messages, ``added`` what this turn added."""
        if self.store is not None:
            await self.store.put_response(tenant, response_id, previous_id, added)
        self._remember((tenant, response_id), [*history, *added])

    def _remember(self, key: tuple[str, str], messages: list[dict[str, Any]]) -> None:
        self._chains[key] = messages
        self._chains.move_to_end(key)
        while len(self._chains) > self.cached:
            self._chains.popitem(last=False)

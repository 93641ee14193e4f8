"""Which conversation a request continues, with work proportional to the new messages on the usual path.

In order: the explicit session key; this process's copy of a conversation whose last request the new one extends
byte for byte (one hash pass over the bytes, no message re-encoded); else the prefix fingerprints (every message
hashed, then the hot copy and the store asked, as another replica or a restarted process must). The fingerprints a
turn stores are chained on from the conversation's last known chain hash, so only new messages are hashed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash

from memci_proxy.caches import BoundedLru
from memci_proxy.engine import ConversationState, Plan, chain_hashes, entry_hashes
from memci_proxy.engine.fingerprint import advance_prefix, entry_digest
from memci_proxy.engine.state import HASH_SIZE
from memci_proxy.metrics import Metrics
from memci_proxy.turn.call import ChatCall
from memci_proxy.turn.identity import conversation_id_for_session, new_conversation_id

_h128 = xxhash.xxh3_128_hexdigest
STARTS_PER_KEY = 4  # conversations remembered per (tenant, end user, first message): forks share it


@dataclass(slots=True)
class Found:
    conversation_id: str
    how: str  # "session_key" | "prefix" | "new"
    known_prefix: int  # leading messages already known (-1: by session key)
    chains: list[str] | None = None  # the request's whole prefix chain, when it had to be computed
    raw_known: int = 0  # leading bytes of the raw messages that are a request's this process took before


class ConversationLookup:
    def __init__(self, hot: Any, repo: Any, state_of: Any, max_entries: int, metrics: Metrics) -> None:
        self.hot = hot
        self.repo = repo
        self.state_of = state_of  # conversation id -> this process's newest state, or None (no I/O)
        self._starts: BoundedLru[tuple[str, str, bytes], list[str]] = BoundedLru(
            "conversation_starts", max_entries, max_entries * 256, lambda _k, _v: 256)
        # conversation -> (entries, digest of the last entry, chain hash over all entries)
        self._chains: BoundedLru[str, tuple[int, bytes, str]] = BoundedLru(
            "chains", max_entries, max_entries * 256, lambda _k, _v: 256)

    async def find(self, call: ChatCall, messages: list[dict[str, Any]]) -> Found:
        if call.session_key:
            return Found(conversation_id_for_session(call.tenant, call.session_key, call.end_user), "session_key", -1)
        if not messages:
            return Found(new_conversation_id(), "new", 0, [])
        continued = self._continued(call, messages)
        if continued is not None:
            return continued
        chains = chain_hashes(entry_hashes(messages), call.end_user)  # seeded: no match across end users
        for back in range(1, min(4, len(chains)) + 1):  # the usual case: all but the newest exchange is known
            hit = await self.hot.get_fingerprint(call.tenant, chains[-back])
            if hit is not None:
                return Found(hit[0], "prefix", len(chains) - back + 1, chains)
        found = await self.repo.find_longest_prefix(call.tenant, chains)
        if found is None:
            return Found(new_conversation_id(), "new", 0, chains)
        return Found(found[0], "prefix", found[1], chains)

    def _continued(self, call: ChatCall, messages: list[dict[str, Any]]) -> Found | None:
        """A conversation of this process whose last request is a byte-for-byte prefix of this one."""
        if call.raw_messages is None:
            return None
        for cid in self._starts.get((call.tenant, call.end_user, entry_digest(messages[0]))) or ():
            state = self.state_of(cid)
            if (state is not None and state.messages_kind == "raw" and 0 < state.entry_count <= len(messages)
                    and advance_prefix(call.raw_messages, state.messages_length, state.messages_digest)[0]):
                return Found(cid, "prefix", state.entry_count, raw_known=state.messages_length)
        return None

    def remember(self, tenant: str, end_user: str, messages: list[dict[str, Any]], conversation_id: str) -> None:
        """After a turn: requests of this end user starting with these messages may continue this conversation."""
        if not messages:
            return
        key = (tenant, end_user, entry_digest(messages[0]))
        known = self._starts.get(key) or []
        if conversation_id not in known:
            self._starts.put(key, [conversation_id, *known][:STARTS_PER_KEY])

    def fingerprints(self, found: Found, conversation_id: str, prior: ConversationState | None, plan: Plan,
                     messages: list[dict[str, Any]], end_user: str = "") -> list[tuple[str, int]]:
        """(chain hash, prefix length) for the prefixes of this request not known before, seeded by the end user's
        key; the conversation's chain is remembered for the next turn. Session-keyed conversations need none."""
        if found.how == "session_key":
            return []
        chains = found.chains
        start = max(0, found.known_prefix)
        if chains is None:
            chained = self._chain_on(conversation_id, prior, plan)
            if chained is not None:
                return chained
            chains = chain_hashes(entry_hashes(messages), end_user)
        out = [(chains[i], i + 1) for i in range(start, len(chains))]
        if chains:
            self._chains.put(conversation_id, (len(chains), plan.state.hash_blob[-HASH_SIZE:], chains[-1]))
        return out

    def _chain_on(self, conversation_id: str, prior: ConversationState | None, plan: Plan
                  ) -> list[tuple[str, int]] | None:
        mine = self._chains.get(conversation_id)
        if prior is None or mine is None:
            return None
        count, last, chain = mine
        if count != prior.entry_count or last != prior.hash_blob[-HASH_SIZE:]:
            return None
        if plan.new_entries and plan.new_entries[0][0] != count:
            return None  # the history was cut (an edit): chained from scratch
        out = []
        for index, _, digest, _ in plan.new_entries:
            chain = _h128((chain + digest).encode())
            out.append((chain, index + 1))
        self._chains.put(conversation_id, (plan.state.entry_count, plan.state.hash_blob[-HASH_SIZE:], chain))
        return out

    def forget(self, conversation_id: str) -> None:
        self._chains.pop(conversation_id)

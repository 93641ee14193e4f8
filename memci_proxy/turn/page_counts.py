"""The X-Memci-Pages-* headers of a managed answer: how many pages are active, archived (every page out of the
prompt, the evicted ones included) and evicted (of those, the ones off the contents page): the states of
memci_proxy.engine.state.STATUS_MEANINGS, counted as `inspect` counts them.

Pages change state only at compaction epochs, so the archived/evicted split is counted once per conversation and
epoch and remembered: a turn between epochs does not walk its pages.
"""

from __future__ import annotations

from memci_proxy.caches import BoundedLru
from memci_proxy.engine.state import EVICTED, ConversationState

# (conversation id, epoch, pages out of the prompt) -> evicted pages among them
_EVICTED: BoundedLru[tuple[str, int, int], int] = BoundedLru("page_state_counts", 20_000, 20_000 * 256,
                                                             size_of=lambda key, _v: len(key[0]) + 200)


def page_headers(conversation_id: str, state: ConversationState) -> dict[str, str]:
    out_of_prompt = state.first_active_page
    key = (conversation_id, state.epoch, out_of_prompt)
    evicted = _EVICTED.get(key)
    if evicted is None:
        evicted = sum(1 for p in state.pages[:out_of_prompt] if p.status == EVICTED)
        _EVICTED.put(key, evicted)
    return {
        "X-Memci-Pages-Active": str(len(state.pages) - out_of_prompt),
        "X-Memci-Pages-Archived": str(out_of_prompt),
        "X-Memci-Pages-Evicted": str(evicted),
    }

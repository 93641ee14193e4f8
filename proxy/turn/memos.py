"""The module-level memos of the engine and the search, reported with the per-process caches (proxy.caches)."""

from __future__ import annotations

from proxy.caches import CacheStats, register_function, register_lru_cache
from proxy.engine import condense, intent
from proxy.recall import text

_memos_registered = False


def register_process_memos() -> None:
    """Report the module-level memos (bounded in entries; their keys are bounded in length where they are
    filled): the image-reference memo, the intent rules' entity memos, the search stemmer's memo."""
    global _memos_registered
    if _memos_registered:
        return
    _memos_registered = True
    register_function("image_refs", lambda: CacheStats(len(condense._DATA_REFS), -1, condense._DATA_REFS_SIZE, 0, 0))
    register_lru_cache("intent_english_entities", intent.english_entities)
    register_lru_cache("intent_chinese_entities", intent.chinese_entities)
    register_lru_cache("intent_word_sets", intent._word_set)
    register_lru_cache("search_stems", text.stem)

"""The module-level memos of the engine and the search, reported with the per-process caches (memci_proxy.caches)."""

from __future__ import annotations

from memci_proxy.caches import register_lru_cache, register_memo
from memci_proxy.engine import condense, intent, layout, markup, output_preview
from memci_proxy.recall.search import ranking
from memci_proxy.recall.push import salience
from memci_proxy.recall.lexical import text

_memos_registered = False
# A search term is cut to MAX_TERM_CHARS characters: a stem or term memo's item (key, value, the map's slots) holds
# at most this many bytes, so their entry bounds are byte bounds.
TERM_ITEM_BYTES = 4 * text.MAX_TERM_CHARS + 256


def register_process_memos() -> None:
    """Report the module-level memos (each bounded in entries and in bytes): the image-reference memo, offload
    previews, the intent rules' entity and word memos, the markup folding's, the memory block and the escaped message leading with it, the search's term patterns and vector queries, the
    search stemmer's and term memos."""
    global _memos_registered
    if _memos_registered:
        return
    _memos_registered = True
    register_memo("image_refs", condense._DATA_REFS)
    register_memo("offload_previews", output_preview._PREVIEWS)
    register_memo("intent_english_entities", intent.english_entities.memo)
    register_memo("intent_chinese_entities", intent.chinese_entities.memo)
    register_memo("intent_word_sets", intent._word_set.memo)
    register_memo("markup_folds", markup._fold_char.memo)
    register_memo("search_term_patterns", salience._term_pattern.memo)
    register_memo("search_vector_queries", ranking.vector_query.memo)
    register_memo("memory_blocks", layout._memory_block.memo)
    register_memo("escaped_lead_messages", layout._escaped_cached.memo)
    register_lru_cache("search_stems", text.stem, TERM_ITEM_BYTES)
    register_lru_cache("search_terms", text._term, TERM_ITEM_BYTES)

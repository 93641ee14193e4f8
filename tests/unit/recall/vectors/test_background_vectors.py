"""Background page embedding: bounded, searches' candidates first, between turns."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from memci_proxy.recall.vectors.background import BackgroundEmbedding


class _Recorder:
    def __init__(self) -> None:
        self.embedded: list[str] = []
        self.kept: dict[str, Sequence[float]] = {}

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.embedded.extend(texts)
        return [[1.0, float(len(t))] for t in texts]

    def keep(self, digest: str, vector: Sequence[float]) -> None:
        self.kept[digest] = vector


def _background(recorder: _Recorder, **kw: float) -> BackgroundEmbedding:
    return BackgroundEmbedding(recorder.embed, recorder.keep, lambda d: d in recorder.kept, **kw)  # type: ignore[arg-type]


async def test_a_searchs_candidates_go_before_the_archived_pages_and_each_digest_once() -> None:
    recorder = _Recorder()
    background = _background(recorder)
    background.mark_busy()  # a turn is running: nothing is embedded before it has been quiet a moment
    background.submit([("a", "archived a"), ("b", "archived b")])
    background.submit([("c", "candidate c"), ("b", "archived b")], soon=True)
    assert len(background) == 3 and recorder.embedded == []
    await background.drain()
    assert recorder.embedded == ["candidate c", "archived b", "archived a"]
    background.submit([("a", "archived a")])
    assert len(background) == 0  # known already


async def test_the_backlog_is_bounded_and_drops_the_oldest_archived_views_first() -> None:
    recorder = _Recorder()
    background = _background(recorder, max_views=2, quiet_s=10.0, max_lag_s=10.0)
    background.mark_busy()
    background.submit([("a", "A"), ("b", "B")])
    background.submit([("c", "C")], soon=True)
    assert len(background) == 2 and background.dropped == 1
    assert background.backlog.pages() == 2
    await background.close()


async def test_a_page_that_waited_max_lag_is_embedded_while_turns_keep_coming() -> None:
    recorder = _Recorder()
    background = _background(recorder, quiet_s=10.0, max_lag_s=0.05)
    background.mark_busy()
    background.submit([("a", "A")])
    await asyncio.wait_for(background.drain(), 2.0)
    assert recorder.embedded == ["A"]


async def test_nothing_is_queued_after_close() -> None:
    recorder = _Recorder()
    background = _background(recorder)
    await background.close()
    background.submit([("a", "A")])
    assert len(background) == 0 and recorder.embedded == []

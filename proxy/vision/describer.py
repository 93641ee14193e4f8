"""Image descriptions by image hash: started when an image first arrives, computed in the background, kept in
memory (LRU) and in the blob store, so they are ready by the time an epoch decays the image."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.blobs.store import BlobStore, BlobStoreError, description_blob_name, image_blob_name
from proxy.engine.condense import ImageRef, image_reference, image_url_of

from .client import VisionClient, VisionError

log = logging.getLogger("memci.vision")


@dataclass
class DescriberStats:
    described: int = 0  # vision model calls that gave a description
    loaded: int = 0  # descriptions read back from the blob store
    failed: int = 0  # images left with the placeholder (no model, no bytes, or the model failed)
    started: int = 0  # background tasks started (one per image hash at most, while it is not ready)


class DescriptionView(Mapping[str, str]):
    """Read-only view of the ready descriptions (what `TurnInput.image_descriptions` takes). A lookup of a hash
    whose description is in the blob store but not in memory schedules loading it for the next epoch."""

    def __init__(self, describer: "ImageDescriber") -> None:
        self._d = describer

    def __getitem__(self, key: str) -> str:
        text = self._d.ready(key)
        if text is None:
            self._d.load_later(key)
            raise KeyError(key)
        return text

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._d._ready))

    def __len__(self) -> int:
        return len(self._d._ready)


class ImageDescriber:
    """`client`: None when no vision model is configured (the engine's placeholder serves then).
    `store`: where descriptions persist and where blob references' bytes are read (None: memory only)."""

    def __init__(
        self,
        client: VisionClient | None,
        store: BlobStore | None,
        capacity: int = 4096,
        concurrency: int = 2,
    ) -> None:
        self.client = client
        self.store = store
        self.capacity = capacity
        self._ready: OrderedDict[str, str] = OrderedDict()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._given_up: set[str] = set()
        self._semaphore = asyncio.Semaphore(max(1, concurrency))
        self.stats = DescriberStats()
        self.descriptions = DescriptionView(self)

    # -- reading -----------------------------------------------------------------------------------
    def ready(self, key: str) -> str | None:
        text = self._ready.get(key)
        if text is not None:
            self._ready.move_to_end(key)
        return text

    def _remember(self, key: str, text: str) -> None:
        self._ready[key] = text
        self._ready.move_to_end(key)
        while len(self._ready) > self.capacity:
            self._ready.popitem(last=False)

    # -- starting ----------------------------------------------------------------------------------
    def start(self, message: dict[str, Any]) -> list[str]:
        """Start describing the message's images that are neither ready nor under way; returns their keys
        (all image keys of the message). Needs a running event loop."""
        content = message.get("content")
        keys: list[str] = []
        if not isinstance(content, list):
            return keys
        for part in content:
            ref = image_reference(part)
            if ref is None:
                continue
            keys.append(ref.key)
            self._schedule(ref, image_url_of(part) or "")
        return keys

    def start_all(self, messages: Iterable[dict[str, Any]]) -> list[str]:
        return [k for m in messages for k in self.start(m)]

    def load_later(self, key: str) -> None:
        """Bring a persisted description back into memory (no model call); no-op without a store or loop."""
        if self.store is None or key in self._tasks or key in self._given_up or len(key) != 64:
            return
        self._schedule(ImageRef(key, "", -1, "blob", ""), "", describe=False)

    def _schedule(self, ref: ImageRef, url: str, describe: bool = True) -> None:
        if ref.key in self._ready or ref.key in self._tasks or ref.key in self._given_up:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.stats.started += 1
        task = loop.create_task(self._run(ref, url, describe))
        self._tasks[ref.key] = task
        task.add_done_callback(lambda _t, key=ref.key: self._tasks.pop(key, None))

    # -- the work ----------------------------------------------------------------------------------
    async def _run(self, ref: ImageRef, url: str, describe: bool) -> None:
        try:
            text = await self._load(ref.key)
            if text is not None:
                self.stats.loaded += 1
                self._remember(ref.key, text)
                return
            if not describe:
                return
            if self.client is None:
                self._give_up(ref.key, "no vision model configured")
                return
            image_url = await self._image_url(ref, url)
            if image_url is None:
                self._give_up(ref.key, "image bytes not found")
                return
            async with self._semaphore:
                text = await self.client.describe(image_url)
            self.stats.described += 1
            self._remember(ref.key, text)
            await self._save(ref.key, text)
        except VisionError as exc:
            self._give_up(ref.key, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a description must never break a turn
            log.exception("image description failed")
            self._give_up(ref.key, repr(exc))

    def _give_up(self, key: str, why: str) -> None:
        self.stats.failed += 1
        self._given_up.add(key)
        log.info("image %s keeps its placeholder: %s", key[:12], why)

    async def _load(self, key: str) -> str | None:
        if self.store is None or len(key) != 64:
            return None
        try:
            data = await self.store.get(description_blob_name(key))
        except (BlobStoreError, ValueError):
            return None
        return data.decode("utf-8", "replace") if data else None

    async def _save(self, key: str, text: str) -> None:
        if self.store is None:
            return
        try:
            await self.store.put(description_blob_name(key), text.encode("utf-8"), "text/plain; charset=utf-8")
        except (BlobStoreError, ValueError) as exc:
            log.warning("cannot persist the description of image %s: %s", key[:12], exc)

    async def _image_url(self, ref: ImageRef, url: str) -> str | None:
        """What the vision model gets: the data URI or remote URL as sent, or the stored bytes of a reference."""
        if ref.source != "blob":
            return url or None
        if self.store is None:
            return None
        try:
            data = await self.store.get(image_blob_name(ref.key))
        except (BlobStoreError, ValueError):
            return None
        if data is None:
            return None
        return f"data:{ref.media_type or 'image/png'};base64,{base64.b64encode(data).decode()}"

    # -- control -----------------------------------------------------------------------------------
    async def wait(self, keys: Iterable[str] | None = None, timeout: float | None = None) -> bool:
        """Wait for the given (default: all) descriptions under way; False when the timeout passed first."""
        wanted = list(self._tasks.values()) if keys is None else [self._tasks[k] for k in keys if k in self._tasks]
        if not wanted:
            return True
        done, pending = await asyncio.wait(wanted, timeout=timeout)
        return not pending

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self.client is not None:
            await self.client.close()

"""Image descriptions by tenant and image hash: started when an image first arrives, computed in the background,
kept in memory (LRU bounded in entries and bytes) and in the blob store, so they are ready by the time an epoch
decays the image."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.wire import logtext
from memci_proxy.blobs.store import BlobStore, BlobStoreError, description_blob_name, image_blob_name
from memci_proxy.engine.condense import ImageRef, image_reference, image_url_of

from .client import VisionClient, VisionError
from .urls import Resolver, resolve_host, url_refusal

log = logging.getLogger("memci.vision")


Owner = Callable[[str, str], Awaitable[bool]]  # (tenant, image key) -> may this tenant read these bytes?
GIVEN_UP_ENTRIES = 16_384


@dataclass
class DescriberStats:
    described: int = 0  # vision model calls that gave a description
    loaded: int = 0  # descriptions read back from the blob store
    failed: int = 0  # images left with the placeholder (no model, no bytes, or the model failed)
    started: int = 0  # background tasks started (one per tenant and image hash at most, while it is not ready)
    refused: int = 0  # blob references to bytes the tenant does not own (never read, never described)
    urls_refused: int = 0  # image URLs the vision model may not be given (memci_proxy.vision.urls; never described)


class DescriptionView(Mapping[str, str]):
    """Read-only view of one tenant's ready descriptions (what `TurnInput.image_descriptions` takes). A lookup of
    a hash whose description is in the blob store but not in memory schedules loading it for the next epoch."""

    def __init__(self, describer: "ImageDescriber", tenant: str) -> None:
        self._d = describer
        self._tenant = tenant

    def __getitem__(self, key: str) -> str:
        text = self._d.ready(key, self._tenant)
        if text is None:
            self._d.load_later(key, self._tenant)
            raise KeyError(key)
        return text

    def __iter__(self) -> Iterator[str]:
        return iter([key for tenant, key in self._d._ready if tenant == self._tenant])

    def __len__(self) -> int:
        return sum(1 for tenant, _ in self._d._ready if tenant == self._tenant)


class ImageDescriber:
    """`client`: None when no vision model is configured (the engine's placeholder serves then).
    `store`: where descriptions persist and where blob references' bytes are read (None: memory only).
    `owns(tenant, key)`: whether a tenant may read the stored bytes of an image (a blob reference a client
    wrote itself is honoured only for bytes that tenant sent); None: blob references are never read.

    Everything is kept per tenant: two tenants sending the same image each get their own description, and a
    tenant naming another's image by `memci-blob://` reference gets the placeholder."""

    def __init__(
        self,
        client: VisionClient | None,
        store: BlobStore | None,
        capacity: int = 4096,
        concurrency: int = 2,
        owns: Owner | None = None,
        max_bytes: int = 16 * 2**20,
        allow_private_urls: bool = False,
        on_refused: Callable[[str], None] | None = None,
        resolve: Resolver = resolve_host,
    ) -> None:
        self.client = client
        self.allow_private_urls = allow_private_urls
        self.on_refused = on_refused  # called with the reason of each refused image URL (a metric)
        self.resolve = resolve
        self.store = store
        self.owns = owns
        self.capacity = capacity
        self._ready: BoundedLru[tuple[str, str], str] = BoundedLru(
            "image_descriptions", capacity, max_bytes, size_of=lambda k, v: len(k[0]) + len(k[1]) + len(v) + 160)
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._describe_after_load: dict[tuple[str, str], tuple[ImageRef, str]] = {}  # only while a load runs
        self._given_up: BoundedLru[tuple[str, str], bool] = BoundedLru(
            "image_descriptions_given_up", GIVEN_UP_ENTRIES, GIVEN_UP_ENTRIES * 256,
            size_of=lambda k, _v: len(k[0]) + len(k[1]) + 160)
        self._semaphore = asyncio.Semaphore(max(1, concurrency))
        self.stats = DescriberStats()

    def for_tenant(self, tenant: str) -> DescriptionView:
        return DescriptionView(self, tenant)

    # -- reading -----------------------------------------------------------------------------------
    def ready(self, key: str, tenant: str) -> str | None:
        return self._ready.get((tenant, key))

    def _remember(self, key: str, tenant: str, text: str) -> None:
        self._ready.put((tenant, key), text)

    def forget(self, tenant: str, keys: Iterable[str]) -> None:
        """Drop a tenant's descriptions of these images from memory (after the conversation that held them was
        deleted)."""
        for key in keys:
            self._ready.pop((tenant, key))
            self._given_up.pop((tenant, key))

    # -- starting ----------------------------------------------------------------------------------
    def start(self, message: dict[str, Any], tenant: str) -> list[str]:
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
            self._schedule(ref, image_url_of(part) or "", tenant)
        return keys

    def start_all(self, messages: Iterable[dict[str, Any]], tenant: str) -> list[str]:
        return [k for m in messages for k in self.start(m, tenant)]

    def load_later(self, key: str, tenant: str) -> None:
        """Bring a persisted description back into memory (no model call); no-op without a store or loop."""
        if self.store is None or (tenant, key) in self._given_up or len(key) != 64:
            return
        self._schedule(ImageRef(key, "", -1, "blob", ""), "", tenant, describe=False)

    def _schedule(self, ref: ImageRef, url: str, tenant: str, describe: bool = True) -> None:
        slot = (tenant, ref.key)
        running = self._tasks.get(slot)
        if running is not None and not running.done() and describe:
            self._describe_after_load[slot] = (ref, url)  # a load under way describes if it finds nothing
            return
        if slot in self._ready or (running is not None and not running.done()) or slot in self._given_up:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.stats.started += 1
        task = loop.create_task(self._run(ref, url, tenant, describe))
        self._tasks[slot] = task
        task.add_done_callback(lambda t, slot=slot: self._task_done(slot, t))

    def _task_done(self, slot: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._tasks.get(slot) is task:
            del self._tasks[slot]
        self._describe_after_load.pop(slot, None)

    # -- the work ----------------------------------------------------------------------------------
    async def _run(self, ref: ImageRef, url: str, tenant: str, describe: bool) -> None:
        try:
            text = await self._load(ref.key, tenant)
            if text is not None:
                self.stats.loaded += 1
                self._remember(ref.key, tenant, text)
                return
            if not describe:
                wanted = self._describe_after_load.pop((tenant, ref.key), None)
                if wanted is None:
                    return
                ref, url = wanted
            if self.client is None:
                self._give_up(ref.key, tenant, "no vision model configured")
                return
            image_url = await self._image_url(ref, url, tenant)
            if image_url is not None:
                why = await url_refusal(image_url, self.allow_private_urls, self.resolve)
                if why is not None:
                    self._refuse_url(ref.key, tenant, why)
                    return
            if image_url is None:
                self._give_up(ref.key, tenant, "image bytes not found")
                return
            async with self._semaphore:
                text = await self.client.describe(image_url)
            self.stats.described += 1
            self._remember(ref.key, tenant, text)
            await self._save(ref.key, tenant, text)
        except VisionError as exc:
            self._give_up(ref.key, tenant, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a description must never break a turn
            log.exception("image description failed")
            self._give_up(ref.key, tenant, type(exc).__name__)

    def _refuse_url(self, key: str, tenant: str, why: str) -> None:
        """An image URL the vision model may not be given: not described (the image stays in the prompt as the
        client sent it, and decays to its placeholder at an epoch), counted, and not tried again."""
        self.stats.urls_refused += 1
        if self.on_refused is not None:
            self.on_refused(why)
        self._give_up(key, tenant, f"its URL is not passed to the vision model ({why}; setting "
                      "vision_allow_private_urls)")

    def _give_up(self, key: str, tenant: str, why: str) -> None:
        self.stats.failed += 1
        self._given_up.put((tenant, key), True)
        log.info("image %s keeps its placeholder: %s", logtext.field(key, 12), logtext.field(why))

    async def _load(self, key: str, tenant: str) -> str | None:
        if self.store is None or len(key) != 64:
            return None
        try:
            data = await self.store.get(description_blob_name(key, tenant))
        except (BlobStoreError, ValueError):
            return None
        return data.decode("utf-8", "replace") if data else None

    async def _save(self, key: str, tenant: str, text: str) -> None:
        if self.store is None:
            return
        try:
            await self.store.put(description_blob_name(key, tenant), text.encode("utf-8"),
                                 "text/plain; charset=utf-8")
        except (BlobStoreError, ValueError) as exc:
            log.warning("cannot persist the description of image %s: %s", logtext.field(key, 12), logtext.field(exc))

    async def _image_url(self, ref: ImageRef, url: str, tenant: str) -> str | None:
        """What the vision model gets: the data URI or remote URL as sent, or the stored bytes of a reference
        when (and only when) the tenant owns them."""
        if ref.source != "blob":
            return url or None
        if self.store is None or self.owns is None:
            return None
        try:
            owned = await self.owns(tenant, ref.key)
        except Exception as exc:  # the ownership check failing means: not readable now
            log.warning("cannot check who owns image %s: %s", logtext.field(ref.key, 12), type(exc).__name__)
            return None
        if not owned:
            self.stats.refused += 1
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
        """Wait for the given (default: all) image keys' descriptions under way; False when the timeout passed
        first."""
        if keys is None:
            wanted = list(self._tasks.values())
        else:
            chosen = set(keys)
            wanted = [task for (_, key), task in self._tasks.items() if key in chosen]
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

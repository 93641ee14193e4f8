"""New messages in: their `data:` images written to the blob store once per hash, descriptions started, and
the messages as they should be stored (blob references instead of the bytes)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from proxy.blobs.externalize import externalize_images, store_blobs
from proxy.blobs.store import BlobStore, BlobStoreError

from .describer import ImageDescriber

log = logging.getLogger("memci.vision")


async def intake_images(
    messages: Iterable[dict[str, Any]], store: BlobStore | None, describer: ImageDescriber | None
) -> list[dict[str, Any]]:
    """The storage form of each message (the same object when it has no `data:` image). Descriptions start
    from the original message, so the vision model gets the bytes without a store read. When the store
    cannot be written the message is kept whole (with its data URI) rather than lose the image."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if describer is not None:
            describer.start(message)
        stored, blobs = externalize_images(message)
        if blobs and store is not None:
            try:
                await store_blobs(store, blobs)
            except (BlobStoreError, OSError) as exc:
                log.warning("blob store unavailable, image kept inline: %s", exc)
                stored = message
        elif blobs:
            stored = message
        out.append(stored)
    return out

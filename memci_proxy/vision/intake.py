"""New messages in: their `data:` images written to the blob store once per hash (owned by the conversation that
sent them), descriptions started, and the messages as they should be stored (blob references instead of the
bytes)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from memci_proxy.blobs.externalize import externalize_images, store_blobs
from memci_proxy.blobs.store import BlobStore, BlobStoreError

from .describer import ImageDescriber

log = logging.getLogger("memci.vision")


async def intake_images(
    messages: Iterable[dict[str, Any]], store: BlobStore | None, describer: ImageDescriber | None,
    tenant: str = "", conversation_id: str = "", owners: Any = None,
) -> list[dict[str, Any]]:
    """The storage form of each message (the same object when it has no `data:` image). Descriptions start
    from the original message, so the vision model gets the bytes without a store read. When the store
    cannot be written the message is kept whole (with its data URI) rather than lose the image.

    ``owners`` (memci_proxy.store.ports.BlobOwnership): records that this conversation of this tenant sent the bytes
    before they are written, so the tenant may read them back and deleting the conversation deletes them."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if describer is not None:
            describer.start(message, tenant)
        stored, blobs = externalize_images(message)
        if blobs and store is not None:
            try:
                if owners is not None:
                    await owners.claim_blobs(tenant, conversation_id, [b.key for b in blobs],
                                             lambda blobs=blobs: store_blobs(store, blobs))
                else:
                    await store_blobs(store, blobs)
            except (BlobStoreError, OSError) as exc:
                log.warning("blob store unavailable, image kept inline: %s", exc)
                stored = message
            except Exception as exc:  # the ownership record could not be written: keep the bytes inline
                log.warning("image ownership not recorded (%s), image kept inline", type(exc).__name__)
                stored = message
        elif blobs:
            stored = message
        out.append(stored)
    return out

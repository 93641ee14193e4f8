"""Messages for storage: `data:` image URIs replaced by `memci-blob://sha256/<hash>` references (pure)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from memci_proxy.engine.condense import BLOB_URL_PREFIX, image_reference, image_url_of, parse_data_uri

from .store import BlobStore, image_blob_name


@dataclass(frozen=True)
class ImageBlob:
    key: str  # sha256 hex of `data`
    media_type: str
    data: bytes

    @property
    def name(self) -> str:
        return image_blob_name(self.key)


def blob_url(key: str, media_type: str, size: int) -> str:
    """`memci-blob://sha256/<hash>?type=<media type>&size=<bytes>`: the reference that stands for the bytes."""
    return f"{BLOB_URL_PREFIX}{key}?type={media_type}&size={size}"


def _with_url(part: dict[str, Any], url: str) -> dict[str, Any]:
    value = part.get("image_url", part.get("url"))
    if isinstance(value, dict):
        field = "image_url" if "image_url" in part else "url"
        return {**part, field: {**value, "url": url}}
    field = "image_url" if "image_url" in part else "url"
    return {**part, field: url}


def externalize_images(message: dict[str, Any]) -> tuple[dict[str, Any], list[ImageBlob]]:
    """The message as it should be stored (each `data:` image replaced by its blob reference; the same object
    when it has none) and the image blobs to write, one per distinct hash. Remote URLs are kept as they are."""
    content = message.get("content")
    if not isinstance(content, list):
        return message, []
    blobs: dict[str, ImageBlob] = {}
    out: list[Any] = []
    changed = False
    for part in content:
        url = image_url_of(part)
        parsed = parse_data_uri(url) if url and url.startswith("data:") else None
        ref = image_reference(part) if parsed is not None else None
        if parsed is None or ref is None:
            out.append(part)
            continue
        media_type, data = parsed
        blobs.setdefault(ref.key, ImageBlob(ref.key, media_type, data))
        out.append(_with_url(part, blob_url(ref.key, media_type, len(data))))
        changed = True
    if not changed:
        return message, []
    return {**message, "content": out}, list(blobs.values())


async def store_blobs(store: BlobStore, blobs: list[ImageBlob]) -> int:
    """Write the blobs not yet stored; returns how many were new."""
    written = 0
    for blob in blobs:
        written += bool(await store.put(blob.name, blob.data, blob.media_type))
    return written


async def internalize_images(message: dict[str, Any], store: BlobStore) -> dict[str, Any]:
    """The message with blob references turned back into `data:` URIs (those whose bytes are missing stay)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    out: list[Any] = []
    changed = False
    for part in content:
        url = image_url_of(part)
        ref = image_reference(part) if url and url.startswith(BLOB_URL_PREFIX) else None
        data = await store.get(image_blob_name(ref.key)) if ref is not None else None
        if ref is None or data is None:
            out.append(part)
            continue
        uri = f"data:{ref.media_type or 'application/octet-stream'};base64,{base64.b64encode(data).decode()}"
        out.append(_with_url(part, uri))
        changed = True
    return {**message, "content": out} if changed else message

"""The blob store protocol: immutable objects by name (image bytes by content hash, their descriptions)."""

from __future__ import annotations

import hashlib
import re
from typing import Protocol, runtime_checkable

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class BlobStoreError(Exception):
    """The store could not be read or written (the caller decides whether the turn goes on without it)."""


@runtime_checkable
class BlobStore(Protocol):
    """Names are relative paths of `[a-z0-9._/-]` (see `image_blob_name`). Objects never change once written,
    so `put` of an existing name is a no-op that returns False. `delete` removes an object no conversation
    references any more (False when it was not there)."""

    async def put(self, name: str, data: bytes, content_type: str = "application/octet-stream") -> bool: ...

    async def get(self, name: str) -> bytes | None: ...

    async def exists(self, name: str) -> bool: ...

    async def delete(self, name: str) -> bool: ...

    async def close(self) -> None: ...


def check_key(key: str) -> str:
    """A sha256 hex digest, lower case; ValueError otherwise (names must never escape the store)."""
    key = key.lower()
    if not _HEX64.match(key):
        raise ValueError(f"not a sha256 hex digest: {key[:80]!r}")
    return key


def image_blob_name(key: str) -> str:
    """Where the bytes of the image with this sha256 live: `images/sha256/ab/<hash>`."""
    key = check_key(key)
    return f"images/sha256/{key[:2]}/{key}"


def tenant_dir(tenant: str) -> str:
    """A tenant's folder name in the blob store (a digest: tenant ids may hold any character)."""
    return "t" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def description_blob_name(key: str, tenant: str) -> str:
    """Where one tenant's text description of an image lives: `descriptions/<tenant dir>/ab/<hash>.txt`.

    Descriptions are kept per tenant: the image bytes are shared by hash underneath, but what a tenant reads
    about an image is only ever what was made for that tenant."""
    key = check_key(key)
    return f"descriptions/{tenant_dir(tenant)}/{key[:2]}/{key}.txt"

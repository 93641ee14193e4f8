"""Blob store on a local directory (default: MEMCI_HOME/blobs). Writes are atomic (temporary file + rename)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path

from .store import BlobStoreError


class FilesystemBlobStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()

    def path_of(self, name: str) -> Path:
        parts = name.split("/")
        if not name or any(p in ("", ".", "..") for p in parts) or name.startswith("/"):
            raise ValueError(f"bad blob name {name!r}")
        return self.root.joinpath(*parts)

    def _put(self, name: str, data: bytes) -> bool:
        path = self.path_of(name)
        if path.exists():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True

    def _get(self, name: str) -> bytes | None:
        try:
            return self.path_of(name).read_bytes()
        except FileNotFoundError:
            return None

    async def put(self, name: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        try:
            return await asyncio.to_thread(self._put, name, data)
        except OSError as exc:
            raise BlobStoreError(f"cannot write blob {name}: {exc}") from exc

    async def get(self, name: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self._get, name)
        except OSError as exc:
            raise BlobStoreError(f"cannot read blob {name}: {exc}") from exc

    async def exists(self, name: str) -> bool:
        return await asyncio.to_thread(self.path_of(name).exists)

    def _delete(self, name: str) -> bool:
        try:
            self.path_of(name).unlink()
        except FileNotFoundError:
            return False
        return True

    async def delete(self, name: str) -> bool:
        try:
            return await asyncio.to_thread(self._delete, name)
        except OSError as exc:
            raise BlobStoreError(f"cannot delete blob {name}: {exc}") from exc

    async def close(self) -> None:
        return None

"""The configured blob store: a directory under MEMCI_HOME by default, S3-compatible for an `s3://` setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .filesystem import FilesystemBlobStore
from .s3 import S3BlobStore
from .store import BlobStore


def make_blob_store(settings: Any) -> BlobStore:
    """Settings read (missing ones take these defaults): `blob_store` ("" = `<home>/blobs`; a directory path;
    or `s3://bucket/prefix`), `blob_s3_endpoint` ("" = `https://s3.<region>.amazonaws.com`), `blob_s3_region`
    ("us-east-1"), `blob_s3_access_key`, `blob_s3_secret_key`."""
    where = str(getattr(settings, "blob_store", "") or "")
    if where.startswith("s3://"):
        parts = urlsplit(where)
        region = str(getattr(settings, "blob_s3_region", "") or "us-east-1")
        endpoint = str(getattr(settings, "blob_s3_endpoint", "") or f"https://s3.{region}.amazonaws.com")
        return S3BlobStore(
            endpoint,
            parts.netloc,
            parts.path,
            access_key=str(getattr(settings, "blob_s3_access_key", "") or ""),
            secret_key=str(getattr(settings, "blob_s3_secret_key", "") or ""),
            region=region,
        )
    if where.startswith("file://"):
        where = where[len("file://") :]
    if where:
        return FilesystemBlobStore(Path(where).expanduser())
    home = getattr(settings, "home_path", None) or Path(str(getattr(settings, "home", "~/.memci"))).expanduser()
    return FilesystemBlobStore(Path(home) / "blobs")

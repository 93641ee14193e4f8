"""Blob store on an S3-compatible service (AWS S3, MinIO, Ceph RGW, R2), path-style URLs, SigV4 over aiohttp."""

from __future__ import annotations

import datetime as _dt
import hashlib
from urllib.parse import urlsplit

import aiohttp

from .sigv4 import EMPTY_SHA256, amz_date, canonical_uri, sign_headers
from .store import BlobStoreError


class S3BlobStore:
    """`endpoint`: e.g. `https://s3.eu-west-1.amazonaws.com` or `http://127.0.0.1:9000`; objects live at
    `<endpoint>/<bucket>/<prefix><name>`."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        prefix: str = "",
        access_key: str = "",
        secret_key: str = "",
        region: str = "us-east-1",
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        parts = urlsplit(endpoint.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"bad S3 endpoint {endpoint!r}")
        self.scheme, self.host = parts.scheme, parts.netloc
        self.base_path = parts.path.rstrip("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._own_session = session is None

    def _path(self, name: str) -> str:
        return f"{self.base_path}/{self.bucket}/{self.prefix}{name}"

    async def _session_(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
            self._own_session = True
        return self._session

    async def _request(
        self, method: str, name: str, data: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        path = self._path(name)
        payload_hash = hashlib.sha256(data).hexdigest() if data else EMPTY_SHA256
        signed = sign_headers(
            method, self.host, path, {}, headers or {}, payload_hash, self.access_key, self.secret_key,
            self.region, amz_date(_dt.datetime.now(_dt.timezone.utc)),
        )
        url = f"{self.scheme}://{self.host}{canonical_uri(path)}"
        session = await self._session_()
        try:
            async with session.request(
                method, url, data=data or None, headers=signed, skip_auto_headers=("Content-Type",)
            ) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BlobStoreError(f"S3 {method} {name}: {exc}") from exc

    async def put(self, name: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        if await self.exists(name):
            return False
        status, body = await self._request("PUT", name, data, {"Content-Type": content_type})
        if status // 100 != 2:
            raise BlobStoreError(f"S3 PUT {name}: HTTP {status} {body[:200]!r}")
        return True

    async def get(self, name: str) -> bytes | None:
        status, body = await self._request("GET", name)
        if status == 404:
            return None
        if status // 100 != 2:
            raise BlobStoreError(f"S3 GET {name}: HTTP {status} {body[:200]!r}")
        return body

    async def exists(self, name: str) -> bool:
        status, _ = await self._request("HEAD", name)
        if status == 404:
            return False
        if status // 100 != 2:
            raise BlobStoreError(f"S3 HEAD {name}: HTTP {status}")
        return True

    async def delete(self, name: str) -> bool:
        """True when it was there (S3 answers 204 either way: a HEAD tells which)."""
        if not await self.exists(name):
            return False
        status, body = await self._request("DELETE", name)
        if status // 100 != 2 and status != 404:
            raise BlobStoreError(f"S3 DELETE {name}: HTTP {status} {body[:200]!r}")
        return True

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

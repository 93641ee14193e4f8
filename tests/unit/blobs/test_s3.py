"""S3BlobStore against an in-process S3 stand-in that checks each request's SigV4 signature as received."""

from __future__ import annotations

import re

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from memci_proxy.blobs import S3BlobStore, image_blob_name
from memci_proxy.blobs.sigv4 import sign_headers

KEY = "cd" * 32


def fake_s3(secret: str) -> tuple[web.Application, dict[str, bytes], list[str]]:
    objects: dict[str, bytes] = {}
    log: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        match = re.match(
            r"AWS4-HMAC-SHA256 Credential=(\w+)/\d{8}/([\w-]+)/s3/aws4_request, SignedHeaders=([\w;-]+), ", auth
        )
        if not match:
            return web.Response(status=403)
        names = match.group(3).split(";")
        given = {n: request.headers[n] for n in names if n not in ("host", "x-amz-date", "x-amz-content-sha256")}
        expected = sign_headers(request.method, request.host, request.raw_path, {}, given,
                                request.headers["x-amz-content-sha256"], match.group(1), secret, match.group(2),
                                request.headers["x-amz-date"])
        if expected["Authorization"] != auth:
            return web.Response(status=403, text="SignatureDoesNotMatch")
        body = await request.read()
        log.append(f"{request.method} {request.raw_path}")
        if request.method == "PUT":
            objects[request.raw_path] = body
            return web.Response(status=200)
        if request.raw_path not in objects:
            return web.Response(status=404)
        return web.Response(body=b"" if request.method == "HEAD" else objects[request.raw_path])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app, objects, log


async def test_put_get_exists_over_signed_requests() -> None:
    app, objects, log = fake_s3("sk")
    async with TestServer(app) as server:
        store = S3BlobStore(f"http://127.0.0.1:{server.port}", "bucket", "memci", "ak", "sk", "eu-west-1")
        name = image_blob_name(KEY)
        try:
            assert await store.get(name) is None
            assert await store.put(name, b"\x89PNG bytes", "image/png") is True
            assert await store.put(name, b"\x89PNG bytes", "image/png") is False  # stored once
            assert await store.get(name) == b"\x89PNG bytes" and await store.exists(name)
        finally:
            await store.close()
    assert objects == {f"/bucket/memci/{name}": b"\x89PNG bytes"}
    assert [line.split()[0] for line in log].count("PUT") == 1


async def test_a_wrong_secret_is_an_error() -> None:
    from memci_proxy.blobs import BlobStoreError

    app, _, _ = fake_s3("right")
    async with TestServer(app) as server:
        store = S3BlobStore(f"http://127.0.0.1:{server.port}", "bucket", "", "ak", "wrong")
        try:
            with pytest.raises(BlobStoreError):
                await store.get(image_blob_name(KEY))
        finally:
            await store.close()

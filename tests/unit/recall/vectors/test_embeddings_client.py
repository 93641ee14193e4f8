"""EmbeddingsClient against in-process fake servers (the emulator's deterministic bag-of-words embeddings)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from memci_proxy.emulator.embeddings import embed as emulator_embed
from memci_proxy.emulator.embeddings import embeddings_body
from memci_proxy.recall.vectors.endpoint import EmbeddingsClient, embeddings_endpoint

Handler = Callable[[web.Request], Any]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Any]]:
    servers: list[TestServer] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/embeddings", handler)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("/v1"))

    yield start
    for server in servers:
        await server.close()


def emulator_handler(dimension: int = 16, seen: list[dict[str, Any]] | None = None) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        if seen is not None:
            seen.append({"body": body, "auth": request.headers.get("Authorization")})
        return web.json_response(embeddings_body(body, dimension, "emu-embed", lambda text: len(text.split())))

    return handle


def test_endpoint_of_a_base_url() -> None:
    assert embeddings_endpoint("http://h:1/v1") == "http://h:1/v1/embeddings"
    assert embeddings_endpoint("http://h:1/v1/") == "http://h:1/v1/embeddings"
    assert embeddings_endpoint("http://h:1/v1/embeddings") == "http://h:1/v1/embeddings"


async def test_batches_in_order_and_learns_the_dimension(serve) -> None:
    seen: list[dict[str, Any]] = []
    url = await serve(emulator_handler(16, seen))
    client = EmbeddingsClient(url, model="emu", batch_size=2, api_key="k1")
    try:
        texts = ["red apple pie", "blue ocean", "green tea", "red apple tart", "train ticket"]
        vectors = await client.embed(texts)
    finally:
        await client.close()
    assert vectors is not None and len(vectors) == 5
    assert client.dimension == 16 and client.last_failure is None
    assert [len(call["body"]["input"]) for call in seen] == [2, 2, 1]
    assert all(call["body"]["model"] == "emu" and call["auth"] == "Bearer k1" for call in seen)
    for text, vector in zip(texts, vectors, strict=True):
        assert vector == pytest.approx(emulator_embed(text, 16), abs=1e-6)
    assert math.isclose(sum(x * x for x in vectors[0]), 1.0, abs_tol=1e-6)


async def test_base64_answers_are_decoded(serve) -> None:
    async def handle(request: web.Request) -> web.Response:
        body = {**(await request.json()), "encoding_format": "base64"}
        return web.json_response(embeddings_body(body, 8, "m", lambda text: 1))

    client = EmbeddingsClient(await serve(handle))
    try:
        vectors = await client.embed(["hello world"])
    finally:
        await client.close()
    assert vectors is not None and vectors[0] == pytest.approx(emulator_embed("hello world", 8), abs=1e-6)


async def test_empty_input_is_no_request(serve) -> None:
    seen: list[dict[str, Any]] = []
    client = EmbeddingsClient(await serve(emulator_handler(8, seen)))
    try:
        assert await client.embed([]) == []
    finally:
        await client.close()
    assert seen == []


async def test_http_error_is_none_with_a_reason(serve) -> None:
    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    client = EmbeddingsClient(await serve(handle))
    try:
        assert await client.embed(["x"]) is None
    finally:
        await client.close()
    assert client.last_failure == "http_503"


async def test_timeout_is_none(serve) -> None:
    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    client = EmbeddingsClient(await serve(handle), timeout_s=0.05)
    try:
        assert await client.embed(["x"]) is None
    finally:
        await client.close()
    assert client.last_failure == "timeout"


async def test_unreachable_is_none() -> None:
    from memci_proxy.emulator.testing import free_port

    client = EmbeddingsClient(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2)
    try:
        assert await client.embed(["x"]) is None
    finally:
        await client.close()
    assert client.last_failure == "unreachable"


@pytest.mark.parametrize(
    "answer",
    [
        {"data": [{"index": 0, "embedding": [0.1, 0.2]}]},  # one vector for two inputs
        {"data": [{"index": 0, "embedding": [0.1]}, {"index": 1, "embedding": [0.1, 0.2]}]},  # mixed dimensions
        {"data": [{"index": 0, "embedding": []}, {"index": 1, "embedding": []}]},
        {"nothing": True},
        "not json at all",
    ],
)
async def test_malformed_answers_are_none(serve, answer: Any) -> None:
    async def handle(request: web.Request) -> web.Response:
        if isinstance(answer, str):
            return web.Response(text=answer, content_type="application/json")
        return web.json_response(answer)

    client = EmbeddingsClient(await serve(handle))
    try:
        assert await client.embed(["a", "b"]) is None
    finally:
        await client.close()
    assert client.last_failure == "bad_answer"


async def test_a_changed_dimension_is_a_failure(serve) -> None:
    dims = [8, 12]

    async def handle(request: web.Request) -> web.Response:
        return web.json_response(embeddings_body(await request.json(), dims.pop(0), "m", lambda text: 1))

    client = EmbeddingsClient(await serve(handle))
    try:
        assert await client.embed(["a"]) is not None
        assert await client.embed(["a"]) is None
    finally:
        await client.close()
    assert client.dimension == 8 and client.last_failure == "bad_answer"


async def test_inputs_are_clipped_and_never_empty(serve) -> None:
    seen: list[dict[str, Any]] = []
    client = EmbeddingsClient(await serve(emulator_handler(8, seen)), max_chars=5)
    try:
        await client.embed(["abcdefghij", "  "])
    finally:
        await client.close()
    assert seen[0]["body"]["input"] == ["abcde", "(empt"]

"""The describer: once per image hash, in the background, persisted beside the blobs, placeholder on failure."""

from __future__ import annotations

import asyncio
import base64
import hashlib

from aiohttp import web
from aiohttp.test_utils import TestServer

from memci_proxy.blobs import FilesystemBlobStore, description_blob_name, image_blob_name
from memci_proxy.vision import ImageDescriber, VisionClient, VisionError, intake_images, make_describer

TENANT = "tenant-a"
DATA = b"\x89PNG" + b"\x01" * 100
URI = "data:image/png;base64," + base64.b64encode(DATA).decode()
KEY = hashlib.sha256(DATA).hexdigest()


def message(url: str = URI) -> dict:
    image_part = {"type": "image_url", "image_url": {"url": url}}
    return {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image_part]}


class FakeClient:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.release = asyncio.Event()
        self.release.set()

    async def describe(self, image_url: str) -> str:
        self.calls.append(image_url)
        await self.release.wait()
        if self.fail:
            raise VisionError("model down")
        return f"description {len(self.calls)}"

    async def close(self) -> None:
        pass


async def test_the_same_image_twice_is_described_once(tmp_path) -> None:
    client = FakeClient()
    client.release.clear()
    describer = ImageDescriber(client, FilesystemBlobStore(tmp_path))
    assert describer.start(message(), TENANT) == [KEY]
    describer.start(message(), TENANT)  # under way: not started again
    assert KEY not in describer.for_tenant(TENANT)  # until ready, the engine's placeholder serves
    client.release.set()
    assert await describer.wait(timeout=5)
    describer.start(message(), TENANT)  # ready: not started again
    await describer.wait(timeout=5)
    assert client.calls == [URI]
    assert describer.for_tenant(TENANT)[KEY] == "description 1"
    assert (tmp_path / description_blob_name(KEY, TENANT)).read_text() == "description 1"
    assert describer.stats.described == 1 and describer.stats.started == 1


async def test_a_persisted_description_is_loaded_without_the_model(tmp_path) -> None:
    store = FilesystemBlobStore(tmp_path)
    await store.put(description_blob_name(KEY, TENANT), b"a stored description")
    client = FakeClient()
    describer = ImageDescriber(client, store)
    assert describer.for_tenant(TENANT).get(KEY) is None  # a miss schedules loading it
    await describer.wait(timeout=5)
    assert describer.for_tenant(TENANT)[KEY] == "a stored description" and client.calls == []


class Owners:
    """memci_proxy.store.ports.BlobOwnership in memory."""

    def __init__(self) -> None:
        self.refs: set[tuple[str, str, str]] = set()

    async def claim_blobs(self, tenant, conversation_id, keys, write) -> None:
        self.refs.update((tenant, conversation_id, k) for k in keys)
        await write()

    async def owns_blob(self, tenant: str, key: str) -> bool:
        return any(t == tenant and k == key for t, _, k in self.refs)


async def test_blob_references_are_described_from_the_stored_bytes_of_their_owner_only(tmp_path) -> None:
    store = FilesystemBlobStore(tmp_path)
    owners = Owners()
    client = FakeClient()
    describer = ImageDescriber(client, store, owns=owners.owns_blob)
    stored = await intake_images([message()], store, None, TENANT, "c1", owners)
    assert (tmp_path / image_blob_name(KEY)).read_bytes() == DATA
    assert owners.refs == {(TENANT, "c1", KEY)}
    describer.start(stored[0], "tenant-b")  # another tenant writes the reference itself: never read
    await describer.wait(timeout=5)
    assert client.calls == [] and describer.stats.refused == 1 and KEY not in describer.for_tenant("tenant-b")
    describer.start(stored[0], TENANT)
    await describer.wait(timeout=5)
    assert client.calls == [URI]
    assert describer.for_tenant(TENANT)[KEY] == "description 1" and KEY not in describer.for_tenant("tenant-b")


async def test_descriptions_are_kept_per_tenant(tmp_path) -> None:
    store = FilesystemBlobStore(tmp_path)
    client = FakeClient()
    describer = ImageDescriber(client, store)
    describer.start(message(), TENANT)
    await describer.wait(timeout=5)
    assert describer.for_tenant("tenant-b").get(KEY) is None  # a miss schedules a load: nothing stored for b
    await describer.wait(timeout=5)
    assert KEY not in describer.for_tenant("tenant-b") and list(describer.for_tenant(TENANT)) == [KEY]
    describer.start(message(), "tenant-b")  # b sends the same bytes: described for b on its own
    await describer.wait(timeout=5)
    assert len(client.calls) == 2 and describer.for_tenant("tenant-b")[KEY] == "description 2"
    describer.forget(TENANT, [KEY])
    assert KEY not in describer.for_tenant(TENANT) and describer.for_tenant("tenant-b")[KEY] == "description 2"


async def test_descriptions_in_memory_are_bounded_in_bytes(tmp_path) -> None:
    describer = ImageDescriber(None, None, capacity=1000, max_bytes=4000)
    for i in range(50):
        describer._remember(f"{i:064x}", TENANT, "d" * 500)
    assert describer._ready.bytes <= 4000 and len(describer._ready) < 10 and describer._ready.evictions > 40


async def test_failures_and_no_model_leave_the_placeholder(tmp_path) -> None:
    for describer in (ImageDescriber(FakeClient(fail=True), None), ImageDescriber(None, None)):
        describer.start(message(), TENANT)
        await describer.wait(timeout=5)
        assert KEY not in describer.for_tenant(TENANT) and describer.stats.failed == 1
        describer.start(message(), TENANT)  # not retried
        await describer.wait(timeout=5)
        assert describer.stats.started == 1


async def test_intake_stores_each_blob_once_and_starts_descriptions(tmp_path) -> None:
    store = FilesystemBlobStore(tmp_path)
    client = FakeClient()
    describer = ImageDescriber(client, store)
    out = await intake_images([message(), {"role": "assistant", "content": "ok"}, message()], store, describer)
    await describer.wait(timeout=5)
    assert out[0]["content"][1]["image_url"]["url"].startswith(f"memci-blob://sha256/{KEY}")
    assert out[1] == {"role": "assistant", "content": "ok"}
    assert len(list((tmp_path / "images").rglob("*"))) == 3  # sha256/, sha256/xx/, the one blob
    assert client.calls == [URI]


async def test_vision_client_sends_an_image_part_and_reads_the_answer() -> None:
    seen: list[dict] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append({"auth": request.headers.get("Authorization"), "body": await request.json()})
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "  A cat\n on a mat. "}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app) as server:
        client = VisionClient(f"http://127.0.0.1:{server.port}/v1", "vl-model", api_key="k", max_tokens=50)
        try:
            assert await client.describe(URI) == "A cat on a mat."
        finally:
            await client.close()
    body = seen[0]["body"]
    assert seen[0]["auth"] == "Bearer k" and body["model"] == "vl-model" and body["max_tokens"] == 50
    assert body["messages"][0]["content"][1] == {"type": "image_url", "image_url": {"url": URI}}


async def test_vision_client_errors_are_vision_errors() -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no"}}, status=500)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", broken)
    async with TestServer(app) as server:
        client = VisionClient(f"http://127.0.0.1:{server.port}/v1", "m")
        try:
            try:
                await client.describe(URI)
            except VisionError as exc:
                assert "HTTP 500" in str(exc)
            else:
                raise AssertionError("expected VisionError")
        finally:
            await client.close()


def test_factory_without_a_model_has_no_client(tmp_path) -> None:
    class S:
        upstream_url = "http://127.0.0.1:30000/v1"
        upstream_urls = ["http://127.0.0.1:30000/v1"]

    assert make_describer(S(), None).client is None
    S.vision_model = "qwen2.5-vl"
    client = make_describer(S(), None).client
    assert client.url == "http://127.0.0.1:30000/v1/chat/completions" and client.model == "qwen2.5-vl"

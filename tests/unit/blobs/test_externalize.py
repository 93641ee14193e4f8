import base64
import hashlib

import pytest

from memci_proxy.blobs import FilesystemBlobStore, externalize_images, image_blob_name, internalize_images, store_blobs
from memci_proxy.engine.condense import image_reference

DATA = b"\x89PNG\r\n" + bytes(range(200))
URI = "data:image/png;base64," + base64.b64encode(DATA).decode()
KEY = hashlib.sha256(DATA).hexdigest()


def message(*urls: str) -> dict:
    images = [{"type": "image_url", "image_url": {"url": u, "detail": "low"}} for u in urls]
    parts = [{"type": "text", "text": "look"}, *images]
    return {"role": "user", "content": parts}


def test_data_uris_become_blob_references_once_per_hash() -> None:
    original = message(URI, URI, "https://example.org/x.png")
    stored, blobs = externalize_images(original)
    assert [b.key for b in blobs] == [KEY] and blobs[0].data == DATA and blobs[0].media_type == "image/png"
    ref = f"memci-blob://sha256/{KEY}?type=image/png&size={len(DATA)}"
    assert stored["content"][1] == {"type": "image_url", "image_url": {"url": ref, "detail": "low"}}
    assert stored["content"][2]["image_url"]["url"] == ref
    assert stored["content"][3]["image_url"]["url"] == "https://example.org/x.png"
    assert "base64" not in str(stored)
    assert original["content"][1]["image_url"]["url"] == URI  # the input is never mutated
    assert image_reference(stored["content"][1]).key == image_reference(original["content"][1]).key


def test_messages_without_data_images_come_back_as_they_are() -> None:
    plain = ({"role": "user", "content": "hi"}, message("https://example.org/x.png"),
             {"role": "assistant", "content": None})
    for m in plain:
        stored, blobs = externalize_images(m)
        assert stored is m and blobs == []


def test_plain_string_image_url_form() -> None:
    stored, blobs = externalize_images({"role": "user", "content": [{"type": "image_url", "image_url": URI}]})
    assert stored["content"][0]["image_url"].startswith("memci-blob://sha256/" + KEY) and len(blobs) == 1


async def test_store_then_internalize_round_trip(tmp_path) -> None:
    store = FilesystemBlobStore(tmp_path)
    stored, blobs = externalize_images(message(URI))
    assert await store_blobs(store, blobs) == 1
    assert await store_blobs(store, blobs) == 0  # stored once
    assert (tmp_path / image_blob_name(KEY)).read_bytes() == DATA
    restored = await internalize_images(stored, store)
    assert restored["content"][1]["image_url"]["url"] == URI


def test_bad_data_uri_is_left_alone() -> None:
    m = message("data:image/png;base64,@@@not base64@@@")
    stored, blobs = externalize_images(m)
    assert blobs == [] or all(len(b.key) == 64 for b in blobs)
    with pytest.raises(ValueError):
        image_blob_name("../../etc/passwd")

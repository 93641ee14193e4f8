"""Recall text of archived pages: images as their descriptions with their blob references."""

import base64
import hashlib

from memci_proxy.blobs import externalize_images
from memci_proxy.recall.reading.pagetext import index_text, render_page

DATA = b"GIF89a" + b"\x00" * 58
URI = "data:image/gif;base64," + base64.b64encode(DATA).decode()
KEY = hashlib.sha256(DATA).hexdigest()
IMAGE = {"type": "image_url", "image_url": {"url": URI}}
PAGE = [
    {"role": "user", "content": [{"type": "text", "text": "why does it fail?"}, IMAGE]},
    {"role": "assistant", "content": "The log shows a timeout."},
]


def test_recall_by_number_returns_the_description_and_the_blob_reference() -> None:
    text = render_page("1", 0.0, "archived", PAGE, {KEY: "Terminal: ERROR connection timed out after 30s"})
    assert f"[image memci-blob://sha256/{KEY}: Terminal: ERROR connection timed out after 30s]" in text
    assert "base64" not in text


def test_stored_messages_with_references_read_the_same() -> None:
    stored = [externalize_images(m)[0] for m in PAGE]
    descriptions = {KEY: "a terminal"}
    assert index_text(stored, descriptions) == index_text(PAGE, descriptions)


def test_without_a_description_the_placeholder_gives_type_and_size() -> None:
    assert f"[image memci-blob://sha256/{KEY}: image/gif, 64 B, no description available]" in index_text(PAGE)

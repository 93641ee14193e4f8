"""Seed 003 tier 2 condenser: drop reasoning, cut long tool outputs, decay images to their text descriptions.
Returns new dicts, never mutates."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from .markup import quote
from .memo import SizedMemo

REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
THINKING_PART_TYPES = ("thinking", "reasoning", "redacted_thinking")
IMAGE_PART_TYPES = ("image_url", "input_image", "image")
# Where the proxy keeps an image's bytes: `memci-blob://sha256/<hex digest of the bytes>`.
BLOB_URL_PREFIX = "memci-blob://sha256/"


@dataclass(frozen=True)
class ImageRef:
    """One image part. `key`: sha256 hex of the image bytes (data URI or blob reference), or of the URL text
    for a remote URL (the engine never fetches). `size`: bytes, -1 when unknown."""

    key: str
    media_type: str
    size: int
    source: str  # "data" | "blob" | "url"
    url: str  # the image's address as it is quoted in text: the blob reference, or the remote URL


def image_url_of(part: Any) -> str | None:
    """The URL of an image content part (`image_url: {url}` or `image_url: "..."`), else None."""
    if not isinstance(part, dict) or part.get("type") not in IMAGE_PART_TYPES:
        return None
    value = part.get("image_url", part.get("url"))
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) and value else None


def parse_data_uri(uri: str) -> tuple[str, bytes] | None:
    """(media type, bytes) of a `data:` URI, or None when it is not one or its payload is malformed."""
    if not uri.startswith("data:"):
        return None
    header, comma, payload = uri[5:].partition(",")
    if not comma:
        return None
    fields = header.split(";")
    media_type = fields[0].strip().lower() or "text/plain"
    if "base64" in (f.strip().lower() for f in fields[1:]):
        try:
            data = base64.b64decode(payload, validate=False)
        except (binascii.Error, ValueError):
            return None
    else:
        from urllib.parse import unquote_to_bytes

        data = unquote_to_bytes(payload)
    return media_type, data


_DATA_REFS: SizedMemo[tuple[int, bytes], ImageRef | None] = SizedMemo(4096, 4 * 1024 * 1024, lambda _key, ref: 120 + (
    0 if ref is None else len(ref.key) + len(ref.media_type) + len(ref.url)))


def _data_uri_ref(uri: str) -> ImageRef | None:
    """Memoised by a fast digest of the URI text (not the text itself: images may be megabytes), so a decayed
    image rendered again each turn is not decoded and hashed again."""
    fingerprint = (len(uri), xxhash.xxh3_128_digest(uri.encode("utf-8", "surrogatepass")))
    if fingerprint in _DATA_REFS:
        return _DATA_REFS.get(fingerprint)
    parsed = parse_data_uri(uri)
    ref = None
    if parsed is not None:
        media_type, data = parsed
        key = hashlib.sha256(data).hexdigest()
        ref = ImageRef(key, media_type, len(data), "data", BLOB_URL_PREFIX + key)
    _DATA_REFS.put(fingerprint, ref)
    return ref


def image_reference(part: Any) -> ImageRef | None:
    """The reference of an image part (hash, type, size), or None when `part` is not an image part."""
    url = image_url_of(part)
    if url is None:
        return None
    if url.startswith("data:"):
        ref = _data_uri_ref(url)
        if ref is not None:
            return ref
        return ImageRef(hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest(), "", -1, "url", "data:…")
    if url.startswith(BLOB_URL_PREFIX):
        rest = url[len(BLOB_URL_PREFIX) :]
        key, _, query = rest.partition("?")
        meta = dict(p.partition("=")[::2] for p in query.split("&") if p)
        size = int(meta["size"]) if meta.get("size", "").isdigit() else -1
        return ImageRef(key.lower(), meta.get("type", ""), size, "blob", BLOB_URL_PREFIX + key.lower())
    return ImageRef(hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest(), "", -1, "url", url)


def message_images(message: dict[str, Any]) -> list[ImageRef]:
    """The image parts of a message's content, in order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [ref for ref in map(image_reference, content) if ref is not None]


def human_size(size: int) -> str:
    if size < 0:
        return "size unknown"
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def image_placeholder(ref: ImageRef) -> str:
    """What stands for an image without a description: its type and size."""
    kind = ref.media_type or "image"
    return f"{kind}, {human_size(ref.size)}, no description available"


def image_description(ref: ImageRef, descriptions: Mapping[str, str] | None) -> str:
    """The description of the image (an empty or missing value means: the placeholder). Descriptions are the
    vision model's output: quoted (memci_proxy.engine.markup)."""
    text = descriptions.get(ref.key) if descriptions is not None else None
    return quote(" ".join(text.split())) if text else image_placeholder(ref)


def image_text(ref: ImageRef, descriptions: Mapping[str, str] | None, with_reference: bool = True) -> str:
    """The text an image decays to: `[image <reference>: <description>]` (no reference on the contents page)."""
    where = f" {ref.url}" if with_reference else ""
    return f"[image{where}: {image_description(ref, descriptions)}]"


def decay_images(message: dict[str, Any], descriptions: Mapping[str, str] | None) -> dict[str, Any] | None:
    """A copy of the message with each image part replaced by a text part holding its description; None when
    the message has no image part."""
    content = message.get("content")
    if not isinstance(content, list):
        return None
    out: list[Any] = []
    changed = False
    for part in content:
        ref = image_reference(part)
        if ref is None:
            out.append(part)
        else:
            out.append({"type": "text", "text": image_text(ref, descriptions)})
            changed = True
    return {**message, "content": out} if changed else None


def cut_marker(removed: int) -> str:
    return f"…[cut {removed} chars]"


def _cut_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + cut_marker(len(text) - limit)


def condense_message(
    message: dict[str, Any], tool_chars: int, image_descriptions: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The condensed form of a message, or None when condensing would not change it. With
    `image_descriptions` (keyed by `ImageRef.key`; a missing or empty value means the placeholder), image parts
    decay to text first; without it they are kept."""
    decayed = decay_images(message, image_descriptions) if image_descriptions is not None else None
    if decayed is None:
        return _condense_text(message, tool_chars)
    return _condense_text(decayed, tool_chars) or decayed


def _condense_text(message: dict[str, Any], tool_chars: int) -> dict[str, Any] | None:
    role = message.get("role")
    if role == "tool":
        content = message.get("content")
        if isinstance(content, str):
            if len(content) <= tool_chars:
                return None
            return {**message, "content": _cut_text(content, tool_chars)}
        if isinstance(content, list):
            text = "".join(
                p.get("text", "") if isinstance(p, dict) and isinstance(p.get("text"), str) else "" for p in content
            )
            has_other = any(not (isinstance(p, dict) and isinstance(p.get("text"), str)) for p in content)
            if len(text) <= tool_chars and not has_other:
                return None
            return {**message, "content": _cut_text(text, tool_chars)}
        return None
    if role == "assistant":
        changed = False
        out = dict(message)
        for key in REASONING_KEYS:
            if key in out:
                del out[key]
                changed = True
        content = out.get("content")
        if isinstance(content, list):
            kept = [p for p in content if not (isinstance(p, dict) and p.get("type") in THINKING_PART_TYPES)]
            if len(kept) != len(content):
                out["content"] = kept
                changed = True
        return out if changed else None
    return None


def condense_messages(messages: list[dict[str, Any]], tool_chars: int) -> tuple[list[dict[str, Any]], bool]:
    out: list[dict[str, Any]] = []
    changed = False
    for m in messages:
        c = condense_message(m, tool_chars)
        if c is None:
            out.append(m)
        else:
            out.append(c)
            changed = True
    return out, changed

"""The configured describer: a vision model on the upstream (or its own URL) when `vision_model` is set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memci_proxy.blobs.store import BlobStore

from .client import DEFAULT_PROMPT, VisionClient
from .describer import ImageDescriber, Owner


def make_describer(settings: Any, store: BlobStore | None, owns: Owner | None = None,
                   on_refused: Callable[[str], None] | None = None) -> ImageDescriber:
    """Settings read (missing ones take these defaults): `vision_model` ("" = placeholders only),
    `vision_url` ("" = the first upstream URL), `vision_api_key` ("" = `upstream_api_key`),
    `vision_timeout` (60 s), `vision_max_tokens` (300), `vision_prompt`, `vision_concurrency` (2),
    `vision_cache_size` (4096 descriptions in memory). ``owns(tenant, key)``: whether a tenant may read stored
    image bytes (see ImageDescriber); `vision_allow_private_urls` (False) and ``on_refused(reason)``: see
    memci_proxy.vision.urls."""
    model = str(getattr(settings, "vision_model", "") or "")
    client = None
    if model:
        urls = getattr(settings, "upstream_urls", None) or [str(getattr(settings, "upstream_url", ""))]
        base = str(getattr(settings, "vision_url", "") or urls[0])
        client = VisionClient(
            base,
            model,
            api_key=str(getattr(settings, "vision_api_key", "") or getattr(settings, "upstream_api_key", "") or ""),
            timeout=float(getattr(settings, "vision_timeout", 60.0)),
            max_tokens=int(getattr(settings, "vision_max_tokens", 300)),
            prompt=str(getattr(settings, "vision_prompt", "") or DEFAULT_PROMPT),
        )
    return ImageDescriber(
        client,
        store,
        capacity=int(getattr(settings, "vision_cache_size", 4096)),
        concurrency=int(getattr(settings, "vision_concurrency", 2)),
        owns=owns,
        allow_private_urls=bool(getattr(settings, "vision_allow_private_urls", False)),
        on_refused=on_refused,
    )

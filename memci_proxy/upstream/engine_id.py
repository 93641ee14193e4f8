"""Which engine serves the upstream, from what it answers at its root, for `memci-proxy doctor`.

Probes, in order (the first that tells wins):
- SGLang: ``GET /server_info`` (its server arguments: ``version``, ``disable_radix_cache``, ``enable_cache_report``,
  ``context_length``);
- llama.cpp's server: ``GET /props`` with ``default_generation_settings`` (one prompt per slot);
- llama-cpp-python's server: ``GET /openapi.json`` titled "llama.cpp Python API" (one slot);
- vLLM: ``GET /version`` (``{"version": ...}``; automatic prefix caching is on by default since its V1 engine);
- this project's emulator: ``GET /emulator/stats`` (a radix cache like SGLang's).
Anything else is an engine the proxy does not know by name (a hosted API, say): the hit-rate check of doctor still
tells whether its prefix cache is reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

RADIX, SINGLE_SLOT, NO_CACHE = "radix", "single_slot", "none"
PROBES = ("/server_info", "/props", "/openapi.json", "/version", "/emulator/stats")


@dataclass(frozen=True)
class Engine:
    name: str
    version: str = ""
    cache: str = RADIX  # radix | single_slot | none
    warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        cache = {RADIX: "a radix prefix cache (many prefixes kept at once)",
                 SINGLE_SLOT: "one cached prompt per slot (memory jobs run before an epoch's request)",
                 NO_CACHE: "no prefix cache"}[self.cache]
        return f"{self.name}{' ' + self.version if self.version else ''}, {cache}"


def _decode(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def engine_of(path: str, status: int, body: bytes) -> Engine | None:
    """The engine one probe's answer shows (None: this probe does not tell)."""
    if status != 200:
        return None
    data = _decode(body)
    if data is None:
        return None
    if path == "/server_info" and "disable_radix_cache" in data:
        warnings = []
        if data.get("disable_radix_cache"):
            warnings.append("SGLang runs with --disable-radix-cache: no prompt is ever cached")
        if not data.get("enable_cache_report"):
            warnings.append("SGLang runs without --enable-cache-report: usage carries no cached_tokens, so the hit-rate "
                            "metrics stay empty and cold caches go unnoticed")
        return Engine("SGLang", _text(data.get("version")), NO_CACHE if data.get("disable_radix_cache") else RADIX,
                      tuple(warnings))
    if path == "/props" and isinstance(data.get("default_generation_settings"), dict):
        return Engine("llama.cpp server", _text(data.get("build_info")), SINGLE_SLOT)
    if path == "/openapi.json":
        info = data.get("info")
        title = _text(info.get("title")) if isinstance(info, dict) else ""
        if "llama.cpp" in title:
            return Engine("llama-cpp-python server", _text(info.get("version")), SINGLE_SLOT)
        return None
    if path == "/version" and isinstance(data.get("version"), str) and len(data) <= 2:
        return Engine("vLLM", data["version"], RADIX)
    if path == "/emulator/stats":
        return Engine("the memci-proxy emulator", "", RADIX)
    return None


def root_of(base_url: str) -> str:
    """The server's root: the OpenAI base URL without its trailing `/v1`."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base

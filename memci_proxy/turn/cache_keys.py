"""Cache keys the serving ecosystem routes by, for managed chat requests.

- `prompt_cache_key` (OpenAI): requests with the same key and prefix go to the same cache. A client's own key
  is passed on as sent; without one the conversation id is used (setting `prompt_cache_key`).
- A session-affinity header for routers that pin a session to one worker (SGLang's router, NVIDIA Dynamo, a
  gateway's consistent hashing): its name is the setting `session_affinity_header`, its value the conversation id.
- SGLang's `cache_salt` stays as it is (`memci_proxy.api.auth`, setting `cache_salt_per_tenant`).
"""

from __future__ import annotations

from typing import Any

from memci_proxy.settings import Settings


def with_prompt_cache_key(data: dict[str, Any], conversation_id: str, enabled: bool) -> dict[str, Any]:
    """The request data with the conversation id as its `prompt_cache_key` when the client gave none."""
    if not enabled or not conversation_id or data.get("prompt_cache_key"):
        return data
    return {**data, "prompt_cache_key": conversation_id}


def upstream_headers(settings: Settings, conversation_id: str) -> dict[str, str] | None:
    """The session-affinity header, when one is configured."""
    name = settings.session_affinity_header.strip()
    if not name or not conversation_id:
        return None
    return {name: conversation_id}

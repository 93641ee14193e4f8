"""Admin endpoints under /memci/ (bearer admin key): what the proxy did with a conversation."""

from __future__ import annotations

from litestar import Request, Response, get

from memci_proxy.api.auth import bore_a_key, is_admin_request
from memci_proxy.api.forwarding import services_of, stored_text_json
from memci_proxy.api.services import Services
from memci_proxy.engine.markup import quote
from memci_proxy.engine.state import STATUS_NAMES as STATUS_NAMES_BY_CODE
from memci_proxy.wire.errors import ProxyError


def check_admin_key(request: Request, admin_key: str) -> None:
    """403 while the admin API is off (no admin key set), 401 unless the request carries the admin key."""
    if not admin_key:
        raise ProxyError(403, "the admin API is off: set MEMCI_ADMIN_KEY", "permission_error", "admin_disabled")
    if is_admin_request(request.scope):
        return
    if bore_a_key(request.scope):
        raise ProxyError(401, "invalid admin key: the key given is not the proxy's admin key", "authentication_error",
                         "invalid_admin_key")
    raise ProxyError(401, "admin key required (Authorization: Bearer <admin key>)", "authentication_error",
                     "missing_admin_key")


def require_admin(request: Request) -> Services:
    services = services_of(request)
    check_admin_key(request, services.settings.admin_key)
    if services.context is None:
        raise ProxyError(404, "context management is off", "invalid_request_error", "context_off")
    return services


@get("/memci/conversations/{conversation_id:str}/prompt")
async def last_prompt(request: Request, conversation_id: str) -> Response:
    """The conversation's last upstream prompt with its block boundaries (B1..B6), and its pages."""
    services = require_admin(request)
    context = services.context
    remembered = context.last_prompts.get(conversation_id)
    state = context.state_of(conversation_id)
    if state is None:  # another replica's turn: the shared hot copy
        snapshot = await services.store.hot.get_snapshot(conversation_id)
        if snapshot is not None:
            from memci_proxy.engine import ConversationState

            state = ConversationState.from_bytes(snapshot[0])
    if remembered is None and state is None:
        raise ProxyError(404, f"no recent prompt for conversation {conversation_id!r} on this replica",
                         "invalid_request_error", "not_found")
    pages = []
    if state is not None:
        pages = [
            {"number": p.label, "first_entry": p.start, "last_entry": p.end - 1, "state": STATUS_NAMES_BY_CODE[p.status],
             "tokens": p.tokens, "recall_count": p.recall_count}
            for p in state.pages
        ]
    body = {
        "conversation_id": conversation_id,
        "epoch": remembered.epoch if remembered else None,
        "messages": remembered.messages if remembered else None,
        "blocks": describe_blocks(remembered, state) if remembered else None,
        # estimated upstream tokens: shed by the turn's epoch, prefilled after its stable prefix, pushed by
        # proactive recall; the answer's max_tokens asked and sent (lowered to fit the window)
        "accounting": remembered.accounting if remembered else None,
        "pages": pages,
    }
    return stored_text_json(body)  # the prompt as the upstream got it


def describe_blocks(remembered, state) -> list[dict]:
    """Block spans as message ranges; the leading system message is split into B1, B2a and B4 by characters."""
    out: list[dict] = []
    for name, start, end in remembered.blocks:
        if name != "system":
            out.append({"name": name, "start": start, "end": end})
            continue
        text = remembered.messages[start].get("content") or ""
        parts = [("B2a", quote(state.profile) if state else ""), ("B4", quote(state.summary) if state else ""),
                 ("B4", state.contents_text if state else "")]
        # From the end: the proxy's parts follow B1, whose client text may contain look-alikes of them.
        found: list[tuple[int, str, int]] = []
        limit = len(text)
        for name, part in reversed(parts):
            position = text.rfind(part, 0, limit) if part else -1
            if position >= 0:
                found.insert(0, (position, name, len(part)))
                limit = position
        b1_end = found[0][0] if found else len(text)
        out.append({"name": "B1", "start": start, "end": end, "chars": [0, b1_end]})
        for pos, name, length in found:
            out.append({"name": name, "start": start, "end": end, "chars": [pos, pos + length]})
    return out


ADMIN_ROUTES = [last_prompt]

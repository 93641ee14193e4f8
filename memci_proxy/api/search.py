"""POST /memci/search: the ranked archived pages the recall tool would use, scoped by the caller's tenant."""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response, post

from memci_proxy.api.forwarding import services_of
from memci_proxy.api.tenants import caller_tenant
from memci_proxy.engine.contents import utc_date
from memci_proxy.recall.users import across
from memci_proxy.turn.end_user import MAX_USER_ID_CHARS, user_key
from memci_proxy.turn.identity import conversation_id_for_session
from memci_proxy.engine import ConversationState
from memci_proxy.engine.state import STATUS_NAMES
from memci_proxy.recall.reading.pagetext import excerpt
from memci_proxy.recall.resolver import RecallContext, query_terms
from memci_proxy.wire.errors import ProxyError, bad_request
from memci_proxy.wire.validate import parse_json_object, stored_text


@post("/memci/search", status_code=200)
async def search(request: Request) -> Response:
    services = services_of(request)
    context = services.context
    if context is None or not context.recall_enabled:
        raise ProxyError(404, "search needs context management and recall on", "invalid_request_error", "search_off")
    data = parse_json_object(await request.body())
    query = data.get("query")
    if not isinstance(query, str) or not query.strip():
        raise bad_request("'query' is required (text)", param="query")
    k = data.get("k", 5)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 100:
        raise bad_request("'k' must be an integer from 1 to 100", param="k")
    tenant = await caller_tenant(request, services)
    end_user = _end_user(data, tenant, services.settings.user_hash_key)
    conversation_id = data.get("conversation_id")
    session_key = data.get("session_key")
    if isinstance(session_key, str) and session_key:
        conversation_id = conversation_id_for_session(tenant, session_key, end_user)
    if end_user and conversation_id is None:  # the user's conversations, all of them
        return await _user_search(services, tenant, end_user, query, k)
    if not isinstance(conversation_id, str) or not conversation_id:
        raise bad_request("give 'conversation_id', 'session_key' or 'user'", param="conversation_id")
    stored_text(conversation_id, "conversation_id", 256)
    stored = await services.store.repo.load_snapshot(tenant, conversation_id)
    if stored is None or stored[0] is None:
        raise ProxyError(404, f"no conversation {conversation_id!r} for this key", "invalid_request_error", "not_found")
    state = ConversationState.from_bytes(stored[0])
    ctx = RecallContext(tenant, conversation_id, state, None)
    resolver = context.resolver
    started = time.perf_counter()
    hits = await resolver.search(ctx, query, k)
    elapsed = time.perf_counter() - started
    services.metrics.recall_search_seconds.observe(elapsed)
    terms = query_terms(query)
    out = [
        {"page": label, "score": round(score, 4), "state": STATUS_NAMES[record.status],
         "excerpt": excerpt(text, terms)}
        for label, score, record, text in await resolver.hit_pages(ctx, hits)
    ]
    body: dict[str, Any] = {"conversation_id": conversation_id, "query": query, "hits": out}
    if end_user:
        others, _ = await resolver.other_conversations(tenant, end_user, conversation_id, query, k)
        body["other_conversations"] = [_other_hit(c, score, terms) for c, score in others]
    body["took_ms"] = round((time.perf_counter() - started) * 1000, 3)
    return Response(content=body)


def _end_user(data: dict[str, Any], tenant: str, secret: str) -> str:
    """The key of the end user the body names (``user``), "" for none."""
    user = data.get("user")
    if user is None:
        return ""
    if not isinstance(user, str) or not user.strip() or len(user) > MAX_USER_ID_CHARS:
        raise bad_request(f"'user' must be a string of 1 to {MAX_USER_ID_CHARS} characters", param="user")
    return user_key(tenant, user.strip(), secret)


def _other_hit(candidate: across.Candidate, score: float, terms: list[str]) -> dict[str, Any]:
    return {"page": across.label_of(candidate), "conversation_id": candidate.conversation_id,
            "date": utc_date(candidate.seen_at), "score": round(score, 4), "excerpt": excerpt(candidate.text, terms)}


async def _user_search(services: Any, tenant: str, end_user: str, query: str, k: int) -> Response:
    started = time.perf_counter()
    hits, _ = await services.context.resolver.other_conversations(tenant, end_user, "", query, k)
    terms = query_terms(query)
    return Response(content={"user": end_user, "query": query, "hits": [_other_hit(c, s, terms) for c, s in hits],
                             "took_ms": round((time.perf_counter() - started) * 1000, 3)})


SEARCH_ROUTES = [search]

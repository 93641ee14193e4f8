"""Conversation APIs under /memci/conversations: list, history, export, delete.

The caller's own key sees its own conversations (tenant = the key's tenant). The admin key sees any tenant's,
named by the header `X-Memci-Tenant` (memci_proxy.api.tenants: a tenant name or id; an unknown one is a 404).
"""

from __future__ import annotations

import bisect
from typing import Any

from litestar import Request, Response, delete, get

from memci_proxy.api.forwarding import services_of, stored_text_json
from memci_proxy.blobs.store import description_blob_name, image_blob_name
from memci_proxy.api.services import Services
from memci_proxy.api.tenants import caller_tenant
from memci_proxy.engine import ConversationState
from memci_proxy.store.ports import ConversationInfo, PageRow
from memci_proxy.wire.errors import ProxyError, bad_request

MAX_PAGE = 1000


async def caller(request: Request, bound_ok: bool = False) -> tuple[Services, str]:
    services = services_of(request)
    if services.context is None or services.store is None:
        raise ProxyError(404, "conversation APIs need context management on", "invalid_request_error", "context_off")
    return services, await caller_tenant(request, services, bound_ok)


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"'{name}' must be an integer", param=name) from None
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be from {low} to {high}", param=name)
    return value


def _info_json(info: ConversationInfo) -> dict[str, Any]:
    return {
        "id": info.id, "label": info.label, "session_key": info.session_key, "parent_id": info.parent_id,
        "forked_at": info.forked_at, "created_at": info.created_at.isoformat(),
        "last_active_at": info.last_active_at.isoformat(), "state_version": info.state_version,
    }


def _page_json(page: PageRow) -> dict[str, Any]:
    return {"number": page.number, "first_entry": page.first_seq, "last_entry": page.last_seq, "state": page.state,
            "tokens": page.tokens, "recall_count": page.recall_count, "last_recalled_turn": page.last_recalled_turn}


async def _offloads_json(services: Services, tenant: str, conversation_id: str) -> list[dict[str, Any]]:
    """The conversation's offloaded outputs (pages of their own, memci_proxy.engine.offload_state): the stored state's."""
    stored = await services.store.repo.load_snapshot(tenant, conversation_id)
    if stored is None or stored[0] is None:
        return []
    state = ConversationState.from_bytes(stored[0])
    return [{"number": r.number, "entry": r.entry, "kind": r.kind, "lines": r.lines, "chars": r.chars,
             "tokens": r.tokens} for r in state.offloads]


async def _require(services: Services, tenant: str, conversation_id: str) -> ConversationInfo:
    await services.context.flush(conversation_id)  # this replica's turns still queued for the database
    info = await services.store.repo.get_conversation(tenant, conversation_id)
    if info is None:
        raise ProxyError(404, f"no conversation {conversation_id!r} for this key", "invalid_request_error", "not_found")
    return info


class _PageOf:
    """Which page an entry belongs to."""

    def __init__(self, pages: list[PageRow]) -> None:
        self.pages = sorted(pages, key=lambda p: p.first_seq)
        self.starts = [p.first_seq for p in self.pages]

    def __call__(self, seq: int) -> PageRow | None:
        i = bisect.bisect_right(self.starts, seq) - 1
        if i >= 0 and self.pages[i].first_seq <= seq <= self.pages[i].last_seq:
            return self.pages[i]
        return None


@get("/memci/conversations")
async def list_conversations(request: Request) -> Response:
    services, tenant = await caller(request)
    limit = _int_param(request, "limit", 50, 1, MAX_PAGE)
    rows = await services.store.repo.list_conversations(tenant, limit=limit)
    return Response(content={"object": "list", "data": [_info_json(r) for r in rows]})


@get("/memci/conversations/{conversation_id:str}")
async def conversation_history(request: Request, conversation_id: str) -> Response:
    """The conversation's messages with their page numbers and archive state (`after`/`limit` page through)."""
    services, tenant = await caller(request)
    info = await _require(services, tenant, conversation_id)
    after = _int_param(request, "after", -1, -1, 2**31 - 1)
    limit = _int_param(request, "limit", 200, 1, MAX_PAGE)
    repo = services.store.repo
    pages = await repo.load_pages(tenant, conversation_id, ("active", "archived", "evicted"))
    page_of = _PageOf(pages)
    entries = await repo.load_entries(tenant, conversation_id, after + 1, after + limit)
    messages = []
    for e in entries:
        page = page_of(e.seq)
        messages.append({"seq": e.seq, "page": page.number if page else None,
                         "state": page.state if page else "active", "message": e.message})
    offloads = await _offloads_json(services, tenant, conversation_id)
    offloaded = {o["entry"]: o["number"] for o in offloads}
    for m in messages:
        if m["seq"] in offloaded:
            m["offloaded_as"] = offloaded[m["seq"]]
    return stored_text_json({
        "conversation": _info_json(info), "pages": [_page_json(p) for p in pages], "offloads": offloads,
        "messages": messages,
        "next_after": messages[-1]["seq"] if len(messages) == limit else None,
    })


@get("/memci/conversations/{conversation_id:str}/export")
async def export_conversation(request: Request, conversation_id: str) -> Response:
    """Everything stored about one conversation, as one JSON document."""
    services, tenant = await caller(request)
    return stored_text_json(await export_of(services, tenant, conversation_id),
                            headers={"Content-Disposition": f'attachment; filename="{conversation_id}.json"'})


async def export_of(services: Services, tenant: str, conversation_id: str) -> dict[str, Any]:
    """Everything stored about one conversation of the tenant (404 when it has none of that id)."""
    info = await _require(services, tenant, conversation_id)
    repo = services.store.repo
    pages = await repo.load_pages(tenant, conversation_id, ("active", "archived", "evicted"))
    entries = await repo.load_entries(tenant, conversation_id, 0, 2**31 - 1)
    events = await repo.load_events(tenant, conversation_id, limit=10_000)
    return {
        "conversation": _info_json(info),
        "pages": [_page_json(p) for p in pages],
        "offloads": await _offloads_json(services, tenant, conversation_id),
        "messages": [{"seq": e.seq, "hash": e.hash, "message": e.message} for e in entries],
        "events": [{"kind": ev.kind, "payload": ev.payload,
                    "created_at": ev.created_at.isoformat() if ev.created_at else None} for ev in events],
    }


@delete("/memci/conversations/{conversation_id:str}", status_code=200)
async def delete_conversation(request: Request, conversation_id: str) -> Response:
    """Remove the conversation from every table (page vectors, summaries and profile facts learnt from it and its
    stored Responses answers included), the images only it referenced from the blob store, and the conversation
    from the hot state and from this replica's caches (another replica's cached Responses chain is checked
    against the store before use)."""
    services, tenant = await caller(request)
    await _require(services, tenant, conversation_id)
    return Response(content=await erase(services, tenant, conversation_id))


async def erase(services: Services, tenant: str, conversation_id: str) -> dict[str, Any]:
    """The conversation gone from every table, the blob store, the hot state and this replica's caches."""
    context = services.context
    # Queued writes and per-process caches first: nothing written behind may bring the conversation back.
    await context.forget(conversation_id)
    if services.response_chain is not None:
        await services.response_chain.flush()
    owners = getattr(services.store, "owners", None)
    body: dict[str, Any] = {"id": conversation_id}
    if owners is not None:
        erased = await owners.erase_conversation(tenant, conversation_id, _object_deleter(context.blobs))
        context.describer.forget(tenant, erased.descriptions_deleted)
        if services.response_chain is not None:
            services.response_chain.forget(tenant, erased.response_ids)
        body.update(deleted=erased.deleted, page_vectors=erased.page_vectors,
                    images_deleted=len(erased.blobs_deleted), images_kept=len(erased.blob_keys)
                    - len(erased.blobs_deleted), images_failed=len(erased.blobs_failed))
    else:
        body["deleted"] = bool(await services.store.repo.delete_conversation(tenant, conversation_id))
    await services.store.hot.delete_conversation(conversation_id)
    if services.memory is not None:
        services.memory.forget(tenant, conversation_id)
    return body


def _object_deleter(blobs: Any):
    """What erasing a conversation does with an image no longer referenced: the tenant's description goes, and
    the bytes too when no conversation of anyone references them."""

    async def delete_object(tenant: str, key: str, with_bytes: bool) -> None:
        await blobs.delete(description_blob_name(key, tenant))
        if with_bytes:
            await blobs.delete(image_blob_name(key))

    return delete_object


CONVERSATION_ROUTES = [list_conversations, conversation_history, export_conversation, delete_conversation]

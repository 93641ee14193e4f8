"""A person's rights, under /memci/users/{user}: their conversations listed, their memory exported, and deleted
(the right to be forgotten). ``{user}`` is the id the client sends as ``user``, ``safety_identifier``,
``X-Memci-User`` or Anthropic's ``metadata.user_id``; the proxy looks it up by its keyed hash (memci_proxy.turn.end_user).

The caller's own key acts on its tenant's users (a key bound to one end user: on that user alone, 403 for another);
the admin key on the tenant named by ``X-Memci-Tenant``.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, delete, get

from memci_proxy.api.conversations import caller, erase, export_of
from memci_proxy.api.forwarding import stored_text_json
from memci_proxy.api.services import Services
from memci_proxy.api.tenants import bound_key_refused
from memci_proxy.turn.end_user import MAX_USER_ID_CHARS, bound_user, user_key
from memci_proxy.wire.errors import ProxyError, bad_request

MAX_CONVERSATIONS = 100_000


async def _user(request: Request, user_id: str) -> tuple[Services, str, str]:
    services, tenant = await caller(request, bound_ok=True)
    if not user_id.strip() or len(user_id) > MAX_USER_ID_CHARS:
        raise bad_request(f"the user id must be 1 to {MAX_USER_ID_CHARS} characters", param="user")
    repo = services.store.repo
    if not hasattr(repo, "user_conversations"):
        raise ProxyError(404, "user APIs need the SQL store", "invalid_request_error", "not_supported")
    key = user_key(tenant, user_id.strip(), services.settings.user_hash_key)
    if bound_user(request.headers) not in ("", key):
        raise bound_key_refused()
    return services, tenant, key


async def _conversations(services: Services, tenant: str, key: str) -> list[dict[str, Any]]:
    return await services.store.repo.user_conversations(tenant, key, MAX_CONVERSATIONS)


@get("/memci/users/{user_id:str}/conversations")
async def user_conversations(request: Request, user_id: str) -> Response:
    """The user's conversations, the most recently active first."""
    services, tenant, key = await _user(request, user_id)
    rows = await _conversations(services, tenant, key)
    return Response(content={"object": "list", "user": key, "data": rows})


@get("/memci/users/{user_id:str}/export")
async def export_user(request: Request, user_id: str) -> Response:
    """Everything stored of the user: each conversation's export, and the profile facts learnt about them."""
    services, tenant, key = await _user(request, user_id)
    conversations = [await export_of(services, tenant, c["id"]) for c in await _conversations(services, tenant, key)]
    facts = await services.store.repo.profile_facts(tenant, "", key, limit=10_000)
    return stored_text_json({"user": key, "profile": facts, "conversations": conversations},
                            headers={"Content-Disposition": f'attachment; filename="{key}.json"'})


@delete("/memci/users/{user_id:str}", status_code=200)
async def delete_user(request: Request, user_id: str) -> Response:
    """Every conversation of the user erased as DELETE /memci/conversations/{id} erases one (pages, vectors,
    summaries, profile facts, the user's page index, offloaded outputs, Responses answers, images only they sent,
    the hot state and this replica's caches), then whatever of the user is left (facts of conversations deleted
    meanwhile), and the cached profile."""
    services, tenant, key = await _user(request, user_id)
    erased = [await erase(services, tenant, c["id"]) for c in await _conversations(services, tenant, key)]
    leftover = await services.store.repo.delete_user(tenant, key)
    if services.memory is not None:
        services.memory.forget_user(tenant, key)
    services.context.across.forget_user(tenant, key)
    return Response(content={"user": key, "deleted": True, "conversations": len(erased) + len(leftover),
                             "images_deleted": sum(e.get("images_deleted", 0) for e in erased)})


USER_ROUTES = [user_conversations, export_user, delete_user]

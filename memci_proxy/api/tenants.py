"""Which tenant a request acts for: its own (the key's), or, for the admin key, the tenant named by the header
``X-Memci-Tenant``.

The header takes the tenant's name as the keys API shows it (``tenant``; virtual_keys mode), or a tenant id
(``tenant_id``, or the hash a pass-through key maps to). A value that names no tenant the proxy knows is a 404
``unknown_tenant``, never an empty answer.

A key bound to one end user acts for that user only: the tenant-wide conversation APIs and /memci/search answer it
403 ``bound_key``; /memci/users/{user} serves it for its own user alone.
"""

from __future__ import annotations

import re

from litestar import Request

from memci_proxy.api.auth import Authenticator, is_admin_request, virtual_tenant
from memci_proxy.api.services import Services
from memci_proxy.turn.end_user import bound_user
from memci_proxy.turn.identity import tenant_of
from memci_proxy.wire.errors import ProxyError, bad_request

TENANT_HEADER = "x-memci-tenant"
_TENANT_ID = re.compile(r"[tv][0-9a-f]{24}")
MAX_NAME = 256


def unknown_tenant(value: str) -> ProxyError:
    return ProxyError(404, f"no tenant {value[:MAX_NAME]!r} (X-Memci-Tenant takes a tenant name, as the keys API "
                      "shows it, or a tenant id)", "invalid_request_error", "unknown_tenant")


def bound_key_refused() -> ProxyError:
    return ProxyError(403, "this key is bound to one end user: it acts for that user only (use a key of the whole "
                      "tenant, or the admin key, here)", "invalid_request_error", "bound_key")


async def caller_tenant(request: Request, services: Services, bound_ok: bool = False) -> str:
    """The request's tenant: its key's, or for the admin key the one X-Memci-Tenant names (400 without it). A key
    bound to one end user is refused (403) unless ``bound_ok`` (the caller then checks the user is its own)."""
    if not is_admin_request(request.scope):
        if bound_user(request.headers) and not bound_ok:
            raise bound_key_refused()
        return tenant_of(request.headers)
    value = request.headers.get(TENANT_HEADER, "").strip()
    if not value:
        raise bad_request("the admin key acts for a tenant named by the header X-Memci-Tenant", param="X-Memci-Tenant")
    return await resolve_tenant(value, request.app.state.authenticator, services)


async def resolve_tenant(value: str, auth: Authenticator, services: Services) -> str:
    """The tenant id of a tenant name or id; ProxyError 404 when it names no known tenant."""
    if len(value) > MAX_NAME or "\x00" in value:
        raise unknown_tenant(value)
    names = {k.tenant_name for k in auth.seeds.values()}
    if value in names:
        return virtual_tenant(value)
    repo = auth.keys.repo
    if repo is not None and await repo.list_keys(tenant=value, include_revoked=True, limit=1):
        return virtual_tenant(value)
    if _TENANT_ID.fullmatch(value):
        if value in {virtual_tenant(n) for n in names}:
            return value
        if repo is not None and value.startswith("v"):
            if any(virtual_tenant(r.tenant) == value for r in await repo.list_keys(include_revoked=True)):
                return value
        store = services.store
        if store is not None and await store.repo.list_conversations(value, limit=1):
            return value
    raise unknown_tenant(value)

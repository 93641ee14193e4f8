"""Admin endpoints for virtual keys under /memci/keys (bearer admin key): create, list (masked), show, change
limits, revoke, rotate.

A key created with ``user`` is bound to that end user: every request with it is that user's (memci_proxy.turn.end_user);
the key stores and shows only the user's keyed hash.

A key's secret is returned once, when it is created or rotated; listings show a hint (``sk-memci-AbCd…wxyz``)
and never the upstream key. Every change is announced to the other replicas (memci_proxy.keys: within a second).
"""

from __future__ import annotations

import math
from typing import Any

from litestar import Request, Response, delete, get, patch, post

from memci_proxy.api.admin import check_admin_key
from memci_proxy.api.auth import Authenticator, same_key, virtual_tenant
from memci_proxy.keys import key_digest, key_hint, new_key_id, new_secret
from memci_proxy.store.sql.key_queries import KeyRecord
from memci_proxy.turn.end_user import MAX_USER_ID_CHARS
from memci_proxy.wire.errors import ProxyError, bad_request
from memci_proxy.wire.validate import parse_json_object, stored_text

MAX_GRACE_SECONDS = 7 * 24 * 3600


def _admin(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.authenticator
    check_admin_key(request, auth.admin_key)
    if not auth.keys.persistent:
        raise ProxyError(404, "virtual keys are kept in the database: turn context management on (the keys of "
                         "the virtual_keys setting are the only keys without it)", "invalid_request_error",
                         "keys_off")
    return auth


def _hint(secret: str) -> str:
    return "" if not secret else key_hint(secret)


def key_json(record: KeyRecord) -> dict[str, Any]:
    return {
        "object": "memci.key", "id": record.id, "name": record.name, "key_hint": record.key_hint,
        "tenant": record.tenant, "tenant_id": virtual_tenant(record.tenant),
        "upstream_key_hint": _hint(record.upstream_key), "rate_limit_rps": record.rate_limit_rps,
        "rate_limit_burst": record.rate_limit_burst, "budget_tokens": record.budget_tokens,
        "used_tokens": record.used_tokens, "source": record.source,
        "created_at": record.created_at.isoformat() if record.created_at else None,
        "revoked_at": record.revoked_at.isoformat() if record.revoked_at else None,
        "previous_key_valid_until": record.previous_valid_until.isoformat() if record.previous_valid_until else None,
        "user": record.end_user,
    }


def _optional_number(data: dict[str, Any], name: str, integer: bool, low: float = 0) -> Any:
    value = data.get(name)
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)) or value < low:
        kind = "an integer" if integer else "a number"
        raise bad_request(f"'{name}' must be {kind} >= {low:g} (or null)", param=name)
    return value


def _optional_text(data: dict[str, Any], name: str, limit: int = 4096) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    return stored_text(value, name, limit)


def _upstream_key(auth: Authenticator, data: dict[str, Any]) -> str:
    """The key's upstream key (400 when it is the admin key: that one never leaves the proxy)."""
    value = _optional_text(data, "upstream_key") or ""
    if same_key(value, auth.admin_key):
        raise bad_request("'upstream_key' must not be the admin key", param="upstream_key")
    return value


def _bound_user(auth: Authenticator, data: dict[str, Any], tenant: str) -> str | None:
    """The keyed hash of the end user the new key is bound to (``user``), None for a key of the whole tenant."""
    user = data.get("user")
    if user is None:
        return None
    if not isinstance(user, str) or not user.strip() or len(user.strip()) > MAX_USER_ID_CHARS:
        raise bad_request(f"'user' must be a string of 1 to {MAX_USER_ID_CHARS} characters (or null)", param="user")
    return auth.bound_user(tenant, user.strip())


def _limits(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "rate_limit_rps": _optional_number(data, "rate_limit_rps", integer=False),
        "rate_limit_burst": _optional_number(data, "rate_limit_burst", integer=True),
        "budget_tokens": _optional_number(data, "budget_tokens", integer=True),
    }


def _revoked(key_id: str) -> ProxyError:
    """A revoked key is immutable: changing or rotating it is a conflict."""
    return ProxyError(409, f"key {key_id!r} is revoked; a revoked key cannot be changed (create a new one)",
                      "invalid_request_error", "key_revoked")


async def _found(auth: Authenticator, key_id: str) -> KeyRecord:
    record = await auth.keys.repo.get(key_id)
    if record is None:
        raise ProxyError(404, f"no key {key_id!r}", "invalid_request_error", "not_found")
    return record


@post("/memci/keys", status_code=201)
async def create_key(request: Request) -> Response:
    """A new key for a tenant (by name: keys of one name share conversations), optionally bound to one end user
    (``user``). The secret is in this answer only."""
    auth = _admin(request)
    data = parse_json_object(await request.body())
    tenant = _optional_text(data, "tenant", 256)
    if not tenant or not tenant.strip():
        raise bad_request("'tenant' (a tenant name) is required", param="tenant")
    end_user = _bound_user(auth, data, tenant.strip())
    secret = new_secret()
    record = await auth.keys.repo.create(
        new_key_id(), key_digest(secret), key_hint(secret), tenant.strip(),
        upstream_key=_upstream_key(auth, data), name=_optional_text(data, "name", 256), end_user=end_user,
        **_limits(data),
    )
    await auth.keys.changed()
    return Response(content={**key_json(record), "key": secret}, status_code=201)


@get("/memci/keys")
async def list_keys(request: Request) -> Response:
    """Keys, masked, oldest first: ``tenant`` (a name) filters, ``include_revoked=true`` shows revoked ones."""
    auth = _admin(request)
    tenant = request.query_params.get("tenant")
    if tenant is not None:
        stored_text(tenant, "tenant", 256)
    include_revoked = request.query_params.get("include_revoked", "false").lower() in ("1", "true", "yes")
    records = await auth.keys.repo.list_keys(tenant=tenant, include_revoked=include_revoked)
    return Response(content={"object": "list", "data": [key_json(r) for r in records]})


@get("/memci/keys/{key_id:str}")
async def show_key(request: Request, key_id: str) -> Response:
    return Response(content=key_json(await _found(_admin(request), key_id)))


@patch("/memci/keys/{key_id:str}")
async def change_key(request: Request, key_id: str) -> Response:
    """Change a key's name, upstream key, rate limit, burst or budget (null: the default / no budget), or reset
    its usage (``used_tokens``)."""
    auth = _admin(request)
    data = parse_json_object(await request.body())
    changes: dict[str, Any] = {}
    for name in ("rate_limit_rps", "rate_limit_burst", "budget_tokens"):
        if name in data:
            changes[name] = _limits(data)[name]
    if "name" in data:
        changes["name"] = _optional_text(data, "name", 256)
    if "upstream_key" in data:
        changes["upstream_key"] = _upstream_key(auth, data)
    if "used_tokens" in data:
        used = _optional_number(data, "used_tokens", integer=True)
        changes["used_tokens"] = used or 0
    unknown = set(data) - {"rate_limit_rps", "rate_limit_burst", "budget_tokens", "name", "upstream_key",
                           "used_tokens"}
    if unknown:
        raise bad_request(f"unknown field {sorted(unknown)[0]!r}", param=sorted(unknown)[0])
    record = await _found(auth, key_id)
    if record.revoked:
        raise _revoked(key_id)
    if changes:
        record = await auth.keys.repo.update_limits(key_id, changes)
        if record is None:  # revoked (or gone) meanwhile
            raise _revoked(key_id)
    await auth.keys.changed()
    return Response(content=key_json(record))


async def _revoke(request: Request, key_id: str) -> Response:
    auth = _admin(request)
    record = await auth.keys.repo.revoke(key_id)
    if record is None:
        raise ProxyError(404, f"no key {key_id!r}", "invalid_request_error", "not_found")
    await auth.keys.changed()
    return Response(content=key_json(record))


@post("/memci/keys/{key_id:str}/revoke", status_code=200)
async def revoke_key(request: Request, key_id: str) -> Response:
    """Revoke at once (every replica refuses the key within a second); the key stays listed as revoked."""
    return await _revoke(request, key_id)


@delete("/memci/keys/{key_id:str}", status_code=200)
async def delete_key(request: Request, key_id: str) -> Response:
    """The same as revoking: keys are never forgotten, so a revoked one cannot come back by accident."""
    return await _revoke(request, key_id)


@post("/memci/keys/{key_id:str}/rotate", status_code=200)
async def rotate_key(request: Request, key_id: str) -> Response:
    """A new secret for the key (same id, tenant, limits and usage). ``grace_seconds`` (default 0) keeps the
    old secret valid that long, so clients can switch without an outage."""
    auth = _admin(request)
    body = await request.body()
    data = parse_json_object(body) if body.strip() else {}
    grace = _optional_number(data, "grace_seconds", integer=False) or 0
    if grace > MAX_GRACE_SECONDS:
        raise bad_request(f"'grace_seconds' must be at most {MAX_GRACE_SECONDS}", param="grace_seconds")
    record = await _found(auth, key_id)
    if record.revoked:
        raise _revoked(key_id)
    secret = new_secret()
    record = await auth.keys.repo.rotate(key_id, key_digest(secret), key_hint(secret), float(grace))
    if record is None:
        raise _revoked(key_id)
    await auth.keys.changed()
    return Response(content={**key_json(record), "key": secret})


KEY_ROUTES = [create_key, list_keys, show_key, change_key, revoke_key, delete_key, rotate_key]

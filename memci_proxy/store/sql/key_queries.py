"""Virtual keys in PostgreSQL (migration 0005): the keys repository behind memci_proxy.keys.

A key is stored as its sha256 only (``key_hash``) with a short hint for listings; the upstream key it maps to is
stored as given (the proxy must send it); a key bound to one end user stores that user's keyed hash (``end_user``). Rotation replaces the hash in place (same id, tenant, limits and
usage); the previous hash may stay valid for a grace period. Revocation is a timestamp, never a delete, so a
revoked key stays listed and can never come back by accident (seeding from the settings does not revive it).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from memci_proxy.store.sql.models import VirtualKeyRow

keys_t = VirtualKeyRow.__table__


@dataclass(frozen=True)
class KeyRecord:
    id: str
    key_hash: str
    key_hint: str
    name: str | None
    tenant: str  # the tenant name as configured (the tenant id is derived from it)
    upstream_key: str
    rate_limit_rps: float | None
    rate_limit_burst: int | None
    budget_tokens: int | None
    used_tokens: int
    source: str
    created_at: dt.datetime | None
    revoked_at: dt.datetime | None
    previous_valid_until: dt.datetime | None = None
    end_user: str | None = None  # the keyed hash of the one end user the key is bound to (migration 0009)

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


_COLUMNS = [keys_t.c[name] for name in KeyRecord.__dataclass_fields__]


def _record(row: Any) -> KeyRecord:
    return KeyRecord(**row._asdict())


class SqlKeyRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def create(
        self, key_id: str, key_hash: str, key_hint: str, tenant: str, upstream_key: str = "", name: str | None = None,
        rate_limit_rps: float | None = None, rate_limit_burst: int | None = None, budget_tokens: int | None = None,
        source: str = "api", end_user: str | None = None,
    ) -> KeyRecord:
        stmt = insert(keys_t).values(
            id=key_id, key_hash=key_hash, key_hint=key_hint, tenant=tenant, upstream_key=upstream_key, name=name,
            rate_limit_rps=rate_limit_rps, rate_limit_burst=rate_limit_burst, budget_tokens=budget_tokens,
            source=source, end_user=end_user,
        ).returning(*_COLUMNS)
        async with self.engine.begin() as connection:
            return _record((await connection.execute(stmt)).one())

    async def seed(self, key_id: str, key_hash: str, key_hint: str, tenant: str, upstream_key: str,
                   end_user: str | None = None) -> None:
        """A key from the settings (``key_id`` derived from its hash): created, or its tenant, upstream key and
        end user brought up to date. A revoked one stays revoked, limits set through the API are kept, and one rotated
        through the API stays rotated (the old secret in the settings no longer works)."""
        stmt = insert(keys_t).values(
            id=key_id, key_hash=key_hash, key_hint=key_hint, tenant=tenant, upstream_key=upstream_key,
            source="settings", end_user=end_user,
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[keys_t.c.id],
            set_={"tenant": stmt.excluded.tenant, "upstream_key": stmt.excluded.upstream_key,
                  "end_user": stmt.excluded.end_user, "updated_at": func.now()},
            where=keys_t.c.key_hash == stmt.excluded.key_hash,
        )
        async with self.engine.begin() as connection:
            await connection.execute(stmt)

    async def find(self, key_hash: str) -> KeyRecord | None:
        """The key with this hash (also a rotated-away hash inside its grace period), revoked ones included."""
        now = func.now()
        stmt = select(*_COLUMNS).where(
            or_(keys_t.c.key_hash == key_hash,
                and_(keys_t.c.previous_key_hash == key_hash, keys_t.c.previous_valid_until > now))
        ).limit(1)
        async with self.engine.connect() as connection:
            row = (await connection.execute(stmt)).first()
        return None if row is None else _record(row)

    async def get(self, key_id: str) -> KeyRecord | None:
        async with self.engine.connect() as connection:
            row = (await connection.execute(select(*_COLUMNS).where(keys_t.c.id == key_id))).first()
        return None if row is None else _record(row)

    async def list_keys(
        self, tenant: str | None = None, include_revoked: bool = False, limit: int = 1000
    ) -> list[KeyRecord]:
        stmt = select(*_COLUMNS)
        if tenant is not None:
            stmt = stmt.where(keys_t.c.tenant == tenant)
        if not include_revoked:
            stmt = stmt.where(keys_t.c.revoked_at.is_(None))
        stmt = stmt.order_by(keys_t.c.created_at, keys_t.c.id).limit(limit)
        async with self.engine.connect() as connection:
            return [_record(r) for r in (await connection.execute(stmt)).all()]

    async def revoke(self, key_id: str) -> KeyRecord | None:
        """Revoke a live key; a revoked one is returned as it is (revoking is idempotent, a revoked key immutable)."""
        stmt = (
            update(keys_t).where(keys_t.c.id == key_id, keys_t.c.revoked_at.is_(None))
            .values(revoked_at=func.now(), updated_at=func.now(), previous_key_hash=None, previous_valid_until=None)
            .returning(*_COLUMNS)
        )
        async with self.engine.begin() as connection:
            row = (await connection.execute(stmt)).first()
        return _record(row) if row is not None else await self.get(key_id)

    async def rotate(self, key_id: str, key_hash: str, key_hint: str, grace_seconds: float = 0.0) -> KeyRecord | None:
        """A new secret for a live key; the old one stays valid ``grace_seconds`` more (0: stops at once)."""
        until = func.now() + dt.timedelta(seconds=grace_seconds) if grace_seconds > 0 else None
        stmt = (
            update(keys_t).where(keys_t.c.id == key_id, keys_t.c.revoked_at.is_(None))
            .values(previous_key_hash=keys_t.c.key_hash if until is not None else None, previous_valid_until=until,
                    key_hash=key_hash, key_hint=key_hint, updated_at=func.now())
            .returning(*_COLUMNS)
        )
        async with self.engine.begin() as connection:
            row = (await connection.execute(stmt)).first()
        return None if row is None else _record(row)

    async def update_limits(self, key_id: str, changes: dict[str, Any]) -> KeyRecord | None:
        """Change some of: name, upstream_key, rate_limit_rps, rate_limit_burst, budget_tokens, used_tokens, of a
        live key (None for a revoked or unknown one: a revoked key is immutable)."""
        allowed = {"name", "upstream_key", "rate_limit_rps", "rate_limit_burst", "budget_tokens", "used_tokens"}
        values = {k: v for k, v in changes.items() if k in allowed}
        stmt = (
            update(keys_t).where(keys_t.c.id == key_id, keys_t.c.revoked_at.is_(None))
            .values(**values, updated_at=func.now()).returning(*_COLUMNS)
        )
        async with self.engine.begin() as connection:
            row = (await connection.execute(stmt)).first()
        return None if row is None else _record(row)

    async def add_usage(self, key_id: str, tokens: int) -> None:
        if tokens <= 0:
            return
        stmt = update(keys_t).where(keys_t.c.id == key_id).values(used_tokens=keys_t.c.used_tokens + tokens)
        async with self.engine.begin() as connection:
            await connection.execute(stmt)

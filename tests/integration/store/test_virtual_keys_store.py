"""Virtual keys on a real PostgreSQL and Redis: two registries stand for two replicas; a revocation reaches the
other within a second, with Redis (version key) and without it (one-second cache)."""

from __future__ import annotations

import asyncio
import time

from memci_proxy.api.auth import virtual_tenant
from memci_proxy.keys import KeyRegistry, key_digest, key_hint, new_key_id, new_secret
from memci_proxy.store.sql.key_queries import SqlKeyRepository
from memci_proxy.store.sql.repository import SqlConversationRepository
from memci_proxy.turn.end_user import user_key


async def _replicas(repo: SqlConversationRepository, redis_url: str = "") -> tuple[KeyRegistry, KeyRegistry, SqlKeyRepository]:
    keys = SqlKeyRepository(repo.engine)
    one, two = KeyRegistry({}, virtual_tenant), KeyRegistry({}, virtual_tenant)
    await one.attach(keys, redis_url)
    await two.attach(keys, redis_url)
    return one, two, keys


async def _refused_within(registry: KeyRegistry, secret: str, limit_s: float) -> float:
    started = time.monotonic()
    while await registry.lookup(secret) is not None:
        assert time.monotonic() - started < limit_s, "the key still works"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def _revocation_reaches_the_other_replica(repo, redis_url: str) -> float:
    one, two, keys = await _replicas(repo, redis_url)
    try:
        secret = new_secret()
        record = await keys.create(new_key_id(), key_digest(secret), key_hint(secret), "acme", "up-1",
                                   budget_tokens=1000)
        await one.changed()
        found = await two.lookup(secret)
        assert found is not None and found.tenant == virtual_tenant("acme") and found.upstream_key == "up-1"
        assert await two.lookup(secret + "x") is None
        await keys.revoke(record.id)
        await one.changed()
        assert await one.lookup(secret) is None  # the replica that revoked: at once
        return await _refused_within(two, secret, 1.0)
    finally:
        await one.close()
        await two.close()


async def test_revocation_reaches_another_replica_within_a_second_through_redis(repo, redis_url) -> None:
    took = await _revocation_reaches_the_other_replica(repo, redis_url)
    assert took < 0.6  # the version is polled every 0.25 s


async def test_revocation_reaches_another_replica_within_a_second_without_redis(repo) -> None:
    assert await _revocation_reaches_the_other_replica(repo, "") <= 1.0


async def test_seeding_rotation_with_grace_and_usage(repo) -> None:
    keys = SqlKeyRepository(repo.engine)
    registry = KeyRegistry({}, virtual_tenant)
    seeds = {key_digest("sk-settings-key"): (key_hint("sk-settings-key"), "globex", "up-g", "")}
    await registry.attach(keys, "", seeds)
    await registry.attach(keys, "", seeds)  # a restart: the same row
    [record] = await keys.list_keys()
    assert record.source == "settings" and record.tenant == "globex" and record.key_hint == "sk-s…-key"
    found = await registry.lookup("sk-settings-key")
    assert found is not None and found.id == record.id

    registry.charge(found, 120)
    await asyncio.gather(*registry._writes)
    assert (await keys.get(record.id)).used_tokens == 120
    assert (await registry.lookup("sk-settings-key")).used_tokens == 120  # this process: at once

    new = new_secret()
    await keys.rotate(record.id, key_digest(new), key_hint(new), grace_seconds=60)
    await registry.changed()
    assert (await registry.lookup(new)).id == record.id
    assert (await registry.lookup("sk-settings-key")).id == record.id  # the old one, within its grace period
    newer = new_secret()
    await keys.rotate(record.id, key_digest(newer), key_hint(newer), grace_seconds=0)
    await registry.changed()
    assert await registry.lookup(new) is None and await registry.lookup("sk-settings-key") is None
    await registry.attach(keys, "", seeds)  # a restart with the old key still in the settings: stays rotated
    assert await registry.lookup("sk-settings-key") is None and (await registry.lookup(newer)).id == record.id

    await keys.revoke(record.id)
    await registry.attach(keys, "", seeds)  # a restart does not revive a revoked key
    await registry.changed()
    assert await registry.lookup(newer) is None
    assert [r.id for r in await keys.list_keys(include_revoked=True)] == [record.id] and await keys.list_keys() == []
    await registry.close()


async def test_a_key_bound_to_one_end_user_keeps_its_users_hash(repo) -> None:
    keys = SqlKeyRepository(repo.engine)
    registry = KeyRegistry({}, virtual_tenant)
    alice = user_key(virtual_tenant("acme"), "alice", "deploy-secret")
    seeded = user_key(virtual_tenant("globex"), "gina", "deploy-secret")
    await registry.attach(keys, "", {key_digest("sk-gina-key"): (key_hint("sk-gina-key"), "globex", "", seeded)})
    secret = new_secret()
    record = await keys.create(new_key_id(), key_digest(secret), key_hint(secret), "acme", end_user=alice)
    plain = await keys.create(new_key_id(), key_digest(new_secret()), "h", "acme")
    assert record.end_user == alice and plain.end_user is None
    assert (await keys.get(record.id)).end_user == alice
    assert {r.id: r.end_user for r in await keys.list_keys(tenant="acme")} == {record.id: alice, plain.id: None}
    assert (await registry.lookup(secret)).end_user == alice
    assert (await registry.lookup("sk-gina-key")).end_user == seeded

    newer = new_secret()
    rotated = await keys.rotate(record.id, key_digest(newer), key_hint(newer))
    await registry.changed()
    assert rotated.end_user == alice and (await registry.lookup(newer)).end_user == alice
    changed = await keys.update_limits(record.id, {"name": "renamed", "end_user": "u-someone-else"})
    assert changed.end_user == alice  # the binding is not a limit: it never changes

    await registry.attach(keys, "", {key_digest("sk-gina-key"): (key_hint("sk-gina-key"), "globex", "", "")})
    await registry.changed()
    assert (await registry.lookup("sk-gina-key")).end_user == ""  # the settings no longer bind it
    await registry.close()

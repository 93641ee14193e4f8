"""X-Memci-Tenant (memci_proxy.api.tenants): a tenant name or id; an unknown one is a 404, never an empty answer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from memci_proxy.api.auth import Authenticator, virtual_tenant
from memci_proxy.api.tenants import resolve_tenant
from memci_proxy.settings import Settings
from memci_proxy.turn.identity import key_tenant
from memci_proxy.wire.errors import ProxyError


class Keys:
    async def list_keys(self, tenant=None, include_revoked=False, limit=1000):
        records = [SimpleNamespace(tenant="made-by-api"), SimpleNamespace(tenant="revoked-co")]
        return [r for r in records if tenant is None or r.tenant == tenant][:limit]


class Conversations:
    async def list_conversations(self, tenant, limit=50):
        return ["c1"] if tenant == key_tenant("sk-passthrough") else []


def setup(persistent: bool = True):
    auth = Authenticator(Settings(auth_mode="virtual_keys", admin_key="adm",
                                  virtual_keys=json.dumps({"sk-a": {"tenant": "seeded"}})))
    auth.keys.repo = Keys() if persistent else None
    return auth, SimpleNamespace(store=SimpleNamespace(repo=Conversations()))


@pytest.mark.parametrize("value, tenant", [
    ("seeded", virtual_tenant("seeded")), ("made-by-api", virtual_tenant("made-by-api")),
    ("revoked-co", virtual_tenant("revoked-co")), (virtual_tenant("seeded"), virtual_tenant("seeded")),
    (virtual_tenant("made-by-api"), virtual_tenant("made-by-api")), (key_tenant("sk-passthrough"), key_tenant("sk-passthrough")),
])
async def test_names_and_ids_resolve(value, tenant):
    auth, services = setup()
    assert await resolve_tenant(value, auth, services) == tenant


@pytest.mark.parametrize("value", ["nobody", virtual_tenant("nobody"), key_tenant("sk-never-used"), "x" * 300,
                                   "a\x00b", "Seeded"])
async def test_unknown_tenants_are_a_404(value):
    auth, services = setup()
    with pytest.raises(ProxyError) as info:
        await resolve_tenant(value, auth, services)
    assert info.value.status == 404 and info.value.code == "unknown_tenant"


async def test_settings_names_resolve_without_a_database():
    auth, services = setup(persistent=False)
    assert await resolve_tenant("seeded", auth, services) == virtual_tenant("seeded")

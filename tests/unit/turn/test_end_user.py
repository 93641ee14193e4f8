"""The end user a request names, and the walls that key keeps: conversations, session keys and prefixes of one user
are never another's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.engine import chain_hashes, entry_hashes
from memci_proxy.turn.call import chat_call
from memci_proxy.turn.end_user import MAX_USER_ID_CHARS, EndUserError, end_user_id, user_key
from memci_proxy.turn.identity import conversation_id_for_session
from memci_proxy.wire.errors import ProxyError

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]


def test_the_id_comes_from_the_header_then_safety_identifier_then_user():
    body = {"user": "u1", "safety_identifier": "s1"}
    assert end_user_id({"X-Memci-User": " h1 "}, body) == ("h1", "X-Memci-User")
    assert end_user_id({"x-memci-user": "h1"}, body) == ("h1", "X-Memci-User")
    assert end_user_id({}, body) == ("s1", "safety_identifier")
    assert end_user_id({}, {"user": "u1"}) == ("u1", "user")
    assert end_user_id({"X-Memci-User": "  "}, {"user": ""}) == ("", "")
    assert end_user_id({}, {}) == ("", "")


@pytest.mark.parametrize("body,param", [({"user": 5}, "user"), ({"safety_identifier": ["a"]}, "safety_identifier"),
                                        ({"user": "x" * (MAX_USER_ID_CHARS + 1)}, "user")])
def test_an_id_that_cannot_be_one_is_refused_naming_its_field(body, param):
    with pytest.raises(EndUserError) as caught:
        end_user_id({}, body)
    assert caught.value.param == param
    with pytest.raises(ProxyError) as refused:
        chat_call({}, {"messages": MESSAGES, **body}, b"{}", None, tenant="t1")
    assert refused.value.status == 400 and param in refused.value.message


def test_the_key_is_a_keyed_hash_per_tenant_and_never_the_id():
    key = user_key("t1", "alice@example.com")
    assert key.startswith("u") and "alice" not in key and len(key) == 25
    assert key == user_key("t1", "alice@example.com")  # every replica derives the same
    assert key != user_key("t2", "alice@example.com")  # another app: an unrelated key
    assert key != user_key("t1", "alice@example.com", secret="deployment-secret")
    assert key != user_key("t1", "bob@example.com")
    assert user_key("t1", "") == ""


def test_the_call_carries_the_key_not_the_id():
    call = chat_call({}, {"messages": MESSAGES, "user": "alice"}, b"{}", None, tenant="t1", user_secret="s")
    assert call.end_user == user_key("t1", "alice", "s")
    assert chat_call({}, {"messages": MESSAGES}, b"{}", None, tenant="t1").end_user == ""


def test_one_session_key_names_one_conversation_per_end_user():
    alice, bob = user_key("t1", "alice"), user_key("t1", "bob")
    ids = {conversation_id_for_session("t1", "default", u) for u in ("", alice, bob)}
    assert len(ids) == 3
    assert conversation_id_for_session("t1", "default") == conversation_id_for_session("t1", "default", "")


@given(st.lists(st.text(max_size=20), min_size=1, max_size=6), st.text(min_size=1, max_size=30))
def test_one_users_prefix_never_matches_anothers(contents, seed):
    hashes = entry_hashes([{"role": "user", "content": c} for c in contents])
    plain, seeded = chain_hashes(hashes), chain_hashes(hashes, seed)
    assert not set(plain) & set(seeded)
    assert chain_hashes(hashes, seed)[:2] == chain_hashes(hashes[:2], seed)  # a prefix's chain is the same

"""prompt_cache_key and the session-affinity header of managed requests (memci_proxy.turn.cache_keys)."""

from __future__ import annotations

from memci_proxy.settings import Settings
from memci_proxy.turn.cache_keys import upstream_headers, with_prompt_cache_key


def test_the_conversation_id_is_the_default_prompt_cache_key():
    data = {"model": "m", "messages": []}
    assert with_prompt_cache_key(data, "conv-1", True)["prompt_cache_key"] == "conv-1"
    assert "prompt_cache_key" not in data  # the client's data is left as it was


def test_a_client_key_is_passed_on_as_sent():
    data = {"model": "m", "prompt_cache_key": "mine"}
    assert with_prompt_cache_key(data, "conv-1", True) is data


def test_the_setting_turns_the_default_off():
    data = {"model": "m"}
    assert with_prompt_cache_key(data, "conv-1", False) is data


def test_affinity_header_off_by_default_and_named_by_the_setting():
    assert Settings().session_affinity_header == ""
    assert upstream_headers(Settings(), "conv-1") is None
    assert upstream_headers(Settings(session_affinity_header="X-Session-Affinity"), "conv-1") == {
        "X-Session-Affinity": "conv-1"}

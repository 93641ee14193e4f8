from memci_proxy.engine import ConversationState, chain_hashes, common_prefix_len, entry_hash, entry_hashes
from memci_proxy.engine.fingerprint import advance_prefix, encode_messages


def test_entry_hash_ignores_key_order_and_unknown_fields() -> None:
    a = {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    b = {"tool_calls": [{"function": {"arguments": "{}", "name": "f"}, "type": "function", "id": "c1"}],
         "content": None, "role": "assistant", "x-extra": 7}
    assert entry_hash(a) == entry_hash(b)
    assert len(entry_hash(a)) == 32


def test_entry_hash_sees_every_identity_field() -> None:
    base = {"role": "user", "content": "hi"}
    variants = [
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "hi!"},
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "user", "content": "hi", "tool_call_id": "x"},
        {"role": "user", "content": "hi", "reasoning_content": "think"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    hashes = {entry_hash(v) for v in variants}
    assert entry_hash(base) not in hashes and len(hashes) == len(variants)


def test_chain_hashes_depend_on_the_whole_prefix() -> None:
    msgs = [{"role": "user", "content": str(i)} for i in range(4)]
    chain = chain_hashes(entry_hashes(msgs))
    assert len(set(chain)) == 4
    other = chain_hashes(entry_hashes([{"role": "user", "content": "x"}, *msgs[1:]]))
    assert all(a != b for a, b in zip(chain, other))
    assert chain_hashes(entry_hashes(msgs[:2])) == chain[:2]


def test_common_prefix_len() -> None:
    hashes = entry_hashes([{"role": "user", "content": str(i)} for i in range(10)])
    state = ConversationState(hash_blob=b"".join(bytes.fromhex(h) for h in hashes), tokens=[1] * len(hashes))
    assert len(state.hashes) == 10 and state.hashes[3] == hashes[3] and state.hashes[-1] == hashes[-1]
    assert state.entry_hash_list() == hashes
    assert common_prefix_len(state, hashes) == 10
    assert common_prefix_len(state, hashes + ["00" * 16]) == 10
    assert common_prefix_len(state, hashes[:4]) == 4
    for i in range(10):
        changed = list(hashes)
        changed[i] = "ff" * 16
        assert common_prefix_len(state, changed) == i
    assert common_prefix_len(None, hashes) == 0


def test_advance_prefix_on_raw_and_reencoded_arrays() -> None:
    first = [{"role": "user", "content": "a"}]
    second = [*first, {"role": "assistant", "content": "b"}]
    for dump in (encode_messages, lambda m: __import__("json").dumps(m, indent=2).encode()):
        ok, end, digest = advance_prefix(dump(first), 0, "")
        assert not ok
        assert advance_prefix(dump(second), end, digest)[0]
        assert advance_prefix(dump(first), end, digest)[0]  # a retry of the same request
        assert not advance_prefix(dump([{"role": "user", "content": "A"}, second[1]]), end, digest)[0]
        assert not advance_prefix(dump([]), end, digest)[0]
    assert advance_prefix(None, 5, "x") == (False, 0, "")

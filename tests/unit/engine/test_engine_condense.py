from memci_proxy.engine import condense_message


def test_tool_output_cut_with_marker() -> None:
    msg = {"role": "tool", "tool_call_id": "c1", "content": "x" * 250}
    out = condense_message(msg, 200)
    assert out == {"role": "tool", "tool_call_id": "c1", "content": "x" * 200 + "…[cut 50 chars]"}
    assert msg["content"] == "x" * 250  # never mutated
    assert condense_message({"role": "tool", "tool_call_id": "c", "content": "short"}, 200) is None


def test_tool_output_parts_are_flattened_and_cut() -> None:
    msg = {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "y" * 30}]}
    assert condense_message(msg, 10)["content"] == "y" * 10 + "…[cut 20 chars]"


def test_assistant_reasoning_dropped() -> None:
    msg = {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "text": "hmm"},
                                            {"type": "text", "text": "answer"}],
           "reasoning_content": "long thoughts", "x-keep": 1}
    out = condense_message(msg, 200)
    assert out == {"role": "assistant", "content": [{"type": "text", "text": "answer"}], "x-keep": 1}
    assert "reasoning_content" in msg
    assert condense_message({"role": "assistant", "content": "plain"}, 200) is None


def test_user_and_system_messages_are_never_condensed() -> None:
    assert condense_message({"role": "user", "content": "u" * 1000}, 10) is None
    assert condense_message({"role": "system", "content": "s" * 1000}, 10) is None

"""The emulator's --refuse: message shapes refused as some servers refuse them."""

from __future__ import annotations

import argparse

import pytest

from memci_proxy.emulator.chat import refuse_shapes
from memci_proxy.emulator.cli import add_arguments, config_from_args
from memci_proxy.emulator.errors import ErrorReply

CALL = {"id": "c1", "type": "function", "function": {"name": "recall", "arguments": "{}"}}


def test_null_content_is_a_500_as_llama_cpp_python_answers_it():
    with pytest.raises(ErrorReply) as refused:
        refuse_shapes([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}],
                      ("null_content",))
    assert refused.value.status == 500 and "valid string" in refused.value.message
    refuse_shapes([{"role": "assistant", "content": "", "tool_calls": [CALL]},
                   {"role": "tool", "tool_call_id": "c1", "content": "x"}], ("null_content",))  # "" is taken


def test_tool_messages_are_a_400_and_nothing_is_refused_by_default():
    messages = [{"role": "assistant", "content": "", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "c1",
                                                                             "content": "x"}]
    with pytest.raises(ErrorReply) as refused:
        refuse_shapes(messages, ("tool_messages",))
    assert refused.value.status == 400
    refuse_shapes([*messages, {"role": "assistant", "content": None}], ())


def test_the_flag_reaches_the_config():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--refuse", "null_content", "--refuse", "tool_messages"]))
    assert config.refuse == ("null_content", "tool_messages")

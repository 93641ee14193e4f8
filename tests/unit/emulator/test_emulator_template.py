import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.emulator.template import (
    DEFAULT_SYSTEM_PROMPT,
    IMAGE_PAD_TOKENS,
    TemplateError,
    render_chat,
    render_chat_pieces,
    render_output,
)
from memci_proxy.emulator.tokenizer import Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object"}},
}


def test_plain_conversation_renders_as_chatml() -> None:
    prompt = render_chat(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_default_system_prompt_when_none_given() -> None:
    prompt = render_chat([{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\nHi")


def test_tools_render_inside_the_leading_system_turn() -> None:
    prompt = render_chat([{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}], [WEATHER_TOOL])
    expected_head = (
        "<|im_start|>system\nSys\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(WEATHER_TOOL, ensure_ascii=False)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )
    assert prompt.startswith(expected_head)
    assert prompt.count("<|im_start|>system") == 1


def test_tool_calls_and_grouped_tool_responses() -> None:
    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    prompt = render_chat(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "a", "content": "one"},
            {"role": "tool", "tool_call_id": "b", "content": "two"},
        ]
    )
    assert prompt.endswith(
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_content_parts_and_image_placeholder() -> None:
    prompt = render_chat(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look: "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "text", "text": " what is it?"},
                ],
            }
        ]
    )
    assert "Look: <|vision_start|>" + "<|image_pad|>" * IMAGE_PAD_TOKENS + "<|vision_end|> what is it?" in prompt
    assert Tokenizer().split(prompt).count("<|image_pad|>") == IMAGE_PAD_TOKENS


@pytest.mark.parametrize(
    "messages",
    [
        "not a list",
        [{"content": "no role"}],
        [{"role": "user", "content": 42}],
        [{"role": "user", "content": [{"type": "audio"}]}],
        [{"role": "wizard", "content": "x"}],
    ],
)
def test_malformed_messages_raise(messages: object) -> None:
    with pytest.raises(TemplateError):
        render_chat(messages)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("content", "tool_calls"),
    [
        ("A plain answer.", None),
        ("", None),
        (None, [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x y"}'}}]),
        (
            None,
            [
                {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "b", "arguments": '{"k": [1, 2]}'}},
            ],
        ),
    ],
)
def test_prompt_plus_output_is_a_prefix_of_the_next_prompt(content: str | None, tool_calls: list | None) -> None:
    tokenizer = Tokenizer()
    first = [{"role": "user", "content": "question"}]
    prompt = render_chat(first)
    output = render_output(content, tool_calls, finished=True)
    assert output.endswith("<|im_end|>")
    following = first + [{"role": "assistant", "content": content, "tool_calls": tool_calls}]
    following.append({"role": "tool", "content": "r"} if tool_calls else {"role": "user", "content": "next"})
    ids = tokenizer.encode(prompt) + tokenizer.encode(output)
    next_ids = tokenizer.encode(render_chat(following))
    assert next_ids[: len(ids)] == ids


def test_unfinished_output_has_no_end_token() -> None:
    assert render_output("cut he", None, finished=False) == "cut he"


def test_tokenizing_pieces_equals_tokenizing_the_whole_prompt() -> None:
    messages = [
        {"role": "system", "content": "Sys  "},
        {"role": "user", "content": "a\n"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": " x "},
        {"role": "tool", "content": "你好"},
        {"role": "user", "content": "end "},
    ]  # fmt: skip
    pieces = render_chat_pieces(messages, [{"type": "function", "function": {"name": "f"}}])
    memoised = Tokenizer()
    whole = Tokenizer()
    assert memoised.split("".join(pieces)) == [token for piece in pieces for token in whole.split(piece)]
    assert memoised.encode_pieces(pieces) == memoised.encode("".join(pieces))
    assert memoised.encode_pieces(pieces) == memoised.encode("".join(pieces))  # memoised second time


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool", "system"]), st.text()), min_size=1, max_size=6))
def test_piecewise_tokens_equal_whole_prompt_tokens_for_any_text(turns: list[tuple[str, str]]) -> None:
    messages = [{"role": role, "content": text} for role, text in turns]
    pieces = render_chat_pieces(messages)
    tokenizer = Tokenizer()
    assert tokenizer.encode_pieces(pieces) == tokenizer.encode("".join(pieces))

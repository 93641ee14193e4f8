from memci_proxy.emulator.answers import generated_tokens, select_calls
from memci_proxy.emulator.markers import ScriptedCall, parse_markers
from memci_proxy.emulator.tokenizer import Tokenizer

TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": {}}},
    {"type": "function", "function": {"name": "recall", "parameters": {}}},
]


def test_no_markers_give_an_empty_script() -> None:
    script = parse_markers("just a question [not a marker]")
    assert script.is_empty


def test_all_markers_parse() -> None:
    script = parse_markers(
        'do it [[call:search {"q": "x", "deep": {"a": [1]}}]] [[call:recall]] [[len:7]] [[status:503]] '
        "[[delay:0.5]] [[slow:0.25]] [[cut:3]] [[abort:2]] [[badsse]] [[say:Exactly this, please.]]"
    )
    assert script.calls == [
        ScriptedCall("search", '{"q": "x", "deep": {"a": [1]}}'),
        ScriptedCall("recall", "{}"),
    ]
    assert (script.length, script.status, script.delay_s, script.slow_s) == (7, 503, 0.5, 0.25)
    assert (script.cut_after, script.abort_after, script.bad_sse) == (3, 2, True)
    assert script.say == "Exactly this, please."


def test_call_arguments_are_canonical_json_or_kept_verbatim() -> None:
    assert parse_markers('[[call:f {"a":1,"b":"é"}]]').calls[0].arguments == '{"a": 1, "b": "é"}'
    assert parse_markers("[[call:f {not json}]]").calls[0].arguments == "{not json}"


def test_calls_need_the_tool_in_the_request() -> None:
    script = parse_markers("[[call:search {}]] [[call:missing {}]]")
    assert [call.name for call in select_calls(script, TOOLS, None)] == ["search"]
    assert select_calls(script, None, None) == []


def test_tool_choice_none_and_named() -> None:
    script = parse_markers("[[call:search {}]] [[call:recall {}]]")
    assert select_calls(script, TOOLS, "none") == []
    assert [c.name for c in select_calls(script, TOOLS, "auto")] == ["search", "recall"]
    named = {"type": "function", "function": {"name": "recall"}}
    assert [c.name for c in select_calls(script, TOOLS, named)] == ["recall"]
    assert select_calls(parse_markers("plain"), TOOLS, named) == [ScriptedCall("recall", "{}")]
    assert select_calls(parse_markers("plain"), TOOLS, "required") == [ScriptedCall("search", "{}")]
    assert select_calls(parse_markers("plain"), TOOLS, "auto") == []


def test_generated_text_is_deterministic_with_the_requested_length() -> None:
    assert generated_tokens(123, 60) == generated_tokens(123, 60)
    assert generated_tokens(123, 60) != generated_tokens(124, 60)
    assert len(generated_tokens(5, 17)) == 17
    for seed in range(50):
        tokens = generated_tokens(seed, 60)
        text = "".join(tokens)
        assert text[0].isupper() and "  " not in text and ",." not in text and not text.endswith(" ")
        assert Tokenizer().split(text) == list(tokens)

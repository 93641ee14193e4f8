"""What an upstream's refusal says (memci_proxy.upstream.refusal), the window that follows the upstream
(memci_proxy.turn.window), the shapes of the proxy's recall rounds (memci_proxy.turn.shapes) and the upstream's cache kind
(memci_proxy.upstream.cache_kind)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from turn_fakes import MockUpstream

import memci_proxy.turn.window as window_module
from memci_proxy.settings import Settings
from memci_proxy.turn.shapes import RECALLED, ShapeChoice, holds_rounds, next_shape, render
from memci_proxy.turn.window import ContextWindow
from memci_proxy.upstream.cache_kind import RADIX, SINGLE_SLOT, CacheKind, kind_of
from memci_proxy.upstream.refusal import context_refusal


def error(message: str, **fields) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", **fields}}).encode()


@pytest.mark.parametrize("status, body, window", [
    (400, error("This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
                "(2076 in the messages, 24 in the completion). Please reduce the length of the messages or "
                "completion.", code="context_length_exceeded"), 2048),  # OpenAI, llama-cpp-python
    (400, error("This model's maximum context length is 4096 tokens and your request has 3900 input tokens "
                "(1000 > 4096 - 3900)."), 4096),  # vLLM
    (400, error("The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make sure "
                "that `max_model_len` is no smaller than the number of text tokens."), 4096),  # vLLM
    (400, error("The input (5000 tokens) is longer than the model's context length (4096 tokens)."), 4096),  # SGLang
    (400, error("Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a "
                "total of 5000 tokens", code="context_length_exceeded"), 4096),  # SGLang, the emulator
    (400, error("max_completion_tokens is too large: 32000.This model supports at most 2048 completion tokens."),
     2048),  # SGLang, the emulator: max_tokens alone over the window
    (400, json.dumps({"error": {"code": 400, "message": "the request exceeds the available context size, try "
                                "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 5000,
                                "n_ctx": 4096}}).encode(), 4096),  # llama.cpp's server
    (400, json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                 "message": "prompt is too long: 5000 tokens > 4096 maximum"}}
                     ).encode(), 4096),  # Anthropic-style
    (413, b"context length exceeded", None),
])
def test_each_engines_wording_of_a_prompt_too_long(status, body, window):
    refusal = context_refusal(status, body)
    assert refusal.too_long and refusal.window == window


@pytest.mark.parametrize("message, prompt", [
    ("Requested token count exceeds the model's maximum context length of 32768 tokens. You requested a total of "
     "32987 tokens: 17633 tokens from the input messages and 15354 tokens for the completion.", 17633),  # SGLang
    ("This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2076 in the messages, "
     "24 in the completion).", 2076),  # OpenAI
    ("This model's maximum context length is 4096 tokens and your request has 3900 input tokens", 3900),  # vLLM
    ("prompt is too long: 5000 tokens > 4096 maximum", 5000),
    ("max_completion_tokens is too large: 32000.This model supports at most 2048 completion tokens.", None),
])
def test_the_prompt_size_a_refusal_states(message, prompt):
    assert context_refusal(400, error(message)).prompt_tokens == prompt


@pytest.mark.parametrize("status, body", [
    (500, b"7 validation errors: content Input should be a valid string"),
    (400, error("'messages' is required and must be a non-empty array")),
    (401, error("maximum context length is 4096 tokens")),  # not a refusal status
    (200, b'{"choices": []}'),
    (400, b""),
])
def test_other_errors_are_not_a_prompt_too_long(status, body):
    assert not context_refusal(status, body).too_long


# --- the window follows the upstream ------------------------------------------------------------------------------
class Models:
    def __init__(self, window: int | None, owned_by: str = "me") -> None:
        self.window, self.owned_by, self.paths = window, owned_by, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == "/v1/models":
            model = {"id": "m", "owned_by": self.owned_by}
            if self.window:
                model["max_model_len"] = self.window
            return httpx.Response(200, json={"data": [model]})
        if request.url.path == "/props" and self.owned_by == "llamacpp":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1})
        return httpx.Response(404, json={"detail": "Not Found"})


async def test_a_refusal_reads_the_window_again_and_a_smaller_one_replaces_it():
    server = Models(32768)
    window = ContextWindow(Settings(), MockUpstream(server))
    assert await window.tokens() == 32768
    server.window = 4096  # restarted with a smaller window
    assert await window.refused(None, 32768) == 4096
    assert await window.tokens() == 4096
    assert await window.refused(4096, 4096) is None  # nothing smaller to plan with: no second retry


async def test_the_number_in_the_error_serves_when_models_says_nothing_and_it_caps_the_setting():
    window = ContextWindow(Settings(context_window=32768), MockUpstream(Models(None)))
    assert await window.tokens() == 32768
    assert await window.refused(2048, 32768) == 2048
    assert await window.tokens() == 2048  # the upstream is the truth: a larger setting can only fail
    blind = ContextWindow(Settings(context_window=8000), MockUpstream(Models(None)))
    assert await blind.refused(None, 8000) == 6000  # no number anywhere: three quarters, then once more


async def test_a_learned_window_is_read_again_now_and_then(monkeypatch):
    monkeypatch.setattr(window_module, "REFRESH_S", 0.0)
    server = Models(32768)
    window = ContextWindow(Settings(), MockUpstream(server))
    assert await window.tokens() == 32768
    server.window = 4096
    assert await window.tokens() == 32768  # the refresh runs in the background: no turn waits for it
    await asyncio.sleep(0.05)
    assert await window.tokens() == 4096


async def test_llama_cpp_states_its_window_in_props():
    window = ContextWindow(Settings(), MockUpstream(Models(None, owned_by="llamacpp")))
    assert await window.tokens() == 8192
    other = Models(None)
    assert await ContextWindow(Settings(), MockUpstream(other)).tokens() == window_module.FALLBACK_WINDOW
    assert "/props" not in other.paths  # only asked of llama.cpp


# --- the shapes of the proxy's recall rounds ----------------------------------------------------------------------
def round_of(call_id: str, query: str, result: str, content=""):
    return [{"role": "assistant", "content": content, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "recall", "arguments": json.dumps({"query": query})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": result}]


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is my locker code?"},
    *round_of("call_1", "locker code", "[Page 1] my gym locker code is 4817", content=None),  # stored before ""
    {"role": "assistant", "content": "It is 4817."},
    {"role": "user", "content": "And my sister?"},
    *round_of("call_2", "sister", "[Page 2] Ines lives in Lisbon"),
]


def test_strings_gives_a_null_content_its_empty_string_and_nothing_else():
    out = render(HISTORY, "strings", "recall")
    assert out[2]["content"] == "" and out[2]["tool_calls"] == HISTORY[2]["tool_calls"]
    assert [m for i, m in enumerate(out) if i != 2] == [m for i, m in enumerate(HISTORY) if i != 2]


def test_text_turns_each_round_into_one_assistant_message_and_omit_leaves_them_out():
    text = render(HISTORY, "text", "recall")
    assert not holds_rounds(text, "recall") and all(m["role"] != "tool" for m in text)
    assert [m["role"] for m in text] == ["system", "user", "assistant", "assistant", "user", "assistant"]
    assert text[2]["content"].startswith(RECALLED) and "4817" in text[2]["content"]
    assert "Lisbon" in text[-1]["content"] and "tool_calls" not in text[-1]
    assert json.dumps(render(HISTORY, "text", "recall")) == json.dumps(text)  # the same bytes every turn
    omitted = render(HISTORY, "omit", "recall")
    assert [m["content"] for m in omitted] == ["Be brief.", "What is my locker code?", "It is 4817.", "And my sister?"]


def test_a_client_tool_call_beside_a_recall_call_stays():
    weather = {"id": "call_w", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    mixed = [{"role": "user", "content": "Weather where my sister lives?"},
             {"role": "assistant", "content": "", "tool_calls": [*round_of("call_3", "sister", "")[0]["tool_calls"],
                                                                  weather]},
             {"role": "tool", "tool_call_id": "call_3", "content": "Ines lives in Lisbon"},
             {"role": "tool", "tool_call_id": "call_w", "content": "sunny"}]
    for shape in ("text", "omit"):
        out = render(mixed, shape, "recall")
        assert out[1]["tool_calls"] == [weather] and out[-1] == mixed[-1] and len(out) == 3
    assert "Lisbon" in render(mixed, "text", "recall")[1]["content"]


@pytest.mark.parametrize("call_id", [["a", "b"], {"x": 1}, 7, None])
def test_a_client_recall_call_with_an_id_that_is_not_a_string_is_rendered_without_error(call_id):
    forged = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": call_id, "type": "function", "function": {"name": "recall", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "call_9", "content": "kept"}]
    for shape in ("text", "omit"):
        out = render(forged, shape, "recall")
        assert not holds_rounds(out, "recall") and out[-1] == forged[-1]  # its answer matched no string id: it stays


def test_the_next_shape_skips_strings_without_a_null_and_ends():
    assert next_shape("as_sent", HISTORY, "recall") == "strings"
    later = HISTORY[4:]
    assert next_shape("as_sent", later, "recall") == "text"
    assert next_shape("text", HISTORY, "recall") == "omit" and next_shape("omit", HISTORY, "recall") is None


def test_the_choice_is_remembered_per_upstream():
    choice = ShapeChoice()
    assert choice.renderer("http://a/v1/chat/completions", "recall") is None
    choice.choose("http://a/v1/chat/completions", "text", 500)
    apply = choice.renderer("http://a/v1/chat/completions", "recall")
    body = {"model": "m", "messages": HISTORY}
    assert apply(body)["messages"] == render(HISTORY, "text", "recall") and apply(body)["model"] == "m"
    assert choice.shape("http://b/v1/chat/completions") == "as_sent"


words = st.text(alphabet="abcdefgh xyz", min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(words, words, st.booleans(), st.sampled_from([None, ""])), min_size=1, max_size=6),
       st.sampled_from(["strings", "text", "omit"]))
def test_every_shape_keeps_the_clients_messages_in_order(turns, shape):
    messages = []
    for i, (question, result, recalled, content) in enumerate(turns):
        messages.append({"role": "user", "content": question})
        if recalled:
            messages.extend(round_of(f"call_{i}", question, result, content))
        messages.append({"role": "assistant", "content": f"answer {i}"})
    out = render(messages, shape, "recall")
    plain = [m for m in messages if not (m["role"] == "tool" or m.get("tool_calls"))]
    kept = [m for m in out if not (m["role"] == "tool" or m.get("tool_calls") or
                                   str(m.get("content")).startswith(RECALLED))]
    assert kept == plain if shape != "strings" else out == [
        {**m, "content": ""} if m.get("content") is None else m for m in messages]
    if shape != "strings":
        assert not holds_rounds(out, "recall")
    assert render(messages, shape, "recall") == out


# --- the upstream's cache kind ------------------------------------------------------------------------------------
def test_llama_cpp_servers_are_recognised_from_their_routes():
    assert kind_of("/openapi.json", 200, json.dumps({"info": {"title": "🦙 llama.cpp Python API"}}).encode()) == SINGLE_SLOT
    assert kind_of("/props", 200, b'{"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4}') == SINGLE_SLOT
    assert kind_of("/openapi.json", 200, b'{"info": {"title": "vLLM API"}}') is None
    assert kind_of("/props", 404, b"") is None and kind_of("/props", 200, b"not json") is None


async def test_the_setting_wins_and_auto_asks_once():
    server = Models(4096, owned_by="llamacpp")
    assert await CacheKind("radix", MockUpstream(server)).kind() == RADIX and not server.paths
    auto = CacheKind("auto", MockUpstream(server))
    assert await auto.single_slot() and await auto.single_slot()
    assert server.paths == ["/props"]
    assert await CacheKind("auto", MockUpstream(Models(4096))).kind() == RADIX

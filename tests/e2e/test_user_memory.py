"""Memory across one user's conversations (openai SDK -> proxy -> emulator).

Ada tells one conversation her locker code; days later, in a new conversation, she asks for it: the proxy pushes a
round with the page of her other conversation (labelled ``<conversation>/<page>``), which the model can read whole
through ``recall``. The turn after keeps that round byte for byte (its prefix is cached). Bob, a request with no
user id under the same key, and a user also called "ada" of another app (key), asking the same, get nothing of hers.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.e2e.recall_client import labelled_metric

WINDOW = 4096
FILLER = "river stone cloud maple lantern orbit copper meadow signal harbor velvet ember".split()
CODE = "locker code at the climbing gym is 4417-ZEBRA"
# these tests check whose pages reach a prompt, not how soon: on a loaded machine (the real engines build beside the
# suite) a search of the user's pages can outlast the 100 ms default, and a search past its deadline pushes nothing,
# which would fail a "she gets her page" check and pass a "he gets nothing" one without a search made
PATIENT = {"MEMCI_USER_MEMORY_TIMEOUT_MS": "30000"}


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW, {"MEMCI_CONTEXT_WINDOW": str(WINDOW), **PATIENT})


def filler(turn: int, words: int = 60) -> str:
    return " ".join(FILLER[(turn + i) % len(FILLER)] for i in range(words))


def chat(client: Any, messages: list[dict[str, Any]], **extra: Any) -> tuple[str, dict[str, Any], str]:
    r = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=32, **extra)
    completion = r.parse()
    usage = completion.usage.model_dump() if completion.usage else {}
    return completion.choices[0].message.content or "", usage, r.headers.get("x-memci-conversation-id", "")


def last_request(emulator: Any, text: str) -> dict[str, Any]:
    for item in reversed(emulator.requests(10)):
        messages = (item.get("body") or {}).get("messages") or []
        if any(m.get("role") == "user" and m.get("content") == text for m in messages):
            return item["body"]
    raise AssertionError(f"no upstream request holds {text!r}")


def tool_results(emulator: Any, text: str) -> str:
    """The recall results the upstream got after the user message ``text``."""
    for item in reversed(emulator.requests(10)):
        messages = (item.get("body") or {}).get("messages") or []
        if messages and messages[-1].get("role") == "tool" and any(m.get("content") == text for m in messages):
            return messages[-1]["content"]
    raise AssertionError(f"no recall result followed {text!r}")


def tell(client: Any, said: str, noted: str, day: str, **extra: Any) -> str:
    """An earlier conversation, sent whole in one request (as an app importing a history would): its id."""
    earlier = [{"role": "system", "content": f"You are a helpful assistant. Today is {day}."},
               {"role": "user", "content": f"{said}, please remember it."},
               {"role": "assistant", "content": f"Noted, I will remember {noted}."},
               {"role": "user", "content": "Thanks, that is all for now."}]
    return chat(client, earlier, **extra)[2]


def small_talk(client: Any, system: dict[str, Any], topic: str, turns: int, **extra: Any
               ) -> tuple[list[dict[str, Any]], str]:
    """A new conversation: ``turns`` turns about something else; its messages and its id."""
    messages: list[dict[str, Any]] = [system]
    conversation_id = ""
    for i in range(turns):
        messages.append({"role": "user", "content": f"Tell me about {topic}, part {i}. {filler(i)}"})
        answer, _, conversation_id = chat(client, messages, **extra)
        messages.append({"role": "assistant", "content": answer})
    return messages, conversation_id


def test_a_new_conversation_of_the_user_gets_what_her_earlier_one_said(pair, client_for):
    client = client_for(pair.proxy, api_key="sk-one-app")
    first_id = tell(client, f"I just joined a climbing gym. My {CODE}", "your locker code", "2024-03-02", user="ada")

    # the new conversation: a few turns of something else, then the question
    system = {"role": "system", "content": "You are a helpful assistant. Today is 2024-03-20."}
    messages, second_id = small_talk(client, system, "rivers", 6, user="ada")
    assert second_id != first_id
    question = "What is my locker code at the climbing gym?"
    messages.append({"role": "user", "content": question})
    answer, _, _ = chat(client, messages, user="ada")
    sent = last_request(pair.emulator, question)
    pushed = [m for m in sent["messages"] if m.get("role") == "tool"]
    assert pushed and "4417-ZEBRA" in pushed[-1]["content"], sent["messages"][-3:]
    label = re.search(r"\[Page (c[0-9a-f]{8}/\d+)\]", pushed[-1]["content"]).group(1)
    assert first_id.startswith(label.split("/")[0])

    # the turn after keeps the round byte for byte: its prefix is the upstream's cached prefix
    messages.append({"role": "assistant", "content": answer})
    follow = "Thanks. And which gym was that?"
    messages.append({"role": "user", "content": follow})
    _, usage, _ = chat(client, messages, user="ada")
    after = last_request(pair.emulator, follow)
    assert after["messages"][:len(sent["messages"])] == sent["messages"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached / usage["prompt_tokens"] >= 0.96, usage

    # the model reads the page whole through recall, by its label
    text = f'Read it. [[call:recall {{"pages": ["{label}"]}}]]'
    messages += [{"role": "assistant", "content": "It is the one you joined."}, {"role": "user", "content": text}]
    chat(client, messages, user="ada")
    assert "4417-ZEBRA" in tool_results(pair.emulator, text)  # the result the upstream got for the model's call

    # Bob, a request naming nobody, and another app's user called "ada" ask the same: nothing of Ada's
    another_app = client_for(pair.proxy, api_key="sk-another-app")
    for asking, extra in ((client, {"user": "bob"}), (client, {}), (another_app, {"user": "ada"})):
        others = [system, {"role": "user", "content": question}]
        answer, _, _ = chat(asking, others, **extra)
        body = json.dumps(last_request(pair.emulator, question))
        assert "4417" not in body and "4417" not in answer
        text = f'Read it. [[call:recall {{"pages": ["{label}"], "query": "locker code climbing gym"}}]]'
        chat(asking, [*others, {"role": "assistant", "content": "?"}, {"role": "user", "content": text}], **extra)
        assert "does not exist" in tool_results(pair.emulator, text) and "4417" not in tool_results(pair.emulator, text)
    assert "timeout" not in labelled_metric(pair.proxy, "memci_user_memory_pushes")  # each asking turn searched

"""Recall's fault cases end to end (openai SDK -> proxy -> emulator), with a stand-in for the packaged model
(tests/e2e/fake_model, first on the proxy's PYTHONPATH) that a test can break mid-run: an image-only and an empty page
(zero vectors, counted), a page longer than the model's input (chunked: a fact at its very end is found), the model
failing mid-run (lexical search, counted, every answer a 200, streamed or not), and a look-up whose search finds
nothing (no round added, counted). Nothing answers 5xx."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import openai
import pytest

from tests.e2e.recall_client import labelled_metric, search

KEY = "sk-faults"
FAKE_MODEL = Path(__file__).resolve().parent / "fake_model"
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8).decode()
FILLER = " ".join(f"weather{i % 50} news{i % 37} chat{i % 11}." for i in range(1300))  # ~31,000 characters
WEDDING = "My sister's wedding will be in Porto, at the Quinta da Aveleda estate."
LONG = FILLER + " At the very end: the code of my gym locker is 4471."


@pytest.fixture(scope="module")
def pair(emulator_and_proxy, tmp_path_factory):
    weights = tmp_path_factory.mktemp("fake-model") / "weights.npz"
    weights.write_bytes(b"fake")
    # every archived page embedded (embeddings_pages=archive): the long page's chunks and the empty pages' zero
    # vectors are embedded as they are archived, and the model's failure hits that background work too. Offload is
    # off: the long page stays a page of the chat, not a pasted document offloaded on first sight (which takes a
    # page number of its own: tests/e2e/test_offload.py), so that the pages keep the numbers the cases name.
    made = emulator_and_proxy(16384, env={"MEMCI_EMBEDDINGS_LOCAL": "use-multilingual-v3",
                                          "MEMCI_OFFLOAD": "false",
                                          "MEMCI_EMBEDDINGS_PAGES": "archive",
                                          "MEMCI_EMBEDDINGS_LOCAL_WEIGHTS": str(weights),
                                          "PYTHONPATH": str(FAKE_MODEL)})
    made.weights = weights
    return made


def _search(proxy, conversation: str, query: str) -> list[dict]:
    return search(proxy, KEY, conversation, query)


def _send(client: openai.OpenAI, messages: list[dict], stream: bool = False) -> dict[str, str]:
    if stream:
        with client.chat.completions.with_streaming_response.create(
                model="m", messages=messages, max_tokens=200, stream=True) as response:
            assert response.http_response.status_code == 200
            chunks = list(response.parse())
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        messages.append({"role": "assistant", "content": "".join(c.choices[0].delta.content or "" for c in chunks
                                                                 if c.choices)})
        return dict(response.headers)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=200)
    assert raw.http_response.status_code == 200
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    messages.append(choice.message.model_dump(exclude_none=True))
    return dict(raw.headers)


def _last_upstream_messages(pair) -> list[dict]:
    return pair.emulator.turn_requests(1)[0]["body"]["messages"]


def test_recall_fault_cases_answer_right_and_are_counted(pair):
    proxy = pair.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=60)
    messages: list[dict] = [{"role": "user", "content": "Our new puppy is a border collie named Pistachio. [[len:24]]"}]
    _send(client, messages)
    messages.append({"role": "user", "content": LONG})  # page 2
    _send(client, messages)
    # pages 3 and 4: an image alone and an empty exchange, sent as history with the next turn
    messages += [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]},
                 {"role": "assistant", "content": ""}, {"role": "user", "content": ""},
                 {"role": "assistant", "content": ""}]
    turn = 0
    headers: dict[str, str] = {}
    while int(headers.get("x-memci-pages-archived", 0)) < 5:
        turn += 1
        assert turn < 150, "the first pages were never archived"
        text = WEDDING if turn == 1 else f"Chit-chat number {turn} about the rain."
        messages.append({"role": "user", "content": text + " [[len:120]]"})
        headers = _send(client, messages, stream=turn % 2 == 0)
    conversation = headers["x-memci-conversation-id"]

    deadline = time.monotonic() + 30  # pages are embedded in the background
    embedded = labelled_metric(proxy, "memci_embedded_texts_total")
    while (embedded.get("chunked", 0) < 1 or embedded.get("empty", 0) < 2) and time.monotonic() < deadline:
        time.sleep(0.3)
        embedded = labelled_metric(proxy, "memci_embedded_texts_total")
    assert embedded.get("chunked", 0) >= 1 and embedded.get("empty", 0) >= 2, embedded
    hits = _search(proxy, conversation, "gym locker")
    assert hits[0]["page"] == "2" and "4471" in hits[0]["excerpt"]
    assert not labelled_metric(proxy, "memci_recall_fallbacks_total")  # the vector half served every search so far

    # the image-only page, recalled by number: its reference and placeholder, no error
    messages.append({"role": "user", "content": 'Show page 3. [[call:recall {"pages": ["3"]}]]'})
    _send(client, messages)
    result = _last_upstream_messages(pair)[-1]
    assert result["role"] == "tool" and "[image memci-blob://sha256/" in result["content"], result

    # the model breaks mid-run: a look-up still gets the fact pushed (lexical search), counted; streamed and not
    pair.weights.with_name("weights.npz.broken").write_bytes(b"")
    for stream, look_up, fact in ((False, "Remind me, what was the name of our new puppy?", "Pistachio"),
                                  (True, "What did I tell you about my sister's wedding?", "Aveleda")):
        messages.append({"role": "user", "content": look_up})
        _send(client, messages, stream=stream)
        sent = _last_upstream_messages(pair)
        assert sent[-1]["role"] == "tool" and fact in sent[-1]["content"], sent[-2:]
    hits = _search(proxy, conversation, "the locker at my gym")  # a query not embedded before (cached by text)
    assert hits[0]["page"] == "2" and "4471" in hits[0]["excerpt"]
    assert labelled_metric(proxy, "memci_recall_fallbacks_total").get("model_error", 0) >= 3
    assert labelled_metric(proxy, "memci_embedded_texts_total").get("failed", 0) >= 3

    # a look-up the archive holds nothing for: no round, counted; streamed and not
    before = labelled_metric(proxy, "memci_recall_pushes_total")
    for stream, look_up in ((False, "What did I tell you about my trip to Zanzibar?"),
                            (True, "Remind me what I said about the skydiving lesson.")):
        messages.append({"role": "user", "content": look_up})
        _send(client, messages, stream=stream)
        assert _last_upstream_messages(pair)[-1]["role"] == "user"
    after = labelled_metric(proxy, "memci_recall_pushes_total")
    unmatched = ("no_match", "weak", "no_hits")
    assert sum(after.get(k, 0) - before.get(k, 0) for k in unmatched) == 2, (before, after)
    assert after.get("pushed") == before.get("pushed") == 2
    client.close()

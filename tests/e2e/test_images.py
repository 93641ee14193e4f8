"""Images end to end: openai SDK -> proxy -> emulator (the emulator also stands in for the vision model).

A 50-turn conversation that sends an image every turn (5 distinct images, each sent 10 times) stays under
budget; images go upstream verbatim until an epoch decays them to their descriptions; each distinct image is
described once and stored once; recalling an archived page returns the description and the blob reference.
"""

from __future__ import annotations

import base64
import hashlib
import json

import httpx
import openai
import pytest

from memci_proxy.settings import Settings
from memci_proxy.vision.client import VisionClient
from tests.e2e.conftest import EmulatorProcess

pytestmark = pytest.mark.skipif(
    not hasattr(Settings, "vision_model"),
    reason="images are not wired into the proxy yet (settings vision_model / blob_store, memci_proxy/turn/service.py)",
)

WINDOW = 4096
MAX_TOKENS = 128
VISION_MODEL = "memci-vision"
TURNS = 50
DISTINCT = 5


def budget(window: int = WINDOW, max_tokens: int = MAX_TOKENS, margin: float = 0.10) -> int:
    return window - max_tokens - int(margin * window)


def image(i: int) -> tuple[str, str]:
    data = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(str(i).encode()).digest() * 40
    return "data:image/png;base64," + base64.b64encode(data).decode(), hashlib.sha256(data).hexdigest()


def is_vision_request(body: dict) -> bool:
    return body.get("model") == VISION_MODEL


def image_parts(messages: list[dict]) -> int:
    return sum(
        1 for m in messages if isinstance(m.get("content"), list)
        for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url"
    )


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW, {"MEMCI_VISION_MODEL": VISION_MODEL})


@pytest.fixture(scope="module")
def emulator(pair):
    return pair.emulator


def expected_description(emulator: EmulatorProcess) -> str:
    """The emulator's answers depend on the text of the last user message only: every image gets this one."""
    body = VisionClient(emulator.base_url, VISION_MODEL).request_body(image(0)[0])
    r = httpx.post(emulator.base_url + "/chat/completions", json=body, timeout=10)
    return " ".join(r.json()["choices"][0]["message"]["content"].split())


def last_chat_request(emulator: EmulatorProcess) -> dict:
    for item in reversed(emulator.requests(10)):
        body = item["body"]
        tools = body.get("tools") or []
        # the proxied chat request carries the recall tool; vision and background summary requests do not
        if not is_vision_request(body) and any((t.get("function") or {}).get("name") == "recall" for t in tools):
            return body
    raise AssertionError("no chat request reached the emulator")


def test_fifty_turns_with_images(proxy, emulator, client_for):
    client = client_for(proxy)
    messages: list[dict] = [{"role": "system", "content": "You look at screenshots."}]
    previous: list[dict] | None = None
    epochs = decayed_at_epoch = 0
    for turn in range(TURNS):
        uri, _ = image(turn % DISTINCT)
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"Turn {turn}: what does this screenshot show?"},
            {"type": "image_url", "image_url": {"url": uri}},
        ]})
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=MAX_TOKENS)
        r = raw.parse()
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        assert r.usage.prompt_tokens <= budget(), f"turn {turn}: {r.usage.prompt_tokens} > {budget()}"
        sent = last_chat_request(emulator)["messages"]
        # newest image verbatim (the message may lead with the proxy's blocks when it is the first active one)
        assert sent[-1]["content"][-1] == {"type": "image_url", "image_url": {"url": uri}}
        epoch = raw.headers["x-memci-epoch"] == "true"
        if previous is not None and not epoch:
            assert sent[: len(previous)] == previous, f"turn {turn}: the prompt changed without an epoch"
        active_decayed = "[image memci-blob://sha256/" in json.dumps(sent[1:])
        if epoch:
            epochs += 1
            decayed_at_epoch += active_decayed
        elif epochs == 0:
            assert not active_decayed and image_parts(sent) == turn + 1, "images decay only at epochs"
        previous = sent
    assert epochs >= 2 and decayed_at_epoch >= 1

    # described once and stored once per distinct image
    vision = [item for item in emulator.requests(200) if is_vision_request(item["body"])]
    assert len(vision) == DISTINCT
    stored = sorted(p.name for p in (proxy.home / "blobs" / "images").rglob("*") if p.is_file())
    assert stored == sorted(image(i)[1] for i in range(DISTINCT))

    # the entries rows keep blob references, never the image bytes
    conversation = raw.headers["x-memci-conversation-id"]
    export = httpx.get(f"{proxy.url}/memci/conversations/{conversation}/export",
                       headers={"Authorization": "Bearer sk-test"}, timeout=30)
    assert export.status_code == 200
    assert "memci-blob://sha256/" in export.text and ";base64," not in export.text

    # the contents page describes archived images; recalling page 1 returns the description and the reference
    description = expected_description(emulator)
    system = json.dumps(last_chat_request(emulator)["messages"][:2])  # the contents page leads the first active message
    assert "[image: " + description[:20] in system
    messages.append({"role": "user", "content": 'Show page 1 again. [[call:recall {"pages": [1]}]]'})
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS)
    assert r.choices[0].message.tool_calls is None  # the proxy answered the recall itself
    recall_results = [
        m["content"] for item in emulator.requests(5) for m in item["body"]["messages"] if m.get("role") == "tool"
    ]
    first = image(0)[1]
    assert any(f"[image memci-blob://sha256/{first}: {description}]" in c for c in recall_results), recall_results


def test_a_url_image_passes_through_and_is_not_stored(proxy, emulator, client_for):
    client = client_for(proxy)
    part = {"type": "image_url", "image_url": {"url": "https://example.org/chart.png"}}
    r = client.chat.completions.create(model="m", max_tokens=32, messages=[
        {"role": "user", "content": [{"type": "text", "text": "chart?"}, part]},
    ])
    assert r.choices[0].message.content
    assert last_chat_request(emulator)["messages"][-1]["content"][1] == part
    files = [p for p in (proxy.home / "blobs").rglob("*") if p.is_file()]
    assert all(p.name != hashlib.sha256(b"https://example.org/chart.png").hexdigest() for p in files)

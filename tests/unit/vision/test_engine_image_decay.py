"""Images in the context engine: verbatim between epochs, decayed to their descriptions at epochs."""

from __future__ import annotations

import base64
import hashlib
import json

from memci_proxy.engine import ARCHIVED, EngineConfig, EstimateCounter, TurnInput, plan
from memci_proxy.engine.condense import (
    BLOB_URL_PREFIX,
    condense_message,
    decay_images,
    image_placeholder,
    image_reference,
    message_images,
)
from memci_proxy.engine.contents import summary_line

C = EstimateCounter()
T0 = 1_763_769_600.0
CONFIG = EngineConfig(context_window=4096, output_reserve=256, contents_max_tokens=600, condense_keep_pages=1)


def png(i: int, size: int = 300) -> tuple[str, str]:
    data = (b"\x89PNG" + i.to_bytes(4, "big")) * (size // 8)
    return "data:image/png;base64," + base64.b64encode(data).decode(), hashlib.sha256(data).hexdigest()


def image_message(text: str, uri: str) -> dict:
    image_part = {"type": "image_url", "image_url": {"url": uri}}
    return {"role": "user", "content": [{"type": "text", "text": text}, image_part]}


def has_image_part(message: dict) -> bool:
    return isinstance(message.get("content"), list) and any(
        isinstance(p, dict) and p.get("type") == "image_url" for p in message["content"]
    )


def test_image_reference_of_data_uri_blob_reference_and_url() -> None:
    uri, key = png(1, 64)
    ref = image_reference({"type": "image_url", "image_url": {"url": uri}})
    assert (ref.key, ref.media_type, ref.size, ref.source) == (key, "image/png", 64, "data")
    assert ref.url == BLOB_URL_PREFIX + key
    reference = f"{BLOB_URL_PREFIX}{key}?type=image/png&size=64"
    blob = image_reference({"type": "image_url", "image_url": {"url": reference}})
    assert (blob.key, blob.media_type, blob.size, blob.source) == (key, "image/png", 64, "blob")
    remote = image_reference({"type": "image_url", "image_url": "https://example.org/a.png"})
    assert remote.source == "url" and remote.key == hashlib.sha256(b"https://example.org/a.png").hexdigest()
    assert image_reference({"type": "text", "text": "x"}) is None


def test_condensing_decays_images_only_when_descriptions_are_given() -> None:
    uri, key = png(2, 2048)
    msg = image_message("what is this?", uri)
    assert condense_message(msg, 200) is None  # unchanged without descriptions: images are kept
    out = condense_message(msg, 200, {key: "A red square with the word ALPHA."})
    text = f"[image {BLOB_URL_PREFIX}{key}: A red square with the word ALPHA.]"
    assert out["content"][1] == {"type": "text", "text": text}
    assert msg["content"][1]["type"] == "image_url"  # never mutated
    placeholder = decay_images(msg, {})["content"][1]["text"]
    assert placeholder == f"[image {BLOB_URL_PREFIX}{key}: image/png, 2.0 KB, no description available]"
    assert image_placeholder(image_reference(msg["content"][1])) in placeholder
    assert C.count_message(out) < C.count_message(msg)


def test_contents_line_shows_the_description() -> None:
    uri, key = png(3)
    described = summary_line(image_message("see", uri), 80, {key: "a chart of sales"})
    assert described == "user: see [image: a chart of sales]"
    assert summary_line(image_message("see", uri), 80) == "user: see [image_url]"


def run(turns: int, descriptions: dict, state=None, start: int = 0, msgs=None):
    msgs = [] if msgs is None else msgs
    plans = []
    for i in range(start, start + turns):
        uri, _ = png(i % 7)  # images repeat: the same image sent again
        msgs.append(image_message(f"turn {i}: what is it?", uri))
        p = plan(state, TurnInput(system=[], messages=list(msgs), now=T0 + i, max_tokens=256,
                                  image_descriptions=descriptions), CONFIG, C)
        plans.append(p)
        state = p.state
        msgs.append({"role": "assistant", "content": f"answer {i} " + "text " * 40})
    return plans, state, msgs


def test_images_stay_verbatim_between_epochs_and_decay_at_epochs() -> None:
    descriptions = {png(i)[1]: f"picture number {i} of a cat" for i in range(7)}
    plans, state, msgs = run(40, descriptions)
    epochs = [p for p in plans if p.epoch]
    assert epochs, "images must force epochs in a 4k window"
    for previous, current in zip(plans, plans[1:]):
        assert current.estimated_tokens <= current.budget
        if not current.epoch:  # append-only: the previous prompt is a prefix of this one
            assert current.messages[: len(previous.messages)] == previous.messages
    last = plans[-1]
    newest_user = [m for m in last.messages if m["role"] == "user"][-1]
    assert has_image_part(newest_user)  # the open page keeps its image
    decayed = [m for m in last.messages[1:] if m["role"] == "user" and not has_image_part(m)]
    assert decayed, "older active pages decay their images at epochs"
    for m in decayed:
        text = m["content"][1]["text"]
        assert "picture number" in text and text.startswith("[image memci-blob://")
    archived = [p for p in state.pages if p.status == ARCHIVED]
    assert archived and all("[image: picture number" in p.contents for p in archived)
    assert "[image: picture number" in str(last.messages[0]["content"])  # the contents page, leading the prompt


def test_a_description_arriving_after_the_epoch_does_not_change_sent_text() -> None:
    plans, state, msgs = run(40, {})  # no description ready: placeholders
    last = plans[-1]
    decayed = [m for m in last.messages[1:] if m["role"] == "user" and not has_image_part(m)]
    assert decayed, "some active image must have decayed"
    assert all("no description available" in m["content"][1]["text"] for m in decayed)
    late = {png(i)[1]: "late description" for i in range(7)}
    msgs.append({"role": "user", "content": "and now?"})
    p = plan(state, TurnInput(system=[], messages=msgs, now=T0 + 100, max_tokens=256, image_descriptions=late),
             CONFIG, C)
    assert not p.epoch
    assert p.messages[: len(last.messages)] == last.messages
    assert "late description" not in json.dumps(p.messages)
    assert all(v == "" for v in p.state.image_texts.values())


def test_frozen_texts_cover_only_active_decayed_images() -> None:
    descriptions = {png(i)[1]: f"cat {i}" for i in range(7)}
    _, state, msgs = run(40, descriptions)
    start = state.active_start_entry()
    keys = {r.key for e in state.condensed if e >= start for r in message_images(msgs[e])}
    assert set(state.image_texts) == keys
    assert all(state.image_texts[k] == descriptions[k] for k in keys)


def test_an_epoch_with_images_restarts_a_ratio_below_one() -> None:
    from memci_proxy.engine import observe_usage

    plans, state, msgs = run(8, {})
    state = observe_usage(state, 100, None, plans[-1].estimated_tokens, T0 + 8)  # images cost far less than estimated
    assert state.correction_ratio < 1.0
    later, state, _ = run(40, {}, state=state, start=8, msgs=msgs)
    first_epoch = next(p for p in later if p.epoch)
    assert first_epoch.state.correction_ratio == 1.0


def test_contents_line_keeps_the_description_of_a_long_message() -> None:
    uri, key = png(4)
    msg = image_message("Here is the error I get when I build the project, can you tell me what is wrong?", uri)
    line = summary_line(msg, 80, {key: "terminal: ERROR linker cannot find -lssl"})
    assert len(line) <= 80 and line.startswith("user: Here is the error") and "[image: terminal: ERROR" in line

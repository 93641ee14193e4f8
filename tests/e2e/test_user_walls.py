"""One app, several people: nothing one end user said reaches another's prompt (openai SDK -> proxy -> emulator).

The scenario of a new user: one API key for every user of the app (pass-through auth, the tenant is a hash of the
key), the memory workers on (their default), a 4096-token window so that epochs happen, and an upstream that answers
the profile job as a model would (a "- fact" line quoting the user: the emulator obeys the [[say:]] marker at the
head of her messages, which the job's instruction quotes).

- Alice, with no user id, tells her conversation a diagnosis and an address. Her profile is her conversation's own:
  it reaches her own later prompts, and none of Bob's, whether Bob sends no id, ``user``, ``safety_identifier`` or
  the header ``X-Memci-User``.
- Alice again with ``user="alice"``: her profile is hers across her conversations (a new one of hers starts with it),
  and never Bob's (``user="bob"``), whose session key and first messages are the same as hers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import pytest

from tests.resilience.walls import UpstreamLog

WINDOW = 4096
FILLER = "river stone cloud maple lantern orbit copper meadow signal harbor velvet ember".split()
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
FACT = "The user's diagnosis is zebracanary syndrome and home address is 12 Quokka Lane"
CANARIES = ("zebracanary", "Quokka")


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW, {"MEMCI_CONTEXT_WINDOW": str(WINDOW), "MEMCI_MEMORY_WORKERS": "true",
                                       "MEMCI_SUMMARY_CACHE_TTL_S": "0"})


def filler(turn: int, words: int = 120) -> str:
    return " ".join(FILLER[(turn + i) % len(FILLER)] for i in range(words))


class Person:
    """One conversation of one person through the openai SDK; ``how``: where the request names the person."""

    def __init__(self, client: Any, name: str, how: str = "", user_id: str = "", session: str = "") -> None:
        self.client, self.name, self.how, self.user_id, self.session = client, name, how, user_id, session
        self.messages: list[dict[str, Any]] = [SYSTEM]
        self.conversation_id = ""

    def say(self, text: str) -> str:
        extra: dict[str, Any] = {}
        headers = {"X-Session-Id": self.session} if self.session else {}
        if self.how == "user":
            extra["user"] = self.user_id
        elif self.how == "safety_identifier":
            extra["safety_identifier"] = self.user_id
        elif self.how == "header":
            headers["X-Memci-User"] = self.user_id
        messages = [*self.messages, {"role": "user", "content": text}]
        r = self.client.chat.completions.with_raw_response.create(
            model="m", messages=messages, max_tokens=64, extra_headers=headers, **extra)
        answer = r.parse().choices[0].message.content or ""
        self.conversation_id = r.headers.get("x-memci-conversation-id", "")
        self.messages = [*messages, {"role": "assistant", "content": answer}]
        return answer


def alice_turn(i: int) -> str:
    # the marker first: the profile job quotes the head of the pages it reads, and the emulator answers the marker
    return (f"[[say:- {FACT}]] Turn {i} of aliceword: my diagnosis is zebracanary syndrome and my home address is 12 Quokka Lane. "
            f"{filler(i)}")


def head_text(messages: list[dict]) -> str:
    """What leads a prompt: the leading system message and the proxy's block (profile, summary, contents page) that
    leads the message after it, as JSON text."""
    out = ""
    rest = messages
    if rest and rest[0].get("role") == "system":
        out, rest = json.dumps(rest[0].get("content"), ensure_ascii=False), rest[1:]
    after = json.dumps(rest[0].get("content") if rest else "", ensure_ascii=False)
    return out + (after.split("</memci-context>")[0] if after.startswith('"<memci-context>') else "")


def system_texts(log: UpstreamLog, marker: str) -> list[str]:
    """What leads every upstream request whose body holds ``marker`` (head_text)."""
    out = []
    for item in log.collect():
        body = item.get("body") or {}
        if marker in json.dumps(body, ensure_ascii=False):
            out.append(head_text(body.get("messages") or []))
    return out


def leaks(log: UpstreamLog, marker: str) -> list[str]:
    """Canaries of Alice in any upstream request made for the person whose messages hold ``marker``."""
    bodies = log.bodies_with(marker)
    assert bodies, f"no upstream request of {marker} was seen"
    return sorted({c for c in CANARIES for b in bodies if c in b})


def last_request_ending_with(emulator: Any, text: str) -> dict[str, Any]:
    """The newest chat request the upstream got whose last message ends with ``text`` (the memory jobs' do not)."""
    for item in reversed(emulator.requests(20)):
        messages = (item.get("body") or {}).get("messages") or []
        last = messages[-1].get("content") if messages else None
        if isinstance(last, str) and last.endswith(text):  # (a new conversation's message leads with the profile)
            return item["body"]
    raise AssertionError(f"no upstream request ends with {text[:40]!r}")


def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_one_users_profile_never_reaches_another_user_of_the_same_app(pair, client_for):
    log = UpstreamLog(pair.emulator)
    client = client_for(pair.proxy, api_key="sk-one-key-for-the-whole-app")

    # -- Alice, no user id: 40 turns, epochs, her profile job answered with her words ----------------------------
    alice = Person(client, "alice")
    for i in range(40):
        alice.say(alice_turn(i))
        if i % 5 == 4:
            log.collect()  # the emulator keeps the last 200 requests: read them before they go
    # her profile is her conversation's own: it reaches her own later system message (the test can fail)
    for i in range(40, 80):
        if any("zebracanary" in s for s in system_texts(log, "aliceword")):
            break
        alice.say(f"Turn {i} of aliceword: more about my week. {filler(i)}")
    assert any("zebracanary" in s for s in system_texts(log, "aliceword")), "Alice's profile never reached her prompt"

    # -- Bob, under the same key: no id, `user`, `safety_identifier`, the header ----------------------------------
    for how in ("", "user", "safety_identifier", "header"):
        marker = f"bobword{how.replace('_', '')}x"
        bob = Person(client, "bob", how, "bob")
        for i in range(34):
            bob.say(f"Turn {i} of {marker}: tell me about rivers. {filler(i)}")
            if i % 5 == 4:
                log.collect()
        assert leaks(log, marker) == [], f"Alice's words reached Bob ({how or 'no user id'})"


def test_a_users_profile_follows_her_across_her_conversations_only(pair, client_for):
    log = UpstreamLog(pair.emulator)
    client = client_for(pair.proxy, api_key="sk-one-key-for-the-whole-app")
    alice = Person(client, "alice", "user", "alice", session="the-app-session")
    for i in range(40):
        alice.say(alice_turn(100 + i))
        if i % 5 == 4:
            log.collect()

    probes: list[str] = []

    def a_new_conversation_of_alice_knows_her() -> bool:
        marker = f"aliceprobe{len(probes)}x"
        probes.append(marker)
        Person(client, "alice", "user", "alice").say(f"{marker}: hello again.")
        return any("zebracanary" in s for s in system_texts(log, marker))

    wait_until(a_new_conversation_of_alice_knows_her, "Alice's profile in a new conversation of hers")

    # Bob, with his own id: the same session key as Alice's, and a new conversation of his own
    for how, session in (("user", "the-app-session"), ("user", ""), ("header", "")):
        marker = f"bobagain{how}{len(session)}x"
        bob = Person(client, "bob", how, "bob", session=session)
        for i in range(12):
            bob.say(f"Turn {i} of {marker}: tell me about rivers. {filler(i)}")
        assert bob.conversation_id != alice.conversation_id
        assert leaks(log, marker) == [], f"Alice's words reached Bob ({how}, session {session!r})"

    # Bob sends Alice's first messages word for word (the same prefix): still his own conversation, no profile
    bob = Person(client, "bob", "user", "bob")
    for message in alice.messages[1:6:2]:
        bob.say(message["content"])
        sent = last_request_ending_with(pair.emulator, message["content"])
        assert "zebracanary" not in head_text(sent["messages"])
    assert bob.conversation_id != alice.conversation_id

    # the other APIs name the user their own way: Responses `user`, Messages `metadata.user_id`
    def responses_system(user: str, marker: str) -> str:
        client.responses.create(model="m", input=f"{marker}: hello.", user=user, max_output_tokens=64)
        return head_text(last_request_ending_with(pair.emulator, f"{marker}: hello.")["messages"])

    assert "zebracanary" in responses_system("alice", "responsesalice")
    assert "zebracanary" not in responses_system("bob", "responsesbob")
    messages_client = anthropic.Anthropic(base_url=pair.proxy.url, api_key="sk-one-key-for-the-whole-app",
                                          max_retries=0)
    for user, known in (("alice", True), ("bob", False)):
        text = f"messages{user}: hello."
        messages_client.messages.create(model="m", max_tokens=64, metadata={"user_id": user},
                                        system="You are a helpful assistant.",
                                        messages=[{"role": "user", "content": text}])
        assert ("zebracanary" in head_text(last_request_ending_with(pair.emulator, text)["messages"])) is known
    messages_client.close()

"""Rules level of the intent rewrite: pronouns and ellipsis, English and Chinese."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memci_proxy.engine.intent import (
    INTENT_PREFIX,
    LEVEL_RULES,
    RewriteResult,
    intent_block,
    message_text,
    rewrite_rules,
    salient_entities,
)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


@pytest.mark.parametrize(
    ("history", "last", "expected"),
    [
        ([user("Tell me about the Python GIL.")], "Why does it exist?", "Why does the Python GIL exist?"),
        ([user("Tell me about lung cancer.")], "What are its symptoms?", "What are lung cancer's symptoms?"),
        (
            [user("I'm using Redis Streams for jobs."), assistant("Redis Streams give you consumer groups.")],
            "How do I trim them?",
            "How do I trim Redis Streams?",
        ),
        ([user("What are Mako sharks?")], "Where do they live?", "Where do Mako sharks live?"),
        ([user("What are Mako sharks?")], "What do they eat?", "What do Mako sharks eat?"),
        ([user("What is the US Electoral College?")], "How does that work?", "How does the US Electoral College work?"),
        ([user("What is Docker?")], "Is it free?", "Is Docker free?"),
    ],
)
def test_english_pronouns_resolve_to_the_salient_entity(history: list[dict], last: str, expected: str) -> None:
    result = rewrite_rules(history, last)
    assert result == RewriteResult(expected, LEVEL_RULES, True)


def test_the_entity_named_in_the_message_itself_is_not_the_antecedent() -> None:
    history = [user("What causes throat cancer?")]
    result = rewrite_rules(history, "Is it the same as esophageal cancer?")
    assert result.query == "Is throat cancer the same as esophageal cancer?"


def test_recent_focus_beats_an_older_mention() -> None:
    history = [user("What is throat cancer?"), user("Is throat cancer treatable?"), user("Tell me about lung cancer.")]
    assert rewrite_rules(history, "What are its symptoms?").query == "What are lung cancer's symptoms?"


def test_expletive_it_and_determiner_that_are_left_alone() -> None:
    history = [user("What is Docker?")]
    assert not rewrite_rules(history, "What does it mean to containerize an app?").changed
    assert not rewrite_rules(history, "Is that image small?").changed


def test_what_about_substitutes_into_the_previous_question() -> None:
    history = [user("What is the weather in Paris today?"), assistant("Sunny, 25 degrees.")]
    assert rewrite_rules(history, "What about London?").query == "What is the weather in London today?"
    history = [user("What are lung cancer's symptoms?")]
    assert rewrite_rules(history, "What about throat cancer?").query == "What are throat cancer's symptoms?"
    assert rewrite_rules(history, "how about throat cancer").query == "What are throat cancer's symptoms?"


def test_what_about_without_a_matching_entity_is_unchanged() -> None:
    history = [user("What were the similarities between the studies?")]
    assert not rewrite_rules(history, "What about the weather?").changed


def test_chinese_pronouns_and_ellipsis() -> None:
    assert rewrite_rules([user("我想了解一下量子计算机")], "它的原理是什么？").query == "量子计算机的原理是什么？"
    history = [user("北京的天气怎么样？"), assistant("北京今天晴，25度。")]
    assert rewrite_rules(history, "那上海呢？").query == "上海的天气怎么样？"
    assert rewrite_rules(history, "上海呢").query == "上海的天气怎么样？"
    other = rewrite_rules([user("推荐几家北京的烤鸭店")], "其他的呢")
    assert other.changed and "烤鸭店" in other.query and other.query.startswith("其他的呢")


def test_chinese_determiner_this_is_left_alone() -> None:
    assert not rewrite_rules([user("我想了解一下量子计算机")], "这个问题很难").changed


def test_what_else_carries_the_previous_question() -> None:
    result = rewrite_rules([user("Which Python web frameworks are fast?")], "What else?")
    assert result.query == "What else? (Which Python web frameworks are fast?)"


def test_nothing_to_resolve_or_no_history_leaves_the_message() -> None:
    assert rewrite_rules([], "Is it good?") == RewriteResult("Is it good?", LEVEL_RULES, False)
    assert rewrite_rules([user("Hello")], "How do I install Rust?") == RewriteResult(
        "How do I install Rust?", LEVEL_RULES, False
    )
    long_message = "it " * 1000
    assert rewrite_rules([user("What is Docker?")], long_message).query == long_message


def test_content_parts_and_non_chat_roles() -> None:
    history = [
        {"role": "system", "content": "You are helpful. Kubernetes is great."},
        {"role": "user", "content": [{"type": "text", "text": "What is Terraform?"}, {"type": "image_url"}]},
        {"role": "tool", "content": "Ansible output"},
    ]
    assert message_text(history[1]) == "What is Terraform?"
    assert rewrite_rules(history, "Is it free?").query == "Is Terraform free?"


def test_pure_and_deterministic() -> None:
    history = [user("Tell me about the Bronze Age collapse."), assistant("It happened around 1177 BC.")]
    frozen = copy.deepcopy(history)
    first = rewrite_rules(history, "What is the evidence for it?")
    assert first == rewrite_rules(history, "What is the evidence for it?")
    assert history == frozen
    assert first.query == "What is the evidence for the Bronze Age collapse?"


def test_salient_entities_rank_by_recency_and_frequency() -> None:
    history = [user("What is Lyme disease?"), user("How do you get Lyme disease?"), user("What is a tick?")]
    ranked = [surface for surface, _ in salient_entities(history, top=2)]
    assert ranked[0] == "Lyme disease" or ranked[0].lower() == "lyme disease"
    assert "tick" in ranked[1]


def test_intent_block_form() -> None:
    assert intent_block("What is  Docker?\n") == INTENT_PREFIX + "What is Docker?"
    assert intent_block("Standalone query") == "Standalone intent: Standalone query"
    assert intent_block("  \n") == ""


messages = st.lists(
    st.builds(lambda role, text: {"role": role, "content": text}, st.sampled_from(["user", "assistant"]), st.text()),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(history=messages, last=st.text())
def test_never_raises_and_keeps_unchanged_messages_verbatim(history: list[dict], last: str) -> None:
    result = rewrite_rules(history, last)
    assert result.level == LEVEL_RULES
    if not result.changed:
        assert result.query == last
    else:
        assert result.query.strip()


@settings(max_examples=100, deadline=None)
@given(
    history=st.lists(st.sampled_from(["What is Docker?", "Tell me about 北京的天气", "Are Mako sharks big?"]), max_size=4),
    last=st.sampled_from(["Is it free?", "它是什么？", "What about Podman?", "Where do they live?", "那上海呢？"]),
)
def test_resolved_pronoun_words_come_from_the_history(history: list[str], last: str) -> None:
    result = rewrite_rules([user(t) for t in history], last)
    if result.changed:
        context = " ".join(history) + " " + last
        for token in re.findall(r"[A-Za-z0-9]+|[\u4e00-\u9fff]", result.query):
            assert token in context or token in ("s", "of", "in")  # possessive 's, topic appended "of X"


def test_chinese_topic_comes_first() -> None:
    history = [user("我想了解一下量子计算机的原理和应用，以及它和经典计算机的区别")]
    assert rewrite_rules(history, "它的原理是什么？").query == "量子计算机的原理是什么？"


def test_narration_is_not_rewritten_only_questions_and_requests() -> None:
    history = [user("Tell me about the Python GIL.")]
    assert not rewrite_rules(history, "I think it is annoying.").changed
    assert rewrite_rules(history, "I think it is annoying. Why does it exist?").query == (
        "I think it is annoying. Why does the Python GIL exist?"
    )
    assert rewrite_rules(history, "Explain it briefly.").query == "Explain the Python GIL briefly."


def test_it_is_not_a_person_and_they_needs_a_plural() -> None:
    history = [user("My teacher gave me a new book about Mars.")]
    assert "teacher" not in rewrite_rules(history, "Why did she give it to me?").query
    assert not rewrite_rules([user("What is Docker?")], "Where do they live?").changed


def test_bare_question_gets_the_topic() -> None:
    history = [user("Tell me about binge drinking."), user("Can binge drinking damage mental health?")]
    assert rewrite_rules(history, "Are there any benefits?").query == "Are there any benefits of binge drinking?"
    assert not rewrite_rules(history, "Do you need milk for strong bones?").changed
    for message in ("Thanks!", "Why?", "OK, go on.", "Is there more?"):
        assert not rewrite_rules(history, message).changed, message

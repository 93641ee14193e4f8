"""memci_proxy.recall.push.proactive: what counts as a look-up phrase (a confidence signal of the push: no false
positives on the benchmark's chats), the words the pushed round searches for, and its shape (deterministic bytes)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.recall.push.proactive import (asks_about_reply, call_id, is_look_up, missing_terms, push_call,
                                               recall_round, search_words)

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "loadtests"))
from workloads import make_workload  # noqa: E402

LOOK_UPS = [
    "What did I tell you about my sister's wedding?", "Remind me what we decided for the logo.",
    "What was the name of the restaurant we picked?", "When did I start the new job?",
    "Do you remember my dog's name?", "Earlier I told you the code of my gym locker. What was it?",
    "Did I mention my flight number to you?", "what was it again, the wifi password?",
    "我之前跟你说过我妹妹的婚礼是哪天吗？", "提醒我一下我们定的餐厅", "你还记得我的狗叫什么吗？",
    "我们上次讨论的方案是什么？", "我什么时候开始新工作的？", "我之前告诉过你我健身房储物柜的密码，是什么来着？",
]
ORDINARY = [
    "What should I do before the interview?", "How do I cook rice?", "What did you mean by that?",
    "Can you tell me about Rome?", "What do you think about tea?", "Which one should I pick?",
    "Tell me a story about a lighthouse.", "Lately I've been procrastinating. What do you suggest I do?", "今天天气怎么样？", "给我三个关于数据库索引的想法。", "请帮我写一封邮件。",
]


@pytest.mark.parametrize("text", LOOK_UPS)
def test_look_ups_fire(text: str) -> None:
    assert is_look_up(text)


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_questions_do_not_fire(text: str) -> None:
    assert not is_look_up(text)


@pytest.mark.parametrize("kind", ["chat", "chat-zh"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_benchmark_chats_fire_on_their_probes_only(kind: str, seed: int) -> None:
    turns = make_workload(kind, seed=seed).turns
    fired = [t.probe is not None for t in turns if is_look_up(t.user)]
    assert fired and all(fired)  # no false positive
    assert len(fired) == sum(t.probe is not None for t in turns)  # every probe


def test_memorybank_dialogues_do_not_fire_and_its_probing_questions_mostly_do(monkeypatch) -> None:
    """MemoryBank (../shared/eval): 566 recorded user turns, 100 questions about earlier days."""
    try:
        from loadtests.evals.evaldata import load_memorybank
    except ImportError:
        pytest.skip("loadtests not importable")
    if not os.environ.get("MEMCI_EVAL_DIR") and Path("/work/shared/eval").is_dir():
        monkeypatch.setenv("MEMCI_EVAL_DIR", "/work/shared/eval")
    users = load_memorybank()
    if not users:
        pytest.skip("MemoryBank data absent")
    turns = [ex.query for u in users for ex in u.exchanges]
    probes = [q for u in users for q in u.probing_questions]
    assert [q for q in turns if is_look_up(q)] == []
    assert sum(map(is_look_up, probes)) >= 0.7 * len(probes)  # measured: 75 of 100


@given(st.text(max_size=400))
def test_any_text_is_answered_quickly_and_without_error(text: str) -> None:
    assert is_look_up(text) in (True, False)


def test_missing_terms_are_the_query_words_the_active_pages_never_mention() -> None:
    assert missing_terms("what is the locker code?", ["we talked about the gym code"]) == ["locker"]
    assert missing_terms("what is the locker code?", ["locker code 1234"]) == []


@given(st.text(min_size=1, max_size=60), st.text(max_size=200), st.integers(0, 10_000))
def test_the_round_is_a_recall_call_and_its_result_with_a_deterministic_id(query: str, result: str, after: int) -> None:
    call = push_call("recall", query, str(after))
    exchange = recall_round(call, result)
    again = recall_round(push_call("recall", query, str(after)), result)
    assert json.dumps(exchange) == json.dumps(again)
    assert exchange[0]["role"] == "assistant" and exchange[0]["content"] == ""
    (tc,) = exchange[0]["tool_calls"]
    assert tc["function"]["name"] == "recall" and json.loads(tc["function"]["arguments"]) == {"query": query}
    assert exchange[1] == {"role": "tool", "tool_call_id": tc["id"], "content": result}
    assert tc["id"].startswith("call_") and len(tc["id"]) == 29
    assert call_id(str(after + 1), query) != tc["id"]


def test_the_search_looks_for_the_words_the_message_is_about() -> None:
    assert search_words("Earlier I told you the code of my gym locker. What was it?") == "Earlier told code gym locker"
    assert search_words("What's my gym locker code?") == "gym locker code"
    assert search_words("我的健身房储物柜密码是多少？") == "我的健身房储物柜密码是多少"
    assert search_words("Flight ZX-1234, flight zx-1234!") == "Flight ZX-1234"
    assert search_words(" ".join(f"word{i}" for i in range(40))).count(" ") == 15
    assert search_words("what is it?") == ""


@given(st.text(max_size=300))
def test_search_words_are_words_of_the_text_with_search_terms(text: str) -> None:
    from memci_proxy.recall.lexical.text import tokenize

    for word in search_words(text).split():
        assert word in text and tokenize(word)


@pytest.mark.parametrize("text", ["How many eggs did you say we need for the omelette?",
                                  "Remind me of the two companies you mentioned.", "You recommended five bottles.",
                                  "What was your advice on the budget?", "你之前推荐的那本书叫什么？"])
def test_a_question_about_what_the_assistant_said(text: str) -> None:
    assert asks_about_reply(text)


@pytest.mark.parametrize("text", ["Can you tell me my gym locker code?", "Could you give me three ideas?",
                                  "I told you my code earlier, what was it?", "我告诉过你我的密码吗？", ""])
def test_a_request_or_a_question_about_the_users_own_words(text: str) -> None:
    assert not asks_about_reply(text)

"""Summary jobs on the cached prefix: the job's request is the conversation's pre-epoch prompt byte for byte plus one
instruction message; pages no kept prompt holds fall back to the plain summariser call; the idle delay."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from memci_proxy.workers.config import MemoryConfig
from memci_proxy.workers.prefix import (
    PROFILE_INSTRUCTION, SUMMARY_INSTRUCTION, SummaryBase, covers, is_job_body, job_body, page_instruction,
)
from memci_proxy.workers.queue import InProcessJobQueue
from memci_proxy.workers.runner import MemoryWorker
from memci_proxy.workers.summaries import PageText, answers, prefix_groups
from memci_proxy.workers.summarizer import PAGES_PROMPT

encode = msgspec.json.Encoder().encode

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}},
         {"type": "function", "function": {"name": "recall", "parameters": {"type": "object", "properties": {}}}}]


def page(number: int, text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{text} (page {number})"},
            {"role": "assistant", "content": f"Answer to {text} — ünïcode 中文 {number}"}]


def base_body(pages: list[list[dict[str, Any]]], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are terse.\n\n## Contents\n- #0 ..."}]
    for p in pages:
        messages.extend(p)
    messages.append({"role": "user", "content": "the newest question"})
    return {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 64, "stream": True,
            "stream_options": {"include_usage": True}, "cache_salt": "t-1", "chat_template_kwargs": {"x": 1},
            "n": 1, "tool_choice": "required", "response_format": {"type": "json_object"}, **extra}


def page_text(number: int, rows: list[dict[str, Any]], first_seq: int) -> PageText:
    return PageText(str(number), first_seq, first_seq + len(rows) - 1, len(rows), "\n".join(r["content"] for r in rows),
                    rows)


def test_the_job_is_the_base_byte_for_byte_plus_one_message() -> None:
    pages = [page(1, "How do I deploy"), page(2, "Which port")]
    base = base_body(pages)
    sent = encode(base)  # what the upstream received for the pre-epoch turn
    instruction = page_instruction(SUMMARY_INSTRUCTION, pages[0][0], pages[-1][-1])
    job = job_body(base, instruction, 300)
    received = json.loads(sent)
    # every message of the base, in order, to the byte; then exactly one more: the instruction, as a user message
    assert encode(job["messages"][:-1]) == encode(received["messages"])
    assert job["messages"][-1] == {"role": "user", "content": instruction}
    assert len(job["messages"]) == len(received["messages"]) + 1
    # what shapes the rendered prompt is kept as sent
    for key in ("model", "tools", "cache_salt", "chat_template_kwargs"):
        assert encode(job[key]) == encode(received[key]), key
    # what only shapes the answer is set for a summary: one whole answer, bounded, no forced tool call or format
    assert job["stream"] is False and job["max_tokens"] == 300 and job["temperature"] == 0
    assert "stream_options" not in job and "response_format" not in job and "n" not in job
    assert job["tool_choice"] == "auto"
    assert base["tool_choice"] == "required" and len(base["messages"]) == 6  # the kept base is not changed
    # the instruction names the pages by their first and last messages
    assert "How do I deploy (page 1)" in instruction and "Answer to Which port" in instruction
    assert is_job_body(job) and not is_job_body(received)


def test_a_tool_choice_that_does_not_force_a_call_is_kept() -> None:
    for choice in ("auto", "none"):
        assert job_body(base_body([], tool_choice=choice), "x", 10)["tool_choice"] == choice
    assert "tool_choice" not in job_body({k: v for k, v in base_body([]).items() if k != "tool_choice"}, "x", 10)


def test_a_base_covers_the_pages_it_still_holds() -> None:
    one, two, three = page(1, "alpha"), page(2, "beta"), page(3, "gamma")
    messages = base_body([one, two])["messages"]
    assert covers(messages, one) and covers(messages, two)
    assert not covers(messages, three)
    assert not covers(messages, [two[1], one[0]])  # out of order: not this page
    assert not covers(messages, [])


def test_pages_are_grouped_by_the_newest_base_holding_them() -> None:
    p = [page(i, f"topic {i}") for i in range(5)]
    older = SummaryBase(base_body([p[0], p[1], p[2]]), "http://w1/v1", 1.0)
    newer = SummaryBase(base_body([p[2], p[3]]), "http://w1/v1", 2.0)
    texts = [page_text(i, rows, 2 * i) for i, rows in enumerate(p)]
    groups = prefix_groups(texts, [older, newer])
    assert [(g[0], [t.number for t in g[1]]) for g in groups] == [
        (older, ["0", "1"]), (newer, ["2", "3"]), (None, ["4"])]
    assert prefix_groups(texts, []) == [(None, texts)]


class FakeSummarizer:
    def __init__(self, prefix: bool = True) -> None:
        self.plain: list[tuple[str, str]] = []
        self.prefixed: list[tuple[dict[str, Any], str]] = []
        if prefix:
            self.complete_after = self._complete_after

    async def complete(self, instruction: str, text: str, max_tokens: int) -> str:
        self.plain.append((instruction, text))
        return "plain summary"

    async def _complete_after(self, body: dict[str, Any], base_url: str, auth: str = "") -> str:
        self.prefixed.append((body, base_url))
        return "prefix summary"


async def test_answers_use_the_base_and_fall_back_for_what_it_does_not_hold() -> None:
    p = [page(i, f"topic {i}") for i in range(3)]
    base = SummaryBase(base_body([p[0], p[1]]), "http://worker-2/v1", 1.0)
    texts = [page_text(i, rows, 2 * i) for i, rows in enumerate(p)]
    summarizer, calls = FakeSummarizer(), []
    out = [(list(t.number for t in g), a) async for g, a in
           answers(summarizer, texts, [base], SUMMARY_INSTRUCTION, PAGES_PROMPT, 100, 8000, calls.append)]
    assert out == [(["0", "1"], "prefix summary"), (["2"], "plain summary")]
    assert calls == ["prefix", "plain"]
    body, url = summarizer.prefixed[0]
    assert url == "http://worker-2/v1"
    assert encode(body["messages"][:-1]) == encode(base.body["messages"])
    assert "topic 0 (page 0)" in body["messages"][-1]["content"]
    assert "topic 2" in summarizer.plain[0][1] and summarizer.plain[0][0] == PAGES_PROMPT


async def test_a_job_answered_with_a_tool_call_is_asked_again_without_the_conversations_tools() -> None:
    from memci_proxy.workers.summarizer import AnsweredWithToolCall

    class Tempted(FakeSummarizer):
        async def _complete_after(self, body: dict[str, Any], base_url: str, auth: str = "") -> str:
            self.prefixed.append((body, base_url))
            raise AnsweredWithToolCall("summariser answered with a tool call")

    p = [page(i, f"topic {i}") for i in range(2)]
    base = SummaryBase(base_body(p), "http://worker-2/v1", 1.0, auth="Bearer sk-client")
    summarizer, calls = Tempted(), []
    out = [(list(t.number for t in g), a) async for g, a in
           answers(summarizer, [page_text(i, rows, 2 * i) for i, rows in enumerate(p)], [base], SUMMARY_INSTRUCTION,
                   PAGES_PROMPT, 100, 8000, calls.append)]
    assert out == [(["0", "1"], "plain summary")] and calls == ["prefix", "plain"]  # now, not ten minutes later


async def test_a_summariser_without_prefix_calls_gets_plain_jobs() -> None:
    p = [page(0, "topic")]
    summarizer = FakeSummarizer(prefix=False)
    out = [a async for _, a in answers(summarizer, [page_text(0, p[0], 0)],
                                        [SummaryBase(base_body(p), "", 1.0)], PROFILE_INSTRUCTION, PAGES_PROMPT, 50,
                                        8000)]
    assert out == ["plain summary"] and len(summarizer.plain) == 1


# --- when the jobs run ---------------------------------------------------------------------------------------------
def worker(idle_s: float) -> MemoryWorker:
    return MemoryWorker(None, FakeSummarizer(), InProcessJobQueue(), MemoryConfig(idle_s=idle_s))


async def test_without_an_idle_delay_jobs_are_queued_right_after_the_epoch() -> None:
    w = worker(0)
    await w.notify("t", "c")
    assert w.queue.pending() == 3


async def test_with_an_idle_delay_jobs_wait_for_a_quiet_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    import memci_proxy.workers.runner as runner

    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    w = worker(30)
    await w.notify("t", "c")
    assert w.queue.pending() == 0
    clock[0] += 20
    w.touch("t", "c")  # a turn: the conversation is not idle
    assert await w.run_idle(clock[0] + 29) == 0
    assert await w.run_idle(clock[0] + 30) == 1
    assert w.queue.pending() == 3
    assert await w.run_idle(clock[0] + 1000) == 0  # queued once
    w.touch("t", "other")  # touching a conversation with nothing waiting does nothing
    assert await w.run_idle(clock[0] + 1000) == 0


async def test_a_second_epoch_runs_the_waiting_jobs_at_once() -> None:
    w = worker(30)
    await w.notify("t", "c")
    assert w.queue.pending() == 0
    await w.notify("t", "c")
    assert w.queue.pending() == 3 and await w.run_idle(float("inf")) == 0


def test_bases_are_kept_per_conversation_newest_last_and_forgotten() -> None:
    w = worker(0)
    bases = [SummaryBase({"messages": [{"role": "user", "content": str(i)}]}, "", float(i), 100) for i in range(3)]
    for b in bases:
        w.keep_base("t", "c", b)
    assert w.bases("t", "c") == (bases[1], bases[2])
    assert w.bases("other", "c") == ()
    w.forget("t", "c")
    assert w.bases("t", "c") == ()


def test_a_separate_summariser_gets_no_kept_prompts() -> None:
    class Settings:
        summary_model_url = "http://summariser:8000/v1"

    assert MemoryConfig.from_settings(Settings()).prefix_jobs is False
    assert MemoryConfig.from_settings(object()).prefix_jobs is True
    w = MemoryWorker(None, FakeSummarizer(), InProcessJobQueue(), MemoryConfig.from_settings(Settings()))
    w.keep_base("t", "c", SummaryBase({"messages": []}, "", 1.0, 10))
    assert w.bases("t", "c") == ()


def test_a_base_holding_a_tool_result_as_a_preview_still_covers_its_page() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]}
    full = {"role": "tool", "tool_call_id": "c1", "content": "line\n" * 5000}
    preview = {"role": "tool", "tool_call_id": "c1", "content": "[Tool output stored in full as page 2 ...]\nline"}
    user = {"role": "user", "content": "run it"}
    assert covers([{"role": "system", "content": "s"}, user, call, preview], [user, call, full])
    other = {"role": "tool", "tool_call_id": "c9", "content": "line\n" * 5000}
    assert not covers([user, call, preview], [user, call, other])


def test_a_page_archived_right_after_its_turn_is_summarised_on_the_base_and_its_answer() -> None:
    # the base is the prompt of the turn that opened page 2 (it ends with that user message); the epoch of the next
    # turn archived page 2 whole, the answer included: the job sends the base, then that answer, then the instruction
    one = page(1, "alpha")
    two = page(2, "beta")
    messages = [{"role": "system", "content": "You are terse."}, *one, two[0]]
    base = SummaryBase({"model": "m", "messages": messages}, "http://w1/v1", 1.0)
    assert base.holds(one) and base.answer_after(one) is None  # held as it is
    assert base.holds(two) and base.answer_after(two) == two[1]
    instruction = page_instruction(SUMMARY_INSTRUCTION, two[0], two[1])
    job = job_body(base.body, instruction, 100, base.answer_after(two))
    assert encode(job["messages"][:len(messages)]) == encode(messages)  # the base to the byte
    assert job["messages"][len(messages):] == [{"role": "assistant", "content": two[1]["content"]},
                                               {"role": "user", "content": instruction}]
    # not when the page's user message is not the base's last one, nor when the page ends with a user message
    assert not base.holds(page(3, "gamma"))
    stale = SummaryBase({"model": "m", "messages": [*messages, {"role": "user", "content": "later"}]}, "", 1.0)
    assert not stale.holds(two) and stale.answer_after(two) is None
    assert base.answer_after([two[0]]) is None and base.answer_after([*one, two[0]]) is None


def test_a_replica_that_kept_the_prompt_of_the_turn_before_sends_the_same_instruction_about_the_same_pages() -> None:
    # turns alternating between two replicas: the one planning the epoch kept the prompt of two turns back; the
    # archived page goes on past it (that turn's answer, the last turn's question and answer): one job on that base
    # and those messages, the instruction one proxy (which kept the last prompt) sends
    one = page(1, "alpha")
    two = [*page(2, "beta"), *page(2, "beta again")]
    system = {"role": "system", "content": "You are terse."}
    older = SummaryBase({"model": "m", "messages": [system, *one, two[0]]}, "", 1.0)
    newer = SummaryBase({"model": "m", "messages": [system, *one, *two[:3]]}, "", 2.0)
    assert older.holds(two) and newer.holds(two)
    assert older.continuation(two) == two[1:] and older.answer_after(two) is None
    assert newer.continuation(two) == [two[3]] and newer.answer_after(two) == two[3]
    instruction = page_instruction(SUMMARY_INSTRUCTION, two[0], two[-1])
    from_older = job_body(older.body, instruction, 100, older.continuation(two))
    from_newer = job_body(newer.body, instruction, 100, newer.continuation(two))
    assert from_older["messages"] == from_newer["messages"]  # the same conversation, the same instruction
    # not past a tool call, an image or a message the base already holds further up
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
    assert older.continuation([*two[:2], call, {"role": "tool", "tool_call_id": "c", "content": "x"},
                               two[3]]) is None


def test_a_page_whose_first_message_carries_the_memory_block_is_held_by_the_prompt() -> None:
    from memci_proxy.engine.layout import memory_block, with_blocks
    from memci_proxy.workers.prefix import covers

    page = [{"role": "user", "content": "what about <b>billing</b>?"}, {"role": "assistant", "content": "Soon."}]
    lead = memory_block("", "They talked.", "## Contents of archived pages\n[Page 1] ...")
    prompt = [{"role": "system", "content": "Be brief."}, with_blocks(page[0], lead, ""), page[1]]
    assert covers(prompt, page)
    listed = [{**page[0], "content": [{"type": "text", "text": "what about billing?"}]}, page[1]]
    assert covers([prompt[0], with_blocks(listed[0], lead, ""), page[1]], listed)


def test_pages_past_a_base_kept_two_turns_back_join_its_group() -> None:
    # the replica planning the epoch kept the prompt of the turn before the last one (ending with page 2's question);
    # pages 2 and 3 (the last turn) go on past it: one group, one call, as one proxy would make on the last prompt
    one, two, three = page(1, "alpha"), page(2, "beta"), page(3, "gamma")
    system = {"role": "system", "content": "You are terse."}
    older = SummaryBase({"model": "m", "messages": [system, *one, two[0]]}, "", 1.0)
    newer = SummaryBase({"model": "m", "messages": [system, *one, *two, three[0]]}, "", 2.0)
    texts = [page_text(1, one, 0), page_text(2, two, 2), page_text(3, three, 4)]
    assert [(b, [p.number for p in g]) for b, g in prefix_groups(texts, [older])] == [(older, ["1", "2", "3"])]
    assert [(b, [p.number for p in g]) for b, g in prefix_groups(texts, [newer])] == [(newer, ["1", "2", "3"])]
    assert older.continuation([*one, *two, *three]) == [two[1], *three]
    assert newer.continuation([*one, *two, *three]) == [three[1]]
    # never more than the turn after the base's: a base kept epochs ago holds no page past it
    four = page(4, "delta")
    assert older.continuation([*one, *two, *three, *four]) is None
    groups = prefix_groups([*texts, page_text(4, four, 6)], [older])
    assert [(b, [p.number for p in g]) for b, g in groups] == [(older, ["1", "2", "3"]), (None, ["4"])]

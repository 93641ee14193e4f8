"""The memory-across-conversations benchmark's pure parts: the requests built from a session, the reach and leak
checks, and the counting of a run against fake proxies (one that remembers per user, one that mixes users up)."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

import pytest

from loadtests.evals.eval_across import (CLOSING, NOBODY, Run, leaked, others, question_messages, reach, sent_text,
                                         session_messages, user_of)
from loadtests.evals.eval_push import prompt_text
from loadtests.evals.evaldata import load_longmemeval_s

FACT = ("My cat is called Biscuit and she is a ginger tabby I adopted from the shelter on Elm Street three years ago, "
        "she loves sleeping on the radiator and hates the vacuum cleaner more than anything else in the world, so I "
        "run it only when she is out in the garden chasing the neighbour's pigeons.")


def write_s_file(path: Path, questions: int = 2) -> Path:
    """A tiny S file: per question, three dated sessions (out of date order), the second its evidence."""
    sessions, records = {}, []
    for q in range(questions):
        ids = [f"filler_{q}_a", f"answer_{q}", f"filler_{q}_b"]
        sessions[ids[0]] = [{"role": "user", "content": f"Can you suggest a recipe with lentils? (user {q})"},
                            {"role": "assistant", "content": "Try a lentil soup with cumin and lemon."}]
        sessions[ids[1]] = [{"role": "user", "content": f"{FACT} Her vet is Dr {q}{q}{q}.", "has_answer": True},
                            {"role": "assistant", "content": "Biscuit sounds lovely!"}]
        sessions[ids[2]] = [{"role": "assistant", "content": "Hello again, how can I help?"},
                            {"role": "user", "content": f"What is the capital of Portugal? ({q})"}]
        records.append({"question_id": f"q{q}", "question_type": "single-session-user",
                        "question": f"Who is my cat's vet? ({q})", "answer": f"Dr {q}{q}{q}",
                        "question_date": "2023/06/01 (Thu) 10:00", "answer_session_ids": [f"answer_{q}"],
                        "haystack_session_ids": [ids[1], ids[0], ids[2]],
                        "haystack_dates": ["2023/05/20 (Sat) 09:00", "2023/05/19 (Fri) 08:00",
                                           "2023/05/21 (Sun) 12:30"]})
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        json.dump({"format": "test", "sessions": sessions, "questions": records}, handle)
    return path


@pytest.fixture
def haystacks(tmp_path):
    return load_longmemeval_s(write_s_file(tmp_path / "s.json.gz"))


def test_the_loader_reads_each_question_s_sessions_in_date_order_with_its_evidence(haystacks, tmp_path) -> None:
    assert len(haystacks) == 2
    first = haystacks[0]
    assert [s.id for s in first.sessions] == ["filler_0_a", "answer_0", "filler_0_b"]
    assert [s.date for s in first.sessions][0] == "2023/05/19 (Fri) 08:00"
    assert [s.id for s in first.question.sessions] == ["answer_0"]
    assert first.evidence() == [f"{FACT} Her vet is Dr 000."]
    assert "has_answer" not in first.sessions[1].messages[0]
    assert load_longmemeval_s(tmp_path / "absent.json.gz") is None


def test_a_session_is_one_request_opened_by_its_date_and_closed_by_the_user(haystacks) -> None:
    ends_with_assistant, ends_with_user = haystacks[0].sessions[0], haystacks[0].sessions[2]
    messages = session_messages(ends_with_assistant)
    assert messages[0] == {"role": "system", "content": "Today is 2023/05/19 (Fri) 08:00."}
    assert messages[1:3] == [dict(m) for m in ends_with_assistant.messages]
    assert messages[3] == {"role": "user", "content": CLOSING}
    messages = session_messages(ends_with_user)
    assert messages[1:] == [dict(m) for m in ends_with_user.messages]  # nothing added after the user's message
    assert question_messages(haystacks[0].question) == [
        {"role": "system", "content": "Today is 2023/06/01 (Thu) 10:00."},
        {"role": "user", "content": "Who is my cat's vet? (0)"}]
    assert user_of(haystacks[0].question) != user_of(haystacks[1].question) != NOBODY


def test_reach_reads_whole_messages_and_excerpts_of_long_ones() -> None:
    whole = prompt_text([{"role": "user", "content": "x"}, {"role": "tool", "content": f"[Page 3] {FACT}"}])
    assert reach([FACT], whole) == (True, True)
    excerpt = prompt_text([{"role": "tool", "content": "[Page 3] ..." + FACT[60:-10] + "..."}])
    assert reach(["unrelated words", FACT], excerpt) == (True, False)
    assert reach([FACT], prompt_text([{"role": "user", "content": FACT[:100]}])) == (False, False)
    assert reach([], whole) == (False, False)


def test_only_what_the_other_user_never_sent_leaks(haystacks) -> None:
    evidence = haystacks[0].evidence()  # FACT and "Her vet is Dr 000."; the other user said FACT too
    own = sent_text(haystacks[1].sessions)
    assert not leaked(evidence, prompt_text([{"role": "user", "content": FACT}]), own)
    assert leaked(evidence, prompt_text([{"role": "tool", "content": evidence[0]}]), own)
    assert leaked(evidence, prompt_text([{"role": "tool", "content": FACT}]), "")
    assert not leaked(evidence, prompt_text([{"role": "tool", "content": "Her vet is Dr 000."}]), "")


def test_each_question_is_asked_again_by_the_previous_question_s_user() -> None:
    assert others(1) == [None]
    assert others(3) == [2, 0, 1]


class FakeUpstream:
    is_emulator = False  # settle() has nothing to wait for


class FakeProxy:
    """Answers like the client's Client.turn: each request a new conversation whose upstream prompt is the user's
    earlier messages (``shared``: everyone's) followed by the request's own; ``same_cid``: every request one id."""

    def __init__(self, remembers: bool, shared: bool = False, same_cid: bool = False) -> None:
        self.remembers, self.shared, self.same_cid = remembers, shared, same_cid
        self.upstream = FakeUpstream()
        self.memory: dict[str, list[dict]] = {}
        self.calls = 0

    def turn(self, messages, stream, extra):
        self.calls += 1
        user = "everyone" if self.shared else extra["user"]
        past = self.memory.setdefault(user, [])
        sent = [*(past if self.remembers else []), *messages]
        past.extend(messages)
        return "c" if self.same_cid else uuid.uuid4().hex, sent, {}


def run_all(proxy: FakeProxy, haystacks) -> Run:
    run = Run(proxy, verbose=False, settle_s=0)
    for haystack in haystacks:
        run.haystack(haystack, stream=False)
    for haystack, other in zip(haystacks, others(len(haystacks))):
        run.cross(haystack, None if other is None else haystacks[other])
    return run


def test_a_proxy_that_remembers_each_user_apart_reaches_everything_and_leaks_nothing(haystacks) -> None:
    run = run_all(FakeProxy(remembers=True), haystacks)
    tally = run.tally
    assert (tally.questions, tally.reached, tally.whole, tally.skipped) == (2, 2, 2, 0)
    assert dict(tally.by_kind) == {"single-session-user": [2, 2, 2]}
    assert (tally.cross_asked, tally.leaks, tally.merged) == (2, 0, 0)
    assert tally.requests == run.client.calls == 2 * (3 + 1) + 2
    assert tally.as_json()["by_kind"] == {"single-session-user": {"reached": 2, "whole": 2, "questions": 2}}


def test_a_proxy_that_mixes_users_up_leaks_and_one_that_forgets_reaches_nothing(haystacks) -> None:
    leaky = run_all(FakeProxy(remembers=True, shared=True), haystacks).tally
    assert (leaky.leaks, leaky.leaked) == (2, ["q0", "q1"])
    forgetful = run_all(FakeProxy(remembers=False), haystacks).tally
    assert (forgetful.reached, forgetful.whole, forgetful.leaks) == (0, 0, 0)
    merging = run_all(FakeProxy(remembers=False, same_cid=True), haystacks).tally
    assert merging.merged == merging.requests - 1


def test_a_question_without_evidence_is_left_out(haystacks) -> None:
    bare = haystacks[0].__class__(haystacks[0].question.__class__(
        "q9", "temporal-reasoning", "When?", "never", "2023/06/01 (Thu) 10:00", ()), haystacks[0].sessions)
    run = run_all(FakeProxy(remembers=True), [bare])
    assert (run.tally.questions, run.tally.skipped, run.tally.cross_asked) == (0, 1, 0)
    assert run.tally.requests == 3 + 1 + 1  # asked again by a user who sent nothing

"""Summaries by the model (the emulator), re-compression, back-off with an injected clock, topics, profile,
deletion of every memory row with the conversation."""

from __future__ import annotations

import datetime as dt

import pytest

from memci_proxy.store.sql.repository import SqlConversationRepository
from memci_proxy.workers.backoff import BACKLOG_EVENT
from memci_proxy.workers.config import MemoryConfig
from memci_proxy.workers.queue import PROFILE_JOB, SUMMARY_JOB, InProcessJobQueue, Job
from memci_proxy.workers.summarizer import ModelSummarizer
from memci_proxy.workers.runner import MemoryWorker
from memci_proxy.workers.text import estimate_tokens
from tests.integration.workers.conftest import TENANT, History, rows_of

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
PAGES = [
    ("How do I configure PostgreSQL replication for the billing database?", "Use streaming replication."),
    ("Which port does the billing PostgreSQL listen on?", "Port 5433 on the primary."),
]


@pytest.fixture
async def worker(repo: SqlConversationRepository, emulator_url: str):
    summarizer = ModelSummarizer(emulator_url, model="emu-summariser", timeout_s=10)
    w = MemoryWorker(repo, summarizer, InProcessJobQueue(), MemoryConfig(max_summary_tokens=1000, cache_ttl_s=0),
                     clock=lambda: T0)
    yield w
    await summarizer.aclose()


async def test_summary_is_made_by_the_model_and_served(repo: SqlConversationRepository, worker: MemoryWorker) -> None:
    history = await History(repo, "c1").create()
    await history.add_pages(PAGES)
    assert await worker.latest_summary(TENANT, "c1") == ""  # nothing yet: the contents lines serve

    await worker.notify(TENANT, "c1")
    assert worker.queue.pending() == 3  # summary, profile, archival by age
    await worker.queue.drain(worker.handle)

    row = await repo.get_summary(TENANT, "c1", "conversation")
    assert row is not None and row.status == "done" and row.text
    assert row.last_seq == 3 and row.message_count == 4 and row.attempts == 0
    assert await worker.latest_summary(TENANT, "c1") == row.text
    assert await worker.latest_summary("tenant-b", "c1") == ""  # scoped by tenant

    topics = await repo.load_topics(TENANT, "c1")
    assert "postgresql" in topics["1"] and "billing" in topics[""]
    assert await repo.load_topics(TENANT, "c1", [""]) == {"": topics[""]}
    assert ("c1", "") in await repo.find_by_topic(TENANT, "billing")
    assert await repo.find_by_topic("tenant-b", "billing") == []

    # Nothing new archived: nothing to do, the summary stays.
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c1")) == "nothing"


async def test_an_epoch_queues_the_archival_by_age_once_a_day_without_a_limit_and_every_time_with_one(
    repo: SqlConversationRepository, emulator_url: str
) -> None:
    """The messages an epoch stores are today's (verbatim): the plan by age changes with the day only, and its
    queries read the whole history; a history limit changes with every message."""
    today = [T0]
    summarizer = ModelSummarizer(emulator_url, model="emu-summariser", timeout_s=10)
    try:
        for config, expected in ((MemoryConfig(cache_ttl_s=0), [3, 2, 3]),
                                 (MemoryConfig(cache_ttl_s=0, history_soft_limit=1000), [3, 3, 3])):
            today[0] = T0
            w = MemoryWorker(repo, summarizer, InProcessJobQueue(), config, clock=lambda: today[0])
            queued = []

            async def skip(job: Job) -> None:
                return None

            for day in (T0, T0 + dt.timedelta(hours=3), T0 + dt.timedelta(days=1)):
                today[0] = day
                await w.notify(TENANT, "c-age")
                queued.append(w.queue.pending())
                await w.queue.drain(skip)
            assert queued == expected, config
            w.forget(TENANT, "c-age")  # forgotten: queued again on its next epoch
            await w.notify(TENANT, "c-age")
            assert w.queue.pending() == 3
    finally:
        await summarizer.aclose()


async def test_the_summary_and_profile_jobs_of_an_epoch_read_its_pages_once(
    repo: SqlConversationRepository, worker: MemoryWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = await History(repo, "c-read", end_user="uRead").create()
    await history.add_pages([("[[say:- The user is called Read]] hello", "hi"), *PAGES])
    reads = []
    load_pages = repo.load_pages

    async def counted(*args, **kwargs):
        reads.append(kwargs.get("after_seq"))
        return await load_pages(*args, **kwargs)

    monkeypatch.setattr(repo, "load_pages", counted)
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c-read")) == "done"
    assert await worker.handle(Job(PROFILE_JOB, TENANT, "c-read")) == "done"
    assert reads == [-1]  # the profile job took the summary job's read
    assert await worker.latest_profile(TENANT, "c-new", "uRead") == "- The user is called Read"
    # a page archived later: both jobs take it in (the summary job reads it; the profile job takes that read)
    await history.add_pages([("[[say:- The user lives in Lyon]] and backups?", "nightly")])
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c-read")) == "done"
    assert await worker.handle(Job(PROFILE_JOB, TENANT, "c-read")) == "done"
    assert len(reads) == 2
    assert "Lyon" in await worker.latest_profile(TENANT, "c-new", "uRead")
    assert (await repo.get_summary(TENANT, "c-read", "profile")).last_seq == \
        (await repo.get_summary(TENANT, "c-read", "conversation")).last_seq
    # an epoch between the two jobs: the second reads for itself (the first one's read may lack the epoch's pages)
    await history.add_pages([("[[say:- The user likes tea]] tea?", "yes")])
    assert await worker.handle(Job(PROFILE_JOB, TENANT, "c-read")) == "done"
    await history.add_pages([("[[say:- The user likes jazz]] music?", "yes")])
    await worker.notify(TENANT, "c-read")
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c-read")) == "done"
    assert len(reads) == 4
    assert (await repo.get_summary(TENANT, "c-read", "conversation")).last_seq == history.entries[-1].seq
    worker.forget(TENANT, "c-read")  # deleted: nothing of it stays in the worker's memory
    assert not worker.page_reads.held(TENANT, "c-read")


async def test_only_archived_pages_are_summarised(repo: SqlConversationRepository, worker: MemoryWorker) -> None:
    history = await History(repo, "c1").create()
    await history.add_pages(PAGES, state="active")
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c1")) == "nothing"
    await history.set_state(["1"], "archived")
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c1")) == "done"
    row = await repo.get_summary(TENANT, "c1", "conversation")
    assert row.last_seq == 1 and row.message_count == 2


async def test_summary_is_recompressed_when_over_its_budget(repo: SqlConversationRepository, emulator_url: str) -> None:
    summarizer = ModelSummarizer(emulator_url, model="emu-summariser", timeout_s=10)
    worker = MemoryWorker(repo, summarizer, InProcessJobQueue(),
                          MemoryConfig(max_summary_tokens=120, batch_chars=200, cache_ttl_s=0), clock=lambda: T0)
    try:
        history = await History(repo, "c2").create()
        for i in range(6):
            await history.add_pages([(f"Question {i} about the deployment of service {i} [[len:40]]", "ok")])
            assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c2")) == "done"
        row = await repo.get_summary(TENANT, "c2", "conversation")
        assert row.compressions >= 1
        assert estimate_tokens(row.text) <= 120 and row.tokens <= 120
        assert row.message_count == 12 and row.last_seq == 11
    finally:
        await summarizer.aclose()


async def test_failures_back_off_then_backlog(repo: SqlConversationRepository, worker: MemoryWorker) -> None:
    history = await History(repo, "c3").create()
    await history.add_pages([("Tell me about the outage [[status:500]]", "It was the disk.")])

    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c3"), T0) == "failed"
    row = await repo.get_summary(TENANT, "c3", "conversation")
    assert row.attempts == 1 and row.next_attempt_at == T0 + dt.timedelta(minutes=10)
    assert row.status == "pending" and await worker.latest_summary(TENANT, "c3") == ""

    # Before the retry time nothing runs; the queue nudging it early changes nothing.
    assert await worker.run_due(T0 + dt.timedelta(minutes=9)) == 0
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c3"), T0 + dt.timedelta(minutes=9)) == "backing_off"

    now = T0 + dt.timedelta(minutes=10)
    expected = [dt.timedelta(minutes=30), dt.timedelta(hours=2), dt.timedelta(hours=6), dt.timedelta(hours=12),
                dt.timedelta(hours=12)]
    for attempt, step in enumerate(expected, start=2):
        assert await worker.run_due(now) == 1
        row = await repo.get_summary(TENANT, "c3", "conversation")
        assert row.attempts == attempt and row.next_attempt_at == now + step
        backlog = await repo.load_events(TENANT, "c3", kinds=(BACKLOG_EVENT,))
        assert len(backlog) == (1 if attempt >= 5 else 0)
        now = row.next_attempt_at
    assert backlog[0].payload["attempts"] == 5 and "500" in backlog[0].payload["error"]


async def test_recovers_after_a_failure(repo: SqlConversationRepository, worker: MemoryWorker) -> None:
    history = await History(repo, "c4").create()
    await history.add_pages([("First question [[status:503]]", "answer")])
    assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c4"), T0) == "failed"
    # The page that made the summariser fail is rewritten (an edited history); the retry then succeeds.
    async with repo.engine.begin() as connection:
        from sqlalchemy import text

        await connection.execute(text(
            "UPDATE entries SET message = '{\"role\": \"user\", \"content\": \"First question\"}'::jsonb "
            "WHERE conversation_id = 'c4' AND seq = 0"))
    assert await worker.run_due(T0 + dt.timedelta(minutes=10)) == 1
    row = await repo.get_summary(TENANT, "c4", "conversation")
    assert row.status == "done" and row.attempts == 0 and row.next_attempt_at is None and row.text


async def test_profile_facts_from_archived_pages(repo: SqlConversationRepository, worker: MemoryWorker) -> None:
    history = await History(repo, "c5", end_user="uAda").create()
    await history.add_pages([("[[say:- The user is called Ada]] hello", "hi Ada")])
    assert await worker.handle(Job(PROFILE_JOB, TENANT, "c5")) == "done"
    other = await History(repo, "c6", end_user="uAda").create()
    await other.add_pages([("[[say:- The user is called Ada]] again", "hi")])
    assert await worker.handle(Job(PROFILE_JOB, TENANT, "c6")) == "done"
    # the end user's profile, from all of their conversations: once, though learnt twice
    assert await worker.latest_profile(TENANT, "c-new", "uAda") == "- The user is called Ada"
    assert await worker.latest_profile(TENANT, "c-new", "uBob") == ""  # another user of the same app
    assert await worker.latest_profile("tenant-b", "c-new", "uAda") == ""
    assert await worker.handle(Job(PROFILE_JOB, TENANT, "c5")) == "nothing"


async def test_without_a_user_id_the_profile_stays_in_its_conversation(
    repo: SqlConversationRepository, worker: MemoryWorker
) -> None:
    alice = await History(repo, "c8").create()
    await alice.add_pages([("[[say:- My address is 12 Quokka Lane]] hello", "hi")])
    assert await worker.handle(Job(PROFILE_JOB, TENANT, "c8")) == "done"
    bob = await History(repo, "c9").create()
    await bob.add_pages([("hello", "hi")])
    assert await worker.latest_profile(TENANT, "c8") == "- My address is 12 Quokka Lane"
    assert await worker.latest_profile(TENANT, "c9") == ""  # the same app (tenant), another conversation
    assert await worker.latest_profile(TENANT, "c9", "uBob") == ""


async def test_deleting_the_conversation_removes_its_memory_rows(
    repo: SqlConversationRepository, worker: MemoryWorker
) -> None:
    history = await History(repo, "c7").create()
    await history.add_pages([("[[say:- Works on the billing service]] PostgreSQL question", "answer")])
    await worker.notify(TENANT, "c7")
    await worker.queue.drain(worker.handle)
    for table in ("memory_summaries", "memory_topics", "memory_profile_facts"):
        assert await rows_of(repo, table, "c7"), table
    assert await repo.delete_conversation(TENANT, "c7")
    for table in ("memory_summaries", "memory_topics", "memory_profile_facts"):
        assert await rows_of(repo, table, "c7") == [], table
    worker.forget(TENANT, "c7")
    assert await worker.latest_profile(TENANT, "c7") == ""


def _base_prompt(pages: list[tuple[str, str]]) -> dict:
    messages = [{"role": "system", "content": "You are the billing team's assistant. " * 100}]
    for user, answer in pages:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": "And what about the backups?"})
    return {"model": "emu-summariser", "messages": messages, "max_tokens": 16}


async def test_summary_on_the_kept_prompt_is_cached_and_a_failure_is_retried_plain(
    repo: SqlConversationRepository, emulator_url: str
) -> None:
    import httpx

    from memci_proxy.metrics import Metrics
    from memci_proxy.workers.prefix import JOB_MARKER, SummaryBase

    metrics = Metrics()
    summarizer = ModelSummarizer(emulator_url, model="emu-summariser", timeout_s=10,
                                 on_usage=metrics.observe_job_usage)
    worker = MemoryWorker(repo, summarizer, InProcessJobQueue(), MemoryConfig(cache_ttl_s=0), clock=lambda: T0,
                          metrics=metrics)
    root = emulator_url.removesuffix("/v1")
    try:
        history = await History(repo, "c7").create()
        await history.add_pages(PAGES)
        base = _base_prompt(PAGES)
        async with httpx.AsyncClient() as http:  # the turn before the epoch: the upstream caches its prompt
            assert (await http.post(emulator_url + "/chat/completions", json=base)).status_code == 200
            worker.keep_base(TENANT, "c7", SummaryBase(base, emulator_url, 0.0))
            assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c7")) == "done"
            assert await worker.handle(Job(PROFILE_JOB, TENANT, "c7")) == "done"
            jobs = (await http.get(root + "/emulator/requests", params={"n": 2})).json()["data"]
        assert worker.calls == {"prefix": 2}
        assert metrics.registry.get_sample_value("memci_summary_calls_total", {"kind": "prefix"}) == 2
        for job in jobs:
            assert job["body"]["messages"][:-1] == base["messages"]
            assert job["body"]["messages"][-1]["content"].startswith(JOB_MARKER)
            assert job["cached_tokens"] >= 0.8 * job["prompt_tokens"]
            assert job["prompt_tokens"] - job["cached_tokens"] < 200  # the instruction and the template around it
        # the jobs' own token counts, apart from the turns'
        sample = metrics.registry.get_sample_value
        assert sample("memci_memory_job_prompt_tokens_total") == sum(job["prompt_tokens"] for job in jobs)
        assert sample("memci_memory_job_cached_tokens_total") == sum(job["cached_tokens"] for job in jobs)
        assert sample("memci_upstream_prompt_tokens_total") == 0
        row = await repo.get_summary(TENANT, "c7", "conversation")
        assert row.status == "done" and row.last_seq == 3 and row.text

        # The upstream fails the prefix call: the attempt is recorded; the retry (the kept prompt gone, as after a
        # restart) summarises the same pages with a plain call.
        other = await History(repo, "c8").create()
        await other.add_pages(PAGES)
        worker.keep_base(TENANT, "c8", SummaryBase(_base_prompt(PAGES), "http://127.0.0.1:9/v1", 0.0))
        assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c8"), T0) == "failed"
        assert (await repo.get_summary(TENANT, "c8", "conversation")).attempts == 1
        worker.forget(TENANT, "c8")
        assert await worker.run_due(T0 + dt.timedelta(minutes=10)) == 1
        row = await repo.get_summary(TENANT, "c8", "conversation")
        assert row.status == "done" and row.attempts == 0 and row.last_seq == 3
        assert worker.calls == {"prefix": 3, "plain": 1}
    finally:
        await summarizer.aclose()


async def test_a_kept_prompt_too_long_for_the_window_is_summarised_plain_at_once(
    repo: SqlConversationRepository, emulator_url: str
) -> None:
    """A conversation whose prompt nearly fills the window (an agent's fixed part on a small window): the prefix job,
    that prompt plus the instruction and the summary's answer, is refused as too long. The same job is asked plain
    at once, not failed and retried ten minutes later on the same prompt."""
    from memci_proxy.workers.prefix import SummaryBase

    summarizer = ModelSummarizer(emulator_url, model="emu-summariser", timeout_s=10)
    worker = MemoryWorker(repo, summarizer, InProcessJobQueue(), MemoryConfig(cache_ttl_s=0), clock=lambda: T0)
    try:
        history = await History(repo, "c9").create()
        await history.add_pages(PAGES)
        base = _base_prompt(PAGES)
        base["messages"][0]["content"] = "You are the billing team's assistant. " * 40_000  # past any window
        worker.keep_base(TENANT, "c9", SummaryBase(base, emulator_url, 0.0))
        assert await worker.handle(Job(SUMMARY_JOB, TENANT, "c9"), T0) == "done"
        assert worker.calls == {"prefix": 1, "plain": 1}
        row = await repo.get_summary(TENANT, "c9", "conversation")
        assert row.status == "done" and row.attempts == 0 and row.text
    finally:
        await summarizer.aclose()

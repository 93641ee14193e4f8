"""The search of a user's other conversations at scale: one user with ``--conversations`` conversations of
``--pages`` pages each (500 x 100 = 50,000 pages by default), beside ``--others`` other users of the same tenant
with as many pages each, in a real PostgreSQL (the embedded one, or ``DATABASE_URL``).

Measured: the time of the push's search (memci_proxy.recall.users.search.search_user: the candidates' statistics from
the user's GIN postings, the ranking, the hits' texts) for questions made of the pages' own words, p50 / p99 over
``--queries``; the same search for a user with ``--small`` pages (the usual case), in the same run; and the time to
write one turn's page (memci_proxy.turn.across.page_row + the upsert) behind the answer.

Page texts come from LongMemEval's S haystacks when ``$MEMCI_EVAL_DIR`` holds them (real vocabulary), else from a
Zipf-distributed vocabulary.

Usage::

    MEMCI_EVAL_DIR=../shared/eval python loadtests/bench_user_memory.py
    python loadtests/bench_user_memory.py --conversations 50 --pages 100 --queries 100   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.evals.evaldata import load_longmemeval_s
from memci_proxy.recall.reading.pagetext import index_text
from memci_proxy.recall.users.search import search_user
from memci_proxy.turn.across import UserTurn, page_row

TENANT = "t-bench"
BATCH = 500


def page_texts(count: int, seed: int) -> list[str]:
    """``count`` page texts: LongMemEval's turns (user message and answer) when present, else synthetic ones."""
    rng = random.Random(seed)
    haystacks = load_longmemeval_s()
    if haystacks:
        turns: list[str] = []
        seen: set[str] = set()
        for h in haystacks:
            for session in h.sessions:
                if session.id in seen:
                    continue
                seen.add(session.id)
                messages = list(session.messages)
                for i in range(0, len(messages) - 1, 2):
                    turns.append(index_text(messages[i:i + 2]))
        return [turns[rng.randrange(len(turns))] for _ in range(count)]
    words = [f"w{n}" for n in range(20_000)]
    weights = [1 / (n + 1) for n in range(len(words))]
    return ["user: " + " ".join(rng.choices(words, weights, k=120)) + "\nassistant: " +
            " ".join(rng.choices(words, weights, k=300)) for _ in range(count)]


async def populate(repo, user: str, conversations: int, pages: int, texts: list[str], offset: int) -> None:
    rows_written = 0
    for c in range(conversations):
        cid = f"c{user[-6:]}{c:08x}"
        await repo.create_conversation(TENANT, cid, end_user=user)
        rows = [page_row(user, UserTurn(str(p + 1), 2 * p, 2 * p + 2, 1.7e9 + c * 86_400 + p),
                         [{"role": "user", "content": t} for t in [texts[(offset + rows_written + p) % len(texts)]] * 2])
                for p in range(pages)]
        for i in range(0, len(rows), BATCH):
            await repo.put_user_pages([(TENANT, user, cid, row) for row in rows[i:i + BATCH]])
        rows_written += pages


def questions(texts: list[str], n: int, seed: int) -> list[str]:
    """Questions made of a page's words: four of its words of five letters or more, and a question mark."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        words = [w.strip(".,!?;:()\"'") for w in texts[rng.randrange(len(texts))].split()]
        words = [w for w in words if len(w) >= 5 and w.isalpha()]
        if len(words) >= 4:
            out.append("What did I say about " + " ".join(rng.sample(words, 4)) + "?")
    return out


async def timed(repo, user: str, asked: list[str]) -> list[float]:
    out = []
    for q in asked:
        started = time.perf_counter()
        await search_user(repo, TENANT, user, "c-new", q, 6)
        out.append((time.perf_counter() - started) * 1000)
    return out


def summary(label: str, ms: list[float]) -> str:
    ms = sorted(ms)
    return (f"{label}: p50 {statistics.median(ms):.2f} ms, p99 {ms[min(len(ms) - 1, int(0.99 * len(ms)))]:.2f} ms, "
            f"max {ms[-1]:.2f} ms over {len(ms)}")


async def main_async(args: argparse.Namespace) -> int:
    from memci_proxy.store.sql.embedded import start_embedded_postgres
    from memci_proxy.store.sql.migrate import run_migrations
    from memci_proxy.store.sql.repository import SqlConversationRepository, create_engine_from_url

    home = Path(tempfile.mkdtemp(prefix="memci-bench-users-"))
    server = await asyncio.to_thread(start_embedded_postgres, home / "pg", "bench_users", "delete")
    await asyncio.to_thread(run_migrations, server.async_url)
    engine = create_engine_from_url(server.async_url)
    repo = SqlConversationRepository(engine)
    try:
        total = args.conversations * args.pages
        texts = page_texts(min(total, 60_000), args.seed)
        started = time.perf_counter()
        await populate(repo, "ubig000000", args.conversations, args.pages, texts, 0)
        for o in range(args.others):
            await populate(repo, f"uoth{o:06d}", args.conversations, args.pages, texts, 7919 * (o + 1))
        await populate(repo, "usmall0000", 1, args.small, texts, 104_729)
        print(f"$ python loadtests/bench_user_memory.py {' '.join(sys.argv[1:])}")
        print(f"populated {total:,} pages of the user and {args.others * total:,} of {args.others} other users in "
              f"{time.perf_counter() - started:.0f} s")
        async with engine.begin() as connection:
            from sqlalchemy import text
            await connection.execute(text("ANALYZE user_pages"))
        asked = questions(texts[:total], args.queries, args.seed + 1)
        await timed(repo, "ubig000000", asked[:20])  # warm the pool and the cache
        big = await timed(repo, "ubig000000", asked)
        small = await timed(repo, "usmall0000", asked)
        write = []
        for i in range(args.queries):
            row = page_row("usmall0000", UserTurn(str(10_000 + i), 0, 2, 1.8e9),
                           [{"role": "user", "content": texts[i % len(texts)]}, {"role": "assistant", "content": "ok"}])
            t0 = time.perf_counter()
            await repo.put_user_pages([(TENANT, "usmall0000", f"c{'usmall0000'[-6:]}{0:08x}", row)])
            write.append((time.perf_counter() - t0) * 1000)
        print(summary(f"search, a user with {total:,} pages in {args.conversations} conversations", big))
        print(summary(f"search, a user with {args.small} pages", small))
        print(summary("writing one turn's page behind the answer (its terms counted, the upsert)", write))
        return 0
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--pages", type=int, default=100, help="pages per conversation")
    parser.add_argument("--others", type=int, default=2, help="other users of the tenant, as large")
    parser.add_argument("--small", type=int, default=300, help="pages of the small user")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

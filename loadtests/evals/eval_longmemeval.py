"""Page-level recall of the search on LongMemEval (dev half): does an evidence page reach the top 5?

Protocol: each question's evidence sessions are surrounded by other questions' sessions until the history holds
about 500 messages (loadtests.evals.evaldata.longmemeval_history, in date order). The history is paged the way the
proxy pages a chat: a page is one user message and what follows it up to the next user message (sessions start
with a user message, so no page straddles two). A page is dated by its session's date, and it is indexed with
the proxy's own page text (memci_proxy.recall.reading.pagetext.index_text). The question is asked in its own words on
its ``question_date`` (what "last week" means: memci_proxy.recall.dates.asked). A page is relevant when it holds a
message flagged ``has_answer``; ``recall_any@5`` is 1 when at least one relevant page is in the top 5.

Rankings over the same pages, with the proxy's ranking code (memci_proxy.recall.search.ranking, through
loadtests.evals.eval_sets.search_rankings): ``lexical`` (the search without vectors: BM25 with its entity boost, the
pages of the days the question names joining its candidates and climbing), ``vector`` (cosine of the whole pages
with the packaged model), ``default`` (what the proxy's search returns with the vector half on: the vectors of the
candidates' user words and whole pages, within one search's bound) and ``archive`` (embeddings_pages=archive).
Per question type too; ``--seed`` surrounds each question with other sessions.

Usage::

    python loadtests/evals/eval_longmemeval.py                  # the 252 dev questions, packaged model
    python loadtests/evals/eval_longmemeval.py --limit 40 --lexical-only
    python loadtests/evals/eval_longmemeval.py --vector-cache /tmp/lme-vectors.npz   # embed once, re-run quickly
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadtests.evals.evaldata import LongMemEvalHistory, LongMemEvalQuestion, load_longmemeval, longmemeval_history
from loadtests.progress import add_argument as add_progress_argument
from loadtests.progress import bars_wanted, progress
from memci_proxy.recall.reading.pagetext import index_text

__all__ = ["HistoryPage", "history_pages", "evidence_pages", "question_day", "session_day", "recall_any",
           "page_rankings", "evaluate_longmemeval", "report", "main"]

EmbedFn = Callable[[list[str]], list[list[float]]]
TOP = 5


@dataclass(frozen=True, slots=True)
class HistoryPage:
    start: int  # index of its first message in the history
    end: int  # one past its last message
    day: dt.date
    messages: tuple[dict, ...]

    @property
    def text(self) -> str:
        """The proxy's page text (what its vector is computed from)."""
        return index_text(list(self.messages))


def session_day(date: str) -> dt.date:
    """"2023/08/16 (Wed) 03:47" -> 2023-08-16."""
    return dt.date(int(date[:4]), int(date[5:7]), int(date[8:10]))


question_day = session_day


def history_pages(history: LongMemEvalHistory) -> list[HistoryPage]:
    """The history paged as the proxy pages a chat: one user message and the messages after it, up to the next."""
    pages: list[HistoryPage] = []
    offset = 0
    for session in history.sessions:
        day = session_day(session.date)
        messages = list(session.messages)
        starts = [i for i, m in enumerate(messages) if m["role"] == "user"] or [0]
        if starts[0] != 0:
            starts.insert(0, 0)
        for first, nxt in zip(starts, [*starts[1:], len(messages)]):
            pages.append(HistoryPage(offset + first, offset + nxt, day, tuple(messages[first:nxt])))
        offset += len(messages)
    return pages


def evidence_pages(history: LongMemEvalHistory, pages: Sequence[HistoryPage]) -> list[int]:
    """Positions in ``pages`` of the pages holding a has_answer message."""
    flagged = history.evidence_messages()
    return [i for i, p in enumerate(pages) if any(p.start <= m < p.end for m in flagged)]


def recall_any(ranking: Sequence[int], relevant: Sequence[int], k: int = TOP) -> float:
    return float(bool(set(ranking[:k]) & set(relevant)))


class _OnDemand(dict):  # type: ignore[type-arg]
    """Vectors by page position, embedded when first read (``--candidates-only``): ``texts`` says which exist."""

    def __init__(self, texts: dict[int, str], embed: EmbedFn) -> None:
        super().__init__()
        self.texts, self.embed = texts, embed

    def __contains__(self, key: object) -> bool:
        return key in self.texts

    def __missing__(self, key: int) -> Sequence[float]:
        vector = self[key] = self.embed([self.texts[key]])[0]
        return vector


def page_rankings(pages: Sequence[HistoryPage], question: str, day: dt.date, embed: EmbedFn | None,
                  user_weight: int = 2, entity_boost: float = 2.0, candidates_only: bool = False
                  ) -> dict[str, list[int]]:
    """The proxy's rankings of the pages for the question (loadtests.evals.eval_sets.search_rankings): each page indexed
    as the proxy indexes it, the question's entity terms boosted as the proxy boosts them. ``candidates_only``: only
    the lexical candidates' views embedded (no ``vector`` or ``archive`` ranking), a fraction of the time."""
    from loadtests.evals.eval_sets import embedded_text, search_rankings, user_view_texts, user_views
    from memci_proxy.recall.lexical.bm25 import BM25Index
    from memci_proxy.recall.reading.pagetext import index_terms
    from memci_proxy.recall.search.ranking import query_weights, vector_query

    index = BM25Index()
    for position, page in enumerate(pages):
        index.add_terms(position, index_terms(list(page.messages), user_weight=user_weight))
    weights = query_weights(question, entity_boost)
    query_vector, vectors = None, {}
    if embed is not None and candidates_only:
        query_vector = embed([vector_query(question)])[0]
        vectors = _OnDemand({i: embedded_text(p.text) for i, p in enumerate(pages)}, embed)
        users = _OnDemand(user_view_texts([list(p.messages) for p in pages]), embed)
        return search_rankings(index, question, weights, query_vector, vectors,  # type: ignore[return-value]
                               lambda i: pages[i].day, day, user_vectors=users, whole_archive=False,
                               page_chars=_page_chars(pages))
    if embed is not None:
        query_vector = embed([vector_query(question)])[0]
        vectors = dict(enumerate(embed([embedded_text(p.text) for p in pages])))
    users, _ = user_views([list(p.messages) for p in pages], embed)
    return search_rankings(index, question, weights, query_vector, vectors, lambda i: pages[i].day, day,  # type: ignore[return-value]
                           user_vectors=users, page_chars=_page_chars(pages))


def _page_chars(pages: Sequence[HistoryPage]) -> dict[int, int]:
    """The length of each page's whole text as the proxy embeds it."""
    from memci_proxy.recall.reading.pagetext import vector_text

    return {i: len(vector_text(list(p.messages))) for i, p in enumerate(pages)}


def evaluate_longmemeval(
    questions: list[LongMemEvalQuestion],
    rank: Callable[[Sequence[HistoryPage], str, dt.date], dict[str, list[int]]],
    limit: int | None = None,
    target_messages: int = 500,
    seed: int = 0,
    bars: bool | None = None,
) -> dict[str, dict[str, list[float]]]:
    """recall_any@5 per ranking name and question type (and "all"): ``rank(pages, question, day)`` gives each
    ranking's best-first page positions."""
    chosen = range(len(questions) if limit is None else min(limit, len(questions)))
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    searching = progress(len(chosen), "LongMemEval: searching", bars, "questions")
    for index in chosen:
        searching.advance()
        history = longmemeval_history(questions, index, target_messages=target_messages, seed=seed)
        pages = history_pages(history)
        relevant = evidence_pages(history, pages)
        if not relevant:
            continue
        question = history.question
        for name, ranking in rank(pages, question.question, question_day(question.date)).items():
            hit = recall_any(ranking, relevant)
            out[name]["all"].append(hit)
            out[name][question.kind].append(hit)
    searching.close()
    return out


def report(results: dict[str, dict[str, list[float]]]) -> list[str]:
    kinds = sorted({k for by_kind in results.values() for k in by_kind if k != "all"})
    header = f"{'ranking':<10} {'all':>12} " + " ".join(f"{k[:22]:>24}" for k in kinds)
    lines = [header]
    for name, by_kind in results.items():
        cells = [f"{sum(v) / len(v):.3f} (n={len(v)})" if v else "-" for v in (by_kind.get(k, []) for k in kinds)]
        everything = by_kind["all"]
        lines.append(f"{name:<10} {sum(everything) / len(everything):>5.3f} (n={len(everything)}) "
                     + " ".join(f"{c:>24}" for c in cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    from loadtests.evals.eval_sets import cached_embed, local_embed
    from memci_proxy.recall.vectors.packaged_models import DEFAULT_MODEL, MODELS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument("--messages", type=int, default=500, help="messages per history (about)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lexical-only", action="store_true", help="no vector half (no embedding model)")
    parser.add_argument("--local-model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    parser.add_argument("--vector-cache", default="", help="a .npz file keeping page vectors between runs")
    parser.add_argument("--user-weight", type=int, default=2,
                        help="times the user's words count in a page's terms (the proxy's recall_user_weight)")
    parser.add_argument("--candidates-only", action="store_true",
                        help="embed the lexical candidates' views only (no vector or archive ranking): quicker")
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    questions = load_longmemeval()
    if questions is None:
        print("LongMemEval data not found (set MEMCI_EVAL_DIR)", file=sys.stderr)
        return 2
    embed = None
    if not args.lexical_only:
        embed = cached_embed(local_embed(args.local_model), args.vector_cache or None)

    def rank(pages: Sequence[HistoryPage], question: str, day: dt.date) -> dict[str, list[int]]:
        return page_rankings(pages, question, day, embed, user_weight=args.user_weight,
                             candidates_only=args.candidates_only)

    print(f"LongMemEval dev: {len(questions)} questions, histories of ~{args.messages} messages (seed {args.seed}), "
          f"page-level recall_any@{TOP}, user weight {args.user_weight}, "
          f"embeddings: {'none' if embed is None else 'packaged ' + args.local_model}")
    results = evaluate_longmemeval(questions, rank, limit=args.limit, target_messages=args.messages,
                                   seed=args.seed, bars=bars_wanted(args.progress))
    if embed is not None:
        embed.save()  # type: ignore[attr-defined]
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

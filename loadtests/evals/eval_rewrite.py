"""Quality of the intent rewrite on TREC CAsT, and its retrieval gain on MADial-Bench.

Rewrite quality (TREC CAsT 2019 with its resolved rewrites, 2020 with its manual rewrites): for every turn,
the history is the conversation's earlier raw user utterances (CAsT gives no system answers in these files);
the prediction is compared with the human rewrite by token-F1 and exact match (SQuAD normalisation: lower
case, punctuation, articles and possessive 's removed). Rows: the raw question (the floor), the rules
level, and with ``--model-url`` the model level. Columns: F1 and EM over all turns; the same over the turns
the humans changed (chg.); and, as a diagnostic of the resolution itself, micro precision / recall / F1 of
the tokens added to the raw question (add.: what the prediction added against what the human added; the
raw question adds nothing, so its row is 0).

Retrieval gain: the CAsT files hold no passage texts (2020 only canonical passage ids), so the retrieval
evaluation is built from MADial-Bench (``loadtests/evals/evaldata.py``): the candidates are the memories of the
dialogue's user, the query comes from the dialogue before the first test turn, recall@5 and hit@5 of the
BM25 search (``memci_proxy/recall/lexical/bm25.py``, min score 0.2) are compared for: the raw last user message, its
rules rewrite, seed 001's keyword query (top 6 keywords of the query and the last 5 messages) built on
either, the same with 12 keywords, and the rewrite followed by the user's 5 previous messages.
As the CAsT files hold no passage texts, a second, constructed retrieval task asks whether a CAsT 2019
turn's query finds its own conversation's topic (title + description) among the 50 by BM25.

Usage::

    python loadtests/evals/eval_rewrite.py
    python loadtests/evals/eval_rewrite.py --model-url http://127.0.0.1:30000/v1 --model qwen2.5-1.5b-instruct
    python loadtests/evals/eval_rewrite.py --fallback 20     # plus: latency with the emulator as a slow model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import string
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadtests.evals.evaldata import MadialBench, eval_dir, load_madial_bench
from memci_proxy.engine.intent import rewrite_rules
from memci_proxy.recall.lexical.bm25 import DEFAULT_MIN_SCORE, BM25Index
from memci_proxy.recall.push.memory_block import memory_keywords

__all__ = [
    "CastTurn",
    "CastConversation",
    "RewriteScores",
    "load_cast",
    "token_f1",
    "exact_match",
    "score_rewrites",
    "evaluate_cast",
    "evaluate_retrieval",
    "evaluate_topic_retrieval",
    "load_cast_descriptions",
    "main",
]

Rewriter = Callable[[list[dict], str], str]


@dataclass(frozen=True, slots=True)
class CastTurn:
    raw: str
    rewrite: str  # the human rewrite


@dataclass(frozen=True, slots=True)
class CastConversation:
    topic: str
    turns: tuple[CastTurn, ...]
    description: str = ""  # 2019: the topic's title and description


def load_cast_descriptions() -> dict[str, str] | None:
    """CAsT 2019 topic number -> "title. description"; None when the file is absent."""
    root = eval_dir()
    topics_file = root / "trec-cast" / "2019_evaluation_topics_v1.0.json" if root is not None else None
    if topics_file is None or not topics_file.is_file():
        return None
    topics = json.loads(topics_file.read_text(encoding="utf-8"))
    return {str(t["number"]): f"{t.get('title', '')}. {t.get('description', '')}" for t in topics}


def load_cast(year: int) -> list[CastConversation] | None:
    """CAsT 2019 (raw + resolved tsv) or 2020 (manual rewrites); None when the files are absent."""
    root = eval_dir()
    folder = root / "trec-cast" if root is not None else None
    if folder is None:
        return None
    if year == 2019:
        topics_file = folder / "2019_evaluation_topics_v1.0.json"
        resolved_file = folder / "2019_evaluation_topics_annotated_resolved_v1.0.tsv"
        if not (topics_file.is_file() and resolved_file.is_file()):
            return None
        lines = resolved_file.read_text(encoding="utf-8").splitlines()
        resolved = dict(line.split("\t", 1) for line in lines if "\t" in line)
        conversations = []
        for topic in json.loads(topics_file.read_text(encoding="utf-8")):
            turns = []
            for turn in topic["turn"]:
                key = f"{topic['number']}_{turn['number']}"
                if key in resolved:
                    turns.append(CastTurn(turn["raw_utterance"].strip(), resolved[key].strip()))
            conversations.append(CastConversation(str(topic["number"]), tuple(turns)))
        return conversations
    if year == 2020:
        topics_file = folder / "2020_manual_evaluation_topics_v1.0.json"
        if not topics_file.is_file():
            return None
        conversations = []
        for topic in json.loads(topics_file.read_text(encoding="utf-8")):
            turns = tuple(
                CastTurn(t["raw_utterance"].strip(), t["manual_rewritten_utterance"].strip()) for t in topic["turn"]
            )
            conversations.append(CastConversation(str(topic["number"]), turns))
        return conversations
    raise ValueError(f"no CAsT loader for {year}")


# -- metrics -------------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation + "\u2019\u2018"})


def _normalise(text: str) -> list[str]:
    return _ARTICLES.sub(" ", text.lower().replace("'s", " ").translate(_PUNCTUATION)).split()


def token_f1(prediction: str, gold: str) -> float:
    predicted, wanted = _normalise(prediction), _normalise(gold)
    if not predicted or not wanted:
        return float(predicted == wanted)
    common = sum((Counter(predicted) & Counter(wanted)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(_normalise(prediction) == _normalise(gold))


@dataclass(frozen=True, slots=True)
class RewriteScores:
    turns: int
    f1: float  # percent
    em: float  # percent
    changed_turns: int  # turns whose human rewrite differs from the raw question
    changed_f1: float
    changed_em: float
    added_precision: float  # tokens the prediction added to the raw question that the human added too
    added_recall: float  # tokens the human added that the prediction added
    added_f1: float


def score_rewrites(pairs: Sequence[tuple[str, CastTurn]]) -> RewriteScores:
    """Mean token-F1 and exact match (percent) of (prediction, turn) pairs, overall and on changed turns."""

    def mean(values: list[float]) -> float:
        return 100.0 * sum(values) / len(values) if values else 0.0

    changed = [(p, t) for p, t in pairs if _normalise(t.raw) != _normalise(t.rewrite)]
    common = predicted_added = gold_added = 0
    for prediction, turn in pairs:
        raw = Counter(_normalise(turn.raw))
        mine, theirs = Counter(_normalise(prediction)) - raw, Counter(_normalise(turn.rewrite)) - raw
        common += sum((mine & theirs).values())
        predicted_added += sum(mine.values())
        gold_added += sum(theirs.values())
    precision = 100.0 * common / predicted_added if predicted_added else 0.0
    recall = 100.0 * common / gold_added if gold_added else 0.0
    added_f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return RewriteScores(
        len(pairs),
        mean([token_f1(p, t.rewrite) for p, t in pairs]),
        mean([exact_match(p, t.rewrite) for p, t in pairs]),
        len(changed),
        mean([token_f1(p, t.rewrite) for p, t in changed]),
        mean([exact_match(p, t.rewrite) for p, t in changed]),
        precision,
        recall,
        added_f1,
    )


def _history(turns: Sequence[CastTurn], upto: int) -> list[dict]:
    return [{"role": "user", "content": t.raw} for t in turns[:upto]]


def rules_rewriter(history: list[dict], last_user: str) -> str:
    return rewrite_rules(history, last_user).query


def raw_rewriter(history: list[dict], last_user: str) -> str:
    return last_user


def evaluate_cast(
    conversations: Sequence[CastConversation], rewriter: Rewriter, limit: int | None = None
) -> RewriteScores:
    """Scores of ``rewriter`` over the turns of the first ``limit`` conversations (all when None)."""
    pairs = []
    for conversation in conversations[:limit] if limit is not None else conversations:
        for i, turn in enumerate(conversation.turns):
            pairs.append((rewriter(_history(conversation.turns, i), turn.raw), turn))
    return score_rewrites(pairs)


async def _model_predictions(
    conversations: Sequence[CastConversation], url: str, model: str, timeout_s: float, api_key: str
) -> list[tuple[str, CastTurn]]:
    from memci_proxy.rewrite.model import ModelRewriter

    async with ModelRewriter(url, model, timeout_s=timeout_s, api_key=api_key) as client:
        pairs = []
        for conversation in conversations:
            for i, turn in enumerate(conversation.turns):
                answer = await client.rewrite(_history(conversation.turns, i), turn.raw)
                pairs.append((answer if answer is not None else turn.raw, turn))
        return pairs


# -- retrieval gain ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RetrievalScores:
    queries: int
    recall_at_5: float
    hit_at_5: float
    hit_at_1: float = 0.0


def evaluate_topic_retrieval(
    conversations: Sequence[CastConversation], descriptions: dict[str, str], rewriter: Rewriter
) -> RetrievalScores:
    """CAsT 2019 has no passage texts; this asks instead whether a turn's query finds its own conversation's
    topic (title + description) among the 50 by BM25: the context a rewrite must carry to reach pages about
    the conversation's subject. Turns after the first only (first turns are standalone by construction)."""
    index = BM25Index()
    for number, text in descriptions.items():
        index.add(number, text)
    hits1 = hits5 = n = 0
    for conversation in conversations:
        for i, turn in enumerate(conversation.turns[1:], start=1):
            query = rewriter(_history(conversation.turns, i), turn.raw)
            top = [doc_id for doc_id, _ in index.search(query, k=5, min_score=DEFAULT_MIN_SCORE)]
            n += 1
            hits1 += top[:1] == [conversation.topic]
            hits5 += conversation.topic in top
    return RetrievalScores(n, hits5 / n if n else 0.0, hits5 / n if n else 0.0, hits1 / n if n else 0.0)


def evaluate_retrieval(bench: MadialBench, limit: int | None = None) -> dict[str, RetrievalScores]:
    """recall@5 / hit@5 of BM25 over the user's memories for raw vs rewritten queries (see module doc)."""
    dialogues = bench.dialogues[:limit] if limit is not None else bench.dialogues
    indexes: dict[int, BM25Index] = {}
    rows: dict[str, list[tuple[float, float]]] = {
        "raw last user": [],
        "rules rewrite": [],
        "keywords(raw + last 5)": [],
        "keywords(rewrite + last 5)": [],
        "keywords(rewrite + last 5), 12": [],
        "rewrite + last 5 user msgs": [],
    }
    rewritten_count = 0
    for dialogue in dialogues:
        if dialogue.user_id not in indexes:
            index = BM25Index()
            for memory in bench.memories_of(dialogue.user_id):
                index.add(memory.id, memory.event)
            indexes[dialogue.user_id] = index
        index = indexes[dialogue.user_id]
        turns = [t for t in dialogue.turns_before(dialogue.test_turns[0]) if t.text]
        messages = [{"role": "assistant" if t.speaker == "Assistant" else "user", "content": t.text} for t in turns]
        last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last is None:
            continue
        raw = messages[last]["content"]
        result = rewrite_rules(messages[:last], raw)
        rewritten_count += result.changed
        recent = [m["content"] for m in messages[:last][-5:]]
        user_texts = [m["content"] for m in messages[:last] if m["role"] == "user"]
        queries = {
            "raw last user": raw,
            "rules rewrite": result.query,
            "keywords(raw + last 5)": " ".join(memory_keywords(raw, recent)),
            "keywords(rewrite + last 5)": " ".join(memory_keywords(result.query, recent)),
            "keywords(rewrite + last 5), 12": " ".join(memory_keywords(result.query, recent, top=12)),
            "rewrite + last 5 user msgs": " ".join([result.query, *user_texts[-5:]]),
        }
        wanted = set(dialogue.relevant_ids)
        for name, query in queries.items():
            top = [doc_id for doc_id, _ in index.search(query, k=5, min_score=DEFAULT_MIN_SCORE)]
            found = len(wanted.intersection(top))
            rows[name].append((found / len(wanted), float(found > 0)))
    out = {}
    for name, values in rows.items():
        n = len(values)
        out[name] = RetrievalScores(
            n, sum(v[0] for v in values) / n if n else 0.0, sum(v[1] for v in values) / n if n else 0.0
        )
    out["_rewritten"] = RetrievalScores(rewritten_count, 0.0, 0.0)
    return out


# -- fallback latency ----------------------------------------------------------------------------
async def _fallback_latency(base_url: str, rounds: int, timeout_s: float) -> tuple[list[float], list[float], set]:
    from memci_proxy.rewrite import ModelRewriter, rewrite

    history = [{"role": "user", "content": "Tell me about the Python GIL."}]
    slow, answering, served = [], [], set()
    async with ModelRewriter(base_url, "rewrite-model", timeout_s=timeout_s) as client:
        await client.rewrite(history, "warm-up [[say:ok]]")
        for marker, sink in (("[[delay:5]]", slow), ("[[say:Why does the GIL exist?]]", answering)):
            for _ in range(rounds):
                started = time.perf_counter()
                result = await rewrite(history, f"Why does it exist? {marker}", client, timeout_s)
                sink.append(time.perf_counter() - started)
                served.add((marker.split(":")[0] + "]]", result.level, result.reason))
    return slow, answering, served


def fallback_report(rounds: int = 20, timeout_s: float = 0.3) -> None:
    """Latency of the rewrite with the emulator as the model: answering, and slow (rules after the timeout)."""
    from memci_proxy.emulator.testing import running_emulator

    with running_emulator() as url:
        slow, answering, served = asyncio.run(_fallback_latency(url, rounds, timeout_s))
    slow.sort()
    answering.sort()
    print(f"\nRewrite latency with the emulator as the model (timeout {timeout_s * 1000:.0f} ms, {rounds} each)")
    print("| model          | min ms | median ms | max ms | served (marker, level, reason) |")
    print("| -------------- | ------ | --------- | ------ | ------------------------------ |")
    for label, values, marker in (("answering", answering, "[[say]]"), ("slow (5 s)", slow, "[[delay]]")):
        levels = ", ".join(f"{lv}/{rs or '-'}" for m, lv, rs in sorted(served) if m == marker)
        median = values[len(values) // 2]
        print(f"| {label:<14} | {values[0] * 1000:6.1f} | {median * 1000:9.1f} | {values[-1] * 1000:6.1f} | {levels} |")
    print(f"slow model: worst {(slow[-1] - timeout_s) * 1000:+.1f} ms past the timeout (target <= +50 ms)")


# -- command -------------------------------------------------------------------------------------
def _human_rewriter(conversations: Sequence[CastConversation]) -> Rewriter:
    """The human rewrite of a turn, looked up by its raw text and history (the ceiling row)."""
    table = {
        (tuple(t.raw for t in c.turns[:i]), turn.raw): turn.rewrite
        for c in conversations
        for i, turn in enumerate(c.turns)
    }
    return lambda history, last_user: table[(tuple(m["content"] for m in history), last_user)]


def _row(label: str, scores: RewriteScores) -> str:
    return (
        f"| {label:<24} | {scores.turns:>5} | {scores.f1:6.2f} | {scores.em:6.2f} | "
        f"{scores.changed_turns:>5} | {scores.changed_f1:6.2f} | {scores.changed_em:6.2f} | "
        f"{scores.added_precision:6.2f} | {scores.added_recall:6.2f} | {scores.added_f1:6.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-url", default=None, help="OpenAI-compatible base URL of the rewrite model")
    parser.add_argument("--model", default="rewrite", help="model name sent to --model-url")
    parser.add_argument("--model-timeout", type=float, default=10.0, help="seconds per model call in the evaluation")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--limit", type=int, default=None, help="only the first N conversations of each set")
    parser.add_argument("--no-retrieval", action="store_true", help="skip the retrieval evaluations")
    parser.add_argument(
        "--fallback", type=int, default=0, metavar="N",
        help="also time N rewrites against the emulator as a slow and as an answering model",
    )
    args = parser.parse_args(argv)

    found_any = False
    print("| set / level              | turns |     F1 |     EM | chg.n | chg.F1 | chg.EM | add.P  | add.R  | add.F1 |")
    print("| ------------------------ | ----- | ------ | ------ | ----- | ------ | ------ | ------ | ------ | ------ |")
    gains = []
    for year in (2019, 2020):
        conversations = load_cast(year)
        if conversations is None:
            print(f"| CAsT {year}: data not found |")
            continue
        found_any = True
        conversations = conversations[: args.limit] if args.limit is not None else conversations
        floor = evaluate_cast(conversations, raw_rewriter)
        started = time.perf_counter()
        rules = evaluate_cast(conversations, rules_rewriter)
        per_turn_ms = 1000 * (time.perf_counter() - started) / max(rules.turns, 1)
        print(_row(f"CAsT {year} raw (floor)", floor))
        print(_row(f"CAsT {year} rules", rules))
        gains.append((year, rules.f1 - floor.f1, per_turn_ms))
        if args.model_url:
            pairs = asyncio.run(
                _model_predictions(conversations, args.model_url, args.model, args.model_timeout, args.api_key)
            )
            print(_row(f"CAsT {year} model", score_rewrites(pairs)))
    for year, gain, per_turn_ms in gains:
        verdict = "met" if gain >= 10.0 else "NOT met"
        print(f"CAsT {year}: rules - floor = {gain:+.2f} F1 points (target >= +10: {verdict}); "
              f"rules rewrite {per_turn_ms:.3f} ms per turn in this run")

    if not args.no_retrieval:
        descriptions = load_cast_descriptions()
        conversations = load_cast(2019)
        if descriptions is not None and conversations is not None:
            print("\nTopic retrieval on CAsT 2019 (BM25 over the 50 topic titles + descriptions, turns 2..n; "
                  "the files hold no passage texts)")
            print("| query              |   n | hit@1 | hit@5 |")
            print("| ------------------ | --- | ----- | ----- |")
            for label, rewriter in (("raw question", raw_rewriter), ("rules rewrite", rules_rewriter),
                                    ("human rewrite", _human_rewriter(conversations))):
                scores = evaluate_topic_retrieval(conversations, descriptions, rewriter)
                print(f"| {label:<18} | {scores.queries:>3} | {scores.hit_at_1:5.3f} | {scores.hit_at_5:5.3f} |")
        bench = load_madial_bench()
        if bench is None:
            print("MADial-Bench data not found: retrieval gain skipped")
        else:
            found_any = True
            results = evaluate_retrieval(bench)
            rewritten = results.pop("_rewritten").queries
            print(f"\nRetrieval on MADial-Bench en (BM25 over the user's memories, min score {DEFAULT_MIN_SCORE}; "
                  f"the rules changed {rewritten} of {len(bench.dialogues)} last user messages)")
            print("| query                          |   n | recall@5 | hit@5 |")
            print("| ------------------------------ | --- | -------- | ----- |")
            for name, scores in results.items():
                print(f"| {name:<30} | {scores.queries:>3} | {scores.recall_at_5:8.3f} | {scores.hit_at_5:5.3f} |")
    if args.fallback > 0:
        fallback_report(args.fallback)
    if not found_any:
        print("no evaluation data found (../shared/eval or MEMCI_EVAL_DIR)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Should the fused search drive the push decision? The push's decision measured on MemoryBank's probing questions.

The push (proxy.turn.push) fires on a look-up (proxy.recall.proactive.is_look_up) whose words are missing from the
prompt when the archive's best BM25 hit for those words scores at least ``recall_push_min_score`` (1.0). The
alternative measured here: also fire when the best cosine of the packaged model's vector of those words with a
page reaches ``--min-cosine-push`` (the query is embedded only on look-ups, a recall path). Each user's dated
exchanges are the archived pages (none active: every keyword is missing); the round shows the fused top 5, as in
the proxy.

* labelled (loadtests/memorybank_evidence.json, 21 questions): ``recall`` = share of questions pushed with a
  round that holds an evidence page;
* every probing question (100) against its own user's archive: ``fired`` (the answer is there, unlabelled);
* every probing question against another user's archive (the next user): ``false`` = pushes where the archive
  holds no answer (each costs the round's tokens and shows the model unrelated pages).

Usage::

    MEMCI_EVAL_DIR=../shared/eval python loadtests/eval_push.py [--min-cosine-push 0.3 0.4 0.5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.eval_sets import local_embed, memorybank_cases, page_text
from loadtests.evaldata import MemoryBankUser, load_memorybank
from proxy.recall.bm25 import BM25Index
from proxy.recall.entities import boosted_query
from proxy.recall.fusion import fuse_lexical_and_vector, rank_by_cosine
from proxy.recall.proactive import DEFAULT_MIN_SCORE, content_words, is_look_up, missing_terms, push_query
from proxy.recall.resolver import FUSION_CANDIDATES, MIN_SCORE, SEARCH_HITS
from proxy.recall.text import tokenize

ENTITY_BOOST = 2.0
MIN_COSINE = 0.2  # recall_min_cosine: the round's fused ranking


class Archive:
    """One user's exchanges as pages: BM25 index and page vectors."""

    def __init__(self, user: MemoryBankUser, embed) -> None:
        texts = [page_text(user, i) for i in range(len(user.exchanges))]
        self.index = BM25Index()
        for i, text in enumerate(texts):
            self.index.add(i, text)
        self.vectors = dict(enumerate(embed(texts)))

    def look(self, query: str, query_vector: list[float]) -> tuple[float, float, list[int]]:
        """(best BM25 score, best cosine, the round's pages: the fused top 5)."""
        weights = boosted_query(dict.fromkeys(tokenize(query), 1.0), query, ENTITY_BOOST)
        candidates = SEARCH_HITS * FUSION_CANDIDATES
        lexical = [(int(i), s) for i, s in self.index.search_weighted(weights, k=candidates, min_score=MIN_SCORE)]
        vector = [(i, c) for i, c in rank_by_cosine(query_vector, self.vectors, k=candidates) if c > 0]
        fused = fuse_lexical_and_vector(lexical, vector, limit=SEARCH_HITS, min_cosine=MIN_COSINE)
        return (max((s for _, s in lexical), default=0.0), max((c for _, c in vector), default=0.0),
                [i for i, _ in fused])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-cosine-push", type=float, nargs="+", default=[0.3, 0.4, 0.5, 0.6])
    parser.add_argument("--bm25-floor", type=float, nargs="*", default=[2.0, 4.0, 6.0],
                        help="lexical decisions with another floor, for comparison")
    args = parser.parse_args(argv)
    users = load_memorybank()
    if not users:
        print("MemoryBank data not found (set MEMCI_EVAL_DIR)", file=sys.stderr)
        return 2
    embed = local_embed()
    archives = {u.name: Archive(u, embed) for u in users}
    labelled = {(u.name, q): relevant for u, q, relevant in memorybank_cases(users)}
    rules: dict[str, tuple[float, float | None, float | None]] = {"lexical (now)": (DEFAULT_MIN_SCORE, None, None)}
    for c in args.min_cosine_push:
        rules[f"lexical or cosine >= {c:g}"] = (DEFAULT_MIN_SCORE, c, None)
        rules[f"lexical and cosine >= {c:g}"] = (DEFAULT_MIN_SCORE, None, c)
    for floor in args.bm25_floor:
        rules[f"bm25 >= {floor:g}"] = (floor, None, None)
    tally = {name: {"recall": 0, "fired": 0, "false": 0} for name in rules}
    asked = look_ups = 0
    for position, user in enumerate(users):
        other = users[(position + 1) % len(users)]
        for question in user.probing_questions:
            asked += 1
            if not is_look_up(question):
                continue
            look_ups += 1
            query = push_query(missing_terms(content_words(question), []))
            if not query:
                continue
            query_vector = embed([query])[0]
            own = archives[user.name].look(query, query_vector)
            foreign = archives[other.name].look(query, query_vector)
            relevant = labelled.get((user.name, question))
            for name, rule in rules.items():
                def fires(best: tuple[float, float, list[int]], rule: tuple = rule) -> bool:
                    floor, cosine_or, cosine_and = rule
                    if cosine_and is not None and best[1] < cosine_and:
                        return False
                    return best[0] >= floor or (cosine_or is not None and best[1] >= cosine_or)
                tally[name]["fired"] += fires(own)
                tally[name]["false"] += fires(foreign)
                if relevant is not None and fires(own) and set(relevant) & set(own[2]):
                    tally[name]["recall"] += 1
    print(f"MemoryBank: {asked} probing questions, {look_ups} look-ups, {len(labelled)} labelled")
    print(f"{'decision':30} {'labelled recall':>16} {'fired (own)':>12} {'false (other user)':>19}")
    for name, t in tally.items():
        print(f"{name:30} {t['recall']:>9}/{len(labelled):<6} {t['fired']:>6}/{asked:<5} {t['false']:>12}/{asked}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

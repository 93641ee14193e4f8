"""Does what the user's message needs reach the prompt? The push (memci_proxy.turn.push) measured end to end.

LongMemEval (dev half, ``$MEMCI_EVAL_DIR/longmemeval``), through a real proxy process and an emulator upstream that
never calls ``recall`` by itself:

* each question's evidence sessions among other questions' sessions (loadtests/evaldata.longmemeval_history, about
  ``--messages`` messages) are sent as one request, then the question as the next user turn, in its own words;
* ``reached``: a message flagged ``has_answer`` reaches the prompt the emulator received for the question (whole, or
  a stretch of at least ``STRETCH`` letters and digits of it, as a recall excerpt shows it); ``whole``: whole;
* ``recall_any@5``: ``POST /memci/search`` with the question ranks a page holding an evidence message in its top 5
  (over the questions whose evidence left the prompt);
* ``--replay N``: N histories sent turn by turn (each user message a turn, the history's own answers resent), then
  the question: pushes and pushed tokens on the ordinary turns, against all prompt tokens.

``--memorybank``: the decision alone, in-process, on MemoryBank's probing questions (each user's exchanges
archived, nothing active): pushes on the user's own archive, pushes on another user's archive (which holds no
answer: each such push costs its round's tokens), and for the 21 labelled questions whether the round's top 5
holds the evidence.

Usage::

    MEMCI_EVAL_DIR=../shared/eval python loadtests/evals/eval_push.py --limit 40 --replay 2
    MEMCI_EVAL_DIR=../shared/eval python loadtests/evals/eval_push.py --proxy-src main=/tmp/main-export --limit 40
    MEMCI_EVAL_DIR=../shared/eval python loadtests/evals/eval_push.py --memorybank
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from loadtests import progress
from loadtests.bench_servers import Upstream, emulator_upstream, proxy_server
from loadtests.cache_bench import pushed_tokens
from loadtests.evals.evaldata import LongMemEvalHistory, load_longmemeval, load_memorybank, longmemeval_history
from loadtests.progress import Progress, bars_wanted
from memci_proxy.workers.prefix import is_job_body

STRETCH = 150  # letters and digits of an evidence message a prompt must hold (a recall excerpt is ~300 characters)
_NOT_WORD = re.compile(r"[\W_]+")


def normal(text: str) -> str:
    return _NOT_WORD.sub("", text.casefold())


def reached(evidence: str, prompt: str) -> tuple[bool, bool]:
    """(a stretch of it is in the prompt, all of it is): both normalised to letters and digits."""
    target = normal(evidence)
    if not target:
        return False, False
    if target in prompt:
        return True, True
    return any(piece in prompt for piece in stretches(target)), False


def stretches(target: str) -> list[str]:
    """The stretches of ``STRETCH`` letters and digits of a normalised message that count as reaching a prompt (none
    when it is not longer: then only all of it does)."""
    if len(target) <= STRETCH:
        return []
    return [target[i:i + STRETCH] for i in range(0, len(target) - STRETCH + 1, STRETCH // 3)]


def prompt_text(messages: list[dict]) -> str:
    return normal("\n".join(m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                            for m in messages))


@dataclass
class Tally:
    questions: int = 0
    skipped: int = 0  # questions without a has_answer message
    reached: int = 0
    whole: int = 0
    pushed: int = 0
    searched: int = 0  # questions whose evidence is archived
    found: int = 0  # ... of them with an evidence page in the search's top 5
    by_kind: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    replay_turns: int = 0
    replay_pushes: int = 0
    replay_pushed: int = 0
    replay_prompt: int = 0
    settled_s: float = 0.0  # --settle: seconds waited for the background embedding

    def line(self) -> str:
        n = max(1, self.questions)
        out = (f"evidence reached {self.reached}/{self.questions} = {self.reached / n:.3f} (whole {self.whole / n:.3f}), "
               f"pushed {self.pushed}/{self.questions} ({self.skipped} without evidence left out); search recall_any@5 {self.found}/{self.searched} = "
               f"{self.found / max(1, self.searched):.3f}")
        if self.settled_s:
            out += f"; waited {self.settled_s / n:.1f} s per question for the background embedding"
        if self.replay_turns:
            out += (f"; replayed ordinary turns {self.replay_turns}: pushes {self.replay_pushes} "
                    f"({100 * self.replay_pushes / self.replay_turns:.1f}%), pushed tokens "
                    f"{100 * self.replay_pushed / max(1, self.replay_prompt):.2f}% of prompt tokens")
        return out


class Client:
    def __init__(self, proxy_url: str, upstream: Upstream) -> None:
        self.url = proxy_url
        self.root = proxy_url.removesuffix("/v1")
        self.upstream = upstream
        self.http = httpx.Client(timeout=600)

    def turn(self, messages: list[dict], stream: bool, extra: dict | None = None) -> tuple[str, list[dict], dict]:
        """One chat request (``extra``: more body fields, e.g. ``user``); (conversation id, the first upstream prompt
        it caused, that log entry)."""
        mark = self.upstream.mark()
        body = {"model": "eval", "messages": messages, "max_tokens": 24, "stream": stream, **(extra or {})}
        if stream:
            with self.http.stream("POST", self.url + "/chat/completions", json=body) as r:
                r.raise_for_status()
                cid = r.headers["x-memci-conversation-id"]
                for _ in r.iter_bytes():
                    pass
        else:
            r = self.http.post(self.url + "/chat/completions", json=body)
            r.raise_for_status()
            cid = r.headers["x-memci-conversation-id"]
        for _ in range(50):  # the emulator logs a request as it finishes: a moment after the answer, at worst
            sent = [e for e in self.upstream.since(mark) or [] if not is_job_body(e.get("body"))]
            if sent:
                return cid, sent[0]["body"]["messages"], sent[0]
            time.sleep(0.1)
        raise RuntimeError("the emulator logged no request for this turn")

    def outcomes(self) -> Counter[str]:
        """The proxy's push outcomes so far (memci_recall_pushes_total)."""
        out: Counter[str] = Counter()
        for line in self.http.get(self.root + "/metrics").text.splitlines():
            if line.startswith("memci_recall_pushes_total{"):
                out[line.split('"')[1]] = int(float(line.rsplit(" ", 1)[1]))
        return out

    def settle(self, timeout_s: float = 300.0) -> float:
        """Wait until the proxy's background embedding backlog is empty (memci_embedding_backlog_pages): the state of
        a chat whose pages were archived turns before the question. Seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            waiting = [float(line.rsplit(" ", 1)[1]) for line in self.http.get(self.root + "/metrics").text.splitlines()
                       if line.startswith("memci_embedding_backlog_pages ")]
            if not waiting or waiting[0] == 0:
                break
            time.sleep(0.2)
        return time.monotonic() - start

    def search(self, cid: str, query: str) -> list[str]:
        r = self.http.post(self.root + "/memci/search", json={"conversation_id": cid, "query": query, "k": 5})
        r.raise_for_status()
        return [str(h["page"]) for h in r.json()["hits"]]

    def pages(self, cid: str) -> dict[int, tuple[str | None, str]]:
        """seq -> (page, archive state) of every stored message."""
        out, after = {}, -1
        while True:
            r = self.http.get(f"{self.root}/memci/conversations/{cid}", params={"after": after, "limit": 1000})
            r.raise_for_status()
            data = r.json()
            for m in data["messages"]:
                out[m["seq"]] = (None if m["page"] is None else str(m["page"]), m["state"])
            if data["next_after"] is None:
                return out
            after = data["next_after"]

    def close(self) -> None:
        self.http.close()


def ask(client: Client, history: LongMemEvalHistory, messages: list[dict], tally: Tally, stream: bool,
        verbose: bool = False) -> None:
    question = history.question
    asked = [*messages, {"role": "user", "content": question.question}]
    before = client.outcomes() if verbose else Counter()
    cid, sent, _ = client.turn(asked, stream)
    outcome = ",".join((client.outcomes() - before).elements()) if verbose else ""
    prompt = prompt_text(sent)
    evidence = history.evidence_messages()
    if not evidence:  # nothing flagged has_answer (some abstention questions): nothing to reach
        tally.skipped += 1
        return
    marks = [reached(messages[i]["content"], prompt) for i in evidence]
    tally.questions += 1
    tally.reached += any(s for s, _ in marks)
    tally.whole += any(w for _, w in marks)
    tally.pushed += pushed_tokens(sent, asked[-1]) > 0
    kind = tally.by_kind[question.kind]
    kind[0] += any(s for s, _ in marks)
    kind[1] += 1
    pages = client.pages(cid)
    archived = {pages[i][0] for i in evidence if i in pages and pages[i][1] != "active" and pages[i][0]}
    found = None
    if archived:
        tally.searched += 1
        found = bool(archived & set(client.search(cid, question.question)))
        tally.found += found
    if verbose:
        shown = {m.group(1) for m in re.finditer(r"\[Page ([0-9.]+)\]", sent[-1].get("content") or "")} \
            if sent and sent[-1].get("role") == "tool" else set()
        print(f"  {question.id} {question.kind}: push {outcome or '-'}, reached {any(s for s, _ in marks)}, "
              f"search {found}, pushed an evidence page {bool(archived & shown)}: {question.question}",
              file=sys.stderr, flush=True)


def replay(client: Client, history: LongMemEvalHistory, tally: Tally) -> None:
    messages = history.messages()
    for end in [i + 1 for i, m in enumerate(messages) if m["role"] == "user"]:
        _, sent, entry = client.turn(messages[:end], stream=False)
        tally.replay_turns += 1
        pushed = pushed_tokens(sent, messages[end - 1])
        tally.replay_pushes += pushed > 0
        tally.replay_pushed += pushed
        tally.replay_prompt += entry.get("prompt_tokens") or 0


def spread(total: int, limit: int, offset: int = 0) -> list[int]:
    """``limit`` question indexes evenly spaced over all ``total`` (the file is sorted by kind: a subset covers every
    kind), shifted by ``offset``; all of them when ``limit`` is 0."""
    if not limit or limit >= total:
        return list(range(total))
    return sorted({(offset + i * total // limit) % total for i in range(limit)})


def run_longmemeval(args: argparse.Namespace) -> int:
    questions = load_longmemeval()
    if not questions:
        print("LongMemEval data not found (set MEMCI_EVAL_DIR)", file=sys.stderr)
        return 2
    chosen = spread(len(questions), args.limit, args.offset)
    sources = [(label, Path(path)) for label, path in (kv.split("=", 1) for kv in args.proxy_src)] or [("", None)]
    env = dict(kv.split("=", 1) for kv in args.proxy_env)
    results = {}
    with tempfile.TemporaryDirectory(prefix="eval-push-") as tmp:
        for label, src in sources:
            tally = Tally()
            with emulator_upstream(args.window, Path(tmp)) as upstream, \
                    proxy_server(upstream.base_url, Path(tmp) / f"home-{label or 'this'}", env, src) as url:
                client = Client(url, upstream)
                bar = Progress(len(chosen), f"longmemeval {label or 'this tree'}", bars=bars_wanted(args.progress),
                               unit="questions")
                with bar:
                    for n, index in enumerate(chosen):
                        history = longmemeval_history(questions, index, args.messages, args.seed)
                        if n < args.replay:
                            replay(client, history, tally)
                        elif args.settle:  # the history first, its pages embedded, then the question
                            client.turn(history.messages(), stream=False)
                            tally.settled_s += client.settle()
                        ask(client, history, history.messages(), tally, n % 2 == 1, args.verbose)
                        bar.advance()
                client.close()
            name = label or "this tree"
            results[name] = tally
            print(f"{name}: {tally.line()}", flush=True)
            print("  by kind (reached): " + ", ".join(
                f"{k} {v[0]}/{v[1]}" for k, v in sorted(tally.by_kind.items())), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {k: {**{f: getattr(v, f) for f in ("questions", "skipped", "reached", "whole", "pushed", "searched", "found",
                                                "replay_turns", "replay_pushes", "replay_pushed", "replay_prompt")},
                 "by_kind": dict(v.by_kind)} for k, v in results.items()}, indent=1))
    return 0


def run_memorybank() -> int:
    """The decision in-process: MemoryBank users' exchanges as the archive, nothing active."""
    from loadtests.evals.eval_sets import memorybank_cases, page_text
    from memci_proxy.recall.lexical.bm25 import BM25Index
    from memci_proxy.recall.push.proactive import is_look_up, search_words
    from memci_proxy.recall.push.salience import asks, verdict, weigh

    users = load_memorybank()
    if not users:
        print("MemoryBank data not found (set MEMCI_EVAL_DIR)", file=sys.stderr)
        return 2
    indexes = {}
    for user in users:
        index = BM25Index()
        for i in range(len(user.exchanges)):
            index.add(i, page_text(user, i))
        indexes[user.name] = index
    labelled = {(u.name, q): relevant for u, q, relevant in memorybank_cases(users)}
    counts: Counter[str] = Counter()
    units = []
    for position, user in enumerate(users):
        other = users[(position + 1) % len(users)]
        for question in user.probing_questions:
            counts["asked"] += 1
            asking = "look_up" if is_look_up(question) else "question" if asks(question) else ""
            own = weigh(indexes[user.name], question)
            fired = verdict(own, asking) == "pushed"
            units.append(own.units)
            counts["fired"] += fired
            counts["false"] += verdict(weigh(indexes[other.name], question), asking) == "pushed"
            relevant = labelled.get((user.name, question))
            if relevant is not None and fired:
                top = [int(i) for i, _ in indexes[user.name].search(search_words(question), k=5)]
                counts["recall"] += bool(set(relevant) & set(top))
    asked = counts["asked"]
    print(f"MemoryBank: {asked} probing questions, {len(labelled)} labelled; strength (one-page idfs) median "
          f"{statistics.median(units):.2f}")
    print(f"pushed, own archive {counts['fired']}/{asked}; pushed, another user's archive {counts['false']}/{asked}; "
          f"labelled: pushed with the evidence in the top 5 {counts['recall']}/{len(labelled)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="questions, evenly spaced over the set (0: all)")
    parser.add_argument("--offset", type=int, default=0, help="shift of the evenly spaced questions")
    parser.add_argument("--messages", type=int, default=500, help="messages of each history")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=16384)
    parser.add_argument("--replay", type=int, default=0, metavar="N", help="send the first N histories turn by turn")
    parser.add_argument("--settle", action="store_true",
                        help="send each history as a turn of its own and wait for the proxy's background embedding "
                             "before the question (pages archived turns before it), instead of one request")
    parser.add_argument("--proxy-src", action="append", default=[], metavar="LABEL=PATH",
                        help="one run per source tree (e.g. main=/tmp/main-export); default: this checkout")
    parser.add_argument("--proxy-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", dest="json_out", default=None)
    parser.add_argument("--verbose", action="store_true", help="each question's push outcome on stderr")
    parser.add_argument("--memorybank", action="store_true", help="the decision alone, on MemoryBank (in-process)")
    progress.add_argument(parser)
    args = parser.parse_args(argv)
    return run_memorybank() if args.memorybank else run_longmemeval(args)


if __name__ == "__main__":
    raise SystemExit(main())

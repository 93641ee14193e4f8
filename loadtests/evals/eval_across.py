"""Memory across conversations: does what one user said in earlier conversations reach the prompt of a question
asked in a new one, and never another user's prompt?

LongMemEval's S haystacks (dev half, ``$MEMCI_EVAL_DIR/longmemeval/longmemeval_s_dev.json.gz``, about 48 sessions
per question), through a real proxy process and the emulator (loadtests.bench_servers):

* one end user per question (the body's ``user``): each haystack session, oldest first, is its own conversation,
  sent whole in one request: a system message ``Today is <session date>.``, the session's messages, and a short
  closing user message when the session ends with the assistant's (so the whole session is stored);
* then the question in a new conversation of the same user: ``Today is <question date>.`` and the question in the
  user's own words. ``reached``: a message flagged ``has_answer`` reaches the prompt the emulator received for it
  (whole, or a stretch of ``STRETCH`` letters and digits: loadtests.evals.eval_push.reached); ``whole``: whole;
* once every haystack is stored, each question again from another user: the previous question's user (a different
  haystack; a user who sent nothing when there is one question). A leak: evidence of the first user's sessions, that
  the other user never sent, reaches that prompt. Must be 0.

Usage::

    MEMCI_EVAL_DIR=../shared/eval python loadtests/evals/eval_across.py --limit 20
    MEMCI_EVAL_DIR=../shared/eval python loadtests/evals/eval_across.py --limit 20 --proxy-src main=/tmp/main-export \\
        --env MEMCI_MEMORY_WORKERS=false --json /tmp/across.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadtests import progress
from loadtests.bench_servers import emulator_upstream, proxy_server
from loadtests.cache_bench import settle
from loadtests.evals.eval_push import Client, normal, prompt_text, reached, spread, stretches
from loadtests.evals.evaldata import LongMemEvalHaystack, LongMemEvalQuestion, LongMemEvalSession, load_longmemeval_s
from loadtests.progress import Progress, bars_wanted

CLOSING = "Thanks, that is all for now."  # ends a session whose last message is the assistant's
NOBODY = "lme-nobody"  # the other user when there is a single question: one who has sent nothing


def dated(date: str) -> dict:
    """The system message that opens every conversation: the day it happens, as LongMemEval's dates write it."""
    return {"role": "system", "content": f"Today is {date}."}


def session_messages(session: LongMemEvalSession) -> list[dict]:
    """One haystack session as one request: its date, its messages, a closing user message after an assistant's."""
    messages = [dated(session.date), *(dict(m) for m in session.messages)]
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": CLOSING})
    return messages


def question_messages(question: LongMemEvalQuestion) -> list[dict]:
    return [dated(question.date), {"role": "user", "content": question.question}]


def user_of(question: LongMemEvalQuestion) -> str:
    return f"lme-{question.id}"


def reach(evidence: list[str], prompt: str) -> tuple[bool, bool]:
    """(a stretch of some evidence message is in the normalised prompt, one is whole)."""
    marks = [reached(text, prompt) for text in evidence]
    return any(s for s, _ in marks), any(w for _, w in marks)


def leaked(evidence: list[str], prompt: str, own: str) -> bool:
    """Some evidence message reaches the normalised ``prompt`` (whole or a stretch, as ``reach`` reads it) by a piece
    that is not in ``own``, the normalised text of everything the asking user sent (what they said themselves is no
    leak)."""
    for text in evidence:
        target = normal(text)
        if target and any(piece in prompt and piece not in own for piece in [target, *stretches(target)]):
            return True
    return False


def sent_text(sessions: tuple[LongMemEvalSession, ...]) -> str:
    return normal("\n".join(m["content"] for s in sessions for m in s.messages))


def others(count: int) -> list[int | None]:
    """For each of ``count`` questions, the position of the question whose user asks it again: the previous one
    (the first's: the last); None (a user who sent nothing) when there is one question."""
    return [None] * count if count < 2 else [(n - 1) % count for n in range(count)]


@dataclass
class Tally:
    questions: int = 0  # asked, with evidence
    skipped: int = 0  # asked, nothing flagged has_answer (left out of the figures)
    reached: int = 0
    whole: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))  # reached, whole, n
    cross_asked: int = 0  # questions with evidence asked again by another user
    leaks: int = 0
    leaked: list[str] = field(default_factory=list)  # question ids whose evidence reached another user's prompt
    merged: int = 0  # requests meant to start a conversation that continued an earlier one instead
    requests: int = 0  # chat requests sent to the proxy
    upstream_requests: int = 0  # requests the emulator answered (the memory workers' jobs included)
    seconds: list[float] = field(default_factory=list)  # per question: its haystack and the question
    cross_seconds: float = 0.0

    def lines(self, total: int) -> list[str]:
        n = max(1, self.questions)
        per = statistics.mean(self.seconds) if self.seconds else 0.0
        return [
            f"evidence reached {self.reached}/{self.questions} = {self.reached / n:.3f} (whole {self.whole}/"
            f"{self.questions} = {self.whole / n:.3f}); {self.skipped} without evidence left out",
            "by kind (reached, whole / questions): " + ", ".join(
                f"{k} {v[0]}, {v[1]} / {v[2]}" for k, v in sorted(self.by_kind.items())),
            f"leaks to another user: {self.leaks}/{self.cross_asked}" + (f" ({', '.join(self.leaked)})" if self.leaked
                                                                          else ""),
            f"conversations merged: {self.merged}; proxy requests {self.requests}, upstream requests "
            f"{self.upstream_requests}",
            f"time per question {per:.1f} s (median {statistics.median(self.seconds) if self.seconds else 0:.1f}); "
            f"other users' asks {self.cross_seconds:.0f} s; all {total} questions at this rate: ~"
            f"{total * per / 60:.0f} min",
        ]

    def as_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["by_kind"] = {k: dict(zip(("reached", "whole", "questions"), v)) for k, v in self.by_kind.items()}
        return out


class Run:
    """One proxy (from one source tree) and its emulator: the haystacks, the questions, the other users' asks."""

    def __init__(self, client: Client, verbose: bool, settle_s: float) -> None:
        self.client, self.verbose, self.settle_s = client, verbose, settle_s
        self.tally = Tally()
        self.seen: set[str] = set()

    def _start(self, messages: list[dict], user: str, stream: bool = False) -> list[dict]:
        """A request that must open a new conversation; the prompt the emulator received for it."""
        cid, sent, _ = self.client.turn(messages, stream, {"user": user})
        self.tally.requests += 1
        self.tally.merged += cid in self.seen
        self.seen.add(cid)
        return sent

    def haystack(self, haystack: LongMemEvalHaystack, stream: bool) -> None:
        started = time.monotonic()
        user = user_of(haystack.question)
        for session in haystack.sessions:
            self._start(session_messages(session), user)
        settle(self.client.upstream, self.settle_s)
        sent = self._start(question_messages(haystack.question), user, stream)
        self.tally.seconds.append(time.monotonic() - started)
        evidence = haystack.evidence()
        if not evidence:
            self.tally.skipped += 1
            return
        got, whole = reach(evidence, prompt_text(sent))
        self.tally.questions += 1
        self.tally.reached += got
        self.tally.whole += whole
        kind = self.tally.by_kind[haystack.question.kind]
        kind[0], kind[1], kind[2] = kind[0] + got, kind[1] + whole, kind[2] + 1
        if self.verbose:
            print(f"  {haystack.question.id} {haystack.question.kind}: reached {got} (whole {whole}): "
                  f"{haystack.question.question}", file=sys.stderr, flush=True)

    def cross(self, haystack: LongMemEvalHaystack, other: LongMemEvalHaystack | None) -> None:
        """The question from another user; a leak when evidence that user never sent reaches the prompt."""
        evidence = haystack.evidence()
        user = user_of(other.question) if other else NOBODY
        sent = self._start(question_messages(haystack.question), user)
        if not evidence:
            return
        self.tally.cross_asked += 1
        if leaked(evidence, prompt_text(sent), sent_text(other.sessions if other else ())):
            self.tally.leaks += 1
            self.tally.leaked.append(haystack.question.id)


def run_tree(label: str, src: Path | None, chosen: list[LongMemEvalHaystack], args: argparse.Namespace,
             workdir: Path) -> Tally:
    env = dict(kv.split("=", 1) for kv in args.env)
    name = label or "this tree"
    bars = bars_wanted(args.progress)
    with emulator_upstream(args.window, workdir) as upstream, \
            proxy_server(upstream.base_url, workdir / f"home-{label or 'this'}", env, src) as url:
        client = Client(url, upstream)
        run = Run(client, args.verbose, args.settle)
        try:
            with Progress(len(chosen), f"across {name}", bars=bars, unit="questions") as bar:
                for n, haystack in enumerate(chosen):
                    run.haystack(haystack, stream=n % 2 == 1)
                    bar.advance()
            started = time.monotonic()
            with Progress(len(chosen), f"other users {name}", bars=bars, unit="questions") as bar:
                for haystack, other in zip(chosen, others(len(chosen))):
                    run.cross(haystack, None if other is None else chosen[other])
                    bar.advance()
            run.tally.cross_seconds = time.monotonic() - started
            run.tally.upstream_requests = upstream.totals()["requests"]
        finally:
            client.close()
    return run.tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="questions, evenly spaced over the set (0: all)")
    parser.add_argument("--offset", type=int, default=0, help="shift of the evenly spaced questions")
    parser.add_argument("--window", type=int, default=16384, help="the emulator's context length")
    parser.add_argument("--settle", type=float, default=0.0, metavar="S",
                        help="before each question, wait until the upstream got no request for S seconds")
    parser.add_argument("--data", default=None, metavar="FILE",
                        help="an S file (default: $MEMCI_EVAL_DIR/longmemeval/longmemeval_s_dev.json.gz)")
    parser.add_argument("--proxy-src", action="append", default=[], metavar="LABEL=PATH",
                        help="one run per source tree (e.g. main=/tmp/main-export); default: this checkout")
    parser.add_argument("--env", "--proxy-env", action="append", default=[], metavar="KEY=VALUE",
                        help="the proxy's environment (repeatable)")
    parser.add_argument("--json", dest="json_out", default=None)
    parser.add_argument("--verbose", action="store_true", help="each question's outcome on stderr")
    progress.add_argument(parser)
    args = parser.parse_args(argv)
    print("$ python loadtests/evals/eval_across.py " + shlex.join(sys.argv[1:] if argv is None else argv), flush=True)
    haystacks = load_longmemeval_s(Path(args.data) if args.data else None)
    if not haystacks:
        print("LongMemEval S data not found (set MEMCI_EVAL_DIR, or --data)", file=sys.stderr)
        return 2
    chosen = [haystacks[i] for i in spread(len(haystacks), args.limit, args.offset)]
    sources = [(label, Path(path)) for label, path in (kv.split("=", 1) for kv in args.proxy_src)] or [("", None)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="eval-across-") as tmp:
        for label, src in sources:
            started = time.monotonic()
            tally = run_tree(label, src, chosen, args, Path(tmp))
            name = label or "this tree"
            results[name] = tally
            print(f"{name}: {len(chosen)} questions, {time.monotonic() - started:.0f} s", flush=True)
            for line in tally.lines(len(haystacks)):
                print("  " + line, flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"command": sys.argv if argv is None else argv, **{k: v.as_json() for k, v in results.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

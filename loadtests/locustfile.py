"""Locust users that hold multi-turn conversations over the OpenAI wire format (streaming).

Each user keeps one conversation going: it sends the whole history every turn (as any OpenAI client does),
streams the answer with ``stream_options.include_usage``, appends it, thinks, and asks again; after
``LOCUST_TURNS`` turns it starts a new conversation. Point ``--host`` at the proxy, or straight at the
upstream (emulator or SGLang) for the pass-through reference; ``LOCUST_STRATEGY`` trims the history on the
client first with one of the baselines (``sliding`` = seed 002, ``three-tier`` = seed 003), their chars/4
budget corrected by the largest ratio of reported prompt tokens to estimate seen in the conversation.

Stats rows: ``POST chat`` (time to response headers, failures), ``TTFT first token`` (time to the first
content or tool-call delta), ``STREAM complete`` (whole answer). At the end: the cache hit rate seen in the
usage (sum cached / sum prompt tokens), output tokens/s, and time to first token by turn number.

    python -m locust -f loadtests/locustfile.py --headless -u 5 -r 5 -t 15s --host http://127.0.0.1:8080

Environment: LOCUST_TURNS (40), LOCUST_ANSWER_TOKENS (120), LOCUST_USER_CHARS (0: extra characters of
filler per user turn), LOCUST_THINK_MIN / LOCUST_THINK_MAX (0.5 / 2.0 s), LOCUST_MAX_TOKENS (256),
LOCUST_MODEL (memci-emulator), LOCUST_API_KEY (sk-load), LOCUST_STRATEGY (none|sliding|three-tier),
LOCUST_WINDOW (8192, for the baselines' budget), LOCUST_SUMMARY_JSON (write the end summary there).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from locust import HttpUser, between, events, task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.baselines import SlidingWindow, ThreeTier, estimate_tokens  # noqa: E402
from loadtests.workloads import chat  # noqa: E402


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


TURNS = int(_env("LOCUST_TURNS", "40"))
ANSWER_TOKENS = int(_env("LOCUST_ANSWER_TOKENS", "120"))
USER_CHARS = int(_env("LOCUST_USER_CHARS", "0"))
THINK = (float(_env("LOCUST_THINK_MIN", "0.5")), float(_env("LOCUST_THINK_MAX", "2.0")))
MAX_TOKENS = int(_env("LOCUST_MAX_TOKENS", "256"))
MODEL = _env("LOCUST_MODEL", "memci-emulator")
API_KEY = _env("LOCUST_API_KEY", "sk-load")
STRATEGY = _env("LOCUST_STRATEGY", "none")
WINDOW = int(_env("LOCUST_WINDOW", "8192"))
BUDGET = WINDOW - MAX_TOKENS - int(0.10 * WINDOW)
FILLER = "Some context about my situation that matters for the answer. "


class Totals:
    """Counters shared by every user of this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt = self.cached = self.completion = 0
        self.stream_seconds = 0.0
        self.ttft_by_turn: dict[int, list[float]] = {}
        self.started = time.monotonic()

    def add(self, turn: int, ttft_ms: float | None, usage: dict | None, gen_seconds: float) -> None:
        with self.lock:
            if ttft_ms is not None:
                self.ttft_by_turn.setdefault(turn, []).append(ttft_ms)
            if usage:
                self.prompt += int(usage.get("prompt_tokens") or 0)
                self.cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                self.completion += int(usage.get("completion_tokens") or 0)
            self.stream_seconds += gen_seconds

    def summary(self) -> dict:
        elapsed = time.monotonic() - self.started
        buckets: dict[str, dict] = {}
        width = max(1, TURNS // 8)
        for turn in sorted(self.ttft_by_turn):
            key = f"{turn // width * width + 1}-{turn // width * width + width}"
            buckets.setdefault(key, {"values": []})["values"].extend(self.ttft_by_turn[turn])
        by_turn = {k: {"n": len(v["values"]), "p50_ms": round(statistics.median(v["values"]), 1),
                       "mean_ms": round(statistics.fmean(v["values"]), 1)} for k, v in buckets.items()}
        return {
            "strategy": STRATEGY, "prompt_tokens": self.prompt, "cached_tokens": self.cached,
            "hit_rate": self.cached / self.prompt if self.prompt else None,
            "completion_tokens": self.completion,
            "output_tokens_per_s_total": self.completion / elapsed if elapsed else None,
            "output_tokens_per_s_per_stream": self.completion / self.stream_seconds if self.stream_seconds else None,
            "ttft_by_turn": by_turn,
        }


TOTALS = Totals()
_USER_IDS = itertools.count()


class ConversationUser(HttpUser):
    wait_time = between(*THINK)

    def on_start(self) -> None:
        self.user_id = next(_USER_IDS)
        self.conversation = 0
        self._new_conversation()

    def _new_conversation(self) -> None:
        self.conversation += 1
        seed = self.user_id * 1000 + self.conversation
        self.script = [t.user.split("[[")[0].strip() for t in chat(turns=TURNS, seed=seed, probes=0).turns]
        self.history: list[dict] = [{"role": "system", "content": f"You are a helpful assistant (session {seed})."}]
        self.turn = 0
        self.trimmer = {"sliding": SlidingWindow, "three-tier": ThreeTier}.get(STRATEGY, lambda: None)()
        self.ratio = 1.0  # largest reported prompt tokens / chars-4 estimate (the baselines' budget correction)

    def _body(self) -> dict:
        messages = self.trimmer.prepare(self.history, int(BUDGET / self.ratio)) if self.trimmer else self.history
        return {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "stream": True,
                "stream_options": {"include_usage": True}}

    def _calibrate(self, messages: list[dict], usage: dict | None) -> None:
        if self.trimmer and usage and usage.get("prompt_tokens"):
            estimate = max(1, sum(estimate_tokens(m) for m in messages))
            self.ratio = max(self.ratio, usage["prompt_tokens"] / estimate)

    @task
    def converse(self) -> None:
        if self.turn >= TURNS:
            self._new_conversation()
        text = self.script[self.turn] + " " + (FILLER * (USER_CHARS // len(FILLER) + 1))[:USER_CHARS]
        self.history.append({"role": "user", "content": f"{text.strip()} [[len:{ANSWER_TOKENS}]]"})
        body = self._body()
        answer, ok = self._stream(body)
        if ok:
            self.history.append({"role": "assistant", "content": answer})
            self.turn += 1
        else:  # keep the conversation valid: forget the unanswered question
            self.history.pop()

    def _stream(self, body: dict) -> tuple[str, bool]:
        env = self.environment
        started = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        usage = None
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with self.client.post("/v1/chat/completions", json=body, headers=headers, stream=True,
                              catch_response=True, name="chat") as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return "", False
            try:
                for raw in response.iter_lines():
                    if not raw or not raw.startswith(b"data:"):
                        continue
                    data = raw[5:].strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if event.get("usage"):
                        usage = event["usage"]
                    for choice in event.get("choices") or ():
                        delta = choice.get("delta") or {}
                        if first is None and (delta.get("content") or delta.get("tool_calls")):
                            first = time.perf_counter()
                        if delta.get("content"):
                            parts.append(delta["content"])
            except Exception as exc:  # a broken stream is a failure, not a crash of the user
                response.failure(f"stream: {exc!r}")
                return "", False
            if first is None or usage is None:
                response.failure("stream without content or usage")
                return "", False
            response.success()
        ended = time.perf_counter()
        ttft_ms = (first - started) * 1000
        env.events.request.fire(request_type="TTFT", name="first token", response_time=ttft_ms,
                                response_length=0, exception=None, context={})
        env.events.request.fire(request_type="STREAM", name="complete", response_time=(ended - started) * 1000,
                                response_length=len("".join(parts)), exception=None, context={})
        TOTALS.add(self.turn, ttft_ms, usage, ended - first)
        self._calibrate(body["messages"], usage)
        return "".join(parts), True


@events.test_start.add_listener
def _start(environment, **_kw) -> None:
    TOTALS.started = time.monotonic()


@events.test_stop.add_listener
def _report(environment, **_kw) -> None:
    summary = TOTALS.summary()
    hit = summary["hit_rate"]
    print(f"\ncache hit rate (usage): {'n/a' if hit is None else f'{hit:.4f}'} "
          f"({summary['cached_tokens']:,} cached / {summary['prompt_tokens']:,} prompt tokens)")
    if summary["output_tokens_per_s_total"] is not None:
        print(f"output tokens/s: {summary['output_tokens_per_s_total']:.1f} in total, "
              f"{summary['output_tokens_per_s_per_stream'] or 0:.1f} per stream")
    print("time to first token by turn (p50 ms / mean ms / n):")
    for key, row in summary["ttft_by_turn"].items():
        print(f"  turns {key:>9}: {row['p50_ms']:8.1f} {row['mean_ms']:8.1f} {row['n']:6d}")
    path = os.environ.get("LOCUST_SUMMARY_JSON")
    if path:
        Path(path).write_text(json.dumps(summary, indent=1))

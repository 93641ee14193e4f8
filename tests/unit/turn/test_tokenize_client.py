"""The upstream's /tokenize as a token counter (memci_proxy.upstream.tokenize), over httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest
from turn_fakes import MockUpstream

from memci_proxy.engine.tokens import EstimateCounter
from memci_proxy.upstream.tokenize import RETRY_AFTER_S, UpstreamTokenCounter, tokenize_url
from tests.manual_clock import ManualClock

TEXT = "The quick brown fox jumps over the lazy dog, twice."


class Tokenizer:
    """An SGLang-like /tokenize (a list of texts too; vLLM-like with lists=False): one token per word; can be slow
    or missing."""

    def __init__(self, status: int = 200, delay: float = 0.0, lists: bool = True) -> None:
        self.status, self.delay, self.lists, self.bodies = status, delay, lists, []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/tokenize":  # e.g. llama-cpp-python's /extras/tokenize/count: not this server's
            assert not request.url.path.startswith("/v1"), request.url  # at the server root, not under /v1
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            return httpx.Response(self.status, json={"detail": "Not Found"})
        prompt = body["prompt"]
        if isinstance(prompt, list):
            if not self.lists:
                return httpx.Response(400, json={"detail": "prompt: Input should be a valid string"})
            tokens = [list(range(len(p.split()))) for p in prompt]
            return httpx.Response(200, json={"tokens": tokens, "count": [len(t) for t in tokens], "max_model_len": 8192})
        tokens = list(range(len(prompt.split())))
        return httpx.Response(200, json={"tokens": tokens, "count": len(tokens), "max_model_len": 8192})


def test_tokenize_url_is_at_the_root():
    assert tokenize_url(MockUpstream(Tokenizer())) == "http://upstream.test/tokenize"


async def test_counts_come_from_the_upstream_once_cached():
    server = Tokenizer()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    assert counter.count_text(TEXT) == EstimateCounter().count_text(TEXT)  # not asked yet: the estimate
    await counter.prefetch([TEXT, "short"], model="m")
    assert counter.count_text(TEXT) == 10
    assert server.bodies == [{"prompt": TEXT, "add_special_tokens": False, "model": "m"}]  # short texts not asked
    await counter.prefetch([TEXT])
    assert len(server.bodies) == 1  # cached by the text's hash


async def test_a_slow_tokenizer_does_not_hold_the_turn():
    server = Tokenizer(delay=0.3)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=0.02)
    started = asyncio.get_running_loop().time()
    await counter.prefetch([TEXT])
    assert asyncio.get_running_loop().time() - started < 0.25
    assert counter.count_text(TEXT) == EstimateCounter().count_text(TEXT)  # meanwhile: the estimate
    await asyncio.sleep(0.4)
    assert counter.count_text(TEXT) == 10  # the late answer fills the cache for the next turn
    await counter.close()


async def test_an_upstream_without_tokenize_falls_back_and_retries_later():
    server, clock = Tokenizer(status=404), ManualClock()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0, clock=clock)
    await counter.prefetch([TEXT])
    assert not counter.available and counter.count_text(TEXT) == EstimateCounter().count_text(TEXT)
    await counter.prefetch([TEXT + " again"])
    assert len(server.bodies) == 1  # off: no more requests
    clock.now += RETRY_AFTER_S
    server.status = 200
    await counter.prefetch([TEXT])
    assert counter.available and counter.count_text(TEXT) == 10


async def test_the_cache_is_bounded():
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer()), max_entries=3, timeout=1.0)
    texts = [f"{TEXT} number {i}" for i in range(6)]
    await counter.prefetch(texts)
    assert len(counter) == 3
    assert counter.lookup(texts[-1]) == 12 and counter.lookup(texts[0]) is None  # the oldest left the cache


async def test_misses_are_estimated_in_the_upstreams_units():
    """Once some texts were counted, a text not asked yet is estimated times the exact/estimate ratio seen."""
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer()), timeout=1.0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 3  # 30 words: 30 tokens
    await counter.prefetch([words])
    estimate = EstimateCounter().count_text(words)
    assert counter.ratio == pytest.approx(30 / estimate)
    unseen = "lambda mu nu xi omicron pi rho sigma tau upsilon " * 3
    assert counter.count_text(unseen) == math.ceil(EstimateCounter().count_text(unseen) * 30 / estimate)


def test_the_turn_counts_with_the_upstream_tokenizer_unless_a_file_is_set():
    from memci_proxy.metrics import Metrics
    from memci_proxy.settings import Settings
    from memci_proxy.turn.counting import TurnCounts

    upstream = MockUpstream(Tokenizer())
    assert isinstance(TurnCounts(Settings(), upstream, Metrics()).base, UpstreamTokenCounter)  # empty cache too
    assert isinstance(TurnCounts(Settings(upstream_tokenize=False), upstream, Metrics()).base, EstimateCounter)


async def test_short_new_texts_are_counted_behind_the_turn_and_long_ones_waited_for():
    server = Tokenizer(delay=0.05)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0, wait_min_chars=200)
    await counter.prefetch([TEXT])  # 51 characters: the turn goes on with the estimate
    assert counter.lookup(TEXT) is None
    await asyncio.sleep(0.15)
    assert counter.lookup(TEXT) == 10  # counted behind it, for the next turns
    long_text = "word " * 100
    await counter.prefetch([long_text])  # 500 characters: worth the wait
    assert counter.lookup(long_text) == 100
    await counter.close()


async def test_a_turns_new_texts_go_in_one_request():
    server = Tokenizer()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    texts = [f"{TEXT} number {i}" for i in range(3)]
    await counter.prefetch([*texts, texts[0]], model="m")
    assert server.bodies == [{"prompt": texts, "add_special_tokens": False, "model": "m"}]  # each text once
    assert [counter.lookup(t) for t in texts] == [12, 12, 12]
    await counter.prefetch([texts[1], TEXT])
    assert server.bodies[1]["prompt"] == TEXT  # only what is not counted yet; a single text as a string



async def test_texts_no_turn_waits_for_share_a_request_with_the_next_turns():
    server = Tokenizer()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0, wait_min_chars=200)
    counter.gather_s = 0.05
    first, second = f"{TEXT} from one chat", f"{TEXT} from another chat"
    await counter.prefetch([first])  # short: not waited for, gathered
    await counter.prefetch([second])  # another conversation's turn meanwhile
    assert server.bodies == []
    await asyncio.sleep(0.1)
    assert [body["prompt"] for body in server.bodies] == [[first, second]]  # one request for both turns
    assert counter.lookup(first) == 13 and counter.lookup(second) == 13
    gathered, long_text = f"{TEXT} gathered", "word " * 100
    started = asyncio.get_running_loop().time()
    await counter.prefetch([gathered])
    await counter.prefetch([long_text])  # waited for: sent at once, with what was gathered
    assert asyncio.get_running_loop().time() - started < 0.04
    assert server.bodies[-1]["prompt"] == [gathered, long_text]
    assert counter.lookup(long_text) == 100
    await counter.close()


async def test_texts_of_different_models_are_gathered_apart():
    server = Tokenizer()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0, wait_min_chars=200)
    counter.gather_s = 0.05
    await counter.prefetch([f"{TEXT} for model a"], model="a")
    await counter.prefetch([f"{TEXT} for model b"], model="b")
    await counter.prefetch([f"{TEXT} for a again"], model="a")
    await asyncio.sleep(0.1)
    asked = sorted((body["model"], body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]])
                   for body in server.bodies)
    assert asked == [("a", [f"{TEXT} for model a", f"{TEXT} for a again"]), ("b", [f"{TEXT} for model b"])]
    await counter.close()


async def test_an_upstream_refusing_lists_is_asked_one_text_per_request():
    server = Tokenizer(lists=False)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    texts = [f"{TEXT} number {i}" for i in range(2)]
    await counter.prefetch(texts)
    assert counter.available and [counter.lookup(t) for t in texts] == [12, 12]
    assert [b["prompt"] for b in server.bodies] == [texts, *texts]
    more = [f"{TEXT} more {i}" for i in range(2)]
    await counter.prefetch(more)
    assert [b["prompt"] for b in server.bodies[3:]] == more  # no list again
    assert [counter.lookup(t) for t in more] == [12, 12]


async def test_texts_below_min_chars_are_estimated_and_not_asked():
    server = Tokenizer()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0, min_chars=60)
    long_text = TEXT + " and then it rests"
    await counter.prefetch([TEXT, long_text])
    assert [b["prompt"] for b in server.bodies] == [long_text]
    assert counter.lookup(TEXT) is None and counter.lookup(long_text) == 14
    assert counter.count_text(TEXT) == math.ceil(EstimateCounter().count_text(TEXT) * counter.ratio)


def test_an_answers_completion_tokens_count_its_text_when_it_is_one_plain_message():
    from memci_proxy.turn.counting import answer_text_count

    def body(message, finish="stop", n=1, **usage):
        return json.dumps({"choices": [{"index": i, "message": message, "finish_reason": finish} for i in range(n)],
                           "usage": {"prompt_tokens": 50, "completion_tokens": 9, **usage}}).encode()

    plain = {"role": "assistant", "content": TEXT}
    assert answer_text_count(body(plain)) == (TEXT, 9)
    assert answer_text_count(body(plain, "length")) == (TEXT, 9)
    assert answer_text_count(body(plain, n=2)) is None  # whose text would the count be?
    assert answer_text_count(body(plain, "tool_calls")) is None
    assert answer_text_count(body({**plain, "tool_calls": [{"id": "c"}]})) is None
    assert answer_text_count(body({**plain, "reasoning_content": "hm"})) is None
    assert answer_text_count(body(plain, completion_tokens_details={"reasoning_tokens": 4})) is None
    assert answer_text_count(body(plain, completion_tokens=0)) is None
    assert answer_text_count(b"not json") is None


def models_or_tokenize(request: httpx.Request, prompts: list) -> httpx.Response | None:
    """An upstream's /models and /tokenize (one token per word; the texts asked are kept in ``prompts``)."""
    if request.url.path.endswith("/models"):
        return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
    if request.url.path != "/tokenize":
        return None
    prompt = json.loads(request.content)["prompt"]
    asked = prompt if isinstance(prompt, list) else [prompt]
    prompts.extend(asked)
    counts = [len(p.split()) for p in asked]
    return httpx.Response(200, json={"count": counts if isinstance(prompt, list) else counts[0]})


async def test_the_answer_sent_back_is_not_asked_for_again():
    from turn_fakes import call_of, make_service

    answer = "A plain answer, long enough to be counted."
    prompts: list = []

    def upstream(request: httpx.Request) -> httpx.Response:
        reply = models_or_tokenize(request, prompts)
        if reply is not None:
            return reply
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                                      "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 40, "completion_tokens": 11}})

    service = make_service(upstream, tokenize_min_chars=16)  # the short questions asked too
    messages = [{"role": "user", "content": "The first question of this conversation."}]
    await service.handle(call_of(messages))
    await asyncio.sleep(0.05)  # counted behind the turn
    assert service.counts.tokenizer.lookup(answer) == 11  # from the answer's completion tokens
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the second question?"}]
    await service.handle(call_of(messages))
    await asyncio.sleep(0.05)
    assert "The first question of this conversation." in prompts and "And the second question?" in prompts
    assert answer not in prompts
    await service.close()


async def test_a_streamed_answer_sent_back_is_not_asked_for_again():
    from turn_fakes import answer_of, call_of, make_service

    pieces = ["A streamed ", "plain answer, ", "long enough to be counted."]
    answer = "".join(pieces)
    prompts: list = []

    def upstream(request: httpx.Request) -> httpx.Response:
        reply = models_or_tokenize(request, prompts)
        if reply is not None:
            return reply
        body = json.loads(request.content)
        assert body["stream"] is True and body["stream_options"]["include_usage"] is True
        base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        chunks += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
        chunks += [{**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                   {**base, "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 12}}]
        sse = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        return httpx.Response(200, content=sse, headers={"Content-Type": "text/event-stream"})

    service = make_service(upstream, tokenize_min_chars=16)
    messages = [{"role": "user", "content": "The first question of this conversation."}]
    await answer_of(await service.handle(call_of(messages, stream=True)))  # the whole stream read
    await asyncio.sleep(0.05)
    assert service.counts.tokenizer.lookup(answer) == 12  # from the stream's completion tokens
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the second question?"}]
    await answer_of(await service.handle(call_of(messages, stream=True)))
    await asyncio.sleep(0.05)
    assert "And the second question?" in prompts and answer not in prompts
    await service.close()


class ExtrasTokenizer:
    """llama-cpp-python's server: no /tokenize; POST /extras/tokenize/count {"input": text} -> {"count": N}."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.bodies: list[dict] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path != "/extras/tokenize/count":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        self.bodies.append(body)
        if not isinstance(body.get("input"), str):
            return httpx.Response(422, json={"detail": "input: Input should be a valid string"})
        return httpx.Response(200, json={"count": len(body["input"].split())})


async def test_llama_cpp_pythons_extras_route_counts_when_tokenize_is_not_found():
    server = ExtrasTokenizer()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    texts = [f"{TEXT} number {i}" for i in range(3)]
    await counter.prefetch(texts, model="smollm2")
    assert [counter.lookup(t) for t in texts] == [12, 12, 12] and counter.available
    assert server.paths[0] == "/tokenize" and set(server.paths[1:]) == {"/extras/tokenize/count"}
    assert all(body == {"input": t} for body, t in zip(server.bodies, texts))  # one text each, no model name
    asked = len(server.paths)
    await counter.prefetch([TEXT + " once more"])
    assert server.paths[asked:] == ["/extras/tokenize/count"]  # straight to the route that answered
    assert counter.lookup(TEXT + " once more") == 12
    await counter.close()


async def test_a_plan_counts_only_what_every_replica_counts_alike():
    """Short texts counted behind a turn, answers this process relayed and its exact/estimate ratio stay out of a
    plan's counts (another replica does not have them); long texts, which a turn waits for, are counted exactly."""
    from memci_proxy.metrics import Metrics
    from memci_proxy.settings import Settings
    from memci_proxy.turn.counting import SharedCounts, TurnCounts

    counts = TurnCounts(Settings(tokenize_wait_min_chars=400), MockUpstream(Tokenizer()), Metrics())
    shared = counts.shared
    assert isinstance(shared, SharedCounts)
    short = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 5  # 290 characters
    long_text = "word " * 100
    await counts.tokenizer.prefetch([short, long_text], timeout=1.0)
    assert counts.tokenizer.lookup(short) == 50 and counts.tokenizer.ratio != 1.0
    assert shared.count_text(short) == EstimateCounter().count_text(short)  # the plain estimate, no ratio
    assert shared.count_text(long_text) == 100
    answer = "an answer this replica relayed " * 20
    counts.answered_stream(answer, {"completion_tokens": 99})
    assert counts.tokenizer.lookup(answer) is None  # long: the next turn asks /tokenize on any replica
    counts.answered_stream(short[:300] + "!", {"completion_tokens": 51})
    assert shared.count_text(short[:300] + "!") == EstimateCounter().count_text(short[:300] + "!")
    await counts.close()


def test_texts_a_plan_estimates_are_asked_for_all_while_calibrating_then_one_in_eight():
    """A plan counts a text exactly only from SharedCounts.min_chars (memci_proxy.turn.counting): the shorter ones'
    counts only keep the exact/estimate ratio current, so once the process has counted a few texts, a sample of
    them is asked (by hash: the same text, resent, is asked or not alike); the long ones always are."""
    import xxhash

    from memci_proxy.metrics import Metrics
    from memci_proxy.settings import Settings
    from memci_proxy.turn.counting import CALIBRATION_TEXTS, SAMPLE_EVERY, TurnCounts

    counts = TurnCounts(Settings(tokenize_wait_min_chars=2000), MockUpstream(Tokenizer()), Metrics())
    short = [f"A message of a few hundred characters, number {i}. " * 6 for i in range(400)]
    long = ["A pasted document. " * 120]
    assert counts.worth_asking(short + long) == short + long  # nothing counted yet: every text calibrates
    counts.tokenizer.counted = CALIBRATION_TEXTS
    asked = counts.worth_asking(short + long)
    sampled = [t for t in short if xxhash.xxh3_64_intdigest(t.encode()) % SAMPLE_EVERY == 0]
    assert asked == sampled + long
    assert 400 / SAMPLE_EVERY / 2 < len(sampled) < 2 * 400 / SAMPLE_EVERY
    assert counts.worth_asking(short[:50]) == [t for t in short[:50] if t in sampled]  # the same texts, the same


async def test_a_calibrated_process_asks_only_the_sample_of_a_turns_short_texts():
    from turn_fakes import call_of, make_service

    from memci_proxy.turn.counting import CALIBRATION_TEXTS

    prompts: list = []

    def upstream(request: httpx.Request) -> httpx.Response:
        reply = models_or_tokenize(request, prompts)
        if reply is not None:
            return reply
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                      "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 40, "completion_tokens": 1}})

    service = make_service(upstream, tokenize_min_chars=16)
    service.counts.tokenizer.counted = CALIBRATION_TEXTS
    questions = [f"Question {i} of a conversation, with some words in it." for i in range(40)]
    for question in questions:
        await service.handle(call_of([{"role": "user", "content": question}]))
    await asyncio.sleep(0.05)
    asked = [q for q in questions if q in prompts]
    assert asked == service.counts.worth_asking(questions) and 0 < len(asked) < len(questions) / 3
    await service.close()

"""The proxy in front of SGLang itself (tests/e2e/sglang_engine.py: SGLang 0.5.23 on the CPU, RadixAttention,
SmolLM2-135M-Instruct, a 4096-token context learnt from its /v1/models), through the official openai and anthropic
SDKs, the memory workers on.

- A 60-turn chat with a fact stated early and looked up in plain words three turns after the first epoch archived it
  (the proxy pushes a recall round):
  every turn answered, no request over the context, and SGLang's own count of reused prompt tokens (its prefill
  batches, the memory jobs' included) at least 0.97 of the ceiling 1 - 2d/H.
- The same chat streamed, 50 turns (cached tokens in the usage chunk).
- An agent loop with a client tool whose large output is offloaded, and read back by the proxy's recall.
- /v1/responses (a previous_response_id chain) and /v1/messages through the proxy.
- Four conversations interleaved turn by turn: a radix tree keeps all four, each at least 0.95 of its ceiling.

Skipped when SGLang's build script is not there (`../shared/tools/real-sglang.sh`, or MEMCI_REAL_SGLANG_SCRIPT). The
first run builds SGLang (about 7-12 minutes, 7 GB, cached in ~/.cache/memci-real-sglang). Figures are printed (-s).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.e2e.proxyproc import ProxyProcess
from tests.e2e.real_engine import ceiling, reuse_ratio
from tests.e2e.scripted_chat import FACTS, LOOK_UP, TOPICS, metric
from tests.e2e.sglang_engine import MODEL, SGLangServer, build_or_skip, prefill_batches

CONTEXT = 4096
MAX_TOKENS = 24
ADMIN = "admin-sglang"
SYSTEM = "You are a helpful assistant. Answer in one sentence."
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def user_text(turn: int, salt: str = "") -> str:
    if turn in FACTS:
        return FACTS[turn]
    topic = TOPICS[turn % len(TOPICS)]
    return (f"{salt}Turn {turn}: I have been reading about {topic} this week, and I keep wondering how people first "
            f"learnt about {topic}, what the most surprising thing about {topic} is, and where I could see it myself. "
            f"Tell me one short fact about {topic}.")


@dataclass
class Chat:
    """One conversation's turns as the client saw them."""

    messages: list[dict] = field(default_factory=lambda: [{"role": "system", "content": SYSTEM}])
    prompts: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    epochs: list[bool] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    conversation: str = ""

    def hit(self) -> float:
        return sum(self.cached) / sum(self.prompts) if self.prompts else 0.0

    def ceiling(self) -> tuple[float, float, int]:
        return ceiling(self.prompts, self.epochs)

    def summary(self) -> str:
        best, d, h = self.ceiling()
        return (f"{len(self.prompts)} turns, errors {len(self.errors)}, max prompt {max(self.prompts, default=0)}, "
                f"epochs {sum(self.epochs)}, hit {self.hit():.4f}, ceiling {best:.4f} (d {d:.1f}, H {h}), "
                f"ratio {self.hit() / best if best else 0:.4f}")


def turn(client: openai.OpenAI, chat: Chat, text: str | None, stream: bool = False, **extra) -> str:
    """One request of the chat (`text`: the user's message; None: the history already ends with what to answer)."""
    if text is not None:
        chat.messages.append({"role": "user", "content": text})
    try:
        if stream:
            with client.chat.completions.with_streaming_response.create(
                    model=MODEL, messages=chat.messages, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                    stream_options={"include_usage": True}, **extra) as raw:
                headers = raw.headers
                parts, usage = [], None
                for chunk in raw.parse():
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        usage = chunk.usage
            answer = "".join(parts)
        else:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=chat.messages, max_tokens=MAX_TOKENS, temperature=0, **extra)
            headers = raw.headers
            r = raw.parse()
            answer, usage = r.choices[0].message.content or "", r.usage
    except openai.APIError as exc:
        chat.errors.append(f"turn {len(chat.prompts) + 1}: {exc}")
        chat.messages.append({"role": "assistant", "content": "(no answer)"})
        return ""
    assert usage is not None, "no usage"
    chat.conversation = headers["x-memci-conversation-id"]
    chat.messages.append({"role": "assistant", "content": answer})
    chat.prompts.append(usage.prompt_tokens)
    details = usage.prompt_tokens_details
    chat.cached.append((details.cached_tokens or 0) if details else 0)
    chat.epochs.append(headers.get("x-memci-epoch") == "true")
    return answer


@pytest.fixture(scope="module")
def sglang():
    script, directory = build_or_skip()
    home = Path(tempfile.mkdtemp(prefix="memci-sglang-"))
    # room in the radix tree for four conversations and the memory jobs at once
    server = SGLangServer(script, directory, home / "sglang.log", context=CONTEXT,
                          extra=("--max-total-tokens", "40000")).start()
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def proxy(sglang):
    home = Path(tempfile.mkdtemp(prefix="memci-sglang-proxy-"))
    # no MEMCI_CONTEXT_WINDOW: the proxy learns 4096 from SGLang's /v1/models
    p = ProxyProcess(sglang.base_url, home, {"MEMCI_MEMORY_WORKERS": "true", "MEMCI_ADMIN_KEY": ADMIN}).start()
    yield p
    p.stop()
    shutil.rmtree(home, ignore_errors=True)


def client_for(proxy: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="sk-sglang", max_retries=0, timeout=300)


def test_sixty_turns_with_a_pushed_recall_round(sglang, proxy):
    client = client_for(proxy)
    start = len(sglang.log())
    chat = Chat()
    pushed: list[dict] = []
    look_up_turn = 0
    for n in range(1, 61):
        if not look_up_turn and any(chat.epochs) and n >= chat.epochs.index(True) + 4:
            look_up_turn = n  # the fact's page is archived by now: asked in plain words, the proxy pushes it back
        turn(client, chat, LOOK_UP if n == look_up_turn else user_text(n))
        if n == look_up_turn and chat.conversation:
            view = httpx.get(f"{proxy.url}/memci/conversations/{chat.conversation}/prompt",
                             headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).json()
            pushed = view["messages"]
    client.close()
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    batches = prefill_batches(sglang.log()[start:])
    reuse = reuse_ratio(batches)
    best, d, h = chat.ceiling()
    print(f"\nSGLang, context {CONTEXT}: {chat.summary()}; SGLang's prefill batches {len(batches)}, radix reuse "
          f"{reuse:.4f} ({reuse / best:.4f} of the ceiling); summary calls "
          f"{metric(text, 'memci_summary_calls_total')}, pages archived {metric(text, 'memci_pages_archived_total')}, "
          f"tokenize {metric(text, 'memci_tokenize_requests_total')}, memory jobs' prompt tokens "
          f"{metric(text, 'memci_memory_job_prompt_tokens_total')} cached "
          f"{metric(text, 'memci_memory_job_cached_tokens_total')}")
    assert not chat.errors, chat.errors
    assert max(chat.prompts) + MAX_TOKENS <= CONTEXT
    assert sum(chat.epochs) >= 1 and metric(text, "memci_pages_archived_total") >= 1
    assert metric(text, "memci_summary_calls_total") >= 1  # the memory workers ran against SGLang
    # the look-up: the pushed round (an assistant call of recall and its result, holding the fact) went upstream
    assert look_up_turn, "no epoch before turn 57"
    assert [m["role"] for m in pushed[-3:]] == ["user", "assistant", "tool"], pushed[-3:]
    assert "4817" in pushed[-1]["content"]
    assert 'memci_tokenize_requests_total{outcome="ok"}' in text, "SGLang's /tokenize was not used for counts"
    # SGLang's own count, every prefill of the run (turns and memory jobs alike)
    assert reuse >= 0.97 * best, (reuse, best)
    # the memory jobs reuse the conversation's cached prefix, on SGLang's own count
    job_prompt = metric(text, "memci_memory_job_prompt_tokens_total")
    assert job_prompt > 0 and metric(text, "memci_memory_job_cached_tokens_total") >= 0.8 * job_prompt


def test_the_same_chat_streamed(sglang, proxy):
    client = client_for(proxy)
    chat = Chat()
    for n in range(1, 51):
        turn(client, chat, user_text(n, salt="(streamed) "), stream=True)
    client.close()
    best, _, _ = chat.ceiling()
    print(f"\nSGLang streamed: {chat.summary()}")
    assert not chat.errors, chat.errors
    assert max(chat.prompts) + MAX_TOKENS <= CONTEXT
    assert sum(chat.epochs) >= 1
    assert chat.hit() >= 0.95 * best, chat.summary()  # the usage chunk carries SGLang's cached tokens


READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def file_output(n: int, lines: int) -> str:
    return "\n".join(f"{n:03d}.{i:04d} def handler_{n}_{i}(request): return process(request, retries={i % 7})"
                     for i in range(lines))


def test_an_agent_loop_with_a_large_offloaded_output(sglang, proxy):
    client = client_for(proxy)
    chat = Chat(messages=[{"role": "system", "content": "You are a coding agent. Use the tools to read files."}])
    marker = "ZEBRA-4242 the config key is retry_budget"
    for n in range(1, 13):
        chat.messages.append({"role": "user", "content": f"Step {n}: read src/module_{n}.py and say what it does."})
        call = {"id": f"call_{n}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{n}.py"})}}
        chat.messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        output = file_output(n, 30)
        if n == 4:  # one output far over the offload threshold, its marker in the middle
            output = file_output(n, 200) + f"\n{marker}\n" + file_output(n + 100, 200)
        chat.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        turn(client, chat, None, tools=[READ_FILE])
    client.close()
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    export = httpx.get(f"{proxy.url}/memci/conversations/{chat.conversation}/export",
                       headers={"Authorization": "Bearer sk-sglang"}, timeout=30)  # the client's own tenant
    print(f"\nSGLang agent loop: {chat.summary()}; offloaded {metric(text, 'memci_offloaded_outputs_total')}")
    assert not chat.errors, chat.errors
    assert max(chat.prompts) + MAX_TOKENS <= CONTEXT
    assert metric(text, "memci_offloaded_outputs_total") >= 1
    assert export.status_code == 200 and marker in export.text  # the whole output is kept, marker included


def test_responses_and_messages_through_the_proxy(sglang, proxy):
    client = client_for(proxy)
    previous, cached, answers = None, [], []
    for n in range(1, 7):
        r = client.responses.create(model=MODEL, input=user_text(n, salt="(responses) "), max_output_tokens=MAX_TOKENS,
                                    temperature=0, previous_response_id=previous,
                                    instructions=SYSTEM)  # instructions are not carried along the chain
        previous = r.id
        answers.append(r.output_text)
        cached.append(r.usage.input_tokens_details.cached_tokens)
    client.close()
    print(f"\nSGLang through /v1/responses: cached per turn {cached}")
    assert all(isinstance(a, str) for a in answers) and any(answers)
    assert all(c > 0 for c in cached[1:]), cached  # each turn of the chain reuses the one before on SGLang

    claude = anthropic.Anthropic(base_url=proxy.url, api_key="sk-sglang", max_retries=0, timeout=300)
    messages: list[dict] = []
    read = []
    for n in range(1, 7):
        messages.append({"role": "user", "content": user_text(n, salt="(messages) ")})
        m = claude.messages.create(model=MODEL, system=SYSTEM, messages=messages, max_tokens=MAX_TOKENS)
        text = "".join(block.text for block in m.content if block.type == "text")
        messages.append({"role": "assistant", "content": text or "(no answer)"})
        read.append(m.usage.cache_read_input_tokens or 0)
    claude.close()
    print(f"SGLang through /v1/messages: cache reads per turn {read}")
    assert all(r > 0 for r in read[1:]), read


def test_four_conversations_interleaved_each_stay_cached(sglang, proxy):
    client = client_for(proxy)
    chats = [Chat() for _ in range(4)]
    for n in range(1, 25):
        for k, chat in enumerate(chats):
            turn(client, chat, user_text(n, salt=f"(conversation {k}) "))
    client.close()
    for k, chat in enumerate(chats):
        print(f"\nSGLang, conversation {k} of 4 interleaved: {chat.summary()}")
    for chat in chats:
        best, _, _ = chat.ceiling()
        assert not chat.errors, chat.errors
        assert chat.hit() >= 0.95 * best, chat.summary()


def test_a_window_set_too_large_is_learnt_again_from_sglangs_refusal(sglang, tmp_path):
    """The proxy told 8192 in front of SGLang's 4096: SGLang refuses the first prompt that does not fit, in its own
    words; the proxy reads the window again, plans the turn for it and sends it once more."""
    history: list[dict] = [{"role": "system", "content": SYSTEM}]
    for n in range(1, 71):  # about 5,000 tokens
        history += [{"role": "user", "content": user_text(n, salt="(window) ")},
                    {"role": "assistant", "content": f"Here is one short fact about {TOPICS[n % len(TOPICS)]}."}]
    history.append({"role": "user", "content": "And one more fact about owls, please."})
    with_window = ProxyProcess(sglang.base_url, tmp_path, {"MEMCI_CONTEXT_WINDOW": "8192"}).start()
    try:
        client = client_for(with_window)
        r = client.chat.completions.with_raw_response.create(model=MODEL, messages=history, max_tokens=MAX_TOKENS,
                                                             temperature=0)
        client.close()
        text = httpx.get(f"{with_window.url}/metrics", timeout=10).text
        log = with_window.log()
    finally:
        with_window.stop()
    usage = r.parse().usage
    print(f"\nSGLang refused a prompt for an 8192 window; resent with {usage.prompt_tokens} prompt tokens")
    assert r.http_response.status_code == 200 and usage.prompt_tokens + MAX_TOKENS <= CONTEXT
    assert metric(text, 'memci_turn_resends_total{why="window"}') == 1
    assert "its context window is now 4096 tokens" in log

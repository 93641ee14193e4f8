"""Conversation workloads for the cache benchmark and the load tests, deterministic by seed.

A workload is a system prompt, optional tools and a list of user turns. Each turn is one user message
(with emulator markers: ``[[len:N]]`` for the answer length, ``[[say:TEXT]]`` for a scripted answer,
``[[call:NAME {json}]]`` for a tool call) and, for agent turns, the results the client gives to the
tool calls the turn triggers, in order; each result but the last starts with the marker of the next call,
so the emulator keeps calling tools until the results run out.

Kinds:

* ``chat``: short English user turns, longer answers (80-220 tokens), with recall probes: a fact is
  stated early (a made-up value) and asked for much later. The probe's value must be visible to the
  model on the turn that asks (the benchmark checks the upstream prompts of that turn).
* ``chat-zh``: the same in Chinese; the answers are scripted Chinese text (``[[say:...]]``), so the
  prompt really is Chinese (one token per character, which a chars/4 estimate undercounts).
* ``agent``: one user turn, then many tool calls with large outputs (file contents, logs, search hits).
* ``agent-large``: the same with huge outputs, 5-50k tokens each (whole build logs with compiler errors and
  tracebacks, long files, search results): what first-sight offload is for.
* ``images``: the ``chat`` workload with a screenshot attached to every other user turn (a ``data:`` PNG URI,
  12 distinct images, so some come back): what a vision chat sends. Its hit rate next to ``chat``'s says
  whether images cost the prefix cache anything (an image's token count is the upstream's, not the text's).
* ``replay``: the dated dialogues of MemoryBank (``../shared/eval``) one after the other, the recorded
  user words as user turns and answers of the recorded answers' length; absent data -> ``None``.

The recall probes carry a ``[[call:recall {"query": ...}]]`` marker: it only acts when the request lists a
``recall`` tool (the proxy's own tool), so the same text serves every strategy.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from dataclasses import dataclass, field

__all__ = ["Turn", "Workload", "KINDS", "make_workload", "chat", "chat_zh", "images", "agent", "agent_fixed", "agent_large", "replay",
           "AGENT_TOOLS", "user_content"]


@dataclass(frozen=True)
class Turn:
    user: str
    tool_results: tuple[str, ...] = ()
    probe: str | None = None  # a value the model must be able to see on this turn (recall)
    images: tuple[str, ...] = ()  # image URIs sent after the text, as image_url parts


def user_content(turn: Turn) -> str | list[dict]:
    """The user message's content: the text, or text and image parts when the turn has images."""
    if not turn.images:
        return turn.user
    return [{"type": "text", "text": turn.user},
            *({"type": "image_url", "image_url": {"url": uri}} for uri in turn.images)]


@dataclass(frozen=True)
class Workload:
    name: str
    system: str
    turns: tuple[Turn, ...]
    tools: tuple[dict, ...] = ()
    max_tokens: int = 256
    notes: str = ""
    probes: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "probes", sum(t.probe is not None for t in self.turns))

    @property
    def requests(self) -> int:
        """Upstream requests a plain client makes: one per user turn plus one per tool result."""
        return sum(1 + len(t.tool_results) for t in self.turns)


# --- chat (English) -----------------------------------------------------------------------------
_EN_TOPICS = (
    "the garden irrigation plan", "my sourdough starter", "the quarterly budget", "a trip to Lisbon",
    "learning the cello", "the kitchen renovation", "our team's on-call rota", "a birthday party for Ana",
    "the marathon training schedule", "a short story about a lighthouse", "the rust borrow checker",
    "database indexes", "the history of tea", "saving for a house", "the book club's next pick",
    "a job interview next week", "migrating photos to a new laptop", "the neighbourhood cleanup",
)
_EN_ASKS = (
    "Can you explain {t} in a bit more detail?", "What would you suggest next for {t}?",
    "I am still unsure about {t}. Any advice?", "Give me three ideas about {t}.",
    "How should I think about {t} this week?", "Could you summarise what matters most for {t}?",
    "What are common mistakes with {t}?", "Let's continue with {t}. What comes after that?",
)
_EN_FACTS = (
    ("locker code", "the code of my gym locker"), ("wifi password", "the password of the cabin wifi"),
    ("flight number", "the number of my flight to Oslo"), ("dentist", "the name of my new dentist"),
    ("bike lock", "the combination of my bike lock"), ("parking spot", "where I parked at the airport"),
    ("library card", "my library card number"), ("cat's vet", "the name of my cat's vet"),
)


def _secret(rng: random.Random) -> str:
    return f"{rng.choice('BCDFGHKMNPRTVWXZ')}{rng.randint(10, 99)}-{rng.choice(_WORDS)}-{rng.randint(1000, 9999)}"


_WORDS = ("mango", "cobalt", "juniper", "falcon", "quartz", "saffron", "harbor", "velvet", "tundra", "ember")


def _plan_probes(rng: random.Random, turns: int, count: int) -> dict[int, tuple[int, int]]:
    """fact index -> (turn stated, turn asked); asked at least a third of the conversation later."""
    if turns < 12:
        return {}
    plan: dict[int, tuple[int, int]] = {}
    gap = max(4, turns // 3)
    for i in range(count):
        said = rng.randint(1, max(1, turns - gap - 2))
        asked = rng.randint(min(turns - 2, said + gap), turns - 1)
        if all(said not in pair and asked not in pair for pair in plan.values()):
            plan[i] = (said, asked)
    return plan



def _probe_schedule(
    rng: random.Random, turns: int, pool: tuple[tuple[str, str], ...], probes: int
) -> tuple[list[tuple[str, str]], dict[int, int], dict[int, int], dict[int, str]]:
    """Facts to state and ask back later: (facts, turn said -> fact, turn asked -> fact, fact -> secret)."""
    facts = rng.sample(pool, k=min(probes, len(pool)))
    plan = _plan_probes(rng, turns, len(facts))
    said = {s: i for i, (s, _) in plan.items()}
    asked = {a: i for i, (_, a) in plan.items()}
    secrets = {i: _secret(rng) for i in plan}
    return facts, said, asked, secrets

def chat(turns: int = 300, seed: int = 0, probes: int = 6) -> Workload:
    rng = random.Random(f"chat:{seed}")
    facts, said, asked, secrets = _probe_schedule(rng, turns, _EN_FACTS, probes)
    out: list[Turn] = []
    for n in range(turns):
        length = rng.randint(80, 220)
        if n in said:
            i = said[n]
            key, phrase = facts[i]
            out.append(Turn(f"Please remember this for later: {phrase} ({key}) is {secrets[i]}. [[len:{length}]]"))
        elif n in asked:
            i = asked[n]
            key, phrase = facts[i]
            marker = json.dumps({"query": key})
            out.append(Turn(f"Earlier I told you {phrase}. What was it? [[call:recall {marker}]] [[len:{length}]]",
                            probe=secrets[i]))
        else:
            ask = rng.choice(_EN_ASKS).format(t=rng.choice(_EN_TOPICS))
            out.append(Turn(f"{ask} [[len:{length}]]"))
    return Workload("chat", "You are a helpful, friendly assistant. Answer clearly.", tuple(out),
                    notes="English chat; recall probes")


# --- chat with images ---------------------------------------------------------------------------
def _image_uri(i: int) -> str:
    data = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(f"bench-image:{i}".encode()).digest() * 40
    return "data:image/png;base64," + base64.b64encode(data).decode()


def images(turns: int = 300, seed: int = 0, probes: int = 6, distinct: int = 12) -> Workload:
    """``chat`` with a screenshot on every other user turn (``distinct`` images in turn, so they come back)."""
    rng = random.Random(f"images:{seed}")
    base = chat(turns, seed, probes)
    out = []
    for n, turn in enumerate(base.turns):
        if n % 2 == 0 and turn.probe is None:
            text = "Here is a screenshot. " + turn.user
            turn = Turn(text, turn.tool_results, turn.probe, (_image_uri(rng.randrange(distinct)),))
        out.append(turn)
    return Workload("images", "You are a helpful, friendly assistant. You can see screenshots. Answer clearly.",
                    tuple(out), notes=f"English chat, an image every other turn ({distinct} distinct); recall probes")


# --- chat (Chinese) -----------------------------------------------------------------------------
_ZH_TOPICS = ("花园的浇水计划", "我的酸面包酵种", "季度预算", "去里斯本的旅行", "学大提琴", "厨房装修", "团队值班表",
              "马拉松训练计划", "关于灯塔的短篇小说", "数据库索引", "茶的历史", "买房存钱", "读书会的下一本书", "下周的面试")
_ZH_ASKS = ("能再详细讲讲{t}吗？", "关于{t}，下一步你有什么建议？", "我对{t}还是不太确定，有什么建议？",
            "给我三个关于{t}的想法。", "这周我该怎么考虑{t}？", "能总结一下{t}最重要的是什么吗？", "{t}常见的错误有哪些？")
_ZH_FACTS = (("储物柜密码", "我健身房储物柜的密码"), ("无线网密码", "小木屋的无线网密码"), ("航班号", "我去奥斯陆的航班号"),
             ("牙医", "我新牙医的名字"), ("车锁密码", "我自行车锁的密码"), ("停车位", "我在机场停车的位置"))
_ZH_SENTENCES = ("这个问题可以从几个方面来看。", "首先要明确目标和限制条件。", "其次，把任务拆成小步骤会更容易推进。",
                 "每一步都要留出检查和调整的时间。", "如果遇到困难，可以先记录下来再回头处理。", "坚持记录进展会让你更有信心。",
                 "另外，和身边的人交流经验也很有帮助。", "最后，别忘了适当休息，保持节奏。", "这样安排之后，整体会清楚很多。",
                 "你也可以根据实际情况灵活调整计划。", "重要的是找到适合自己的方法。", "可以先从最简单的部分开始尝试。")


def _zh_answer(rng: random.Random, chars: int) -> str:
    text = ""
    while len(text) < chars:
        text += rng.choice(_ZH_SENTENCES)
    return text.replace("]", "")


def chat_zh(turns: int = 300, seed: int = 0, probes: int = 6) -> Workload:
    rng = random.Random(f"chat-zh:{seed}")
    facts, said, asked, secrets = _probe_schedule(rng, turns, _ZH_FACTS, probes)
    out: list[Turn] = []
    for n in range(turns):
        answer = _zh_answer(rng, rng.randint(60, 160))
        if n in said:
            key, phrase = facts[said[n]]
            out.append(Turn(f"请记住：{phrase}（{key}）是 {secrets[said[n]]}。[[say:好的，我记住了。{answer}]]"))
        elif n in asked:
            key, phrase = facts[asked[n]]
            marker = json.dumps({"query": key}, ensure_ascii=False)
            out.append(Turn(f"我之前告诉过你{phrase}，是什么来着？[[call:recall {marker}]][[say:{answer}]]",
                            probe=secrets[asked[n]]))
        else:
            out.append(Turn(rng.choice(_ZH_ASKS).format(t=rng.choice(_ZH_TOPICS)) + f"[[say:{answer}]]"))
    return Workload("chat-zh", "你是一个友好、耐心的助手，请用中文清楚地回答。", tuple(out),
                    notes="Chinese chat; scripted Chinese answers; recall probes")


# --- agent --------------------------------------------------------------------------------------
def _tool(name: str, description: str, **params: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
        "required": list(params)}}}


AGENT_TOOLS: tuple[dict, ...] = (
    _tool("read_file", "Read a file of the repository.", path="path relative to the repository root"),
    _tool("run_shell", "Run a shell command in the repository and return its output.", cmd="the command line"),
    _tool("search_code", "Search the repository for a regular expression.", pattern="the regular expression"),
    _tool("write_file", "Replace a file's content.", path="path relative to the repository root", content="new content"),
)

_IDENT = ("parse", "load", "render", "merge", "split", "update", "resolve", "index", "flush", "encode", "decode", "plan")
_NOUN = ("config", "page", "token", "entry", "chapter", "buffer", "session", "record", "query", "budget", "cache")


def _file_text(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        fn = f"{rng.choice(_IDENT)}_{rng.choice(_NOUN)}"
        block = (f"def {fn}(items: list[dict], limit: int = {rng.randint(2, 512)}) -> list[dict]:\n"
                 f"    \"\"\"{fn.replace('_', ' ').capitalize()} for the {rng.choice(_NOUN)} layer.\"\"\"\n"
                 f"    out = [x for x in items if x.get('{rng.choice(_NOUN)}') is not None]\n"
                 f"    return sorted(out, key=lambda x: x['{rng.choice(_NOUN)}'])[:limit]\n\n")
        lines.append(block)
        size += len(block)
    return "".join(lines)


def _log_text(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        mod = f"tests/test_{rng.choice(_NOUN)}.py::test_{rng.choice(_IDENT)}_{rng.randint(1, 99)}"
        status = rng.choice(("PASSED", "PASSED", "PASSED", "FAILED", "SKIPPED"))
        line = f"{mod} {status} [{rng.randint(1, 99):>3}%]\n"
        if status == "FAILED":
            line += f"E   AssertionError: expected {rng.randint(0, 999)} got {rng.randint(0, 999)}\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)


def _next_call(rng: random.Random) -> str:
    kind = rng.choice(("read_file", "read_file", "run_shell", "search_code"))
    if kind == "read_file":
        args = {"path": f"src/{rng.choice(_NOUN)}/{rng.choice(_IDENT)}.py"}
    elif kind == "run_shell":
        args = {"cmd": f"pytest -x tests/test_{rng.choice(_NOUN)}.py"}
    else:
        args = {"pattern": f"def {rng.choice(_IDENT)}_"}
    return f"[[call:{kind} {json.dumps(args)}]]"


def agent(turns: int = 120, seed: int = 0, output_chars: tuple[int, int] = (1500, 6000)) -> Workload:
    """One user turn followed by ``turns - 1`` tool calls (``turns`` upstream requests in all)."""
    rng = random.Random(f"agent:{seed}")
    calls = max(0, turns - 1)
    results: list[str] = []
    for i in range(calls):
        size = rng.randint(*output_chars)
        body = _file_text(rng, size) if rng.random() < 0.6 else _log_text(rng, size)
        # the next call's marker leads the output, so trimming or condensing the output keeps the loop going
        results.append((_next_call(rng) + "\n" if i < calls - 1 else "All tests pass now.\n") + body)
    first = "The test suite fails after the refactor. Find the cause and fix it. " + _next_call(rng)
    return Workload("agent", "You are a coding agent. Use the tools to inspect and change the repository.",
                    (Turn(first, tuple(results)),), tools=AGENT_TOOLS,
                    notes=f"1 user turn, {calls} tool calls, outputs {output_chars[0]}-{output_chars[1]} chars")


def _fixed_tools(rng: random.Random, tokens: int) -> tuple[dict, ...]:
    """The agent's tools and as many more as make about ``tokens`` tokens of definitions (a coding agent's 9k)."""
    tools = list(AGENT_TOOLS)
    while estimate_json_tokens(tools) < tokens:
        verb, noun = rng.choice(_IDENT), rng.choice(_NOUN)
        detail = " ".join(f"It {rng.choice(_IDENT)}s each {rng.choice(_NOUN)} of the {rng.choice(_NOUN)} layer."
                          for _ in range(6))
        tools.append(_tool(f"{verb}_{noun}_{len(tools)}", f"{verb.capitalize()} a {noun}. {detail}",
                           target=f"the {noun} to {verb}", options=f"how to {verb} it ({rng.choice(_NOUN)}s too)"))
    return tuple(tools)


def estimate_json_tokens(value: object) -> int:
    """Tokens as the emulator counts them (its tokenizer splits words and punctuation apart)."""
    from memci_proxy.emulator.tokenizer import Tokenizer

    return Tokenizer().count(value if isinstance(value, str) else json.dumps(value))


def agent_fixed(turns: int = 160, seed: int = 0, output_chars: tuple[int, int] = (1500, 6000),
                system_tokens: int = 6000, tool_tokens: int = 9000) -> Workload:
    """The agent loop with a coding agent's fixed part: a system prompt of about ``system_tokens`` tokens and tool
    definitions of about ``tool_tokens`` (15k in all, as Codex sends), which every epoch must keep cached."""
    base = agent(turns, seed, output_chars)
    rng = random.Random(f"agent-fixed:{seed}")
    rules = []
    while estimate_json_tokens("\n".join(rules)) < system_tokens:
        rules.append(f"- When you {rng.choice(_IDENT)} a {rng.choice(_NOUN)}, check the {rng.choice(_NOUN)} first "
                     f"and keep the {rng.choice(_NOUN)} of rule {len(rules)} unchanged.")
    system = base.system + "\n\n# Rules\n" + "\n".join(rules)
    return Workload("agent-fixed", system, base.turns, tools=_fixed_tools(rng, tool_tokens),
                    notes=base.notes + f", fixed part ~{system_tokens + tool_tokens} tokens ({tool_tokens} of tools)")


def _lines_until(chars: int, make_line) -> list[str]:
    """Lines from ``make_line()`` until they hold ``chars`` characters (newlines counted)."""
    lines: list[str] = []
    size = 0
    while size < chars:
        lines.append(make_line())
        size += len(lines[-1]) + 1
    return lines


def _build_log(rng: random.Random, chars: int) -> str:
    """A build and test log: compile lines, a few compiler errors, a traceback, the test summary at the end."""
    def line() -> str:
        roll = rng.random()
        unit = f"src/{rng.choice(_NOUN)}/{rng.choice(_IDENT)}_{rng.randint(1, 400)}.c"
        if roll < 0.01:
            return f"{unit}:{rng.randint(1, 900)}:{rng.randint(1, 80)}: error: '{rng.choice(_NOUN)}' undeclared"
        if roll < 0.015:
            return ("Traceback (most recent call last):\n  File \"tools/gen.py\", line 88, in <module>\n"
                    f"    main()\nKeyError: '{rng.choice(_NOUN)}'")
        if roll < 0.03:
            return f"{unit}:{rng.randint(1, 900)}: warning: unused variable '{rng.choice(_IDENT)}'"
        return f"[{rng.randint(1, 999):>3}/999] CC {unit} -O2 -Wall -fPIC -o build/{rng.randint(1, 99999)}.o"

    lines = _lines_until(chars, line)
    failed = rng.randint(0, 4)
    lines.append(f"==== {rng.randint(200, 900)} passed, {failed} failed in {rng.randint(10, 300)}.{rng.randint(0, 99)}s ====")
    return "\n".join(lines) + "\n"


def _search_text(rng: random.Random, chars: int) -> str:
    """grep-style search results: path:line: matching text."""
    def line() -> str:
        fn = f"{rng.choice(_IDENT)}_{rng.choice(_NOUN)}"
        return (f"src/{rng.choice(_NOUN)}/{rng.choice(_IDENT)}.py:{rng.randint(1, 2000)}:    "
                f"result = {fn}(items, limit={rng.randint(1, 512)})  # {rng.choice(_NOUN)}")

    return "\n".join(_lines_until(chars, line)) + "\n"


def agent_large(turns: int = 40, seed: int = 0, output_tokens: tuple[int, int] = (5_000, 50_000)) -> Workload:
    """One user turn followed by ``turns - 1`` tool calls whose outputs are 5-50k tokens (about 4 characters each):
    build logs, file reads, search results."""
    rng = random.Random(f"agent-large:{seed}")
    calls = max(0, turns - 1)
    results: list[str] = []
    for i in range(calls):
        size = 4 * rng.randint(*output_tokens)
        kind = rng.random()
        body = _build_log(rng, size) if kind < 0.4 else _file_text(rng, size) if kind < 0.75 else _search_text(rng, size)
        results.append((_next_call(rng) + "\n" if i < calls - 1 else "All tests pass now.\n") + body)
    first = "The build breaks after the upgrade. Find out why and fix it. " + _next_call(rng)
    return Workload("agent-large", "You are a coding agent. Use the tools to inspect and change the repository.",
                    (Turn(first, tuple(results)),), tools=AGENT_TOOLS,
                    notes=f"1 user turn, {calls} tool calls, outputs {output_tokens[0]:,}-{output_tokens[1]:,} tokens")


# --- replay of real dialogues -------------------------------------------------------------------
def replay(turns: int = 300, seed: int = 0) -> Workload | None:
    """MemoryBank's dated dialogues, user after user, as one long conversation (None when absent)."""
    try:
        from loadtests.evals.evaldata import load_memorybank
    except ImportError:  # run from another directory without the repository on the path
        return None
    users = load_memorybank()
    if not users:
        return None
    rng = random.Random(f"replay:{seed}")
    order = list(users)
    rng.shuffle(order)
    out: list[Turn] = []
    for user in order:
        for ex in user.exchanges:
            if len(out) >= turns:
                break
            length = max(16, min(400, int(len(ex.response.split()) * 1.6)))
            query = ex.query.replace("[[", "[ [")
            out.append(Turn(f"[{ex.date}] {query} [[len:{length}]]"))
    return Workload("replay", "You are an AI companion with a long memory of the user's life.", tuple(out),
                    notes="MemoryBank dialogues replayed (user words recorded, answers of recorded length)")


KINDS = ("chat", "chat-zh", "images", "agent", "agent-fixed", "agent-large", "replay")


def make_workload(kind: str, turns: int | None = None, seed: int = 0,
                  agent_output_chars: tuple[int, int] | None = None) -> Workload | None:
    """A workload by name; ``turns`` None takes each kind's default. None for replay without its data."""
    makers = {"chat": chat, "chat-zh": chat_zh, "images": images, "agent": agent, "agent-fixed": agent_fixed,
              "agent-large": agent_large,
              "replay": replay}
    if kind not in makers:
        raise ValueError(f"unknown workload {kind!r}; choose from {', '.join(KINDS)}")
    kw: dict = {"seed": seed} if turns is None else {"seed": seed, "turns": turns}
    if kind in ("agent", "agent-fixed") and agent_output_chars:
        kw["output_chars"] = agent_output_chars
    return makers[kind](**kw)

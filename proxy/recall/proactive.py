"""Proactive recall, the cache-neutral push (pure, no I/O).

When the user's latest message looks up something said earlier that the active pages no longer hold and the
archive does, the proxy runs one recall round itself before the model answers. The round is shaped as if the
model had called the tool (``assistant(tool_call recall{query})`` + ``tool(result)``) and is kept as hidden
messages: later turns splice it back byte for byte, so the next turn's prefix is unchanged and the push costs
no cache miss (unlike B5 injection, a per-turn block next to the latest message).

* ``is_look_up(text)``: the message asks about an earlier thing ("what did I tell you about…", "remind me…",
  "what was the … we …", "when did…", Chinese equivalents). Ordinary questions do not fire (tested against the
  chat and chat-zh workloads of the benchmark).
* ``content_words(text)``: the look-up without its phrasing, what the search looks for.
* ``missing_terms(query, active_texts)``: the query's keywords the active pages never mention.
* ``decide(look_up, missing, hits, floor)``: fire only on a look-up whose words are not all in the prompt and
  whose best archive hit scores at least ``floor`` (BM25).
* ``push_call(name, query, salt)`` and ``recall_round(call, result)``: the two messages, with a call id derived
  from the salt and the query, so that the same push renders the same bytes wherever it is rebuilt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from proxy.recall.rounds import ToolCall, assistant_call_message, tool_result_message
from proxy.recall.text import keywords, tokenize

__all__ = ["DEFAULT_MIN_SCORE", "Decision", "call_id", "content_words", "decide", "is_look_up", "missing_terms", "push_call", "push_query",
           "recall_round"]

DEFAULT_MIN_SCORE = 1.0  # BM25 score of the best hit (seed 001's floor is 0.2: too weak to act on unasked)
QUERY_TERMS = 6
MAX_LOOK_UP_CHARS = 2000  # a look-up is a question; long pasted text is not read through

_SPEECH = (r"(?:say|said|tell|told|mention(?:ed)?|ask(?:ed)?|write|wrote|share[sd]?|give|gave|decide[sd]?|agree[sd]?|"
           r"discuss(?:ed)?|talk(?:ed)?|pick(?:ed)?|choose|chose|suggest(?:ed)?|recommend(?:ed)?|name[sd]?|call(?:ed)?|"
           r"plan(?:ned)?|book(?:ed)?|buy|bought|set|put|park(?:ed)?|settle[sd]?|note[sd]?|store[sd]?)")
_EN = re.compile(
    r"\b(?:what|which|where|who|whom|how\s+(?:much|many|long|old))\b[^.?!\n]{0,60}?\b(?:did|have|had)\s+"
    r"(?:i|we|you)\s+(?:ever\s+|already\s+|just\s+|once\s+)?" + _SPEECH + r"\b"
    r"|\bremind\s+me\b"
    r"|\b(?:do|did|can|could)\s+you\s+(?:still\s+)?(?:remember|recall)\b"
    r"|\b(?:did|have)\s+(?:i|we)\s+(?:ever\s+|already\s+)?(?:tell|told|mention(?:ed)?|say|said|share[sd]?)\b"
    r"[^.!\n]{0,80}?\?"
    r"|\bwhat\s+(?:was|were)\s+(?:the|that|those|my|our|your|it|they|its)\b[^.?!\n]{0,60}?\b(?:i|we|you)\s+"
    r"(?:had\s+|have\s+|once\s+)?(?:said|told|mentioned|talked|discussed|decided|agreed|picked|chose|named|called|"
    r"used|planned|booked|bought|set|gave|shared|suggested|recommended|settled|noted)\b"
    r"|\bwhen\s+did\s+(?:i|we|you)\b"
    r"|\b(?:earlier|previously|last\s+time|the\s+other\s+day|a\s+while\s+ago)\b[^?\n]{0,120}\?"
    r"|\bwhat\s+was\s+(?:it|that)\s+again\b"
    # a statement about the past, then the question: "I recommended a film before, what was it?"
    r"|\b(?:i|you|we)\s+(?:once\s+|recently\s+|previously\s+|already\s+)?(?:recommended|shared|mentioned|suggested|"
    r"told|showed|sent|gave)\b[^?\n]{0,120}?\b(?:what|which|who|where|when)\b[^?\n]{0,60}\?"
    r"|\b(?:before|earlier|once|previously|last\s+(?:week|month|year|time)|on\s+(?:jan|feb|mar|apr|may|jun|jul|aug|"
    r"sep|oct|nov|dec)[a-z]*\.?\s+\d{1,2}(?:st|nd|rd|th)?)\b[^?\n]{0,120}?\b(?:what|which|who|where|how\s+long|"
    r"how\s+many|how\s+much)\b[^?\n]{0,60}\?"
    # what the user likes, as only the conversation can tell: "what kind of cuisine do I like?"
    r"|\b(?:what|which)\b[^?.\n]{0,40}\bdo\s+i\s+(?:like|love|prefer|enjoy|hate|dislike|usually)\b"
    r"|\bi\s+(?:don't|do\s+not|didn't|did\s+not)\b[^?\n]{0,60},\s*right\?",
)  # matched against the lowered text: twice as fast as re.IGNORECASE
_ZH_WHO = r"(?:我|我们|咱们|你)"
_ZH_WHEN = r"(?:之前|以前|上次|上回|刚才|早些时候|曾经|那天|前几天|当时)"
_ZH_SAY = r"(?:说|讲|提|告诉|问|聊|讨论|谈|定|选|约|订|买|记)"
_ZH_ASK = r"(?:吗|么|什么|啥|哪|多少|几|谁|来着|？|\?)"
_ZH = re.compile(
    _ZH_WHO + _ZH_WHEN + r"?[^。！？\n]{0,12}?" + _ZH_SAY + r"(?:过|了)[^。！\n]{0,40}?" + _ZH_ASK
    + r"|提醒(?:我|一下)"
    + r"|(?:还)?记(?:得|不记得)[^。！\n]{0,40}?" + _ZH_ASK
    + r"|什么时候[^。！？\n]{0,20}?(?:过|的)"
    + r"|" + _ZH_WHEN + r"[^。！\n]{0,40}?(?:什么|啥|哪|多少|几|谁|来着)"
    + r"|来着"
)


def is_look_up(text: str) -> bool:
    """Whether the message asks about something said or decided earlier in the conversation."""
    if not text:
        return False
    head = text[:MAX_LOOK_UP_CHARS]
    return bool(_EN.search(head.lower()) or (not head.isascii() and _ZH.search(head)))


_PHRASING = re.compile(
    r"\b(?:remind|remember|recall|told|tell|said|say|mention(?:ed)?|earlier|before|previously|again|once|ago|last\s+time|"
    r"asked|ask|shared|share|recommended|recommend|suggested|suggest|did|do|does|you|what|was|were|which|who|when|"
    r"right)\b"
    r"|之前|以前|上次|上回|刚才|早些时候|曾经|告诉过?你?|跟你说过|说过|讲过|提过|提到过|提醒我?|一下|还记得|记不记得|记得|来着|"
    r"是什么|是哪|什么时候|什么|吗|呢",
    re.IGNORECASE,
)


def content_words(text: str) -> str:
    """The look-up without its phrasing ("what did I tell you about…", 我之前告诉过你…来着): what it is about. The
    phrasing would match every earlier look-up instead of the page that answers it."""
    return _PHRASING.sub(" ", text[:MAX_LOOK_UP_CHARS])


def missing_terms(query: str, active_texts: Iterable[str], top: int = QUERY_TERMS) -> list[str]:
    """Keywords of ``query`` (seed 001: top ``top``, stop words removed) that none of ``active_texts`` mentions."""
    wanted = keywords(query, top=top)
    if not wanted:
        return []
    seen: set[str] = set()
    for text in active_texts:
        seen.update(tokenize(text))
    return [word for word in wanted if not set(tokenize(word)) <= seen]


def push_query(missing: Sequence[str]) -> str:
    """The recall query the push shows the model: the missing keywords, in order."""
    return " ".join(missing)


@dataclass(frozen=True)
class Decision:
    push: bool
    reason: str  # "pushed" | "not_look_up" | "in_prompt" | "no_hits" | "below_floor"


def decide(look_up: bool, missing: Sequence[str], hits: Sequence[tuple[str, float]],
           floor: float = DEFAULT_MIN_SCORE) -> Decision:
    """Push only on a look-up the active pages cannot answer (some keyword is missing from them) and the archive
    can (its best hit scores at least ``floor``)."""
    if not look_up:
        return Decision(False, "not_look_up")
    if not missing:
        return Decision(False, "in_prompt")
    if not hits:
        return Decision(False, "no_hits")
    if max(score for _, score in hits) < floor:
        return Decision(False, "below_floor")
    return Decision(True, "pushed")


def call_id(salt: str, query: str) -> str:
    """A deterministic tool-call id (OpenAI-style ``call_`` + 24 hex digits)."""
    return "call_" + xxhash.xxh3_128_hexdigest(f"memci-push\0{salt}\0{query}".encode("utf-8", "surrogatepass"))[:24]


def push_call(name: str, query: str, salt: str) -> ToolCall:
    """The recall call the push makes in the model's place, with a deterministic id."""
    return ToolCall(call_id(salt, query), name, json.dumps({"query": query}, ensure_ascii=False))


def recall_round(call: ToolCall, result: str) -> list[dict[str, Any]]:
    """``assistant(tool_call recall{query})`` and ``tool(result)``, as a model-called recall exchange is kept."""
    return [assistant_call_message(None, [call]), tool_result_message(call, result)]

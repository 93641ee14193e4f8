"""Proactive recall, the cache-neutral push: its shape and its phrasing signal (pure, no I/O).

Whether a turn gets a push is weighed by memci_proxy.recall.push.salience (the message's specific terms against the
archive); this module shapes the round. When the proxy pushes, it runs one recall round itself before the model
answers. The round is shaped as if the model had called the tool (``assistant(tool_call recall{query})`` +
``tool(result)``) and is kept as hidden messages: later turns splice it back byte for byte, so the next turn's
prefix is unchanged and the push costs no cache miss (unlike B5 injection, a per-turn block next to the latest
message).

* ``is_look_up(text)``: the message asks about an earlier thing ("what did I tell you about…", "remind me…",
  "what was the … we …", "when did…", Chinese equivalents). A confidence signal only: it lowers the match the
  archive must show (memci_proxy.recall.push.salience.verdict), it is not the gate.
* ``search_words(text)``: the message's words worth searching for (stop words and punctuation out), as the query
  the pushed round shows the model.
* ``missing_terms(query, active_texts)``: the query's keywords the active pages never mention (memory injection).
* ``push_call(name, query, salt)`` and ``recall_round(call, result)``: the two messages, with a call id derived
  from the salt and the query, so that the same push renders the same bytes wherever it is rebuilt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Set
from typing import Any

import xxhash

from memci_proxy.recall.tool.rounds import ToolCall, assistant_call_message, tool_result_message
from memci_proxy.recall.lexical.text import CJK_CHAR, keywords, tokenize

__all__ = ["LOOK_UP_TERMS", "asks_about_reply", "call_id", "has_cjk", "is_look_up", "missing_terms", "push_call",
           "recall_round", "search_words"]

QUERY_TERMS = 6
QUERY_WORDS = 16
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


_ABOUT_REPLY = re.compile(
    r"\bdid\s+you\s+(?:ever\s+)?(?:say|mention|recommend|suggest|tell|give|write|create|list|explain|provide|share|"
    r"propose|describe|name|make|compose|draft|offer|come\s+up\s+with)\b"
    r"|\byou\s+(?:had\s+|have\s+|once\s+|just\s+|previously\s+|earlier\s+)?(?:said|mentioned|recommended|suggested|"
    r"told|gave|wrote|created|listed|explained|provided|shared|proposed|described|named|made|composed|drafted|offered|"
    r"came\s+up\s+with)\b"
    r"|\byour\s+(?:answer|reply|response|suggestion|recommendation|list|advice|explanation|story|poem|song)s?\b"
    r"|你(?:之前|上次|刚才|以前)?(?:说|提到|推荐|建议|讲|给|写|列|提|创作|编)(?:过|了|的)")


def asks_about_reply(text: str) -> bool:
    """Whether the message asks about what the assistant said ("how many eggs did you say?", "the two companies you
    mentioned", 你之前推荐的那本书): its answer is in the replies more than in the user's own words."""
    head = text[:MAX_LOOK_UP_CHARS]
    return bool(_ABOUT_REPLY.search(head.lower()) or (not head.isascii() and _ABOUT_REPLY.search(head)))


def is_look_up(text: str) -> bool:
    """Whether the message asks about something said or decided earlier in the conversation."""
    if not text:
        return False
    head = text[:MAX_LOOK_UP_CHARS]
    return bool(_EN.search(head.lower()) or (not head.isascii() and _ZH.search(head)))


_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+|[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+(?:['’.,-][^\W_]+)*")


def search_words(text: str, most: int = QUERY_WORDS, wanted: Set[str] | None = None,
                 skip: Set[str] = frozenset()) -> str:
    """The words of ``text`` that the search can use (each yields a search term: stop words and punctuation out),
    each once, in order, at most ``most``: "What's my gym locker code?" -> "gym locker code". ``wanted``: only the
    words (a Chinese or Japanese run counts as one) holding one of these search terms; ``skip``: not the words
    whose terms are all among these."""
    words: list[str] = []
    seen: set[str] = set()
    for match in _WORD.finditer(text[:MAX_LOOK_UP_CHARS]):
        word = match.group()
        terms = tokenize(word) if word.casefold() not in seen else []
        if not terms or (wanted is not None and wanted.isdisjoint(terms)) or (skip and skip.issuperset(terms)):
            continue
        seen.add(word.casefold())
        words.append(word)
        if len(words) >= most:
            break
    return " ".join(words)


# The words of a look-up phrase ("earlier I told you…", "remind me", "我之前告诉过你…来着"): they say that the message
# asks back, not about what, and find an earlier question put the same way before the page that answers it; a pushed
# round's search gives them no weight (a Chinese word's characters alone are left alone: they are other words too)
LOOK_UP_TERMS = frozenset(term for term in tokenize(
    "earlier told tell said say mention remind remember recall conversation discuss talk "
    "之前 以前 上次 告诉 说过 提过 提到 记得 来着 提醒") if len(term) > 1 or term.isascii())


def has_cjk(text: str) -> bool:
    """Whether the message's head holds Chinese or Japanese characters."""
    return CJK_CHAR.search(text[:MAX_LOOK_UP_CHARS]) is not None


def missing_terms(query: str, active_texts: Iterable[str], top: int = QUERY_TERMS) -> list[str]:
    """Keywords of ``query`` (seed 001: top ``top``, stop words removed) that none of ``active_texts`` mentions."""
    wanted = keywords(query, top=top)
    if not wanted:
        return []
    seen: set[str] = set()
    for text in active_texts:
        seen.update(tokenize(text))
    return [word for word in wanted if not set(tokenize(word)) <= seen]


def call_id(salt: str, query: str) -> str:
    """A deterministic tool-call id (OpenAI-style ``call_`` + 24 hex digits)."""
    return "call_" + xxhash.xxh3_128_hexdigest(f"memci-push\0{salt}\0{query}".encode("utf-8", "surrogatepass"))[:24]


def push_call(name: str, query: str, salt: str) -> ToolCall:
    """The recall call the push makes in the model's place, with a deterministic id."""
    return ToolCall(call_id(salt, query), name, json.dumps({"query": query}, ensure_ascii=False))


def recall_round(call: ToolCall, result: str) -> list[dict[str, Any]]:
    """``assistant(tool_call recall{query})`` and ``tool(result)``, as a model-called recall exchange is kept."""
    return [assistant_call_message(None, [call]), tool_result_message(call, result)]

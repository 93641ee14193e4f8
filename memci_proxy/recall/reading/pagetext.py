"""Archived pages as text: what a recall by page number returns, and what the search indexes."""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from typing import Any

from memci_proxy.engine.condense import image_reference, image_text
from memci_proxy.engine.contents import utc_date
from memci_proxy.engine.markup import quote
from memci_proxy.recall.lexical.counting import counted_terms
from memci_proxy.recall.lexical.text import tokenize


def content_text(content: Any, image_descriptions: Mapping[str, str] | None = None) -> str:
    """Text parts quoted (memci_proxy.engine.markup: page text lands inside the proxy's recall results, excerpts and
    memory block); each image as `[image <blob reference or URL>: <description>]` (the placeholder with its type
    and size when no description is known)."""
    if isinstance(content, str):
        return quote(content)
    if isinstance(content, list):
        parts = []
        for part in content:
            ref = image_reference(part)
            if ref is not None:
                parts.append(image_text(ref, image_descriptions or {}))
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(quote(part["text"]))
        return "\n".join(parts)
    return ""


def message_text(message: dict[str, Any], image_descriptions: Mapping[str, str] | None = None) -> str:
    """One message as role-labelled text (tool calls spelled out, images described)."""
    role = str(message.get("role", "?"))
    text = content_text(message.get("content"), image_descriptions)
    lines = [f"{role}: {text}"] if text else []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        lines.append(f"{role} called {quote(str(fn.get('name', '?')))}({quote(str(fn.get('arguments', '')))})")
    if role == "tool" and not text:
        lines.append("tool: (empty result)")
    return "\n".join(lines) if lines else f"{role}: (empty)"


def page_messages_with_hidden(
    messages: list[dict[str, Any]], start: int, hidden: list[tuple[int, list[dict[str, Any]]]]
) -> list[dict[str, Any]]:
    """The page's messages in order, hidden messages spliced after the entries they follow."""
    after: dict[int, list[dict[str, Any]]] = {}
    for index, group in hidden:
        after.setdefault(index, []).extend(group)
    out: list[dict[str, Any]] = []
    for offset, message in enumerate(messages):
        out.append(message)
        out.extend(after.get(start + offset, ()))
    return out


def render_page(
    label: str, first_seen: float, status: str, messages: list[dict[str, Any]],
    image_descriptions: Mapping[str, str] | None = None,
) -> str:
    count = f"{len(messages)} message{'s' if len(messages) != 1 else ''}"
    header = f"[Page {label}] {utc_date(first_seen)}, {count} ({status})"
    return header + "\n" + "\n".join(message_text(m, image_descriptions) for m in messages)


def index_text(messages: list[dict[str, Any]], image_descriptions: Mapping[str, str] | None = None) -> str:
    return "\n".join(message_text(m, image_descriptions) for m in messages)


def index_terms(
    messages: list[dict[str, Any]], image_descriptions: Mapping[str, str] | None = None, user_weight: int = 1,
) -> list[str]:
    """The page's BM25 terms: those of ``index_text``, the user's messages' counted ``user_weight`` times (a field
    weight, as in BM25F: the user's own words are what a user asks back about, and an assistant's long answers
    would otherwise weigh on the page's length as much as they do on its matches). The user's messages add the
    terms of what their numbers count, once (memci_proxy.recall.lexical.counting: "I have 12 rare figurines"), which the
    search of a question asking for a count weighs."""
    terms: list[str] = []
    for message in messages:
        text = message_text(message, image_descriptions)
        words = tokenize(text)
        if message.get("role") != "user":
            terms.extend(words)
            continue
        terms.extend(words * user_weight if user_weight > 1 else words)
        terms.extend(counted_terms(text))
    return terms


def _has_content(message: dict[str, Any], image_descriptions: Mapping[str, str]) -> bool:
    """Whether the message says anything: text, a described image or a tool call."""
    if message.get("tool_calls"):
        return True
    content = message.get("content")
    if isinstance(content, str):
        return bool(content.strip())
    for part in content if isinstance(content, list) else ():
        ref = image_reference(part)
        if ref is not None and image_descriptions.get(ref.key):
            return True
        if ref is None and isinstance(part, dict) and str(part.get("text") or "").strip():
            return True
    return False


def vector_text(messages: list[dict[str, Any]], image_descriptions: Mapping[str, str] | None = None) -> str:
    """What the page's vector is computed from: its index text, or nothing when no message says anything (empty
    messages, images without a description): such a page gets a zero vector, which never ranks, instead of the
    vector of its labels and placeholders."""
    if any(_has_content(m, image_descriptions or {}) for m in messages):
        return index_text(messages, image_descriptions)
    return ""


def user_text(messages: list[dict[str, Any]], image_descriptions: Mapping[str, str] | None = None) -> str:
    """What the vector of the page's user words is computed from (memci_proxy.recall.search.ranking): the
    ``vector_text`` of its user messages ("" when it has none that says anything)."""
    return vector_text([m for m in messages if m.get("role") == "user"], image_descriptions)


MAX_PLACES = 64  # places of each term looked at when choosing the excerpt
USER_PLACE_WEIGHT = 2.0  # a query term in the user's own words counts this much more where the excerpt is placed


def excerpt(text: str, terms: list[str], limit: int = 300, whole: int = 0,
            weights: Mapping[str, float] | None = None, second: int = 0,
            user_place: float = USER_PLACE_WEIGHT) -> str:
    """About `limit` characters of `text` around the place where the most query terms occur together (the first
    such place): from the start of the message holding it when that place is within two thirds of the window from
    there (a short message is shown whole), a third of the window before it otherwise, but never past that
    message's end when it has more text before (a fact at the end of a long message is shown with what led to it,
    not with the start of the next message); the whole message, when it is longer than `limit` but at most `whole`
    characters. ``weights``: each term's weight in that choice (the
    resolver gives its idf: a rare term places the excerpt before a common one); a place in a user message counts
    ``user_place`` times (``USER_PLACE_WEIGHT``; its inverse for a question about what the assistant said).
    ``second``: characters of a second window, placed the same way among the query
    terms the first one lacks that weigh at least half the heaviest term of the text (the user's question shown,
    and the answer in the reply that follows it: the rare word that answers it); none when no such term occurs.
    Quoted after it is cut and its whitespace collapsed (escaping comes last: memci_proxy.engine.markup)."""
    flat = " ".join(text.split())
    lower = flat.lower()
    start, size = _window(flat, _densest(lower, terms, limit, weights, user_place=user_place), limit, whole)
    windows = [(start, start + size)]
    if second > 0:
        shown = lower[start:start + size]
        weight = (lambda term: 1.0) if weights is None else (lambda term: weights.get(term, 1.0))
        present = [term for term in dict.fromkeys(terms) if term and term in lower]
        heaviest = max((weight(term) for term in present), default=0.0)
        lacking = [term for term in present if term not in shown and weight(term) >= heaviest / 2]
        if lacking:  # placed by all the query's terms, among the places the first window does not show
            placed = _densest(lower, terms, second, weights, (start, start + size), user_place)
            other, other_size = _window(flat, placed, second, 0)
            windows = _merged([*windows, (other, other + other_size)])
    pieces = [quote(flat[a:b]) for a, b in windows]
    return ("…" if windows[0][0] > 0 else "") + " … ".join(pieces) + ("…" if windows[-1][1] < len(flat) else "")


def _window(flat: str, densest: int, limit: int, whole: int) -> tuple[int, int]:
    """(start, length) of the excerpt around ``densest`` (the rules of ``excerpt``)."""
    start = max(0, densest - limit // 3)
    opening = max(flat.rfind(" user: ", 0, densest + 1), flat.rfind(" assistant: ", 0, densest + 1)) + 1
    ends = [at for at in (flat.find(" user: ", densest), flat.find(" assistant: ", densest)) if at >= 0]
    closing = min(ends, default=len(flat))
    if densest - opening <= 2 * limit // 3:  # the message holding it fits from its start: shown from there
        start = opening
    elif start + limit > closing:  # near the end of its message: the window ends with it, not in the next one
        start = max(opening, closing - limit)
    if whole > limit and closing - opening <= whole:  # the message that matched, whole
        start, limit = opening, max(limit, closing - opening)
    return start, min(limit, len(flat) - start)


def _merged(windows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character spans in order, overlapping or touching ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(windows):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


_OPENING = re.compile(r"(?:^| )(user|assistant|tool|system|developer): ")


def _message_openings(lower: str) -> tuple[list[int], list[bool]]:
    """Where each message of a page's flattened text starts, and whether it is the user's."""
    openings, users = [], []
    for match in _OPENING.finditer(lower):
        openings.append(match.start())
        users.append(match.group(1) == "user")
    return openings, users



def _densest(lower: str, terms: list[str], limit: int, weights: Mapping[str, float] | None = None,
             shown: tuple[int, int] = (0, 0), user_place: float = USER_PLACE_WEIGHT) -> int:
    """Where the window of ``2 * limit // 3`` characters holding the most of the query starts (at a term's place; 0
    when no term occurs): the sum of the ``weights`` (default 1) of the distinct terms in it, times ``user_place``
    when it starts in a user message (what a user asks back about is mostly what they said).
    ``shown``: a span whose places do not count (a window already shown). Cost: at most ``MAX_PLACES`` places per
    term."""
    places: list[tuple[int, int]] = []  # (position, term number)
    numbered = list(dict.fromkeys(t for t in terms if t))
    weight_of = [1.0 if weights is None else max(1e-6, weights.get(term, 1.0)) for term in numbered]
    for number, term in enumerate(numbered):
        at = lower.find(term)
        while at >= 0 and len(places) < MAX_PLACES * (number + 1):
            if not shown[0] <= at < shown[1]:
                places.append((at, number))
            at = lower.find(term, at + len(term))
    if not places:
        return 0
    places.sort()
    openings, users = _message_openings(lower)
    span = max(1, 2 * limit // 3)
    best, best_score, right, total = places[0][0], 0.0, 0, 0.0
    counts: dict[int, int] = {}
    for left, (start, _) in enumerate(places):  # two pointers: the terms in [start, start + span)
        while right < len(places) and places[right][0] < start + span:
            number = places[right][1]
            if number not in counts:
                total += weight_of[number]
            counts[number] = counts.get(number, 0) + 1
            right += 1
        opened = bisect.bisect_right(openings, start) - 1
        score = total * (user_place if opened >= 0 and users[opened] else 1.0)
        if score > best_score + 1e-9:
            best, best_score = start, score
        number = places[left][1]
        counts[number] -= 1
        if not counts[number]:
            del counts[number]
            total -= weight_of[number]
    return best

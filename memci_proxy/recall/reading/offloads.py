"""Reading part of an offloaded output (memci_proxy.engine.output_preview): a line range or a character range, exactly as
the tool returned it, or the lines that match a search inside it (a long line shown around its match); always within
the room the answer has. A line longer than the room (JSON on one line, a minified file) is read in pieces: the
answer names the character range that comes next, which ``read_chars`` reads."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memci_proxy.engine import ConversationState, TokenCounter
from memci_proxy.engine.markup import quote
from memci_proxy.engine.offload_state import find_offload
from memci_proxy.engine.output_preview import OffloadRecord, split_lines
from memci_proxy.recall.lexical.text import tokenize
from memci_proxy.recall.tool.schema import RecallArgs

SEARCH_LINE_CHARS = 400  # a matching line longer than this is shown cut (read it whole by its number)
MARGIN_TOKENS = 48  # the header and footer lines


@dataclass(frozen=True)
class OffloadRead:
    """One read of an offloaded output a recall call asks for: a line range, a character range, a search inside
    it, or (none of them) its start."""

    record: OffloadRecord
    lines: tuple[int, int] | None = None
    query: str = ""
    chars: tuple[int, int] | None = None


def _fit(lines: list[str], first: int, last: int, cap: int, counter: TokenCounter) -> int:
    """The last line (1-based) of `first..last` that fits in `cap` tokens with those before it; at least `first`."""
    used = 0
    end = first
    for n in range(first, last + 1):
        used += counter.count_text(lines[n - 1]) + 1
        if used > cap and n > first:
            break
        end = n
    return end


def _chars_within(text: str, cap: int, counter: TokenCounter) -> int:
    """How many leading characters of `text` fit in `cap` tokens (at least 1)."""
    count = counter.count_text(text)
    if count <= cap:
        return len(text)
    limit = max(1, int(len(text) * cap / max(1, count)))
    while limit > 1 and counter.count_text(text[:limit]) > cap:
        limit = max(1, int(limit * 0.9))
    return limit


def _room(cap: int, frame: tuple[str, str], counter: TokenCounter) -> int:
    """Tokens left for the text itself beside its header and footer lines (and the recall answer's own framing)."""
    return max(16, cap - counter.count_text(frame[0]) - counter.count_text(frame[1]) - 16)


def _line_start(lines: list[str], n: int) -> int:
    """Offset (0-based) in the output of line `n` (1-based)."""
    return sum(len(line) + 1 for line in lines[: n - 1])


def _returned(record: OffloadRecord) -> str:
    return "sent" if record.kind == "document" else "returned"


def read_lines(record: OffloadRecord, text: str, first: int, last: int, cap: int, counter: TokenCounter) -> str:
    """Lines `first..last` of the output, byte for byte between a header line and (when cut) a footer line. A first
    line longer than the room is shown in part, and the footer names the characters of it that follow."""
    lines = split_lines(text)
    total = len(lines)
    if first > total:
        return (f"[Page {record.number}] has {total:,} lines: line {first:,} does not exist. Ask for lines "
                f"1-{total} or a part of them.")
    last = min(last, total)
    room = max(16, cap - MARGIN_TOKENS)
    end = _fit(lines, first, last, room, counter)
    line = lines[first - 1]
    if end == first and counter.count_text(line) + 1 > room:
        at = _line_start(lines, first)

        def framed(keep: int) -> tuple[str, str]:
            return (f"[Page {record.number}, line {first:,} of {total:,}: its first {keep:,} of {len(line):,} "
                    f"characters (characters {at + 1:,}-{at + keep:,} of the output's {len(text):,}), exactly as they "
                    f"were {_returned(record)}:]", f"[… the line goes on: read chars=\"{at + keep + 1}-"
                    f"{at + len(line)}\" next (page={record.number}).]")

        keep = _chars_within(line, _room(cap, framed(len(line)), counter), counter)
        head, footer = framed(keep)
        return f"{head}\n{quote(line[:keep])}\n{footer}"
    head = f"[Page {record.number}, lines {first:,}-{end:,} of {total:,}, exactly as they were {_returned(record)}:]"
    body = quote("\n".join(lines[first - 1 : end]))
    if end < last:
        return (f"{head}\n{body}\n[… the answer has no room for more: lines {end + 1:,}-{last:,} not shown; ask for "
                f"lines=\"{end + 1}-{last}\" next.]")
    return f"{head}\n{body}"


def read_chars(record: OffloadRecord, text: str, first: int, last: int, cap: int, counter: TokenCounter) -> str:
    """Characters `first..last` (1-based, inclusive) of the output, byte for byte, as far as the room allows; the
    footer names the characters that follow when they are cut."""
    total = len(text)
    if first > total:
        return (f"[Page {record.number}] has {total:,} characters: character {first:,} does not exist. Ask for "
                f"chars=\"1-{total}\" or a part of them.")
    last = min(last, total)
    piece = text[first - 1 : last]
    line = text.count("\n", 0, first - 1) + 1

    def framed(keep: int) -> tuple[str, str]:
        return (f"[Page {record.number}, characters {first:,}-{first + keep - 1:,} of {total:,} (from line {line:,}), "
                f"exactly as they were {_returned(record)}:]",
                f"[… the answer has no room for more: read chars=\"{first + keep}-{last}\" next.]")

    keep = _chars_within(piece, _room(cap, framed(len(piece)), counter), counter)
    head, footer = framed(keep)
    if keep < len(piece):
        return f"{head}\n{quote(piece[:keep])}\n{footer}"
    return f"{head}\n{quote(piece)}"


def _around(line: str, lowered: str, phrase: str, terms: set[str]) -> tuple[int, int]:
    """The part of a long line shown for a search: SEARCH_LINE_CHARS characters around the whole query where the
    line holds it, else around the first query term found; the line's start when none is found as written."""
    at = lowered.find(phrase) if phrase else -1
    if at < 0:
        found = [i for i in (lowered.find(term) for term in terms) if i >= 0]
        at = min(found) if found else 0
    start = max(0, min(at - SEARCH_LINE_CHARS // 3, len(line) - SEARCH_LINE_CHARS))
    return start, min(len(line), start + SEARCH_LINE_CHARS)


def search_lines(record: OffloadRecord, text: str, query: str, cap: int, counter: TokenCounter) -> str:
    """The lines of the output that match `query` best (the whole query, then the most query terms), with their
    line numbers, in line order."""
    lines = split_lines(text)
    phrase = query.strip().lower()
    terms = set(tokenize(query))
    scored: list[tuple[float, int]] = []
    for n, line in enumerate(lines, 1):
        lowered = line.lower()
        score = 10.0 if phrase and phrase in lowered else 0.0
        if terms:
            score += len(terms.intersection(tokenize(line)))
        if score > 0:
            scored.append((score, n))
    if not scored:
        return (f"[Page {record.number}] ({len(lines):,} lines): no line matches {quote(repr(query))}. Read it by lines "
                f"(lines=\"1-60\") or search with other words.")
    scored.sort(key=lambda item: (-item[0], item[1]))
    budget = max(16, cap - MARGIN_TOKENS)
    chosen: list[int] = []
    used = 0
    for _score, n in scored:
        line = lines[n - 1]
        cost = counter.count_text(line[:SEARCH_LINE_CHARS]) + 4
        if used + cost > budget and chosen:
            break
        chosen.append(n)
        used += cost
    chosen.sort()
    out = [f"[Page {record.number}] ({len(lines):,} lines): {len(scored):,} lines match {quote(repr(query))}; "
           f"{len(chosen):,} shown (line number: text). Read around one with lines=\"a-b\" (a long line by its "
           "characters: chars=\"a-b\")."]
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    for n in chosen:
        line = lines[n - 1]
        if len(line) <= SEARCH_LINE_CHARS:
            out.append(f"{n}: {quote(line)}")
            continue
        start, end = _around(line, line.lower(), phrase, terms)
        at = starts[n - 1]
        shown = ("…" if start else "") + line[start:end] + ("…" if end < len(line) else "")
        out.append(f"{n} (characters {at + start + 1:,}-{at + end:,} of the output; the line has {len(line):,}): "
                   f"{quote(shown)}")
    return "\n".join(out)


def offloaded_reads(state: ConversationState, args: RecallArgs) -> tuple[RecallArgs, list[OffloadRead]]:
    """The reads of offloaded outputs the arguments ask for, and the arguments left for the archive: `page` with
    `lines`, `chars` or `query` (also one of `pages` with a `query`) reads inside an offloaded output; an
    offloaded output among `pages` is read from its first line."""
    if not state.offloads and not getattr(args, "page", ""):  # (duck-typed arguments have pages and query only)
        return args, []
    pages, query, problems = list(args.pages), args.query, list(args.problems)
    target = args.page
    if not target and len(pages) == 1 and query and find_offload(state, pages[0]) is not None:
        target = pages.pop()
    reads: list[OffloadRead] = []
    if target:
        record = find_offload(state, target)
        if record is None:
            if args.lines is not None or args.chars is not None or query:
                problems.append(f"page {target} is not an offloaded output: `lines`, `chars` and a search within "
                                "a page apply to those; it is read in full")
            if target not in pages:
                pages.append(target)
        else:
            reads.append(OffloadRead(record, args.lines, query, args.chars))
            query = ""
    rest = []
    for label in pages:
        record = find_offload(state, label)
        if record is None:
            rest.append(label)
        elif all(r.record is not record for r in reads):
            reads.append(OffloadRead(record))
    return replace(args, pages=rest, query=query, problems=problems), reads

"""Reading part of an offloaded output (proxy.engine.offload): a line range, exactly as the tool returned it, or
the lines that match a search inside it; always within the room the answer has."""

from __future__ import annotations

from proxy.engine import TokenCounter
from proxy.engine.markup import quote
from proxy.engine.offload import OffloadRecord, split_lines
from proxy.recall.text import tokenize

SEARCH_LINE_CHARS = 400  # a matching line longer than this is shown cut (read it whole by its number)
MARGIN_TOKENS = 48  # the header and footer lines


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


def read_lines(record: OffloadRecord, text: str, first: int, last: int, cap: int, counter: TokenCounter) -> str:
    """Lines `first..last` of the output between a header line and (when cut) a footer line, byte for byte but
    quoted (proxy.engine.markup: a line that looks like a page header or a tag of the proxy's is escaped)."""
    lines = split_lines(text)
    total = len(lines)
    if first > total:
        return (f"[Page {record.number}] has {total:,} lines: line {first:,} does not exist. Ask for lines "
                f"1-{total} or a part of them.")
    last = min(last, total)
    end = _fit(lines, first, last, max(16, cap - MARGIN_TOKENS), counter)
    head = (f"[Page {record.number}, lines {first:,}-{end:,} of {total:,}, exactly as they were "
            f"{'sent' if record.kind == 'document' else 'returned'}:]")
    body = quote("\n".join(lines[first - 1 : end]))
    if end < last:
        return (f"{head}\n{body}\n[… the answer has no room for more: lines {end + 1:,}-{last:,} not shown; ask for "
                f"lines=\"{end + 1}-{last}\" next.]")
    return f"{head}\n{body}"


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
           f"{len(chosen):,} shown (line number: text). Read around one with lines=\"a-b\"."]
    for n in chosen:
        line = lines[n - 1]
        shown = line if len(line) <= SEARCH_LINE_CHARS else line[:SEARCH_LINE_CHARS] + f"…[+{len(line) - SEARCH_LINE_CHARS} chars]"
        out.append(f"{n}: {quote(shown)}")
    return "\n".join(out)

"""The `recall` function tool: its schema (byte-identical on every turn), injection, and argument parsing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

RECALL_DESCRIPTION = (
    "Read archived parts of this conversation. The contents page in the system message lists archived pages "
    "by number. Pass `pages` to read those pages in full, or `query` to search every archived page (also those "
    "no longer listed) and get the best matching excerpts with their page numbers. A large tool output or pasted "
    "document shown only by a preview is a page of its own: pass its number as `page` with `lines` (e.g. "
    "\"200-260\") to read those lines exactly, with `chars` (e.g. \"40001-48000\") to read characters of it (a line "
    "too long to read whole), or with `query` to search within it."
)
LINES_HINT = 'a line range such as "200-260" or "1500" (the first line is 1)'
CHARS_HINT = 'a character range such as "40001-48000" (the first character is 1)'
# Bounds on what the model writes, checked before it is parsed: past them the call gets a note, never a failure,
# and no work on the event loop grows with a hostile size.
MAX_ARGUMENTS_CHARS = 20_000  # the raw arguments string
MAX_PAGES = 50  # page references in one call (the first are read)
MAX_LABEL_CHARS = 24  # one page reference ("12.2", "#17")
MAX_QUERY_CHARS = 2_000  # the search words (the first are searched)
MAX_LINES_CHARS = 40  # a line range ("200-260")
MAX_LINE_DIGITS = 9  # a line number

def recall_tool(name: str) -> dict[str, Any]:
    """The tool definition. A pure function of the name, so the tools list is identical turn after turn."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": RECALL_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "pages": {
                        "type": "array",
                        "items": {"type": ["integer", "string"]},
                        "description": 'Page numbers from the contents page, e.g. [3, "12.2"].',
                    },
                    "query": {"type": "string", "description": "Words to search the archived pages for (with "
                              "`page`: within that page)."},
                    "page": {"type": ["integer", "string"], "description": "One page: an offloaded output named by "
                             "its preview, to read by `lines` or search by `query`."},
                    "lines": {"type": "string", "description": f"With `page`: {LINES_HINT}."},
                    "chars": {"type": "string", "description": f"With `page`: {CHARS_HINT}."},
                },
            },
        },
    }


def _tool_name(tool: Any) -> str | None:
    if isinstance(tool, dict):
        fn = tool.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
    return None


def effective_name(tools: list[Any] | None, wanted: str) -> str:
    """`wanted`, unless the client already has a tool of that name: then a prefixed one."""
    taken = {_tool_name(t) for t in tools or []}
    if wanted not in taken:
        return wanted
    candidate = f"memci_{wanted}"
    n = 2
    while candidate in taken:
        candidate = f"memci_{wanted}_{n}"
        n += 1
    return candidate


def inject(data: dict[str, Any], wanted: str) -> tuple[dict[str, Any], str]:
    """A copy of the request with the recall tool appended last to ``tools``; ``tool_choice`` is left as the client
    set it (``"none"`` or a named client function keep the model from calling recall)."""
    tools = data.get("tools")
    tools = list(tools) if isinstance(tools, list) else []
    name = effective_name(tools, wanted)
    tools.append(recall_tool(name))
    return {**data, "tools": tools}, name


@dataclass
class RecallArgs:
    pages: list[str] = field(default_factory=list)
    query: str = ""
    problems: list[str] = field(default_factory=list)
    page: str = ""  # one page to read by `lines` or search by `query` (an offloaded output)
    lines: tuple[int, int] | None = None  # first and last line, 1-based, inclusive
    chars: tuple[int, int] | None = None  # first and last character, 1-based, inclusive


def _label(page: object) -> str | None:
    if isinstance(page, str) and len(page) > MAX_LABEL_CHARS:
        return None
    if isinstance(page, (int, float, str)) and not isinstance(page, bool):
        label = str(page).strip().lstrip("#")
        if label.endswith(".0"):
            label = label[:-2]
        return label if label and len(label) <= MAX_LABEL_CHARS else None
    return None


def parse_lines(value: object) -> tuple[int, int] | None:
    """A line range as the model writes it: "200-260", "200:260", "200..260", "1500", 1500, [200, 260]; "200-"
    reads on from line 200. None when it is not one."""
    if isinstance(value, bool) or (isinstance(value, str) and len(value) > MAX_LINES_CHARS):
        return None
    if isinstance(value, int):
        first, last = value, value
    elif isinstance(value, list) and len(value) in (1, 2) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        first, last = value[0], value[-1]
    elif isinstance(value, str):
        text = value.strip().lower().removeprefix("lines").removeprefix("line").strip()
        for separator in ("..", "-", ":", "–", " to "):
            if separator in text:
                head, _, tail = text.partition(separator)
                break
        else:
            head, tail = text, text
        head, tail = head.strip().replace(",", ""), tail.strip().replace(",", "")
        if not head.isdigit() or (tail and not tail.isdigit()) or max(len(head), len(tail)) > MAX_LINE_DIGITS:
            return None
        first, last = int(head), int(tail) if tail else 1 << 30
    else:
        return None
    if first < 1 or last < first or first >= 10 ** MAX_LINE_DIGITS:
        return None
    return first, min(last, 1 << 30)


def parse_arguments(raw: str | None) -> RecallArgs:
    """Lenient parsing of the model's arguments: bad parts become problems reported back to the model."""
    args = RecallArgs()
    if isinstance(raw, str) and len(raw) > MAX_ARGUMENTS_CHARS:
        args.problems.append(f"the arguments were {len(raw)} characters long; at most {MAX_ARGUMENTS_CHARS} are "
                             f"read: ask for fewer pages (at most {MAX_PAGES}) or a shorter query")
        return args
    try:
        data = msgspec.json.decode((raw or "{}").encode() if isinstance(raw, str) else b"{}")
    except msgspec.DecodeError:
        args.problems.append("the arguments were not valid JSON")
        return args
    if not isinstance(data, dict):
        args.problems.append("the arguments must be a JSON object")
        return args
    pages = data.get("pages")
    if isinstance(pages, (int, float, str)) and not isinstance(pages, bool):
        pages = [pages]
    if isinstance(pages, list):
        _add_pages(args, pages)
    elif pages is not None:
        args.problems.append("`pages` must be an array of page numbers")
    query = data.get("query")
    if isinstance(query, str):
        args.query = query.strip()
        if len(args.query) > MAX_QUERY_CHARS:
            args.problems.append(f"`query` was {len(args.query)} characters long; its first {MAX_QUERY_CHARS} were "
                                 "searched")
            args.query = args.query[:MAX_QUERY_CHARS]
    elif query is not None:
        args.problems.append("`query` must be text")
    page = data.get("page")
    if page is not None:
        label = _label(page)
        if label is None:
            args.problems.append("`page` must be one page number, e.g. 17")
        else:
            args.page = label
    for name, hint in (("lines", LINES_HINT), ("chars", CHARS_HINT)):
        value = data.get(name)
        if value is None:
            continue
        span = parse_lines(value)
        if span is None:
            args.problems.append(f"`{name}` must be {hint}, not {_shown(value)}")
        elif not args.page and len(args.pages) == 1:
            args.page = args.pages.pop()
        elif not args.page:
            span = None
            args.problems.append(f"`{name}` needs `page`: the number of the offloaded output to read")
        setattr(args, name, span)
    if args.lines is not None and args.chars is not None:
        args.problems.append("`lines` and `chars` both given: `chars` was read")
        args.lines = None
    if not args.pages and not args.query and not args.page:
        args.problems.append("give `pages` (page numbers from the contents page) or a `query`")
    return args


def _add_pages(args: RecallArgs, pages: list[Any]) -> None:
    """The page references, each once, in order, at most MAX_PAGES of them (a set: linear in the references)."""
    seen: set[str] = set()
    ignored: list[str] = []
    for page in pages:
        label = _label(page)
        if label is None:
            ignored.append(_shown(page))
        elif label not in seen:
            seen.add(label)
            args.pages.append(label)
    if len(args.pages) > MAX_PAGES:
        args.problems.append(f"{len(args.pages)} pages were asked for; at most {MAX_PAGES} are read in one call: "
                             f"the first {MAX_PAGES} were")
        del args.pages[MAX_PAGES:]
    if ignored:
        more = f" and {len(ignored) - 3} more" if len(ignored) > 3 else ""
        args.problems.append(f"ignored page reference{'s' if len(ignored) > 1 else ''} {', '.join(ignored[:3])}{more}")


def _shown(value: object, limit: int = 40) -> str:
    """A value the model wrote, quoted for a note: at most ``limit`` characters (a huge one is not echoed back)."""
    if isinstance(value, str):
        text = value if len(value) <= limit else value[:limit] + "…"
        return repr(text)
    if isinstance(value, (int, float, bool)) or value is None:
        text = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else "a very large number"
        return text
    return f"a {type(value).__name__}"

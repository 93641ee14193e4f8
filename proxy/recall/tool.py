"""The `recall` function tool: its schema (byte-identical on every turn), injection, and argument parsing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

RECALL_DESCRIPTION = (
    "Read archived parts of this conversation. The contents page in the system message lists archived pages "
    "by number. Pass `pages` to read those pages in full, or `query` to search every archived page (also those "
    "no longer listed) and get the best matching excerpts with their page numbers."
)


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
                    "query": {"type": "string", "description": "Words to search the archived pages for."},
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


def parse_arguments(raw: str | None) -> RecallArgs:
    """Lenient parsing of the model's arguments: bad parts become problems reported back to the model."""
    args = RecallArgs()
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
        for page in pages:
            if isinstance(page, (int, float, str)) and not isinstance(page, bool):
                label = str(page).strip().lstrip("#")
                if label.endswith(".0"):
                    label = label[:-2]
                if label and label not in args.pages:
                    args.pages.append(label)
            else:
                args.problems.append(f"ignored page reference {page!r}")
    elif pages is not None:
        args.problems.append("`pages` must be an array of page numbers")
    query = data.get("query")
    if isinstance(query, str):
        args.query = query.strip()
    elif query is not None:
        args.problems.append("`query` must be text")
    if not args.pages and not args.query:
        args.problems.append("give `pages` (page numbers from the contents page) or a `query`")
    return args

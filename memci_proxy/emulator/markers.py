"""Script markers read from the last message of a request (see README.md for the grammar)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_MARKER = re.compile(
    r"\[\[(?:"
    r"call:(?P<call_name>[^\s\[\]{}]+)\s*(?P<call_args>\{.*?\})?\s*"
    r"|say:(?P<say>.*?)"
    r"|len:\s*(?P<len>\d+)\s*"
    r"|status:\s*(?P<status>\d{3})\s*"
    r"|delay:\s*(?P<delay>\d+(?:\.\d+)?)\s*"
    r"|slow:\s*(?P<slow>\d+(?:\.\d+)?)\s*"
    r"|cut:\s*(?P<cut>\d+)\s*"
    r"|abort:\s*(?P<abort>\d+)\s*"
    r"|(?P<badsse>badsse)"
    r")\]\]",
    re.DOTALL,
)


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: str  # the JSON text the model emits as `function.arguments`


@dataclass
class Script:
    calls: list[ScriptedCall] = field(default_factory=list)
    say: str | None = None
    length: int | None = None
    status: int | None = None
    delay_s: float = 0.0
    slow_s: float = 0.0
    cut_after: int | None = None
    abort_after: int | None = None
    bad_sse: bool = False

    @property
    def is_empty(self) -> bool:
        return self == _EMPTY


_EMPTY = Script()


def _arguments_text(raw: str | None) -> str:
    """Arguments as the model emits them: canonical JSON when the marker holds valid JSON, else verbatim."""
    if raw is None:
        return "{}"
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except ValueError:
        return raw


def parse_markers(text: str) -> Script:
    script = Script()
    if "[[" not in text:
        return script
    for match in _MARKER.finditer(text):
        groups = match.groupdict()
        if groups["call_name"] is not None:
            script.calls.append(ScriptedCall(groups["call_name"], _arguments_text(groups["call_args"])))
        elif groups["say"] is not None:
            script.say = groups["say"]
        elif groups["len"] is not None:
            script.length = int(groups["len"])
        elif groups["status"] is not None:
            script.status = int(groups["status"])
        elif groups["delay"] is not None:
            script.delay_s = float(groups["delay"])
        elif groups["slow"] is not None:
            script.slow_s = float(groups["slow"])
        elif groups["cut"] is not None:
            script.cut_after = int(groups["cut"])
        elif groups["abort"] is not None:
            script.abort_after = int(groups["abort"])
        elif groups["badsse"] is not None:
            script.bad_sse = True
    return script


def plain_text(content: Any) -> str:
    """Text of a message content for marker scanning (image parts ignored)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) and isinstance(part.get("text"), str) else ""
            for part in content
        )
    return ""

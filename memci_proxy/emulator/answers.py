"""Deterministic answers: pseudo-random English text, scripted text and scripted tool calls."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from memci_proxy.emulator.markers import Script, ScriptedCall

_WORDS: tuple[str, ...] = tuple(
    """the a of to and in is it that for on with as was be by this are at from or an have not they which
    one you had her all she there would their we him been has when who will more no if out so said what up
    its about into than them can only other new some could time these two may then do first any my now such
    like our over man me even most made after also did many before must through back years where much your
    way well down should because each just those people how too little state good very make world still own
    see men work long get here between both life being under never day same another know while last might
    us great old year off come since against go came right used take three system cache prefix token page
    model answer server request memory context window tool result river mountain garden window library
    signal engine harbor lantern meadow orbit pencil quartz ribbon summit timber velvet willow yonder zephyr""".split()
)
_MASK = (1 << 64) - 1
TOOL_RESULT_PREFIX = "Tool result: "
TOOL_RESULT_CHARS = 300


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


@lru_cache(maxsize=4096)
def generated_tokens(seed: int, count: int) -> tuple[str, ...]:
    """``count`` token strings of English-looking text (words, single spaces, commas, full stops)."""
    state = seed or 0x9E3779B97F4A7C15
    tokens: list[str] = []
    words_left_in_sentence = 0
    capitalise = True
    while len(tokens) < count:
        state = (state * 6364136223846793005 + 1442695040888963407) & _MASK
        if words_left_in_sentence == 0:
            words_left_in_sentence = 6 + (state >> 60)
        word = _WORDS[(state >> 33) % len(_WORDS)]
        tokens.append(word.capitalize() if capitalise else word)
        capitalise = False
        words_left_in_sentence -= 1
        if words_left_in_sentence == 0:
            tokens.append(".")
            capitalise = True
        elif (state >> 20) & 15 == 0:
            tokens.append(",")
        tokens.append(" ")
    del tokens[count:]
    if tokens and tokens[-1] == ",":
        tokens[-1] = "."
    elif tokens and tokens[-1] == " ":  # end on a word or a full stop, keeping the exact token count
        if tokens[-2] in (".", ","):
            tokens[-2:] = [" ", "now"]
        else:
            tokens[-1] = "."
    return tuple(tokens)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def tool_names(tools: Any) -> list[str]:
    names: list[str] = []
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict):
                function = tool.get("function")
                if isinstance(function, dict) and isinstance(function.get("name"), str):
                    names.append(function["name"])
    return names


def forced_function(tool_choice: Any) -> str | None:
    """The function name a `tool_choice` object forces, if any."""
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return function["name"]
        if isinstance(tool_choice.get("name"), str):
            return tool_choice["name"]
    return None


def select_calls(script: Script, tools: Any, tool_choice: Any) -> list[ScriptedCall]:
    """The scripted calls the request allows: names in `tools`, filtered by `tool_choice`.

    `none` allows no call. A forced function keeps only calls of that function, and calls it with `{}`
    when the script has none. `required` with no usable scripted call calls the first tool with `{}`.
    """
    available = tool_names(tools)
    if not available or tool_choice == "none":
        return []
    calls = [call for call in script.calls if call.name in available]
    forced = forced_function(tool_choice)
    if forced is not None:
        calls = [call for call in calls if call.name == forced]
        if not calls and forced in available:
            calls = [ScriptedCall(forced, "{}")]
    elif tool_choice == "required" and not calls:
        calls = [ScriptedCall(available[0], "{}")]
    return calls


def make_tool_calls(calls: list[ScriptedCall], seed: int, choice_index: int) -> list[ToolCall]:
    made = []
    for position, call in enumerate(calls):
        digest = hashlib.blake2b(f"{seed}:{choice_index}:{position}:{call.name}".encode(), digest_size=12).hexdigest()
        made.append(ToolCall(id="call_" + digest, name=call.name, arguments=call.arguments))
    return made


def tool_result_text(tool_contents: str) -> str:
    return TOOL_RESULT_PREFIX + tool_contents[:TOOL_RESULT_CHARS]

"""The prompt a turn would send, counted without sending it: what an API's token-counting endpoint answers
(Anthropic's `/v1/messages/count_tokens`). The conversation is found as a turn finds it and planned from its state
(pages archived, outputs offloaded, the contents page), nothing stored, no lock taken; the volatile blocks of the
latest user message (intent, memory) are left out: they need searches a count should not start."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from memci_proxy.engine import TurnInput, plan
from memci_proxy.recall.tool.schema import recall_tool
from memci_proxy.turn.answer_room import requested_tokens
from memci_proxy.turn.call import ChatCall
from memci_proxy.turn.identity import continues, split_system

_encode = msgspec.json.Encoder().encode


async def managed_prompt_tokens(service: Any, call: ChatCall) -> int:
    """Tokens of the prompt ``service`` (a memci_proxy.turn.service.TurnService) would send upstream for ``call``: its
    messages as planned, and the tools with the recall tool, counted as the turns count."""
    system, messages = split_system(call.messages)
    found = await service.lookup.find(call, messages)
    state = None
    if found.how != "new":
        state = (await service.states.load(call.tenant, found.conversation_id)).state
        # An edit (a message differing from the stored one) would fork: planned from nothing. A count whose messages
        # are all known (the history without a new turn, shorter than the stored entries) is planned from the state.
        if (state is not None and found.how == "prefix" and found.known_prefix < min(state.entry_count, len(messages))
                and not continues(state, messages, call.raw_messages)):
            state = None
    data = call.data
    tools = list(data.get("tools") or [])
    if service.recall_enabled:
        tools.append(recall_tool(service.settings.recall_tool_name))
    tools_json = _encode(tools).decode() if tools else ""
    model = data.get("model") if isinstance(data.get("model"), str) else ""
    counter = await service.counts.counter_for(model, system, messages, found.known_prefix, state)
    config = service._config(await service.window.tokens())
    turn = TurnInput(system=system, messages=messages, tools_tokens=service.counts.tools_tokens(counter, tools_json),
                     max_tokens=requested_tokens(data), now=time.time(), raw_messages=call.raw_messages,
                     offload=call.offload_mode != "off")
    planned = plan(state, turn, config, counter)
    return await service.counts.prompt_tokens(model, planned.messages, tools_json, state)

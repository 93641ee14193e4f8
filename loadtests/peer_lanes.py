"""The client side of the peers benchmark: one conversation per target, one request at a time.

``conversation(workload)`` is a generator: it yields each request body and is sent the assistant message that came
back (None when the request failed), as a chat client or an agent loop keeps its history. Each target gets its own
conversation, so what a target answers is what its next request carries, as with a real client.

Agent loops follow the workload's script: each tool call is answered with the next scripted output. When the model
stops calling tools while outputs remain (a target that rewrote the output lost the marker of the next call), the
client pastes the next output as a user message, so every target serves the same number of requests (counted in
``breaks``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from loadtests.workloads import Workload, user_content

MODEL = "memci-emulator"


class Conversation:
    def __init__(self, workload: Workload, model: str = MODEL) -> None:
        self.workload, self.model = workload, model
        self.breaks = 0
        self.steps = self._steps()
        self.body: dict[str, Any] | None = next(self.steps)

    def answer(self, message: dict | None) -> None:
        """Take the answer to the current body and move to the next one (``body`` None: the workload is done)."""
        try:
            self.body = self.steps.send(message)
        except StopIteration:
            self.body = None

    def _request(self, history: list[dict]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": list(history),
                                "max_tokens": self.workload.max_tokens, "temperature": 0}
        if self.workload.tools:
            body["tools"] = list(self.workload.tools)
        return body

    def _steps(self) -> Generator[dict[str, Any], dict | None, None]:
        history: list[dict] = [{"role": "system", "content": self.workload.system}]
        tool_names = {t["function"]["name"] for t in self.workload.tools}
        for turn in self.workload.turns:
            history.append({"role": "user", "content": user_content(turn)})
            results = list(turn.tool_results)
            while True:
                message = yield self._request(history)
                if message is None:
                    message = {"role": "assistant", "content": "(no answer)"}
                history.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
                calls = message.get("tool_calls") or []
                for call in calls:
                    mine = call.get("function", {}).get("name") in tool_names
                    text = (results.pop(0) if results else "done") if mine else "unknown tool"
                    history.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": text})
                if not calls and results:
                    self.breaks += 1
                    history.append({"role": "user", "content": "Output of the next step:\n" + results.pop(0)})
                elif not calls:
                    break


def request_count(workload: Workload) -> int:
    """Client requests of a workload when every tool call is scripted (what a conversation sends)."""
    return workload.requests

"""The OpenAI Agents SDK with its default model (the Responses API) through the managed proxy: an agent runs a
function tool, and a long conversation chained by previous_response_id gets an archived page back by recall."""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest

agents = pytest.importorskip("agents")

FACT = "My locker code is 7349 and my cat is called Brioche."


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096)


@pytest.fixture(scope="module")
def model(proxy):
    """A factory: the SDK's default model class (the Responses API), on a client of the running event loop."""
    agents.set_tracing_disabled(True)

    def make():
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="sk-agents", max_retries=0, timeout=60)
        return agents.OpenAIResponsesModel(model="m", openai_client=client)

    return make


def _weather(calls: list[str]):
    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        calls.append(city)
        return f"Sunny in {city}, 21 C"

    return get_weather


def test_the_default_model_is_the_responses_api():
    assert agents.models.get_default_model_settings() is not None  # the SDK is importable and configured
    provider = agents.OpenAIProvider(api_key="sk-x", base_url="http://127.0.0.1:1/v1")
    assert type(provider.get_model("m")).__name__ == "OpenAIResponsesModel"


def test_an_agent_runs_a_tool(proxy, emu):
    calls: list[str] = []

    async def run():
        # as the README says: the default client on the proxy, a model name, the default API (Responses)
        agents.set_default_openai_client(openai.AsyncOpenAI(base_url=proxy.base_url, api_key="sk-agents",
                                                            max_retries=0, timeout=60))
        agent = agents.Agent(name="Weather", instructions="Answer with the weather.", model="m",
                             tools=[_weather(calls)])
        return await agents.Runner.run(agent, 'Weather in Paris? [[call:get_weather {"city": "Paris"}]]')

    result = asyncio.run(run())
    assert calls == ["Paris"]
    assert isinstance(result.final_output, str) and result.final_output
    sent = emu.turn_requests(1)[0]["body"]
    assert sent["messages"][-1]["role"] == "tool" and "Sunny in Paris" in sent["messages"][-1]["content"]
    assert {t["function"]["name"] for t in sent["tools"]} == {"get_weather", "recall"}


def test_a_long_conversation_recalls_an_archived_page(model, emu, proxy):
    async def converse() -> str:
        agent = agents.Agent(name="Chat", instructions="You are a helpful assistant.", model=model())
        previous = None
        for turn in range(1, 51):
            text = FACT if turn == 3 else f"Chit-chat number {turn} about the weather and the news."
            result = await agents.Runner.run(agent, text + " [[len:80]]", previous_response_id=previous)
            previous = result.last_response_id
        asked = await agents.Runner.run(agent, 'What was my locker code? [[call:recall {"pages": [3]}]]',
                                        previous_response_id=previous)
        return asked.final_output

    answer = asyncio.run(converse())
    assert "7349" in answer
    sent = emu.requests(2)
    assert sent[-1]["body"]["messages"][-1]["role"] == "tool" and "[Page 3]" in sent[-1]["body"]["messages"][-1]["content"]
    metrics = httpx.get(proxy.url + "/metrics", timeout=10).text
    archived = re.search(r"^memci_pages_archived_total ([0-9.e+]+)$", metrics, re.M)
    assert archived and float(archived.group(1)) > 20  # page 3 had left the prompt long before

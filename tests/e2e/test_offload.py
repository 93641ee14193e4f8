"""First-sight offload end to end: openai SDK (and the OpenAI Agents SDK) -> proxy -> emulator scripted to call tools.

A client tool returns about 100 KB; the proxy stores it as its own page and sends the emulator a preview in its place;
the preview's first line carries the emulator's script (call recall for one line range), so the model asks for lines
of the offloaded output and the test checks that they reach it byte for byte."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

WINDOW = 8192
RUN_TESTS = {"type": "function", "function": {"name": "run_tests", "description": "Run the test suite.",
                                              "parameters": {"type": "object", "properties": {}}}}


def big_output(marker: str, lines: int = 2000) -> str:
    """About 100 KB of test log whose first line is an emulator script; line n reads `... case n ...`."""
    body = [f"tests/test_mod_{n % 37}.py::test_case_{n} {'FAILED' if n % 251 == 0 else 'PASSED'} [{n % 100:>3}%]"
            f" checksum={(n * 7919) % 100_003:06d} \t trailing" for n in range(2, lines + 1)]
    return "\n".join([f"collected {lines} items {marker}", *body]) + "\n"


def line_of(text: str, n: int) -> str:
    return text.split("\n")[n - 1]


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW)


def recall_marker(page: int, lines: str) -> str:
    return "[[call:recall " + json.dumps({"page": page, "lines": lines}) + "]]"


@pytest.mark.parametrize("stream", [False, True])
def test_an_agent_loop_reads_lines_of_an_offloaded_output_byte_for_byte(pair, client_for, stream):
    proxy, emu = pair.proxy, pair.emulator
    client = client_for(proxy)
    output = big_output(recall_marker(2, "1500-1502"))
    assert len(output) > 90_000
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"Run the tests ({'stream' if stream else 'whole'}). [[call:run_tests {{}}]]"}]

    def ask():
        if not stream:
            r = client.chat.completions.create(model="m", messages=messages, tools=[RUN_TESTS], max_tokens=300)
            return r.choices[0].message.content, r.choices[0].message.tool_calls, r.choices[0].finish_reason
        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=[RUN_TESTS], max_tokens=300,
                                                     stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls: dict[int, dict] = {}
        for c in chunks:
            for call in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
        finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices and c.choices[0].finish_reason)
        return text, [type("Call", (), {"id": v["id"], "function": type("F", (), v)}) for v in calls.values()] or None, finish

    content, calls, finish = ask()
    assert finish == "tool_calls" and [c.function.name for c in calls] == ["run_tests"]  # the client's own tool
    messages.append({"role": "assistant", "content": content or None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": "run_tests", "arguments": "{}"}} for c in calls]})
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": output})
    content, calls, finish = ask()
    assert finish == "stop" and not calls
    sent = emu.requests(2)
    # the first request of the turn carries the preview, not the 100 KB
    preview = sent[0]["body"]["messages"][-1]
    assert preview["role"] == "tool" and preview["content"].startswith("[Tool output stored in full as page 2: 2,000 lines")
    assert len(json.dumps(sent[0]["body"]["messages"])) < 12_000
    assert line_of(output, 2000) in preview["content"]  # the tail
    # the recall round: the lines come back byte for byte
    result = sent[1]["body"]["messages"][-1]
    assert result["role"] == "tool"
    head, body = result["content"].split("\n", 1)
    assert head == "[Page 2, lines 1,500-1,502 of 2,000, exactly as they were returned:]"
    assert body == "\n".join(output.split("\n")[1499:1502]) and "\t" in body
    assert content.startswith("Tool result: [Page 2, lines 1,500-1,502")  # the emulator's answer quotes it
    # the next request of the loop keeps the preview byte for byte (the cache holds)
    messages.append({"role": "assistant", "content": content})
    messages.append({"role": "user", "content": "Thanks. [[len:20]]"})
    ask()
    again = emu.turn_requests(1)[0]["body"]["messages"]
    assert preview in again and again.index(preview) < len(again) - 1
    assert emu.turn_requests(1)[0]["cached_tokens"] >= 0.8 * emu.turn_requests(1)[0]["prompt_tokens"]


def test_offload_off_per_request_sends_the_output_in_full(pair, client_for):
    proxy, emu = pair.proxy, pair.emulator
    client = client_for(proxy)
    output = big_output("", lines=100)  # ~7.5 KB: over the threshold (~700 tokens at 8k), within the window
    messages = [{"role": "user", "content": "Run them, no offload. [[call:run_tests {}]]"}]
    headers = {"X-Memci-Offload": "off"}
    r = client.chat.completions.create(model="m", messages=messages, tools=[RUN_TESTS], max_tokens=50,
                                       extra_headers=headers)
    call = r.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": output}]
    client.chat.completions.create(model="m", messages=messages, tools=[RUN_TESTS], max_tokens=50,
                                   extra_headers=headers)
    assert emu.turn_requests(1)[0]["body"]["messages"][-1]["content"] == output
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m", messages=messages, max_tokens=50,
                                       extra_headers={"X-Memci-Offload": "sometimes"})
    assert "X-Memci-Offload" in str(bad.value)


def test_the_agents_sdk_reads_line_1500_of_a_100_kb_tool_output(pair):
    agents = pytest.importorskip("agents")
    proxy, emu = pair.proxy, pair.emulator
    output = big_output(recall_marker(2, "1500"))

    @agents.function_tool
    def run_tests() -> str:
        """Run the test suite and return its log."""
        return output

    async def run() -> str:
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="sk-agents", max_retries=0, timeout=60)
        model = agents.OpenAIChatCompletionsModel(model="m", openai_client=client)
        agent = agents.Agent(name="coder", instructions="You are a coding agent.", model=model, tools=[run_tests],
                             model_settings=agents.ModelSettings(max_tokens=300))
        result = await agents.Runner.run(agent, "Run the tests and tell me line 1500. [[call:run_tests {}]]",
                                         run_config=agents.RunConfig(tracing_disabled=True))
        await client.close()
        return str(result.final_output)

    final = asyncio.run(run())
    line = line_of(output, 1500)
    assert final == "Tool result: [Page 2, lines 1,500-1,500 of 2,000, exactly as they were returned:]\n" + line[:300 - 83]
    recalled = [r for r in emu.requests(8) if r["body"]["messages"][-1].get("content", "").startswith("[Page 2, lines")]
    assert recalled and recalled[-1]["body"]["messages"][-1]["content"].split("\n", 1)[1] == line


def test_a_100_kb_output_on_one_line_is_read_to_its_end_and_found_by_search(pair, client_for):
    """An MCP result as JSON with escaped newlines: 100 KB on one line. Its last 100 characters come back through
    recall (chars), the search of the conversation finds it, and the conversation API lists it."""
    proxy, emu = pair.proxy, pair.emulator
    client = client_for(proxy, api_key="sk-one-line")
    rows = ", ".join(f'{{"id": {i}, "text": "row {i}\\nof the table"}}' for i in range(2600))
    tail = ', "marker": "ZEBRA-42 where the output ends"}'
    output, size = "", 0
    while len(output) != size or not size:  # the marker names the output's last 100 characters
        size = len(output) or 100_000
        marker = "[[call:recall " + json.dumps({"page": 2, "chars": f"{size - 99}-{size}"}) + "]]"
        output = '{"note": "' + marker + '", "rows": [' + rows + "]" + tail
    assert len(output) == size and "\n" not in output and output.endswith(tail) and len(output) > 100_000
    messages = [{"role": "user", "content": "List the rows. [[call:run_tests {}]]"}]
    r = client.chat.completions.create(model="m", messages=messages, tools=[RUN_TESTS], max_tokens=300)
    call = r.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": output}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=[RUN_TESTS],
                                                           max_tokens=300)
    cid = raw.headers["x-memci-conversation-id"]
    sent = emu.requests(2)
    preview = sent[0]["body"]["messages"][-1]["content"]
    assert preview.startswith("[Tool output stored in full as page 2: 1 lines") and 'chars="' in preview
    assert output[-200:] in preview  # the preview shows where the line ends
    result = sent[1]["body"]["messages"][-1]["content"]  # the recall round
    assert result.split("\n", 1)[1] == output[-100:]
    # the search of the conversation finds it, showing the part around the match
    found = httpx.post(proxy.url + "/memci/search", headers={"Authorization": "Bearer sk-one-line"}, timeout=30,
                       json={"query": "ZEBRA-42", "conversation_id": cid}).json()
    assert [h["page"] for h in found["hits"]][:1] == ["2"] and "ZEBRA-42" in found["hits"][0]["excerpt"]
    history = httpx.get(f"{proxy.url}/memci/conversations/{cid}", timeout=30,
                        headers={"Authorization": "Bearer sk-one-line"}).json()
    assert [(o["number"], o["entry"], o["chars"]) for o in history["offloads"]] == [(2, 2, size)]
    assert [m.get("offloaded_as") for m in history["messages"]][2] == 2

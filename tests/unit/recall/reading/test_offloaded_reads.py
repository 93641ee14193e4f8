"""Recall reads part of an offloaded output: a line range byte for byte, or a search inside it; bad arguments are
reported to the model in words."""

from __future__ import annotations

import pytest

from memci_proxy.engine import EngineConfig, EstimateCounter, TurnInput, plan
from memci_proxy.metrics import Metrics
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.tool.schema import parse_arguments, parse_lines, recall_tool

C = EstimateCounter()
LOG = "".join(f"step {i}: compiling module_{i % 13}.c\r\n" if i % 400 else f"src/m{i}.c:{i}: error: boom {i}\n"
              for i in range(1, 3001))


def _conversation(output: str = LOG, window: int = 8192):
    msgs = [{"role": "user", "content": "build it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "make", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": output}]
    p = plan(None, TurnInput(system=[], messages=msgs), EngineConfig(context_window=window), C)
    assert p.offloaded == ["2"]
    return p.state, msgs, p


def test_parse_lines_and_arguments() -> None:
    assert parse_lines("200-260") == (200, 260) and parse_lines("1500") == (1500, 1500)
    assert parse_lines("lines 1,200 to 1,260") == (1200, 1260) and parse_lines([3, 9]) == (3, 9)
    assert parse_lines(7) == (7, 7) and parse_lines("10-")[0] == 10
    for bad in ("0-3", "9-3", "abc", True, [1, 2, 3], "-5", 1.5):
        assert parse_lines(bad) is None, bad
    args = parse_arguments('{"page": 17, "lines": "200-260"}')
    assert args.page == "17" and args.lines == (200, 260) and not args.problems
    args = parse_arguments('{"pages": ["#17"], "lines": "5"}')
    assert args.page == "17" and args.pages == [] and args.lines == (5, 5)
    args = parse_arguments('{"lines": "5-9"}')
    assert args.lines is None and any("`lines` needs `page`" in p for p in args.problems)
    args = parse_arguments('{"page": 4, "lines": "nine"}')
    assert any('`lines` must be a line range such as "200-260"' in p for p in args.problems)
    args = parse_arguments('{"page": true}')
    assert any("`page` must be one page number" in p for p in args.problems)
    params = recall_tool("recall")["function"]["parameters"]["properties"]
    assert set(params) == {"pages", "query", "page", "lines", "chars"}


@pytest.mark.parametrize("source", ["request", "store"])
async def test_lines_come_back_byte_for_byte(source: str) -> None:
    state, msgs, _ = _conversation()

    class Repo:
        async def load_entries(self, tenant, cid, first, last):
            class Row:
                def __init__(self, m):
                    self.message = m
            return [Row(m) for m in msgs[first : last + 1]]

    metrics = Metrics()
    resolver = RecallResolver(Repo(), C, 2048, metrics=metrics)
    ctx = RecallContext("t", "c", state, msgs if source == "request" else None)
    lines = LOG.split("\n")
    out = await resolver.resolve(ctx, parse_arguments('{"page": 2, "lines": "1500-1510"}'))
    head, body = out.text.split("\n", 1)
    assert head == "[Page 2, lines 1,500-1,510 of 3,000, exactly as they were returned:]"
    assert body == "\n".join(lines[1499:1510]) and "\r" in body
    assert out.kind == "offloaded" and out.pages == []
    # a range larger than the room: whole lines, and where to go on
    out = await resolver.resolve(ctx, parse_arguments('{"page": 2, "lines": "1-3000"}'))
    head, rest = out.text.split("\n", 1)
    shown = rest.rsplit("\n", 1)[0]
    assert LOG.startswith(shown + "\n") and 'ask for lines="' in out.text
    assert C.count_text(out.text) <= 2048
    # past the end
    out = await resolver.resolve(ctx, parse_arguments('{"page": 2, "lines": "5000-5001"}'))
    assert "has 3,000 lines" in out.text
    # reading the page without lines: from its first line
    out = await resolver.resolve(ctx, parse_arguments('{"pages": [2]}'))
    assert out.text.startswith("[Page 2, lines 1-")
    reads = {s.labels["how"]: s.value for m in metrics.offload_reads.collect() for s in m.samples
             if s.name.endswith("_total")}
    assert reads == {"lines": 3.0, "start": 1.0}


async def test_search_within_an_offloaded_output() -> None:
    state, msgs, _ = _conversation()
    resolver = RecallResolver(None, C, 2048)
    ctx = RecallContext("t", "c", state, msgs)
    out = await resolver.resolve(ctx, parse_arguments('{"page": 2, "query": "error: boom"}'))
    assert "7 lines match 'error: boom'" in out.text
    assert "1200: src/m1200.c:1200: error: boom 1200" in out.text.split("\n")
    # pages=[N] with a query searches within it too
    again = await resolver.resolve(ctx, parse_arguments('{"pages": [2], "query": "error: boom"}'))
    assert again.text == out.text
    nothing = await resolver.resolve(ctx, parse_arguments('{"page": 2, "query": "zebra"}'))
    assert "no line matches 'zebra'" in nothing.text
    # a page that is not an offloaded output: read in full, with a word about it
    other = await resolver.resolve(ctx, parse_arguments('{"page": 1, "lines": "1-2"}'))
    assert "page 1 is not an offloaded output" in other.text


ONE_LINE = '{"results": [' + ", ".join(f'{{"id": {i}, "name": "item-{i}", "tags": ["a", "b"]}}'
                                      for i in range(2100)) + '], "marker": "ZEBRA-42 the end of the output"}'


def _one_line_conversation():
    state, msgs, p = _conversation(ONE_LINE, 32768)
    preview = p.messages[-1]["content"]
    assert 'chars="' in preview and ONE_LINE[-200:] in preview  # the preview shows where it ends
    return state, msgs


async def test_a_huge_one_line_output_is_read_to_its_end_by_characters() -> None:
    assert len(ONE_LINE) > 100_000 and "\n" not in ONE_LINE
    state, msgs = _one_line_conversation()
    resolver = RecallResolver(None, C, 2048)
    ctx = RecallContext("t", "c", state, msgs)
    # lines="1" cannot show the line whole: its first part, and the characters that follow
    out = await resolver.resolve(ctx, parse_arguments('{"page": 2, "lines": "1"}'))
    assert out.text.split("\n")[1] == ONE_LINE[: len(out.text.split("\n")[1])]
    assert 'the line goes on: read chars="' in out.text and C.count_text(out.text) <= 2048
    # following the footers reaches the end, byte for byte
    read, calls = "", 0
    arguments = '{"page": 2, "lines": "1"}'
    while True:
        out = await resolver.resolve(ctx, parse_arguments(arguments))
        head, rest = out.text.split("\n", 1)
        if 'chars="' not in rest.rsplit("\n", 1)[-1]:
            read += rest
            break
        body, footer = rest.rsplit("\n", 1)
        read += body
        arguments = '{"page": 2, "chars": "' + footer.split('chars="', 1)[1].split('"', 1)[0] + '"}'
        calls += 1
        assert calls < 100
    assert read == ONE_LINE
    # the last 100 characters at once
    first = len(ONE_LINE) - 99
    out = await resolver.resolve(ctx, parse_arguments('{"page": 2, "chars": "%d-%d"}' % (first, len(ONE_LINE))))
    assert out.text.split("\n", 1)[1] == ONE_LINE[-100:]
    # a search inside the line shows the part around the match
    found = await resolver.resolve(ctx, parse_arguments('{"page": 2, "query": "ZEBRA-42"}'))
    assert "ZEBRA-42 the end of the output" in found.text and "1 lines match" in found.text
    assert f"of the output; the line has {len(ONE_LINE):,})" in found.text
    # lines and chars both given: chars win, with a word
    both = parse_arguments('{"page": 2, "lines": "1", "chars": "1-10"}')
    assert both.lines is None and both.chars == (1, 10) and both.problems


async def test_an_offloaded_output_is_found_by_the_search_while_its_page_is_active() -> None:
    state, msgs = _one_line_conversation()
    assert all(p.status == 0 for p in state.pages)  # nothing archived: the output's own page only
    resolver = RecallResolver(None, C, 2048)
    ctx = RecallContext("t", "c", state, msgs)
    out = await resolver.resolve(ctx, parse_arguments('{"query": "ZEBRA-42"}'))
    assert out.text.startswith("Archived pages matching 'ZEBRA-42'") and "[Page 2]" in out.text
    assert "ZEBRA-42 the end of the output" in out.text

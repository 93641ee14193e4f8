"""First-sight offload: huge tool outputs and pasted documents become pages of their own on arrival, shown by a
preview that stays byte-identical turn after turn; small outputs are never touched."""

from __future__ import annotations

import os
from typing import Any

from engine_checks import check_budget, check_no_loss, check_pages, check_tool_pairing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memci_proxy.engine import ConversationState, EngineConfig, EstimateCounter, TurnInput, plan
from memci_proxy.engine import output_preview
from memci_proxy.engine.output_preview import build_preview, split_lines

C = EstimateCounter()
SYSTEM = [{"role": "system", "content": "You are a coding agent."}]
EXAMPLES = int(os.environ.get("ENGINE_PROPERTY_EXAMPLES", "40"))


def log_text(data: st.DataObject, lines: int) -> str:
    seed = data.draw(st.integers(0, 10_000))
    out = []
    for i in range(lines):
        k = (seed + i * 31) % 53
        if k == 0:
            out.append(f"src/mod_{i}.c:{i}: error: expected ';' before '}}' token")
        elif k == 1:
            out.append(f"tests/test_{i}.py::test_case FAILED")
        elif k == 2:
            out.append("")
        else:
            out.append(f"line {i}: compiling unit_{(seed + i) % 97} ok " + "x" * ((seed + i) % 40))
    return "\n".join(out) + ("\n" if seed % 2 else "")


def call(i: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "make"}'}}]}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.data_too_large])
@given(st.data())
def test_previews_stay_byte_identical_and_small_outputs_untouched(data: st.DataObject) -> None:
    config = EngineConfig(context_window=data.draw(st.integers(4000, 40_000)), output_reserve=500,
                          offload_preview_tokens=data.draw(st.integers(64, 400)), condense_tool_chars=80)
    limits = config.offload_limits()
    history: list[dict[str, Any]] = [{"role": "user", "content": "Build the project and fix what fails."}]
    state: ConversationState | None = None
    previous = None
    shown: dict[int, str] = {}  # entry -> the preview text prompts carried
    for step in range(data.draw(st.integers(2, 14))):
        lines = data.draw(st.sampled_from([1, 3, 20, 200, 1500]))
        history += [call(step), {"role": "tool", "tool_call_id": f"c{step}", "content": log_text(data, lines)}]
        if data.draw(st.integers(0, 4)) == 0:
            history += [{"role": "assistant", "content": "Done with that part."},
                        {"role": "user", "content": "Go on."}]
        result = plan(state, TurnInput(system=SYSTEM, messages=list(history), now=float(step)), config, C)
        check_pages(result.state, history)
        check_budget(result, config)
        check_no_loss(result, history, config)
        check_tool_pairing(result.messages)
        s = result.state
        numbers = [p.number for p in s.pages] + [r.number for r in s.offloads]
        assert len(set(r.number for r in s.offloads)) == len(s.offloads)
        assert not {r.number for r in s.offloads} & {p.number for p in s.pages}, numbers
        assert [r.entry for r in s.offloads] == sorted(r.entry for r in s.offloads)
        offloaded = {r.entry: r for r in s.offloads}
        for index, message, _digest, tokens in result.new_entries:
            if index in offloaded:
                assert tokens > limits.tool_tokens
                assert s.tokens[index] < tokens
            else:
                assert tokens <= limits.tool_tokens or message["role"] != "tool" or s.tokens[index] == tokens
        start = s.active_start_entry()
        b6 = result.messages[1:] if s.system_text is not None else result.messages
        for offset, sent in enumerate(b6):
            entry = start + offset
            original = history[entry]
            if entry not in offloaded:
                if original["role"] == "tool" and entry not in s.condensed:
                    assert sent == original  # small outputs (and everything not offloaded) go verbatim
                continue
            if entry in shown and entry not in s.condensed:
                assert sent["content"] == shown[entry]  # the same bytes on every turn
            if entry not in s.condensed:
                shown[entry] = sent["content"]
            assert sent["tool_call_id"] == original["tool_call_id"]
        if previous is not None and not result.epoch:
            keep = len(previous.messages)
            assert result.messages[:keep] == previous.messages[:keep]
        # a replica rebuilding the state from bytes (its memo of previews empty) plans the same prompt
        output_preview._PREVIEWS.clear()
        again = plan(ConversationState.from_bytes(result.state.to_bytes()),
                     TurnInput(system=SYSTEM, messages=list(history), now=float(step) + 0.5), config, C)
        assert again.messages == result.messages or again.epoch or result.epoch
        state, previous = result.state, result
        history.append({"role": "assistant", "content": "Looking at it."}) if data.draw(st.booleans()) else None
        if history[-1]["role"] == "assistant" and "tool_calls" not in history[-1]:
            history.append({"role": "user", "content": "Next step."})


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_preview_holds_head_tail_errors_and_the_way_to_read_it(data: st.DataObject) -> None:
    text = log_text(data, data.draw(st.integers(1, 3000)))
    chars = data.draw(st.integers(200, 6000))
    preview = build_preview(text, 7, "tool", chars, 999)
    lines = split_lines(text)
    assert "\n".join(lines) + ("\n" if text.endswith("\n") and lines != [""] else "") == text or text == "\n"
    assert preview == build_preview(text, 7, "tool", chars, 999)
    head = preview.split("\n", 1)[0]
    assert "page 7" in head and 'page=7 and lines="' in head and f"{len(lines):,} lines" in head
    body = preview.split("\n")[1:]
    assert len(preview) <= len(head) + chars * 1.1 + 400
    if lines[-1] and len(lines[-1]) <= 240 and len(lines) > 1:
        assert body[-1] == lines[-1]  # the tail is kept
    errors = [i for i, line in enumerate(lines) if "error:" in line or "FAILED" in line]
    if errors and chars >= 2000:
        assert any(lines[i] in preview for i in errors)
        assert "look like errors" in head or all(lines[i] in body for i in errors)


def test_huge_tool_output_becomes_a_page_with_a_preview_and_offload_off_restores_it() -> None:
    cfg = EngineConfig(context_window=8192)
    log = "".join(f"tests/test_x.py::test_{i} {'FAILED' if i % 97 == 0 else 'PASSED'}\n" for i in range(3000))
    msgs = [{"role": "user", "content": "fix it"}, call(1), {"role": "tool", "tool_call_id": "c1", "content": log}]
    p = plan(None, TurnInput(system=SYSTEM, messages=msgs), cfg, C)
    assert p.offloaded == ["2"] and p.offload_tokens_saved > 20_000 and not p.over_budget
    preview = p.messages[-1]["content"]
    assert preview.startswith("[Tool output stored in full as page 2: 3,000 lines")
    assert "tests/test_x.py::test_2999 PASSED" in preview and "[line 98] tests/test_x.py::test_97 FAILED" in preview
    assert any(e["type"] == "context.offloaded" and e["page"] == "2" for e in p.events)
    # the next user message opens page 3: numbers are shared with the pages
    more = [*msgs, {"role": "assistant", "content": "Fixed."}, {"role": "user", "content": "thanks"}]
    p2 = plan(p.state, TurnInput(system=SYSTEM, messages=more), cfg, C)
    assert p2.messages[: len(p.messages)] == p.messages and [q.label for q in p2.state.pages] == ["1", "3"]
    # offload off for a request: the output is shown in full again (here it no longer fits: page 1 is archived)
    small = EngineConfig(context_window=100_000)
    q = plan(None, TurnInput(system=SYSTEM, messages=msgs), small, C)
    assert q.offloaded == ["2"]
    q2 = plan(q.state, TurnInput(system=SYSTEM, messages=more, offload=False), small, C)
    assert q2.messages[3]["content"] == log and not q2.state.offloads and not q2.offloaded
    assert q2.stable_prefix_messages <= 3


def test_offload_switched_off_by_setting_and_small_outputs_untouched() -> None:
    log = "line\n" * 5000
    msgs = [{"role": "user", "content": "go"}, call(1), {"role": "tool", "tool_call_id": "c1", "content": log}]
    off = plan(None, TurnInput(system=SYSTEM, messages=msgs), EngineConfig(context_window=100_000, offload=False), C)
    assert not off.offloaded and off.messages[-1]["content"] == log
    small = [{"role": "user", "content": "go"}, call(1), {"role": "tool", "tool_call_id": "c1", "content": "ok\n" * 50}]
    p = plan(None, TurnInput(system=SYSTEM, messages=small), EngineConfig(context_window=8192), C)
    assert not p.offloaded and p.messages[-1] == small[-1]


def test_pasted_document_is_offloaded_under_its_own_threshold() -> None:
    doc = "".join(f"Clause {i}: the party of the first part agrees to clause {i + 1}.\n" for i in range(2000))
    msgs = [{"role": "user", "content": doc + "Summarise the clauses about payment."}]
    cfg = EngineConfig(context_window=32_768)
    p = plan(None, TurnInput(system=SYSTEM, messages=msgs, intent="summarise payment clauses"), cfg, C)
    assert p.offloaded == ["2"] and p.state.offloads[0].kind == "document"
    content = p.messages[-1]["content"]
    assert content.startswith("[Pasted document stored in full as page 2")
    assert "Summarise the clauses about payment." in content and "<memci-context>" in content
    none = plan(None, TurnInput(system=SYSTEM, messages=msgs), EngineConfig(context_window=32_768,
                                                                              offload_document_tokens=0), C)
    assert not none.offloaded


def test_a_fork_drops_offloads_past_it_and_never_reuses_their_numbers() -> None:
    cfg = EngineConfig(context_window=8192)
    log = "build step\n" * 3000
    msgs = [{"role": "user", "content": "go"}, call(1), {"role": "tool", "tool_call_id": "c1", "content": log}]
    p = plan(None, TurnInput(system=SYSTEM, messages=msgs), cfg, C)
    assert p.offloaded == ["2"]
    edited = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "no tools today"},
              {"role": "user", "content": "ok"}]
    p2 = plan(p.state, TurnInput(system=SYSTEM, messages=edited), cfg, C)
    assert not p2.state.offloads and p2.forked_at == 1
    assert [q.label for q in p2.state.pages] == ["1", "3"]

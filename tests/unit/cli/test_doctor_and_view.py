"""`doctor`'s verdicts and explanations against scripted upstream answers, and `inspect`'s rendering of an admin
prompt view (colours on and off). The end-to-end runs against the emulator are in tests/e2e/test_doctor_inspect.py."""

from __future__ import annotations

import re

import httpx

from memci_proxy import doctor, prompt_view
from memci_proxy.settings import load_settings

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def settings(**env: str):
    return load_settings(env={"MEMCI_UPSTREAM_URL": "http://up.test/v1", **env}, read_file=False)


def upstream(usage: dict, models: list[dict] | None = None, chat_status: int = 200) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": models if models is not None else [{"id": "m1", "max_model_len": 8192}]})
        return httpx.Response(chat_status, json={"choices": [{"message": {"content": "x"}}], "usage": usage})
    return httpx.MockTransport(handle)


def run_upstream(transport: httpx.MockTransport, **env: str) -> tuple[doctor.Report, doctor.UpstreamFacts | None]:
    report = doctor.Report(say=lambda line: None)
    facts = doctor.check_upstream(settings(**env), report, transport=transport)
    return report, facts


def test_an_upstream_that_reports_cached_tokens_passes() -> None:
    report, facts = run_upstream(upstream({"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 96}}))
    assert not report.failed and facts.max_model_len == 8192 and facts.models == ["m1"]
    assert any("reports cached_tokens (96 of 100" in text for _, text in report.lines)


def test_an_upstream_without_cached_tokens_is_a_warning_not_a_failure() -> None:
    report, _ = run_upstream(upstream({"prompt_tokens": 100}))
    assert not report.failed
    assert [level for level, text in report.lines if "cached_tokens" in text] == ["warn"]


def test_a_failing_chat_request_fails_the_check() -> None:
    report, _ = run_upstream(upstream({}, chat_status=500))
    assert report.failed


def test_no_model_listed_and_none_given_fails() -> None:
    report, _ = run_upstream(upstream({}, models=[]))
    assert report.failed


def explained(facts: doctor.UpstreamFacts | None, **env: str) -> str:
    report = doctor.Report(say=lambda line: None)
    doctor.explain(settings(**env), facts, report)
    return "\n".join(text for _, text in report.lines)


def test_the_window_and_why() -> None:
    assert "context window 8,192 tokens (the upstream's max_model_len)" in explained(doctor.UpstreamFacts(["m"], 8192))
    assert "context window 4,000 tokens (setting context_window)" in explained(
        doctor.UpstreamFacts(["m"], 8192), MEMCI_CONTEXT_WINDOW="4000")
    assert "32,768 tokens (fallback" in explained(None)
    # 8192 - min(4096, 8192 // 4) - 819
    assert "prompt budget 5,325 tokens" in explained(doctor.UpstreamFacts(["m"], 8192))
    assert "push: proactive (memory_push): the proxy runs one recall round itself" in explained(None)
    assert "push: injection (memory_injection_enabled): a B5 memory block" in explained(
        None, MEMCI_MEMORY_INJECTION_ENABLED="true")
    assert "push: off (memory_push): only the model's own recall calls" in explained(None, MEMCI_MEMORY_PUSH="off")
    assert explained(None, MEMCI_MANAGE_CONTEXT="false").startswith("pass-through")


VIEW = {
    "conversation_id": "c1", "epoch": 2,
    "messages": [
        {"role": "system", "content": "Be brief.\n\nPROFILE\n\nCONTENTS"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "r1", "type": "function", "function": {"name": "recall", "arguments": "{\"pages\": [1]}"}}]},
        {"role": "tool", "tool_call_id": "r1", "content": "page 1 text"},
        {"role": "user", "content": "latest\n\n<memci-context><intent>x</intent></memci-context>"},
    ],
    "blocks": [{"name": "B1", "start": 0, "end": 1, "chars": [0, 9]}, {"name": "B2a", "start": 0, "end": 1, "chars": [11, 18]},
               {"name": "B4", "start": 0, "end": 1, "chars": [20, 28]}, {"name": "B6", "start": 1, "end": 5},
               {"name": "tail", "start": 4, "end": 5}],
    "pages": [{"number": "1", "state": "archived"}, {"number": "2", "state": "active"}],
}


def test_the_view_colours_each_block_and_plain_text_keeps_every_word() -> None:
    coloured = prompt_view.render(VIEW, color=True)
    plain = prompt_view.render(VIEW, color=False)
    assert "\x1b[" not in plain
    assert ANSI.sub("", coloured) == plain
    assert prompt_view.COLORS["B1"] + "Be brief." in coloured
    assert prompt_view.COLORS["B2a"] + "PROFILE" in coloured
    assert prompt_view.COLORS["B4"] + "CONTENTS" in coloured
    assert prompt_view.COLORS["recall"] + "page 1 text" in coloured
    assert prompt_view.COLORS["context"] + "<memci-context><intent>x</intent></memci-context>" in coloured
    assert "[2] assistant  B6 recall" in plain and "[4] user  B6 + context" in plain
    assert "pages: 1 active, 1 archived (1 on the contents page, 0 evicted)" in plain and "-> recall({\"pages\": [1]})" in plain

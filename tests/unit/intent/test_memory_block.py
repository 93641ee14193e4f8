"""B5: seed 001's "## Memory" block and keyword query."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.recall.push.memory_block import (
    MEMORY_HEADER,
    TRUNCATED,
    estimate_tokens,
    format_memory,
    memory_keywords,
    memory_line,
    memory_query_text,
)


def test_format_of_hits() -> None:
    hits = [("memory.md", "The user prefers pnpm over npm."), ("page 12", "Deployed on\nCloudflare Workers.")]
    block = format_memory(hits)
    assert block == "## Memory\n[memory.md] The user prefers pnpm over npm.\n[page 12] Deployed on Cloudflare Workers."


def test_no_hits_inject_nothing() -> None:
    assert format_memory([]) == ""
    assert format_memory([("a", "   ")]) == ""
    assert format_memory([("a", "text")], max_hits=0) == ""


def test_long_text_is_cut_at_300_characters() -> None:
    line = memory_line("src", "x" * 301)
    assert line == "[src] " + "x" * 300 + TRUNCATED
    assert memory_line("src", "y" * 300) == "[src] " + "y" * 300
    assert memory_line("src", "上" * 400, cut_chars=10) == "[src] " + "上" * 10 + TRUNCATED


def test_at_most_five_hits_and_duplicates_once() -> None:
    hits = [(f"page {i}", f"fact {i}") for i in range(8)]
    assert format_memory(hits).count("\n") == 5
    assert format_memory([("p", "same"), ("p", "same"), ("q", "other")]).splitlines()[1:] == ["[p] same", "[q] other"]


def test_budget_stops_at_the_first_hit_that_does_not_fit() -> None:
    hits = [("a", "w" * 300), ("b", "v" * 300), ("c", "short")]
    one = estimate_tokens(MEMORY_HEADER) + 1 + estimate_tokens(memory_line("a", "w" * 300)) + 1
    block = format_memory(hits, budget_tokens=one)
    assert block.splitlines() == [MEMORY_HEADER, memory_line("a", "w" * 300)]
    assert format_memory(hits, budget_tokens=5) == ""


def test_cjk_counts_one_token_per_character() -> None:
    assert estimate_tokens("北京天气") == 4
    assert estimate_tokens("abcdefgh") == 2


def test_source_brackets_cannot_be_broken() -> None:
    assert memory_line("we]ird\nname", "t") == "[we)ird name] t"


def test_keywords_query_first_then_recent_messages() -> None:
    words = memory_keywords("Why does the Python GIL exist?", ["We talked about asyncio threads", "and uvloop"])
    assert words[:3] == ["python", "gil", "exist"]
    assert len(words) == 6 and len(set(words)) == 6
    assert memory_keywords("北京的天气怎么样", []) == ["北京的天气怎么样"]
    assert memory_keywords("", ["x"], recent=0) == []


@given(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=600)), max_size=10), st.integers(0, 3000))
def test_block_respects_budget_and_limits(hits: list[tuple[str, str]], budget: int) -> None:
    block = format_memory(hits, budget_tokens=budget)
    if block:
        lines = block.split("\n")
        assert lines[0] == MEMORY_HEADER and 2 <= len(lines) <= 6
        assert estimate_tokens(MEMORY_HEADER) + 1 + sum(estimate_tokens(line) + 1 for line in lines[1:]) <= budget
        for line in lines[1:]:
            assert line.startswith("[") and len(line) <= 30 + 300 + len(TRUNCATED)


def test_query_text_is_the_query_then_the_recent_user_messages() -> None:
    previous = [f"message {i}" for i in range(8)]
    assert memory_query_text("Why does the GIL exist?", previous).splitlines() == [
        "Why does the GIL exist?", "message 3", "message 4", "message 5", "message 6", "message 7"
    ]
    assert memory_query_text("q", ["", "  ", "a"], recent=0) == "q"

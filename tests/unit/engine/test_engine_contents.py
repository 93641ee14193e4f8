from memci_proxy.engine import ARCHIVED, PageRecord, render_contents, summary_line
from memci_proxy.engine.contents import page_entry_body

DAY = 1_763_769_600.0  # 2025-11-22 00:00 UTC


def test_summary_line_of_text_tool_calls_and_tool_results() -> None:
    assert summary_line({"role": "user", "content": "How do I\n  tune   postgres?"}, 80) == "user: How do I tune postgres?"
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": '{"q":\n "pg"}'}},
        {"id": "d", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}
    assert summary_line(call, 80) == 'assistant: called search({"q": "pg"}); called read({})'
    assert summary_line({"role": "tool", "name": "search", "content": "3 results"}, 80) == "tool search: 3 results"
    assert summary_line({"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url"}]}, 80) \
        == "user: see [image_url]"
    assert summary_line({"role": "assistant", "content": ""}, 80) == "assistant: (empty)"


def test_summary_line_is_cut_to_the_limit() -> None:
    line = summary_line({"role": "user", "content": "word " * 100}, 40)
    assert len(line) == 40 and line.endswith("…")


def test_contents_page_text_is_deterministic() -> None:
    msgs = [{"role": "user", "content": "Which index for a range query?"},
            {"role": "assistant", "content": "A B-tree index."}]
    body = page_entry_body(msgs, 80)
    pages = [
        PageRecord(3, 1, 4, 6, 50, status=ARCHIVED, first_seen=DAY + 3600, contents=body, recall_count=2),
        PageRecord(4, 2, 6, 7, 50, status=ARCHIVED, first_seen=DAY + 90000, contents="  - assistant: done"),
        PageRecord(5, 1, 7, 9, 50, first_seen=DAY),
    ]
    text = render_contents(pages, "recall")
    assert text == (
        "## Contents of archived pages\n"
        "Earlier parts of this conversation were archived into numbered pages that are no longer shown in full. "
        "Each entry gives the page number, date, message count and one line per message. To read pages in full, "
        'call the `recall` tool with their numbers, e.g. {"pages": [3, "12.2"]}.\n\n'
        "[Page 3] 2025-11-22, 2 messages, recalled 2x\n"
        "  - user: Which index for a range query?\n"
        "  - assistant: A B-tree index.\n"
        "[Page 4.2] 2025-11-23, 1 message\n"
        "  - assistant: done"
    )
    assert render_contents(pages, "recall") == text
    assert render_contents(pages[2:], "recall") == ""
    assert "`recall`" not in render_contents(pages, None)

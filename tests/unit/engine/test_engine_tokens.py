import importlib.util

import pytest

from memci_proxy.engine import EstimateCounter, TokenCounter, make_counter
from memci_proxy.engine.tokens import MESSAGE_OVERHEAD


def test_estimate_counts_cjk_one_each_and_other_text_by_four() -> None:
    c = EstimateCounter()
    assert c.count_text("") == 0
    assert c.count_text("abcd" * 10) == 10
    assert c.count_text("数据库查询") == 5
    assert c.count_text("数据库 abcd") == 3 + 2  # 3 CJK + 5 other chars -> 2
    assert c.count_text("こんにちは") == 5


def test_message_counts_content_parts_tool_calls_and_overhead() -> None:
    c = EstimateCounter()
    assert c.count_message({"role": "user", "content": "abcd"}) == MESSAGE_OVERHEAD + 1
    parts = {"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url", "image_url": {}}]}
    assert c.count_message(parts) > MESSAGE_OVERHEAD + 100
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": '{"q": "abcdabcd"}'}}]}
    assert c.count_message(call) > MESSAGE_OVERHEAD + 5
    reasoning = {"role": "assistant", "content": "a", "reasoning_content": "x" * 400}
    assert c.count_message(reasoning) >= 100


def test_message_texts_of_plain_and_fuller_messages() -> None:
    from memci_proxy.engine.tokens import message_texts

    assert message_texts({"role": "user", "content": "abcd"}) == (["abcd"], 0)
    assert message_texts({"role": "user", "content": "abcd", "name": "ann"}) == (["abcd", "ann"], 0)
    assert message_texts({"content": "abcd", "tool_call_id": "t1"}) == (["abcd", "t1"], 0)  # no role: not the plain kind
    assert message_texts({"role": "tool", "content": "ok", "tool_call_id": "t1"}) == (["ok", "t1"], 0)
    assert message_texts({"role": "user", "content": [{"type": "text", "text": "a"}]}) == (["a"], 0)


def test_counters_satisfy_the_protocol() -> None:
    assert isinstance(EstimateCounter(), TokenCounter)
    assert isinstance(make_counter(""), EstimateCounter)
    assert isinstance(make_counter("/nonexistent/tokenizer.json"), EstimateCounter)


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None, reason="tokenizers not installed")
def test_tokenizers_counter(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from memci_proxy.engine import TokenizersCounter

    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = TokenizersCounter(str(path))
    assert counter.count_text("hello world hello") == 3
    assert counter.count_message({"role": "user", "content": "hello"}) == MESSAGE_OVERHEAD + 1

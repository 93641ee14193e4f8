from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.emulator.tokenizer import SPECIAL_TOKENS, Tokenizer


def test_special_tokens_are_single_tokens() -> None:
    tokenizer = Tokenizer()
    assert tokenizer.split("<|im_start|>user\nhi<|im_end|>") == ["<|im_start|>", "user", "\n", "hi", "<|im_end|>"]
    for token in SPECIAL_TOKENS:
        assert tokenizer.split(token) == [token]


def test_each_cjk_character_is_one_token() -> None:
    tokenizer = Tokenizer()
    assert tokenizer.split("你好世界") == ["你", "好", "世", "界"]
    assert tokenizer.split("日本語のテキスト。") == list("日本語のテキスト。")
    assert tokenizer.count("한국어") == 3


def test_words_punctuation_and_whitespace() -> None:
    tokenizer = Tokenizer()
    assert tokenizer.split("Hello, world!  foo_bar 42") == [
        "Hello", ",", " ", "world", "!", "  ", "foo_bar", " ", "42"
    ]  # fmt: skip
    assert tokenizer.split("a\n\nb") == ["a", "\n", "\n", "b"]
    assert tokenizer.split("x\t \ty") == ["x", "\t \t", "y"]
    assert tokenizer.split('{"a": 1}') == ["{", '"', "a", '"', ":", " ", "1", "}"]


def test_ids_are_interned_and_stable() -> None:
    tokenizer = Tokenizer()
    first = tokenizer.encode("the cat and the dog")
    assert first[0] == first[4 + 2]  # "the" twice
    assert tokenizer.encode("the cat and the dog") == first
    assert tokenizer.token_id("<|im_start|>") == 0
    assert tokenizer.vocabulary_size >= len(SPECIAL_TOKENS) + 4


@given(st.text())
def test_tokens_concatenate_back_to_the_text(text: str) -> None:
    assert "".join(Tokenizer().split(text)) == text


@given(st.text(), st.text())
def test_prompt_ending_with_newline_keeps_its_tokens_when_text_follows(prompt: str, answer: str) -> None:
    tokenizer = Tokenizer()
    head = prompt + "<|im_start|>assistant\n"
    assert tokenizer.split(head + answer)[: len(tokenizer.split(head))] == tokenizer.split(head)


def test_piece_memo_stays_bounded_and_correct() -> None:
    tokenizer = Tokenizer(memo_entries=3, memo_chars=40)
    pieces = [f"<|im_start|>user\npiece number {index}<|im_end|>\n" for index in range(10)]
    for _ in range(2):
        assert tokenizer.encode_pieces(pieces) == tokenizer.encode("".join(pieces))
    assert len(tokenizer._memo) <= 3
    assert tokenizer._memo_chars == sum(len(piece) for piece in tokenizer._memo)

"""The emulator with a real model's files (--model-dir): prompts rendered by the model's chat template, counted by its
byte-level tokenizer, and an answer cut inside a character cached as the server caches it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from memci_proxy.emulator.chat import plan_chat  # noqa: E402
from memci_proxy.emulator.cli import add_arguments, config_from_args  # noqa: E402
from memci_proxy.emulator.config import EmulatorConfig  # noqa: E402
from memci_proxy.emulator.model_files import ModelFilesError, load_model_files  # noqa: E402
from memci_proxy.emulator.state import EmulatorState  # noqa: E402

# SmolLM2-Instruct's template, as its tokenizer_config.json ships it: ChatML, tools ignored
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello proxy",
          "这个问题可以从几个方面来看。首先要明确目标和限制条件。", "你好，世界"] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE (as SmolLM2's and GPT-2's) trained here, with the special tokens of ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    root = tmp_path_factory.mktemp("model")
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": "<|im_end|>"}))
    return root


def test_the_models_template_renders_the_prompt(model_dir: Path) -> None:
    _, template = load_model_files(model_dir)
    text = "".join(template.render_chat_pieces(
        [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
         {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": []}],
        tools=[{"type": "function", "function": {"name": "recall"}}]))
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n")  # tools: as the template says


def test_pieces_join_to_the_text_and_carry_the_tokenizers_ids(model_dir: Path) -> None:
    tokenizer, _ = load_model_files(model_dir)
    for text in ("你好，世界 hello", "龍鳳 naïve café ☕", "x", ""):
        pieces = tokenizer.split(text)
        assert "".join(pieces) == text
        assert tokenizer.ids_of(pieces) == tokenizer.encode(text)
    assert tokenizer.count("龍鳳") > 2  # characters it did not learn: bytes
    assert tokenizer.end_of_turn_id == tokenizer.token_id("<|im_end|>")


def test_an_answer_cut_inside_a_character_is_cached_as_generated(model_dir: Path) -> None:
    state = EmulatorState(EmulatorConfig(model_dir=str(model_dir), max_model_len=4096))
    tokenizer = state.tokenizer
    say = "龍鳳呈祥，这个问题可以从几个方面来看。"  # characters it did not learn: two or three tokens each
    pieces = tokenizer.split(say)
    cut = next(i for i in range(1, len(pieces)) if pieces[i] == "")  # the second token of one character
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": f"q[[say:{say}]]"}]
    first = plan_chat(state, {"model": "m", "messages": messages, "max_tokens": cut})
    answer = first.choices[0]
    assert answer.finish_reason == "length" and answer.completion_tokens == cut
    following = messages + [{"role": "assistant", "content": answer.content}, {"role": "user", "content": "more"}]
    second = plan_chat(state, {"model": "m", "messages": following, "max_tokens": 4})
    # the cache holds the generated ids; the resent text tokenizes to the whole character: the match stops there
    assert second.cached_tokens == first.prompt_tokens + cut
    prompt = "".join(state.render_chat_pieces(following))
    assert second.prompt_tokens == len(tokenizer.encode(prompt))


def test_the_flag_and_a_directory_without_a_tokenizer(model_dir: Path, tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--model-dir", str(model_dir)])).model_dir == str(model_dir)
    assert config_from_args(parser.parse_args([])).model_dir is None
    with pytest.raises(ModelFilesError, match="tokenizer.json not found"):
        load_model_files(tmp_path)
    (tmp_path / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text())
    with pytest.raises(ModelFilesError, match="no chat template"):
        load_model_files(tmp_path)


def test_the_agent_sessions_tools_template_renders_schemas_calls_and_results(model_dir: Path, tmp_path: Path) -> None:
    """loadtests/chatml_tools.jinja (the agent sessions' EMULATOR_CHAT_TEMPLATE): the tools' schemas in the system turn,
    the assistant's calls and the tool results in the prompt, so that an agent's fixed part is counted as a
    tool-calling model's template renders it."""
    (tmp_path / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text())
    template_file = Path(__file__).resolve().parents[3] / "loadtests" / "chatml_tools.jinja"
    (tmp_path / "chat_template.jinja").write_text(template_file.read_text())
    _, template = load_model_files(tmp_path)
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    text = "".join(template.render_chat_pieces(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list"},
         {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}], tools=tools))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(tools[0], ensure_ascii=False) in text
    assert '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\na.txt\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    without = "".join(template.render_chat_pieces([{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": "hi"}]))
    assert without == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

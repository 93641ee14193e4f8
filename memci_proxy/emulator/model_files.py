"""A real model's tokenizer and chat template for the emulator (``--model-dir``): prompts rendered and counted as the
real server renders and counts them, so that the emulator's cache figures can be compared with that server's.

The directory is a Hugging Face model's: ``tokenizer.json`` (the `tokenizers` package reads it) and the chat template
(``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template``; rendered with jinja2 as transformers
renders it). Where the built-in tokenizer splits text into whole words, a byte-level BPE splits a Chinese character
into two or three tokens and an answer cut by ``max_tokens`` may end inside a character: what the server caches
(the generated ids) then differs from what the next request's prompt tokenizes to, as on the real server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memci_proxy.emulator.template import TemplateError, check_shapes, content_text


class ModelFilesError(ValueError):
    """The model directory lacks a file the emulator needs, or a package to read it is missing."""


class Piece(str):
    """A token's share of the text (``""`` for the second and later tokens of one character) and its id."""

    token_id: int

    def __new__(cls, text: str, token_id: int) -> "Piece":
        piece = super().__new__(cls, text)
        piece.token_id = token_id
        return piece


class ModelTokenizer:
    """The emulator's tokenizer interface over a ``tokenizer.json``."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError:  # pragma: no cover - the extra `tokenizers` is not installed
            raise ModelFilesError("--model-dir needs the `tokenizers` package (pip install 'memci-proxy[tokenizers]')")
        self._tokenizer = HfTokenizer.from_file(str(path))
        end = self._tokenizer.token_to_id("<|im_end|>")
        if end is None:
            end = self._tokenizer.token_to_id("<|endoftext|>")
        self.end_of_turn_id = end if end is not None else 0

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_pieces(self, pieces: list[str]) -> list[int]:
        return self.encode("".join(pieces))  # the server tokenizes the whole prompt: pieces may merge across

    def split(self, text: str) -> list[str]:
        """Pieces whose concatenation is ``text``, each carrying its token's id (see Piece)."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        pieces: list[str] = []
        end = 0
        for token_id, (_, stop) in zip(encoding.ids, encoding.offsets):
            stop = max(stop, end)
            pieces.append(Piece(text[end:stop], token_id))
            end = stop
        if pieces and end < len(text):
            last = pieces[-1]
            pieces[-1] = Piece(last + text[end:], last.token_id)
        return pieces

    def ids_of(self, tokens: list[str]) -> list[int]:
        if all(isinstance(t, Piece) for t in tokens):
            return [t.token_id for t in tokens]  # type: ignore[attr-defined]
        return self.encode("".join(tokens))

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def token_id(self, token: str) -> int:
        found = self._tokenizer.token_to_id(token)
        return found if found is not None else 0

    @property
    def vocabulary_size(self) -> int:
        return self._tokenizer.get_vocab_size()


class ModelTemplate:
    """The model's chat template, rendered as transformers renders it (sandboxed jinja2, trim and lstrip blocks)."""

    def __init__(self, source: str, special: dict[str, str]) -> None:
        try:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:  # pragma: no cover
            raise ModelFilesError("--model-dir needs the `jinja2` package to render the chat template")

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        self._template = env.from_string(source)
        self._special = special

    def render_chat_pieces(self, messages: list[Any], tools: list[Any] | None = None,
                           add_generation_prompt: bool = True) -> list[str]:
        check_shapes(messages, tools)
        plain = []
        for message in messages:
            item = dict(message)
            item["content"] = content_text(message.get("content"))  # parts joined, null as "" (as SGLang passes)
            if item["role"] == "developer":
                item["role"] = "system"
            plain.append(item)
        try:
            text = self._template.render(messages=plain, tools=tools or None,
                                         add_generation_prompt=add_generation_prompt, **self._special)
        except TemplateError:
            raise
        except Exception as exc:  # a template's own error (jinja2's TemplateError, a missing key)
            raise TemplateError(f"the model's chat template failed: {exc}") from None
        return [text]


def load_model_files(directory: str | Path) -> tuple[ModelTokenizer, ModelTemplate]:
    """The tokenizer and chat template of a model directory; ModelFilesError naming what is missing."""
    root = Path(directory)
    tokenizer_file = root / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelFilesError(f"{tokenizer_file} not found (--model-dir names a Hugging Face model's directory)")
    config: dict[str, Any] = {}
    config_file = root / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
    template_file = root / "chat_template.jinja"
    source = template_file.read_text(encoding="utf-8") if template_file.is_file() else config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str) or not source:
        raise ModelFilesError(f"no chat template in {root} (chat_template.jinja or tokenizer_config.json)")
    special = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}
    return ModelTokenizer(tokenizer_file), ModelTemplate(source, special)


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content") or "")
    return value if isinstance(value, str) else ""

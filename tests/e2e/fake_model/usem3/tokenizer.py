"""The fake package's tokenizer: words, lower-cased."""

from __future__ import annotations

import re


class UseTokenizer:
    def __init__(self, model_path: str) -> None:
        self.model_path = model_path

    def words(self, text: str) -> list[str]:
        return re.findall(r"\w+", text.lower())

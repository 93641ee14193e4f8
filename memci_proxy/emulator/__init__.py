"""Upstream emulator: an OpenAI-compatible server standing in for SGLang in tests and benchmarks.

It renders chat messages with a ChatML (Qwen2.5-style) template, counts tokens with a deterministic
tokenizer, accounts cached prefix tokens with its own radix tree, answers with deterministic text and
can be scripted (tool calls, faults) through markers in the last message. It shares no code with
``memci_proxy.engine``: its counts are an independent measurement of what the engine does.
"""

from memci_proxy.emulator.config import EmulatorConfig

__all__ = ["EmulatorConfig"]

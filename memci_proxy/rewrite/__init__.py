"""Intent rewrite levels (DESIGN 7, seed 004 NQR): a small model with a tight timeout -> rules -> pass-through.

``rewrite(history, last_user, model_client, timeout_s)`` (``levels.py``) returns a
``memci_proxy.engine.intent.RewriteResult`` whose ``level`` says which level served; ``ModelRewriter``
(``model.py``) is the model level's client for an OpenAI-compatible ``/chat/completions`` endpoint.
"""

from memci_proxy.engine.intent import LEVEL_MODEL, LEVEL_PASSTHROUGH, LEVEL_RULES, RewriteResult, intent_block
from memci_proxy.rewrite.levels import DEFAULT_TIMEOUT_S, RewriteModel, rewrite
from memci_proxy.rewrite.model import ModelRewriter, build_prompt, clean_answer

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LEVEL_MODEL",
    "LEVEL_PASSTHROUGH",
    "LEVEL_RULES",
    "ModelRewriter",
    "RewriteModel",
    "RewriteResult",
    "build_prompt",
    "clean_answer",
    "intent_block",
    "rewrite",
]

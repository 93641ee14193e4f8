"""Logs never hold a key: a filter on every log handler that redacts the configured secrets and anything shaped
like a bearer token or an ``sk-`` key (defence in depth: the proxy's own messages never name a key, and message
content is logged only with ``log_prompts``). The same filter quotes every argument that holds a line-breaking
character (memci_proxy.wire.logtext), so client text cannot forge a log line."""

from __future__ import annotations

import json
import logging
import os
import re
import tomllib
from pathlib import Path

from memci_proxy.keys import parse_virtual_keys
from memci_proxy.settings import Settings
from memci_proxy.wire.logtext import safe_arg

_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_SK = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")


class RedactSecrets(logging.Filter):
    """A handler filter: the configured secrets and anything shaped like a bearer or ``sk-`` key are replaced by
    ``[redacted]`` in every record written (defence in depth: the proxy's own messages never name a key)."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        text = _BEARER.sub(r"\1[redacted]", text)
        return _SK.sub("[redacted]", text)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(safe_arg(a) for a in record.args)
        try:
            message = record.getMessage()
        except Exception:
            return True
        redacted = self.redact(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if redacted != message or record.args:
            record.msg, record.args = redacted, ()
        return True


def install_log_redaction(settings: Settings) -> RedactSecrets:
    """Put the redaction filter on every handler of the root logger (call after logging is configured)."""
    secrets = [settings.admin_key, settings.upstream_api_key, settings.embeddings_api_key,
               settings.rewrite_model_api_key, settings.summary_model_api_key, settings.vision_api_key,
               settings.blob_s3_secret_key]
    if settings.auth_mode == "virtual_keys":
        secrets += [k.upstream_key for k in parse_virtual_keys(settings.virtual_keys).values()]
        secrets += _settings_client_keys(settings.virtual_keys)
    redactor = RedactSecrets(secrets)
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if redactor not in handler.filters:
                handler.addFilter(redactor)
    return redactor


def _settings_client_keys(text: str) -> list[str]:
    """The client keys written in the ``virtual_keys`` setting (only to redact them from logs)."""
    try:
        raw = text.strip()
        if raw and not raw.startswith(("{", "[")) and "=" not in raw:
            raw = Path(os.path.expanduser(raw)).read_text()
        data = json.loads(raw) if raw.startswith("{") else tomllib.loads(raw)
    except (OSError, ValueError):
        return []
    if isinstance(data, dict) and isinstance(data.get("keys"), dict):
        data = data["keys"]
    return [str(k) for k in data] if isinstance(data, dict) else []

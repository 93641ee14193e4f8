"""Client text in log lines is quoted (memci_proxy.wire.logtext), at the call sites and by the handlers' filter."""

from __future__ import annotations

import io
import logging

from memci_proxy.log_redaction import RedactSecrets
from memci_proxy.wire.logtext import field, safe_arg

FORGED = "memci-blob://sha256/\nFORGED 2026-01-01 00:00:00 INFO memci: admin logged in\r\u2028\u202eX\x1b[2J"


def test_a_field_is_one_bounded_json_string_with_every_line_breaking_character_escaped():
    quoted = field(FORGED)
    assert quoted.startswith('"') and "\n" not in quoted and "\r" not in quoted
    assert "\u2028" not in quoted and "\u202e" not in quoted and "\x1b" not in quoted
    assert "\\n" in quoted and "\\u2028" in quoted
    long = field("x" * 10_000, 50)
    assert len(long) < 80 and long.endswith("(+9950 chars)")
    assert field("plain") == '"plain"'


def test_safe_arg_quotes_only_text_that_breaks_lines():
    assert safe_arg("conversation c123") == "conversation c123"
    assert safe_arg(42) == 42
    assert "\n" not in safe_arg(FORGED)
    assert "\n" not in safe_arg(ValueError(FORGED))


def test_the_log_filter_keeps_every_record_on_one_line():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets([]))
    logger = logging.getLogger("memci.test.quoting")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("image %s keeps its placeholder: %s", FORGED[:40], ValueError(FORGED))
        logger.warning("could not store %s (%s)", "c1", "plain reason")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("INFO memci.test.quoting: image \"memci-blob")
    assert lines[1] == "WARNING memci.test.quoting: could not store c1 (plain reason)"

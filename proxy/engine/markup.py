"""The proxy's own markup in the prompt, and how text a client controls is kept from imitating it.

The proxy never parses its markup back out of text: hidden recall exchanges are spliced by position (the
state), the contents page is rendered from the state, blob references are honoured only for bytes the
tenant sent. What remains is the model, which reads the prompt as one text. So wherever the proxy *quotes*
client-derived text inside a block of its own (contents lines, recall results, search excerpts, the memory
and intent blocks, summaries and profile facts), ``quote`` neutralises look-alikes of that block's structure:

* the volatile block's tags ``<memci-context>``, ``<task-state>``, ``<intent>``, ``<memory>`` (and closers):
  ``<`` becomes ``&lt;``;
* a page header ``[Page N]`` and a decayed image ``[image memci-blob://...]``: a backslash before the ``[``;
* a markdown heading at the start of a line (the contents page, summary and memory headings): a backslash
  before the ``#``.

The client's own messages are forwarded byte for byte, with one exception: the user message that carries
the proxy's ``<memci-context>`` block has the block's tags escaped in the client's text (``escape_tags``), so
the only block the model sees there is the proxy's. That message is rendered without the block (and so
unescaped) on later turns anyway: no cache is lost. Every function here is a pure function of its input, so
the same text always renders the same bytes (the prefix cache depends on it).
"""

from __future__ import annotations

import re

VOLATILE_TAGS = ("memci-context", "task-state", "intent", "memory")

_TAG = re.compile(r"<(?=[ \t]{0,3}/?[ \t]{0,3}(?:memci-context|task-state|intent|memory)\b)", re.IGNORECASE)
_BRACKET = re.compile(r"(?<!\\)\[(?=page[ \t]|image[ \t]+memci-blob://)", re.IGNORECASE)
_HEADING = re.compile(r"^(?=[ \t]{0,3}#{1,6}[ \t])", re.MULTILINE)
# One pass to tell whether anything needs quoting (most text needs none).
_ANY = re.compile(
    r"<[ \t]{0,3}/?[ \t]{0,3}(?:memci-context|task-state|intent|memory)\b|(?<!\\)\[(?:page[ \t]|image[ \t]+memci-blob://)"
    r"|^[ \t]{0,3}#{1,6}[ \t]",
    re.IGNORECASE | re.MULTILINE,
)


def escape_tags(text: str) -> str:
    """``text`` with look-alikes of the volatile block's tags made inert (``<`` -> ``&lt;``)."""
    if "<" not in text:
        return text
    return _TAG.sub("&lt;", text)


def quote(text: str) -> str:
    """Client-derived ``text`` as it may appear inside one of the proxy's blocks (see the module docstring).
    Idempotent: quoting quoted text changes nothing."""
    if not text or ("<" not in text and "[" not in text and "#" not in text) or _ANY.search(text) is None:
        return text
    text = _TAG.sub("&lt;", text)
    text = _BRACKET.sub(r"\\[", text)
    return _HEADING.sub("\\\\", text)

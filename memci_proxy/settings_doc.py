"""The settings reference, generated from `memci_proxy/settings.py`.

    memci-proxy settings --markdown > docs/settings.md      # the page (tests/unit/test_settings_doc.py checks it)
    memci-proxy settings                                     # the resolved values of this machine, with their source

The page is written from the fields' docstrings (`metadata["doc"]`), defaults, limits and choices, grouped by
`SECTIONS`; nothing in it is typed by hand, so it cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from memci_proxy.settings import SECTIONS, Settings, env_name, setting_fields

COMMAND = "memci-proxy settings --markdown > docs/settings.md"

_INTRO = f"""# Settings

<!-- Generated from memci_proxy/settings.py by `{COMMAND}`: edit the docstrings there, not this page. -->

Precedence: command-line flags > environment variables > a TOML config file (`--config FILE` or `MEMCI_CONFIG`;
the packaged `default.toml` lists every setting with its default) > built-in defaults. A bad value stops start-up
with a message that names the setting. `memci-proxy settings` prints the values a proxy started here would use,
and where each came from; `memci-proxy doctor` checks them against the upstream, the database and Redis.
"""


def format_default(value: object) -> str:
    """A default as the page shows it: `(empty)` for empty text, true/false for booleans, code otherwise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def _limits(f: dataclasses.Field) -> str:
    meta = f.metadata
    parts = []
    if "choices" in meta:
        parts.append("one of " + ", ".join(f"`{c}`" for c in meta["choices"]))
    if "min" in meta and "max" in meta:
        parts.append(f"{meta['min']} to {meta['max']}")
    elif "min" in meta:
        parts.append(f"at least {meta['min']}")
    elif "max" in meta:
        parts.append(f"at most {meta['max']}")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def grouped_fields() -> Iterator[tuple[str, list[dataclasses.Field]]]:
    """(section title, its fields) in the order of `Settings`."""
    title = "Other"
    group: list[dataclasses.Field] = []
    for f in setting_fields():
        if f.name in SECTIONS:
            if group:
                yield title, group
            title, group = SECTIONS[f.name], []
        group.append(f)
    if group:
        yield title, group


def markdown() -> str:
    """docs/settings.md."""
    out = [_INTRO]
    out.append("Sections: " + ", ".join(f"[{title}](#{_anchor(title)})" for title, _ in grouped_fields()) + ".\n")
    for title, fields in grouped_fields():
        out.append(f"## {title}\n")
        out.append("| setting | env var | default | meaning |")
        out.append("| --- | --- | --- | --- |")
        for f in fields:
            doc = f.metadata.get("doc", "")
            limits = _limits(f)
            meaning = doc + (f" ({limits}.)" if limits else "")
            out.append(f"| `{f.name}` | `{env_name(f.name)}` | {_cell(format_default(f.default))} | {_cell(meaning)} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def resolved(settings: Settings, sources: dict[str, str]) -> str:
    """The values in effect, one per line, secrets masked, with where each came from."""
    lines = []
    width = max(len(f.name) for f in setting_fields())
    for f in setting_fields():
        lines.append(f"{f.name:<{width}}  {shown_value(f.name, getattr(settings, f.name))}  "
                     f"({sources.get(f.name, 'default')})")
    return "\n".join(lines) + "\n"


def shown_value(name: str, value: object) -> str:
    """A setting's value as it may be printed: keys masked (text values only: a switch named *_key holds no
    secret), passwords in URLs hidden."""
    if value and isinstance(value, str) and (name.endswith("_key") or name == "virtual_keys"):
        return "'****'"
    if value and isinstance(value, str) and name.endswith("_url") and "@" in value:
        head, _, tail = value.rpartition("@")
        scheme, _, credentials = head.partition("://")
        user = credentials.split(":", 1)[0]
        return repr(f"{scheme}://{user}:***@{tail}")
    return repr(value)

"""The documentation stays true: generated pages are current, links resolve, the README keeps its commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memci_proxy import metrics_doc, settings_doc
from memci_proxy.settings import env_name, setting_fields

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize(("page", "generate", "command"), [
    ("settings.md", settings_doc.markdown, settings_doc.COMMAND),
    ("metrics.md", metrics_doc.markdown, metrics_doc.COMMAND),
])
def test_generated_pages_are_current(page: str, generate, command: str) -> None:
    current = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert current == generate(), f"docs/{page} is out of date: run `{command}`"


def test_every_setting_has_a_row_with_its_env_var() -> None:
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    for f in setting_fields():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{f.name}` |")), None)
        assert row is not None, f"docs/settings.md lacks a row for {f.name}"
        assert f"`{env_name(f.name)}`" in row
        assert f.metadata.get("doc"), f"setting {f.name} has no docstring (metadata doc)"


def test_the_readme_keeps_the_two_commands() -> None:
    assert "bash scripts/test.sh" in README
    assert ".venv/bin/memci-proxy serve --upstream" in README
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in ci


def test_the_readme_links_every_docs_page() -> None:
    for page in PAGES:
        assert f"(docs/{page.name})" in README, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("path", [ROOT / "README.md", ROOT / "loadtests" / "README.md", *PAGES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links {target}, which does not exist"

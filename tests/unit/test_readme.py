"""The README stays true: every setting is in its configuration table, with its env var and default."""

from pathlib import Path

from proxy.settings import env_name, setting_fields

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented():
    for f in setting_fields():
        row = next((line for line in README.splitlines() if line.startswith(f"| `{f.name}` |")), None)
        assert row is not None, f"README lacks a row for {f.name}"
        assert f"`{env_name(f.name)}`" in row


def test_the_two_setup_commands_are_there():
    assert "bash scripts/test.sh" in README
    assert ".venv/bin/memci-proxy serve --upstream" in README
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci

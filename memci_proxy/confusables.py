"""Look-alike characters for the escaping of client text inside the proxy's own blocks (memci_proxy.engine.markup):
Unicode's confusables table (UTS #39) as the maintained ``confusable-homoglyphs`` package ships it. Its data file is
part of the package and read once; nothing is fetched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confusable_homoglyphs.confusables import confusables_data


def _ascii_table(data: Mapping[str, Sequence[Mapping[str, str]]]) -> dict[str, str]:
    """Each non-ASCII character with a printable ASCII character among its homoglyphs -> the first such one."""
    table: dict[str, str] = {}
    for char, glyphs in data.items():
        if char.isascii():
            continue
        for glyph in glyphs:
            c = glyph.get("c", "")
            if len(c) == 1 and c.isascii() and c.isprintable() and c != " ":
                table[char] = c
                break
    return table


class UnicodeLookAlikes:
    """memci_proxy.engine.markup.LookAlikes over the confusables table."""

    def __init__(self, data: Mapping[str, Sequence[Mapping[str, str]]] = confusables_data) -> None:
        self._ascii = _ascii_table(data)

    def ascii_of(self, char: str) -> str:
        return self._ascii.get(char, "")

    def spellings_of(self, ascii_char: str) -> str:
        return "".join(sorted(c for c, a in self._ascii.items() if a == ascii_char))


def install() -> None:
    """Fold look-alikes with the confusables table in this process (the composition root calls this once)."""
    from memci_proxy.engine.markup import use_look_alikes

    use_look_alikes(UnicodeLookAlikes())

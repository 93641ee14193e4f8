"""Long texts cut into pieces an encoder reads whole: it averages over its tokens, so a very long input blurs what
it is about."""

from __future__ import annotations

__all__ = ["CHUNK_CHARS", "MAX_CHUNKS", "chunk_text"]

CHUNK_CHARS = 1200
MAX_CHUNKS = 24  # a page past CHUNK_CHARS * MAX_CHUNKS characters is embedded from chunks spread over all of it


def chunk_text(text: str, max_chars: int = CHUNK_CHARS, max_chunks: int = MAX_CHUNKS) -> list[str]:
    """Pieces of at most ``max_chars`` characters cut at whitespace (inside a word when it is longer); no piece
    for a blank text. A text of more than ``max_chunks`` pieces keeps ``max_chunks`` of them spread evenly over
    it, the first and the last included (its end counts as much as its beginning)."""
    text = " ".join(text.split())
    chunks: list[str] = []
    while text:
        if len(text) <= max_chars:
            chunks.append(text)
            break
        cut = text.rfind(" ", max_chars // 2, max_chars + 1)
        cut = cut if cut > 0 else max_chars
        chunks.append(text[:cut])
        text = text[cut:].lstrip()
    if len(chunks) <= max_chunks:
        return chunks
    if max_chunks <= 1:
        return chunks[:max_chunks]
    step = (len(chunks) - 1) / (max_chunks - 1)
    return [chunks[round(i * step)] for i in range(max_chunks)]

"""The vector half of the recall search as the settings choose it (or none: lexical search only)."""

from __future__ import annotations

from typing import Any

from memci_proxy.recall.vectors.candidates import CandidateVectors
from memci_proxy.recall.vectors.endpoint import EmbeddingsClient
from memci_proxy.recall.vectors.local_embedder import LocalEmbedder
from memci_proxy.recall.vectors.index import PageVectors
from memci_proxy.store.ports import PageVectorStore

__all__ = ["build_page_vectors"]


def build_page_vectors(
    store: PageVectorStore,
    embeddings_url: str,
    upstream_url: str = "",
    model: str = "",
    api_key: str = "",
    timeout_s: float = 5.0,
    inline_pages: int = 0,
    local_model: str = "",
    local_weights: str = "",
    metrics: object = None,
    cache_max_bytes: int = 64 * 2**20,
    max_lag_s: float = 5.0,
    pages: str = "candidates",
    query_deadline_s: float = 0.05,
    page_process: bool = False,
) -> Any:
    """The vector half of the search, or None (lexical only) when neither an endpoint nor the local model is set.

    ``embeddings_url``: an OpenAI base URL serving ``/embeddings``, or "upstream" for the upstream's own
    (the first of ``upstream_url``'s comma-separated URLs); it takes precedence over ``local_model``, the
    packaged model's name (memci_proxy.recall.vectors.packaged_models.MODELS; empty or "off": none; an unknown name: a
    model that is absent, so the search is lexical and counted so). ``pages``: "candidates" (a search embeds its lexical
    candidates: memci_proxy.recall.vectors.candidates.CandidateVectors) or "archive" (every archived page: PageVectors);
    ``query_deadline_s``: how long a search waits for its query's vector (candidates; then it is lexical; with an
    embeddings server, at least ``timeout_s``); ``page_process``: the packaged model embeds pages in a child process
    (memci_proxy.recall.vectors.page_process)."""
    def vectors(embedder: Any) -> Any:
        if pages == "candidates":
            return CandidateVectors(embedder, cache_max_bytes=cache_max_bytes, metrics=metrics,
                                    query_deadline_s=query_deadline_s, max_lag_s=max_lag_s)
        return PageVectors(store, embedder, inline_pages=inline_pages, cache_max_bytes=cache_max_bytes,
                           max_lag_s=max_lag_s, metrics=metrics)

    url = embeddings_url.strip()
    if url.lower() == "upstream":
        url = upstream_url.split(",")[0].strip()
    if url:  # a query's vector from a server is bounded by the client's own timeout
        query_deadline_s = max(query_deadline_s, timeout_s)
        return vectors(EmbeddingsClient(url, model=model, timeout_s=timeout_s, api_key=api_key))
    name = local_model.strip().lower()
    if name in ("", "off", "none"):
        return None
    return vectors(LocalEmbedder(name, local_weights, metrics=metrics, page_process=page_process))

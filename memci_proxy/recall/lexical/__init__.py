"""The lexical half of the recall search (pure): terms (text), BM25 (bm25), entity and count terms (entities,
counting)."""

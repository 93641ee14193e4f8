"""Recall: the `recall` tool the proxy answers itself, the search behind it, and the push that recalls unasked.

Grouped by concern (each group's own docstring says what it holds):

- ``resolver``: answering one recall call, by page number or by search; where the groups meet.
- ``tool/``: the tool's schema and injection, the server-side loop over recall rounds, the rounds' bookkeeping.
- ``lexical/``: text analysis, BM25, entity and count terms.
- ``search/``: a conversation's indexes, the ranking's steps, the fusion of its lexical and vector halves.
- ``vectors/``: page and query vectors, the packaged models and the embeddings endpoint, the background embedding.
- ``dates/``: the days a query asks about, calendar and relative.
- ``push/``: what a user message needs from the archive (salience), the pushed round's shape, the B5 memory block.
- ``reading/``: archived pages as text, reading part of an offloaded output, a hit's neighbouring parts.
- ``users/``: memory across one end user's conversations: ranking, labels, and the search of the store.
"""

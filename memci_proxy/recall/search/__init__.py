"""The recall search: a conversation's indexes and where page bodies come from (indexes), the steps a search runs
(ranking, pure) and the fusion of its lexical and vector rankings (fusion, pure)."""

"""The vector half of the recall search: what the settings build (build), page vectors and their index (index,
candidates, background, backlog), and the models that make them (local_embedder, packaged_models, page_process,
chunks, endpoint)."""

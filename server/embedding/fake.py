"""A deterministic fake embedder for pure unit tests of the selection and scoring maths.

Never used by the server. Each text maps to a bag of hashed word buckets plus a small
seeded noise, so texts sharing words are close and unrelated texts are nearly orthogonal.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

_WORD = re.compile(r"\w+", re.UNICODE)


class FakeEmbedder:
    """Deterministic bag-of-words vectors of unit norm."""

    def __init__(self, dimension: int = 384, noise: float = 0.05) -> None:
        self.model_id = f"fake-bow-{dimension}"
        self.dimension = dimension
        self.query_prefix = ""
        self.passage_prefix = ""
        self._noise = noise

    def _vector(self, text: str) -> np.ndarray:
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        vector = rng.normal(0.0, self._noise, self.dimension)
        for word in _WORD.findall(text.lower()):
            bucket = int.from_bytes(hashlib.md5(word.encode("utf-8")).digest()[:4], "little")
            vector[bucket % self.dimension] += 1.0
        norm = float(np.linalg.norm(vector))
        return (vector / norm if norm else vector).astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self._vector(text) for text in texts])

    def embed_with_spans(
        self, text: str, spans: Sequence[tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The text's vector and each span's (embedded alone: no token vectors to pool)."""
        rows = self.embed([text, *(text[start:end] for start, end in spans)])
        return rows[0], rows[1:]

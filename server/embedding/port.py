"""The embedder port: texts in, unit vectors out. Adapters live beside it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors, batched.

    `query_prefix` / `passage_prefix` are what the model wants in front of queries and
    passages ("query: " / "passage: " for e5 models, "" for MiniLM); callers add them.
    """

    model_id: str
    dimension: int
    query_prefix: str
    passage_prefix: str

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return an array of shape (len(texts), dimension), each row of unit norm."""
        ...

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


class SpanPooler(Protocol):
    """An embedder that can also pool vectors of parts of a text from one model run (the mean
    of the token vectors inside each part, as the text's own vector is the mean of all)."""

    def embed_with_spans(
        self, text: str, spans: Sequence[tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The text's unit vector (as `embed([text])[0]`) and one unit vector per character
        span of it, shape (len(spans), dimension); None when the model does not pool by mean."""
        ...

"""A model wrapper for tests that check what is embedded, and on which thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np


class RecordingEmbedder:
    """Stands in for an embedder: delegates to `model`, recording each batch it embeds
    (`texts`) and the thread that embedded it (`threads`, ids)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.texts: list[list[str]] = []
        self.threads: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.append(list(texts))
        self.threads.append(threading.get_ident())
        return self.model.embed(texts)

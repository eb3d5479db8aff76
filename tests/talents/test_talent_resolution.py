"""Unit tests of `satchel.server.talents.service`' pure parts: resolve_selection, rendering,
defaults."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from satchel.server.embedding.fake import FakeEmbedder
from satchel.server.platform.config import ConfigError, Settings, TalentSettings
from satchel.server.talents.domain.selection import (
    CentredSpace,
    Scoring,
    SelectionParams,
    centred_similarities,
)
from satchel.server.talents.service import (
    FUSED_MARGIN,
    FUSED_MAX_SERVED,
    HYBRID_MODEL_DEFAULTS,
    MODEL_DEFAULTS,
    OUT_OF_DOMAIN_TEXT,
    SEED_DEFAULTS,
    TalentService,
    default_params,
    graph_node,
    is_candidate,
    model_defaults,
    render_compiled,
    resolve_selection,
    scorable,
    text_digest,
)
from satchel.server.talents.storage.catalogue import TalentRecord

RECORDS = [
    TalentRecord(
        "hex",
        "Hexagonal",
        summary="hexagonal architecture ports adapters",
        body="Hexagonal body.",
        tags=("hexagonal",),
        requires=("uc", "vo", "ghost"),
    ),
    TalentRecord("uc", "Use case", summary="use case orchestration", body="Use case body."),
    TalentRecord("vo", "Value object", summary="immutable value objects", body="VO body."),
    TalentRecord("css", "CSS", summary="css keyframes animations", body="CSS body."),
    TalentRecord("pay", "Payments", summary="stripe payments refunds", body="Pay body."),
]


def setup(records: list[TalentRecord] = RECORDS):  # type: ignore[no-untyped-def]
    embedder = FakeEmbedder()
    candidates = [scorable(r) for r in records]
    vectors = embedder.embed([c.text for c in candidates])
    graph = {r.id: graph_node(r) for r in records}
    return embedder, candidates, vectors, graph


def test_closure_readds_requirements_after_the_cut_and_reports_inactive_ones() -> None:
    embedder, candidates, vectors, graph = setup()
    task = "hexagonal architecture ports adapters"
    result = resolve_selection(
        candidates,
        vectors,
        embedder.embed([task])[0],
        task,
        relevance=True,
        params=SelectionParams(floor=0.0, beta=0.12, margin=0.05, budget_tokens=2000),
        graph=graph,
    )
    assert result.selected_ids == ["hex", "uc", "vo"]
    assert [t.reason for t in result.selected] == ["relevance", *["requires_closure"] * 2]
    assert [t.required_by for t in result.selected] == ["", "hex", "hex"]
    excluded = {t.id: t for t in result.excluded}
    assert excluded["ghost"].reason == "not_active" and excluded["ghost"].required_by == "hex"
    assert {excluded["css"].reason, excluded["pay"].reason} == {"below_margin"}
    assert "uc" not in excluded and "vo" not in excluded
    assert result.compiled.splitlines()[1] == "## Hexagonal"
    assert result.tokens_selected == sum(c.tokens for c in candidates[:3])
    assert result.tokens_candidates == sum(c.tokens for c in candidates)


def test_relevance_off_keeps_every_candidate_and_closes_over_other_servable_talents() -> None:
    _, candidates, _, graph = setup()
    extra = scorable(TalentRecord("ops", "Ops only", body="Ops body."))
    graph["pay"] = graph_node(TalentRecord("pay", "Payments", requires=("ops",)))
    result = resolve_selection(
        candidates,
        None,
        None,
        "refunds through stripe",
        relevance=False,
        params=SelectionParams(),
        graph=graph,
        servable={**{c.id: c for c in candidates}, "ops": extra},
    )
    assert [t.reason for t in result.selected[:5]] == ["relevance_off"] * 5
    assert result.selected[5].id == "ops" and result.selected[5].required_by == "pay"
    assert result.selected_ids[:5] == sorted(result.selected_ids[:5])  # no stems hit: by id
    assert [t.id for t in result.excluded] == ["ghost"]
    assert result.tokens_candidates == sum(c.tokens for c in candidates)
    assert result.tokens_selected == result.tokens_candidates + extra.tokens


def test_relevance_needs_vectors() -> None:
    _, candidates, _, _ = setup()
    with pytest.raises(ValueError):
        resolve_selection(candidates, None, None, "task", relevance=True, params=SelectionParams())


def test_render_compiled() -> None:
    talent = scorable(TalentRecord("a", "Alpha", body="  Body.\n"))
    assert render_compiled([talent], out_of_domain=False) == (
        "<satchel_talents>\n## Alpha\nBody.\n</satchel_talents>"
    )
    assert OUT_OF_DOMAIN_TEXT in render_compiled([], out_of_domain=True)
    assert render_compiled([], out_of_domain=False) == ""


def test_served_text_is_the_body_else_the_summary() -> None:
    with_body = scorable(TalentRecord("a", "A", summary="s" * 40, body="b" * 80))
    without = scorable(TalentRecord("b", "B", summary="s" * 40))
    assert (with_body.body, with_body.tokens) == ("b" * 80, 20)
    assert (without.body, without.tokens) == ("s" * 40, 10)
    assert with_body.text == "A\n" + "s" * 40


def test_defaults_per_model_and_settings_override() -> None:
    assert model_defaults("all-MiniLM-L6-v2-onnx-qint8") == MODEL_DEFAULTS["all-minilm-l6-v2"]
    assert model_defaults("intfloat/multilingual-e5-small") == SEED_DEFAULTS
    settings = TalentSettings(scoring="seed", margin=0.5, budget_tokens=300)
    params = default_params(settings, "other-model")
    assert (params.floor, params.beta, params.margin, params.budget_tokens) == (
        SEED_DEFAULTS[0],
        SEED_DEFAULTS[1],
        0.5,
        300,
    )


def test_candidates_and_digests() -> None:
    assert is_candidate((), "backend") and is_candidate(("backend",), "backend")
    assert not is_candidate(("frontend",), "backend") and not is_candidate(("frontend",), "")
    assert text_digest("passage: ", "x") != text_digest("", "x")
    assert len(text_digest("", "x")) == 64
    assert np.isfinite(FakeEmbedder().embed(["x"])).all()


def test_a_reused_centred_space_gives_the_same_selection() -> None:
    embedder, candidates, vectors, graph = setup()
    space = CentredSpace.of(vectors)
    for task in ("use case orchestration", "stripe refunds", "immutable value objects"):
        task_vector = embedder.embed([task])[0]
        np.testing.assert_allclose(
            space.similarities(task_vector), centred_similarities(vectors, task_vector)
        )
        params = SelectionParams(floor=0.0, margin=0.3)
        with_space = resolve_selection(
            candidates, space, task_vector, task, relevance=True, params=params, graph=graph
        )
        with_array = resolve_selection(
            candidates, vectors, task_vector, task, relevance=True, params=params, graph=graph
        )
        assert with_space == with_array
    assert len(space) == len(candidates)


def test_server_settings_reach_the_service() -> None:
    settings = Settings.from_env(
        {
            "SATCHEL_TALENT_RELEVANCE": "embeddings",
            "SATCHEL_TALENT_MARGIN": "0.4",
            "SATCHEL_TALENT_BUDGET_TOKENS": "500",
            "SATCHEL_TALENT_ROLES": "backend, reviewer,,",
        }
    )
    runtime = SimpleNamespace(settings=settings, embedder=FakeEmbedder())
    service = TalentService(runtime)  # type: ignore[arg-type]
    assert service.default_relevance()
    assert service.configured_roles == ("backend", "reviewer")
    # Fused scoring whatever the model: its gate calibrated per candidate set (floor None).
    defaults = SelectionParams(None, SEED_DEFAULTS[1], 0.4, 500, Scoring.FUSED, max_served=8)
    assert service.defaults == defaults
    assert service.params(floor=0.3, budget_tokens=7, max_served=2) == replace(
        defaults, floor=0.3, budget_tokens=7, max_served=2
    )
    seed = Settings.from_env({"SATCHEL_TALENT_SCORING": "seed", "SATCHEL_TALENT_MAX_SERVED": "0"})
    assert default_params(seed.talents, "any-model") == SelectionParams(*SEED_DEFAULTS)


def test_fused_scoring_and_relevance_are_the_defaults_and_the_others_stay_reachable() -> None:
    minilm = "all-MiniLM-L6-v2-onnx-qint8"
    auto = default_params(TalentSettings(), minilm)
    assert (auto.scoring, auto.floor, auto.margin) == (Scoring.FUSED, None, FUSED_MARGIN)
    assert auto.max_served == FUSED_MAX_SERVED
    hybrid = default_params(TalentSettings(scoring="hybrid"), minilm)
    assert (hybrid.floor, hybrid.beta, hybrid.margin) == HYBRID_MODEL_DEFAULTS["all-minilm-l6-v2"]
    seed = default_params(TalentSettings(scoring="seed", max_served=0), minilm)
    assert seed == SelectionParams(*MODEL_DEFAULTS["all-minilm-l6-v2"])
    e5_seed = default_params(TalentSettings(scoring="seed", max_served=0), "multilingual-e5-small")
    assert e5_seed == SelectionParams(*SEED_DEFAULTS)
    service = TalentService(
        SimpleNamespace(settings=Settings.from_env({}), embedder=FakeEmbedder())  # type: ignore[arg-type]
    )
    assert service.default_relevance()
    off = Settings.from_env({"SATCHEL_TALENT_RELEVANCE": "off"})
    assert not TalentService(
        SimpleNamespace(settings=off, embedder=FakeEmbedder())  # type: ignore[arg-type]
    ).default_relevance()


@pytest.mark.parametrize(
    "name, value",
    [
        ("SATCHEL_TALENT_RELEVANCE", "sometimes"),
        ("SATCHEL_TALENT_BETA", "-0.1"),
        ("SATCHEL_TALENT_MARGIN", "nan"),
        ("SATCHEL_TALENT_FLOOR", "2"),
        ("SATCHEL_TALENT_FLOOR", "high"),
        ("SATCHEL_TALENT_SCORING", "fuzzy"),
        ("SATCHEL_TALENT_TEXT_WEIGHT", "-1"),
        ("SATCHEL_TALENT_MAX_SERVED", "-3"),
        ("SATCHEL_TALENT_GATE_QUANTILE", "1.5"),
        ("SATCHEL_TALENT_SCORING", "z"),
        ("SATCHEL_TALENT_BUDGET_TOKENS", "0"),
    ],
)
def test_bad_talent_settings_stop_the_server(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})

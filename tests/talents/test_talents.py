"""TalentService over gRPC against the real database and the real embedding model.

The catalogue is shared by every test, so each test prefixes its talent ids with its fresh
project id.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest
from helpers.embedding import RecordingEmbedder
from helpers.talents import (
    activate,
    error_reason,
    field_violations,
    reasons,
    resolve,
    stub,
    upsert,
)

from satchel.server.platform.config import Settings
from satchel.server.talents.domain.fusion import CONTRAST
from satchel.server.talents.domain.selection import Scoring
from satchel.server.talents.service import model_defaults, unrelated_tasks
from satchel.v1 import talent_pb2, talent_pb2_grpc

OFF = talent_pb2.RELEVANCE_MODE_OFF
EMBEDDINGS = talent_pb2.RELEVANCE_MODE_EMBEDDINGS


@pytest.fixture(scope="module")
async def hybrid_channel(settings: Settings) -> AsyncIterator[grpc.aio.Channel]:
    """A server on the same database configured with the previous default: hybrid scoring, at
    most 5 talents (SATCHEL_TALENT_SCORING=hybrid, SATCHEL_TALENT_MAX_SERVED=5)."""
    from satchel.server.platform.app import SatchelServer

    srv = SatchelServer(
        replace(settings, talents=replace(settings.talents, scoring="hybrid", max_served=5))
    )
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as chan:
            yield chan
    finally:
        await srv.stop()


async def seed_catalogue(channel: grpc.aio.Channel, project_id: str) -> dict[str, str]:
    """The seed's example: hexagonal requires four talents; an unrelated CSS talent; two more
    unrelated talents so centring has a population. Returns short name -> talent id."""
    talents = stub(channel)
    ids = {
        short: f"{project_id}.{short}"
        for short in ("hexagonal", "use-case", "dependency-rule", "port-adapter", "value-object")
    }
    ids |= {short: f"{project_id}.{short}" for short in ("css", "sql", "testing")}
    await upsert(
        talents,
        ids["hexagonal"],
        "Hexagonal architecture",
        summary="Ports and adapters: the domain is isolated from frameworks and infrastructure.",
        body="Keep the domain pure; adapters implement the ports it owns.",
        tags=["architecture", "hexagonal"],
        triggers=["use case", "application service"],
        task_types=["feature"],
        requires=[ids[k] for k in ("dependency-rule", "use-case", "port-adapter", "value-object")],
        recommends=[ids["css"]],  # soft: never pulled in by the closure
    )
    await upsert(
        talents,
        ids["use-case"],
        "Use case",
        summary="One application use case per user intent, orchestrating the domain.",
        body="One use case per intent; it orchestrates, the domain decides.",
        tags=["application"],
        triggers=["use case", "UpdateProject", "implement"],
    )
    await upsert(
        talents,
        ids["dependency-rule"],
        "Dependency rule",
        summary="Source code dependencies point inward, towards the domain.",
        body="Dependencies point inward.",
        tags=["dependencies", "imports"],
    )
    await upsert(
        talents,
        ids["port-adapter"],
        "Ports and adapters",
        summary="Interfaces owned by the domain, implemented by infrastructure adapters.",
        body="Ports are interfaces of the domain.",
        tags=["ports", "adapters", "infrastructure"],
    )
    await upsert(
        talents,
        ids["value-object"],
        "Value object",
        summary="Immutable objects compared by value, validated at construction.",
        body="Value objects are immutable.",
        tags=["immutability", "modelling"],
    )
    await upsert(
        talents,
        ids["css"],
        "CSS animations",
        summary="Keyframes and transitions for smooth UI animations.",
        body="Animate transform and opacity only.",
        tags=["css", "animation", "frontend"],
    )
    await upsert(
        talents,
        ids["sql"],
        "SQL migrations",
        summary="Safe PostgreSQL schema migrations: add columns and indexes without locking.",
        body="Create indexes concurrently.",
        tags=["database", "migration", "postgresql"],
    )
    await upsert(
        talents,
        ids["testing"],
        "Unit testing",
        summary="Fast deterministic unit tests with pytest and fakes.",
        body="Arrange, act, assert.",
        tags=["testing", "pytest"],
    )
    await activate(talents, project_id, ids.values())
    return ids


SEED_TASK = "Implement the UpdateProject use case following the hexagonal architecture"


async def list_all(
    talents: talent_pb2_grpc.TalentServiceStub, page_size: int = 0, **fields: object
) -> tuple[list[talent_pb2.Talent], list[str], int]:
    """Every page of a ListTalents listing: the talents, the active ids and the page count."""
    request = talent_pb2.ListTalentsRequest(page_size=page_size, **fields)
    listed: list[talent_pb2.Talent] = []
    active: list[str] = []
    pages = 0
    while True:
        page = await talents.ListTalents(request)
        pages += 1
        listed += page.talents
        active += page.active_talent_ids
        if not page.next_page_token:
            return listed, active, pages
        request.page_token = page.next_page_token


# --- catalogue ---------------------------------------------------------------------------------


async def test_upsert_creates_then_replaces_with_edges_in_order(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    talent_id = f"{project_id}.architecture.hexagonal"
    first = await upsert(
        talents,
        talent_id,
        "Hexagonal",
        summary="Ports and adapters",
        tags=["architecture"],
        triggers=["use case"],
        task_types=["feature"],
        roles=["backend"],
        requires=["b.second", "a.first"],
        includes=["c.included"],
        recommends=["d.recommended"],
    )
    assert first.created
    assert first.talent.updated_at.seconds > 0
    assert list(first.talent.requires) == ["b.second", "a.first"]
    assert list(first.talent.includes) == ["c.included"]
    assert list(first.talent.recommends) == ["d.recommended"]
    assert list(first.talent.roles) == ["backend"]

    second = await upsert(talents, talent_id, "Hexagonal v2", requires=["a.first", "a.first"])
    assert not second.created
    assert second.talent.name == "Hexagonal v2"
    assert list(second.talent.requires) == ["a.first"]  # replaced, duplicates dropped
    assert list(second.talent.includes) == [] and list(second.talent.tags) == []
    assert second.talent.updated_at.ToDatetime() >= first.talent.updated_at.ToDatetime()

    listed, _, _ = await list_all(talents)
    stored = next(t for t in listed if t.id == talent_id)
    assert stored.name == "Hexagonal v2" and list(stored.requires) == ["a.first"]


async def test_upsert_refuses_self_edges_with_field_violations(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    talent_id = f"{project_id}.loop"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await upsert(talents, talent_id, requires=[talent_id], includes=[talent_id])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = field_violations(caught.value)
    assert set(violations) == {"talent.requires", "talent.includes"}
    assert "itself" in violations["talent.requires"]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await upsert(talents, talent_id, recommends=[talent_id])
    assert set(field_violations(caught.value)) == {"talent.recommends"}
    listed, _, _ = await list_all(talents)
    assert talent_id not in {t.id for t in listed}


async def test_upsert_validates_every_field_at_once(channel: grpc.aio.Channel) -> None:
    talents = stub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.UpsertTalent(talent_pb2.UpsertTalentRequest())
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(caught.value)) == {"talent"}

    bad = talent_pb2.Talent(
        id=" padded",
        name="",
        tags=[""],
        roles=["ok", "bad\x07role"],
        requires=[""],
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=bad))
    assert set(field_violations(caught.value)) >= {
        "talent.id",
        "talent.name",
        "talent.tags[0]",
        "talent.roles[1]",
        "talent.requires[0]",
    }


async def test_unknown_edge_targets_are_kept(channel: grpc.aio.Channel, project_id: str) -> None:
    talents = stub(channel)
    reply = await upsert(talents, f"{project_id}.a", requires=[f"{project_id}.missing"])
    assert reply.created and list(reply.talent.requires) == [f"{project_id}.missing"]


async def test_activation_of_an_unknown_talent_is_not_found(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await activate(talents, project_id, [f"{project_id}.nobody"])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(caught.value) == "TALENT_NOT_FOUND"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await activate(talents, "", [""])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(caught.value)) == {"project_id", "talent_id"}


async def test_list_talents_catalogue_and_project_active_set(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    ids = [f"{project_id}.{name}" for name in ("b", "a", "c")]
    for talent_id in ids:
        await upsert(talents, talent_id)
    await activate(talents, project_id, ids[:2])
    await activate(talents, project_id, ids[:1], active=False)

    everything, active_ids, _ = await list_all(talents, project_id=project_id)
    listed = [t.id for t in everything]
    assert set(ids) <= set(listed) and listed == sorted(listed)
    assert active_ids == [f"{project_id}.a"]

    active = await talents.ListTalents(
        talent_pb2.ListTalentsRequest(project_id=project_id, active_only=True)
    )
    assert [t.id for t in active.talents] == [f"{project_id}.a"]
    assert list(active.active_talent_ids) == [f"{project_id}.a"]

    catalogue = await talents.ListTalents(talent_pb2.ListTalentsRequest())
    assert list(catalogue.active_talent_ids) == []

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.ListTalents(talent_pb2.ListTalentsRequest(active_only=True))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(caught.value)) == {"project_id"}


async def test_list_talents_pages_by_id(channel: grpc.aio.Channel, project_id: str) -> None:
    talents = stub(channel)
    ids = [f"{project_id}.t{i}" for i in range(7)]
    for talent_id in reversed(ids):
        await upsert(talents, talent_id)
    await activate(talents, project_id, ids[:5])

    request = talent_pb2.ListTalentsRequest(project_id=project_id, active_only=True, page_size=2)
    pages: list[list[str]] = []
    while True:
        page = await talents.ListTalents(request)
        pages.append([t.id for t in page.talents])
        assert list(page.active_talent_ids) == pages[-1], "the page's active ids"
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert pages == [ids[0:2], ids[2:4], ids[4:5]]

    everything, active, pages_read = await list_all(talents, page_size=3, project_id=project_id)
    listed = [t.id for t in everything]
    assert len(listed) == len(set(listed)) and listed == sorted(listed)
    assert set(ids) <= set(listed) and active == ids[:5]
    assert pages_read == math.ceil(len(listed) / 3)
    whole = await talents.ListTalents(talent_pb2.ListTalentsRequest(page_size=5000))
    assert len(whole.talents) == min(len(listed), 1000)
    assert bool(whole.next_page_token) == (len(listed) > 1000)


async def test_list_talents_refuses_bad_page_tokens_and_sizes(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    ids = [f"{project_id}.t{i}" for i in range(2)]
    for talent_id in ids:
        await upsert(talents, talent_id)
    await activate(talents, project_id, ids)
    page = await talents.ListTalents(
        talent_pb2.ListTalentsRequest(project_id=project_id, active_only=True, page_size=1)
    )
    token = page.next_page_token
    assert token
    document, _, tag = token.partition(".")
    for request in (
        talent_pb2.ListTalentsRequest(project_id=project_id, page_token=token),
        talent_pb2.ListTalentsRequest(page_token=token),
        talent_pb2.ListTalentsRequest(
            project_id=f"{project_id}-other", active_only=True, page_token=token
        ),
        talent_pb2.ListTalentsRequest(page_token="not a token"),
        talent_pb2.ListTalentsRequest(page_token=f"{document}.{tag[::-1]}"),
        talent_pb2.ListTalentsRequest(page_token=document),
        talent_pb2.ListTalentsRequest(page_token="A" * 2000),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await talents.ListTalents(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert set(field_violations(caught.value)) == {"page_token"}, request
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.ListTalents(talent_pb2.ListTalentsRequest(page_size=-1))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(caught.value)) == {"page_size"}


# --- relevance off ----------------------------------------------------------------------------


async def test_relevance_off_serves_every_active_talent_of_the_role_ordered_by_task(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    ids = await seed_catalogue(channel, project_id)
    frontend_only = f"{project_id}.frontend-only"
    backend_only = f"{project_id}.backend-only"
    inactive = f"{project_id}.inactive"
    await upsert(talents, frontend_only, "Frontend", roles=["frontend"])
    await upsert(talents, backend_only, "Backend", roles=["backend", "ops"])
    await upsert(talents, inactive, "Inactive")
    await activate(talents, project_id, [frontend_only, backend_only])

    selection = await resolve(
        talents, project_id, "Write a safe PostgreSQL migration", role="backend", relevance=OFF
    )
    assert selection.relevance == OFF
    assert not selection.out_of_domain and not selection.excluded
    selected = [t.talent_id for t in selection.selected]
    assert set(selected) == {*ids.values(), backend_only}  # no frontend-only, no inactive
    assert {t.reason for t in selection.selected} == {"relevance_off"}
    assert selected[0] == ids["sql"]  # the task only orders them (by shared stems)
    assert all(t.similarity == 0 for t in selection.selected)  # no model with relevance off
    scores = [t.score for t in selection.selected]
    assert scores == sorted(scores, reverse=True)
    assert selection.tokens_selected == selection.tokens_candidates
    assert selection.tokens_selected == sum(t.tokens for t in selection.selected)

    # The server default (SATCHEL_TALENT_RELEVANCE unset) is relevance: a task is required.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await resolve(
            talents,
            project_id,
            "",
            role="frontend",
            relevance=talent_pb2.RELEVANCE_MODE_UNSPECIFIED,
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    default = await resolve(
        talents,
        project_id,
        "Write a safe PostgreSQL migration",
        role="backend",
        relevance=talent_pb2.RELEVANCE_MODE_UNSPECIFIED,
    )
    assert default.relevance == talent_pb2.RELEVANCE_MODE_EMBEDDINGS
    assert default.params.scoring == "fused"
    assert ids["sql"] in [t.talent_id for t in default.selected]
    assert len(default.selected) < len(selection.selected)


# --- relevance on -----------------------------------------------------------------------------


def margin_keeping_top(selection: talent_pb2.TalentSelection, count: int) -> float:
    """A margin whose cut keeps exactly the `count` best-scored talents of a wide selection:
    halfway between the count-th and the next score, so no model drift sits on its edge."""
    scores = sorted((t.score for t in (*selection.selected, *selection.excluded)), reverse=True)
    assert scores[count - 1] - scores[count] > 0.01, scores
    return scores[0] - (scores[count - 1] + scores[count]) / 2


async def test_seed_example_closure_readds_hard_requirements(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """The cut keeps the two best talents, hexagonal among them; its other hard requirements
    come back by the closure (exempt from margin); the other low-score talents stay out."""
    talents = stub(channel)
    ids = await seed_catalogue(channel, project_id)
    wide = await resolve(talents, project_id, SEED_TASK, margin=10.0)
    margin = margin_keeping_top(wide, 2)
    selection = await resolve(talents, project_id, SEED_TASK, margin=margin)
    why = reasons(selection)
    kept = [t.talent_id for t in selection.selected if t.reason == "relevance"]
    assert len(kept) == 2 and ids["hexagonal"] in kept, why
    required = [ids[k] for k in ("dependency-rule", "use-case", "port-adapter", "value-object")]
    readded = [i for i in required if i not in kept]
    assert len(readded) >= 3
    for talent_id in readded:
        assert why[talent_id] == "requires_closure", talent_id
    for talent_id in set(ids.values()) - {*kept, *readded}:  # css is recommended: still cut
        assert why[talent_id] == "below_margin", talent_id
    selected = {t.talent_id: t for t in selection.selected}
    top = selection.selected[0].score
    for talent_id in readded:
        assert selected[talent_id].required_by == ids["hexagonal"]
        assert selected[talent_id].score < top - margin  # the cut alone would have dropped it
    # Kept talents first by score, then the closure in hexagonal's declared order.
    assert [t.talent_id for t in selection.selected] == [
        *sorted(kept, key=lambda i: -selected[i].score),
        *readded,
    ]
    assert not selection.out_of_domain
    compiled = selection.compiled
    assert compiled.startswith("<satchel_talents>") and compiled.endswith("</satchel_talents>")
    headings = [line for line in compiled.splitlines() if line.startswith("## ")]
    assert headings == [f"## {t.name}" for t in selection.selected]
    assert "Keep the domain pure" in compiled and "Animate transform" not in compiled
    assert selection.tokens_selected == sum(t.tokens for t in selection.selected)
    assert selection.tokens_candidates == sum(
        t.tokens for t in (*selection.selected, *selection.excluded)
    )
    assert selection.tokens_selected < selection.tokens_candidates


async def test_closure_never_serves_an_inactive_requirement(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    ids = await seed_catalogue(channel, project_id)
    await activate(talents, project_id, [ids["value-object"]], active=False)
    missing = f"{project_id}.never-written"
    await upsert(talents, ids["port-adapter"], "Ports and adapters", requires=[missing])
    selection = await resolve(talents, project_id, SEED_TASK, margin=0.3)
    why = reasons(selection)
    assert why[ids["value-object"]] == "not_active"
    assert why[missing] == "not_active"
    excluded = {t.talent_id: t for t in selection.excluded}
    assert excluded[ids["value-object"]].required_by == ids["hexagonal"]
    assert excluded[missing].required_by == ids["port-adapter"]
    assert "Value objects are immutable" not in selection.compiled
    assert why[ids["port-adapter"]] == "requires_closure"


async def test_closure_follows_includes_transitively_across_roles(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    lead, middle, leaf = (f"{project_id}.{n}" for n in ("lead", "middle", "leaf"))
    filler = [f"{project_id}.filler-{n}" for n in range(3)]
    await upsert(
        talents,
        lead,
        "Kubernetes deployment",
        summary="Deploy services to Kubernetes with Helm charts.",
        tags=["kubernetes", "helm", "deployment"],
        includes=[middle],
    )
    await upsert(talents, middle, "Observability", summary="Metrics and traces.", requires=[leaf])
    await upsert(talents, leaf, "Alerting", summary="Pager rules.", roles=["ops"])
    for index, talent_id in enumerate(filler):
        topic = ("Watercolour painting", "Baking sourdough", "Chess openings")[index]
        await upsert(talents, talent_id, topic, summary=topic)
    await activate(talents, project_id, [lead, middle, leaf, *filler])
    selection = await resolve(
        talents, project_id, "Deploy the API to Kubernetes with a Helm chart", role="dev"
    )
    why = reasons(selection)
    assert why[lead] == "relevance"
    assert why[middle] == "requires_closure"
    assert why[leaf] == "requires_closure"  # active, although its role is not the request's
    chain = {t.talent_id: t.required_by for t in selection.selected}
    assert chain[middle] == lead and chain[leaf] == middle


async def test_off_domain_task_is_gated(channel: grpc.aio.Channel, project_id: str) -> None:
    """Fused scoring's gate is calibrated on the candidates with the shipped unrelated tasks:
    a recipe gets no talent of a software catalogue, and the selection says why."""
    talents = stub(channel)
    ids = await seed_catalogue(channel, project_id)
    selection = await resolve(talents, project_id, "What is a good recipe for banana bread?")
    assert selection.out_of_domain
    assert not selection.selected
    assert {t.reason for t in selection.excluded} == {"out_of_domain"}
    assert {t.talent_id for t in selection.excluded} == set(ids.values())
    gate = selection.gate
    assert gate.calibration_tasks == len(unrelated_tasks()) >= 100
    assert max(t.similarity for t in selection.excluded) == pytest.approx(gate.best_similarity)
    assert gate.HasField("unrelated_similarity")  # an English task: the contrast applied
    below = gate.best_similarity < gate.similarity_threshold
    assert below or gate.best_similarity - gate.unrelated_similarity <= CONTRAST
    assert selection.params.floor == 0.0  # calibrated, not configured
    assert selection.note.startswith("no specific talent for this task (best similarity")
    why = f"{gate.similarity_threshold:.2f}" if below else "a request that needs no talent"
    assert why in selection.note
    assert "No specific talent for this task." in selection.compiled
    assert selection.tokens_selected == 0 and selection.tokens_candidates > 0

    served = await resolve(talents, project_id, "Add a CSS animation to the login button")
    assert not served.out_of_domain and served.selected[0].talent_id == ids["css"]
    assert served.gate.similarity_threshold == gate.similarity_threshold  # one per catalogue
    assert served.gate.best_similarity >= served.gate.similarity_threshold

    # The request's floor replaces the calibrated gate.
    forced = await resolve(talents, project_id, "What is a good recipe for banana bread?", floor=-1)
    assert not forced.out_of_domain and forced.gate.similarity_threshold == -1.0
    assert not forced.gate.HasField("unrelated_similarity")


async def test_a_shared_stem_opens_the_hybrid_gate(
    hybrid_channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(hybrid_channel)
    ids = await seed_catalogue(hybrid_channel, project_id)
    selection = await resolve(talents, project_id, "What is a good recipe for banana bread?")
    assert selection.out_of_domain and selection.note == "no specific talent for this task"
    assert max(t.similarity for t in selection.excluded) < selection.params.floor
    assert all(t.stem_hits == 0 for t in selection.excluded)
    assert not selection.HasField("gate")
    # One shared stem opens the gate (sum(hits) > 0), whatever the similarity.
    opened = await resolve(talents, project_id, "A banana bread recipe, then css animations?")
    assert not opened.out_of_domain
    assert opened.selected[0].talent_id == ids["css"]
    assert opened.selected[0].stem_hits >= 1


async def test_fallback_keeps_the_top_three_when_nothing_fits(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    ids = await seed_catalogue(channel, project_id)
    selection = await resolve(talents, project_id, SEED_TASK, budget_tokens=1)
    assert [t.reason for t in selection.selected[:3]] == ["fallback_top3"] * 3
    assert selection.note == "no talent passed the cut; kept the top 3 by score"
    top3 = [t.talent_id for t in selection.selected[:3]]
    assert ids["hexagonal"] in top3
    scores = [t.score for t in selection.selected[:3]]
    assert scores == sorted(scores, reverse=True)
    excluded_scores = [t.score for t in selection.excluded if t.reason != "not_active"]
    assert max(excluded_scores) <= min(scores)
    # Hard requirements of the fallback set still come with it.
    assert {t.reason for t in selection.selected[3:]} <= {"requires_closure"}


async def test_budget_packs_greedily_in_score_order(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """Scores are dominated by stem hits (beta 2): a 3 > b 2 > c 1. The budget fits a and c
    but not b, which is skipped while packing goes on."""
    talents = stub(channel)
    a, b, c, other = (f"{project_id}.{n}" for n in ("a", "b", "c", "other"))
    await upsert(talents, a, "Alpha", tags=["kafka", "consumer", "offsets"], body="a" * 400)
    await upsert(talents, b, "Bravo", tags=["kafka", "consumer"], body="b" * 2000)
    await upsert(talents, c, "Charlie", tags=["kafka"], body="c" * 200)
    await upsert(talents, other, "Other", tags=["gardening"], body="o" * 400)
    await activate(talents, project_id, [a, b, c, other])
    selection = await resolve(
        talents,
        project_id,
        "Fix the Kafka consumer that loses offsets",
        beta=2.0,
        margin=10.0,
        budget_tokens=200,
    )
    assert [t.talent_id for t in selection.selected] == [a, c]
    assert [t.reason for t in selection.selected] == ["relevance", "relevance"]
    assert [t.stem_hits for t in selection.selected] == [3, 1]
    excluded = {t.talent_id: t.reason for t in selection.excluded}
    assert excluded[b] == "over_budget"
    assert excluded[other] in {"over_budget", "non_positive"}
    assert selection.tokens_selected == 100 + 50 <= 200
    assert selection.params.budget_tokens == 200


async def test_per_request_overrides_and_the_hybrid_score_formula(
    hybrid_channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(hybrid_channel)
    await seed_catalogue(hybrid_channel, project_id)
    floor, beta, margin = model_defaults("all-MiniLM-L6-v2-onnx-qint8", Scoring.HYBRID)
    default = await resolve(talents, project_id, SEED_TASK)
    assert (default.params.floor, default.params.beta, default.params.margin) == (
        floor,
        beta,
        margin,
    )
    assert default.params.budget_tokens == 2000
    assert (default.params.scoring, default.params.text_weight) == ("hybrid", 0.3)
    assert default.params.max_served == 5

    wide = await resolve(talents, project_id, SEED_TASK, beta=0.5, margin=2.0, floor=0.0)
    assert (wide.params.beta, wide.params.margin, wide.params.floor) == (0.5, 2.0, 0.0)
    scored = [t for t in (*wide.selected, *wide.excluded) if t.reason != "not_active"]
    for talent in scored:
        assert 0.0 <= talent.text_rank <= 1.0
        hybrid = talent.similarity + 0.5 * talent.stem_hits + 0.3 * talent.text_rank
        assert math.isclose(talent.score, hybrid, abs_tol=1e-9)
    assert max(t.text_rank for t in scored) == 1.0  # the best lexical match ranks 1

    def cut(selection: talent_pb2.TalentSelection) -> list[str]:
        return [t.talent_id for t in selection.selected if t.reason == "relevance"]

    # The default cut is the margin rule applied to the scores: every talent within MARGIN of
    # the best, best first (the scores come from an uncut selection with the same floor and beta).
    uncut = await resolve(talents, project_id, SEED_TASK, margin=10.0)
    ranked = sorted(
        (t for t in (*uncut.selected, *uncut.excluded) if t.reason != "not_active"),
        key=lambda t: -t.score,
    )
    assert cut(default) == [t.talent_id for t in ranked if t.score >= ranked[0].score - margin]
    narrow = await resolve(talents, project_id, SEED_TASK, margin=0.0)
    assert narrow.params.margin == 0.0
    assert cut(narrow) == cut(default)[:1] == [ranked[0].talent_id]

    gated = await resolve(talents, project_id, "Sourdough starter feeding schedule", floor=1.0)
    assert gated.out_of_domain and gated.params.floor == 1.0

    capped = await resolve(talents, project_id, SEED_TASK, margin=10.0, max_served=2)
    assert capped.params.max_served == 2
    assert cut(capped) == [t.talent_id for t in ranked[:2]]
    over = {t.talent_id for t in capped.excluded if t.reason == "over_max_served"}
    assert over and over <= {t.talent_id for t in ranked[2:]}


async def test_the_seed_scoring_stays_reachable(
    settings: Settings, channel: grpc.aio.Channel, project_id: str
) -> None:
    """SATCHEL_TALENT_SCORING=seed and SATCHEL_TALENT_MAX_SERVED=0: the spec's score (centred
    similarity + beta x stem hits), no lexical rank, no cap; the default server ranks the same
    catalogue by the hybrid score."""
    from satchel.server.platform.app import SatchelServer

    await seed_catalogue(channel, project_id)
    seed_talents = replace(settings.talents, scoring="seed", max_served=0)
    srv = SatchelServer(replace(settings, talents=seed_talents))
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as seed_channel:
            seed = await resolve(stub(seed_channel), project_id, SEED_TASK, margin=10.0)
    finally:
        await srv.stop()
    hybrid = await resolve(stub(channel), project_id, SEED_TASK, margin=10.0)
    assert (seed.params.scoring, seed.params.max_served) == ("seed", 0)
    seed_scored = {
        t.talent_id: t for t in (*seed.selected, *seed.excluded) if t.reason != "not_active"
    }
    for talent in seed_scored.values():
        assert talent.text_rank == 0.0
        assert math.isclose(talent.score, talent.similarity + seed.params.beta * talent.stem_hits)
    # Without a cap, every positive talent within the (wide) margin is served.
    assert not [t for t in seed.excluded if t.reason == "over_max_served"]
    hybrid_scored = {t.talent_id: t for t in (*hybrid.selected, *hybrid.excluded)}
    centred_differs = [
        i
        for i, t in seed_scored.items()
        if not math.isclose(t.similarity, hybrid_scored[i].similarity)
    ]
    assert centred_differs, "the seed's centred similarity is not the hybrid's plain cosine"


async def test_resolve_validates_the_request(channel: grpc.aio.Channel) -> None:
    talents = stub(channel)
    request = talent_pb2.ResolveTalentsRequest(
        project_id="",
        role="bad\x00role",
        task="",
        relevance=EMBEDDINGS,
        budget_tokens=0,
        floor=float("nan"),
        beta=-1.0,
        margin=-0.5,
        max_served=-1,
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.ResolveTalents(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(caught.value)) == {
        "project_id",
        "role",
        "task",
        "budget_tokens",
        "floor",
        "beta",
        "margin",
        "max_served",
    }
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.ResolveTalents(
            talent_pb2.ResolveTalentsRequest(project_id="p", task="x", relevance=7)
        )
    assert set(field_violations(caught.value)) == {"relevance"}


async def test_project_without_talents_gets_an_empty_selection(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    selection = await resolve(stub(channel), project_id, "anything at all")
    assert not selection.selected and not selection.excluded
    assert selection.compiled == "" and selection.note == "no candidate talents"
    assert selection.tokens_candidates == 0


async def test_resolve_embeds_only_the_task(
    channel: grpc.aio.Channel, project_id: str, server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Talent vectors are computed at upsert, once per content, and cached in memory and in
    talent_embeddings: a ResolveTalents call embeds its task and nothing else (and a task
    seen recently not even that; the gate's unrelated tasks once per process)."""
    talents = stub(channel)
    await seed_catalogue(channel, project_id)
    # The gate's shipped unrelated tasks are embedded once per process, maybe by this call.
    await resolve(talents, project_id, f"Warm up for {project_id}")
    runtime = server.runtime.value
    recording = RecordingEmbedder(runtime.embedder)  # on the loop or not
    monkeypatch.setattr(runtime, "embedder", recording)
    embedded = recording.texts
    first, second = f"{SEED_TASK} ({project_id})", f"Value objects for {project_id}"
    await resolve(talents, project_id, first)
    await resolve(talents, project_id, second)
    await resolve(talents, project_id, first)  # a repeated task: its vector is kept
    await resolve(talents, project_id, f"{second}!", relevance=OFF)  # off: no model at all
    assert embedded == [[first], [second]]

    # Same content under another id: no new vector either.
    twin = f"{project_id}.twin"
    await upsert(
        talents,
        twin,
        "Dependency rule",
        summary="Source code dependencies point inward, towards the domain.",
        body="Dependencies point inward.",
        tags=["dependencies", "imports"],
    )
    assert len(embedded) == 2
    async with runtime.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM talent_embeddings WHERE embedding_model = %s",
            (runtime.embedder.model_id,),
        )
        (count,) = await cur.fetchone()
    assert count >= 8


async def test_every_change_is_seen_by_the_next_resolve(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """The server keeps a project's active set in memory: activation, deactivation and
    upserts (content, roles, edges) must all show on the very next call."""
    talents = stub(channel)
    a, b, c = (f"{project_id}.{n}" for n in ("a", "b", "c"))
    await upsert(talents, a, "Alpha", body="first body")
    await upsert(talents, b, "Bravo")
    await upsert(talents, c, "Charlie")
    await activate(talents, project_id, [a, b])

    async def served() -> list[str]:
        selection = await resolve(talents, project_id, "", relevance=OFF)
        return [t.talent_id for t in selection.selected]

    assert await served() == [a, b]
    await activate(talents, project_id, [c])
    assert await served() == [a, b, c]
    await activate(talents, project_id, [b], active=False)
    assert await served() == [a, c]
    await upsert(talents, a, "Alpha", body="second body", roles=["ops"])
    assert await served() == [c]
    selection = await resolve(talents, project_id, "", role="ops", relevance=OFF)
    assert "second body" in selection.compiled
    await upsert(talents, c, "Charlie", requires=[b])
    assert reasons(await resolve(talents, project_id, "", relevance=OFF))[b] == "not_active"
    await activate(talents, project_id, [b])
    final = await resolve(talents, project_id, "", relevance=OFF)
    assert reasons(final) == {b: "relevance_off", c: "relevance_off"}


# --- the doctor -------------------------------------------------------------------------------


async def test_doctor_reports_each_kind_of_finding(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    a, b, c, d, e, off = (f"{project_id}.{n}" for n in ("a", "b", "c", "d", "e", "off"))
    unknown = f"{project_id}.ghost"
    await upsert(talents, a, requires=[b])
    await upsert(talents, b, includes=[a])  # a <-> b cycle
    await upsert(talents, c, requires=[off], recommends=[unknown])
    await upsert(talents, off)
    await upsert(talents, d, roles=["designer"])
    await upsert(talents, e, roles=["backend"])
    await activate(talents, project_id, [a, b, c, d, e])

    # A role recorded by ResolveTalents, plus one named in the request.
    await resolve(talents, project_id, "", role="backend", relevance=OFF)
    reply = await talents.DiagnoseProject(
        talent_pb2.DiagnoseProjectRequest(project_id=project_id, roles=["reviewer"])
    )
    assert list(reply.roles_known) == ["backend", "reviewer"]
    found = {(f.code, f.talent_id) for f in reply.findings}
    assert found == {
        ("requires_cycle", a),
        ("required_not_active", c),
        ("unknown_edge_target", c),
        ("unreachable_by_role", d),
    }
    details = {f.code: f.detail for f in reply.findings}
    assert details["requires_cycle"] == f"{a} -> {b} -> {a}"
    assert unknown in details["unknown_edge_target"]
    assert off in details["required_not_active"]

    # Activating the missing requirement and naming the role fixes those findings.
    await activate(talents, project_id, [off])
    reply = await talents.DiagnoseProject(
        talent_pb2.DiagnoseProjectRequest(project_id=project_id, roles=["designer"])
    )
    assert {(f.code, f.talent_id) for f in reply.findings} == {
        ("requires_cycle", a),
        ("unknown_edge_target", c),
    }


async def test_doctor_skips_the_role_check_without_known_roles(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    lonely = f"{project_id}.lonely"
    await upsert(talents, lonely, roles=["nobody-asks"])
    await activate(talents, project_id, [lonely])
    reply = await talents.DiagnoseProject(talent_pb2.DiagnoseProjectRequest(project_id=project_id))
    assert list(reply.roles_known) == [] and list(reply.findings) == []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.DiagnoseProject(talent_pb2.DiagnoseProjectRequest(roles=[""]))
    assert set(field_violations(caught.value)) == {"project_id", "roles[0]"}

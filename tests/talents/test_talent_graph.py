"""Unit tests of the talent graph: closure over hard edges, the doctor, edge validation."""

from __future__ import annotations

import pytest

from satchel.server.embedding.fake import FakeEmbedder
from satchel.server.talents.domain.graph import (
    MAX_REPORTED_CYCLES,
    EdgeViolation,
    Finding,
    FindingCode,
    InvalidEdgesError,
    TalentNode,
    diagnose,
    requires_closure,
    validate_edges,
)
from satchel.server.talents.domain.selection import ScorableTalent, select, stems


def graph_of(*nodes: TalentNode) -> dict[str, TalentNode]:
    return {node.id: node for node in nodes}


# --- closure ------------------------------------------------------------------------------------

HEXAGONAL = "architecture.hexagonal"
USE_CASE = "architecture.use-case"
PORT_ADAPTER = "architecture.port-adapter"
VALUE_OBJECT = "architecture.value-object"
DEPENDENCY_RULE = "architecture.dependency-rule"
CSS_GRID = "frontend.css-grid"

SEED_GRAPH = graph_of(
    TalentNode(
        HEXAGONAL,
        requires=(DEPENDENCY_RULE, USE_CASE, PORT_ADAPTER, VALUE_OBJECT),
        recommends=("architecture.cqrs",),
    ),
    TalentNode(USE_CASE),
    TalentNode(PORT_ADAPTER, requires=("design.interface-segregation",)),
    TalentNode(VALUE_OBJECT, includes=("design.immutability",)),
    TalentNode(DEPENDENCY_RULE),
    TalentNode(CSS_GRID),
    TalentNode("architecture.cqrs"),
    TalentNode("design.interface-segregation"),
    TalentNode("design.immutability"),
)
SEED_ACTIVE = frozenset(SEED_GRAPH)


def seed_candidates() -> list[ScorableTalent]:
    rows = [
        (HEXAGONAL, "Hexagonal architecture", "Ports and adapters around a pure domain core",
         ["architecture", "hexagonal"], ["hexagonal"]),
        (USE_CASE, "Use case", "One application service per use case",
         ["application", "use-case"], ["use case"]),
        (PORT_ADAPTER, "Port and adapter", "Interfaces owned by the domain, implemented outside",
         ["ports", "adapters"], ["repository interface"]),
        (VALUE_OBJECT, "Value object", "Immutable types compared by value",
         ["modelling"], ["value object", "immutable"]),
        (DEPENDENCY_RULE, "Dependency rule", "Source dependencies point inwards only",
         ["layers", "dependencies"], ["import direction"]),
        (CSS_GRID, "CSS grid layout", "Page layout with CSS grid",
         ["css", "layout"], ["grid", "responsive"]),
    ]  # fmt: skip
    return [
        ScorableTalent.build(i, name, summary, body="b" * 200, tags=tags, triggers=triggers)
        for i, name, summary, tags, triggers in rows
    ]


def test_seed_example_cut_then_closure_readds_hexagonal_prerequisites() -> None:
    candidates = seed_candidates()
    embedder = FakeEmbedder()
    task = "Implement the UpdateProject use case in the hexagonal architecture"
    selection = select(
        candidates,
        embedder.embed([c.text for c in candidates]),
        embedder.embed([task])[0],
        stems(task),
    )
    assert sorted(selection.kept_ids) == [HEXAGONAL, USE_CASE]

    closure = requires_closure(selection.kept_ids, SEED_GRAPH, SEED_ACTIVE)
    assert closure.added == [
        DEPENDENCY_RULE,
        PORT_ADAPTER,
        VALUE_OBJECT,
        "design.interface-segregation",
        "design.immutability",
    ]
    assert closure.missing == []
    served = {*selection.kept_ids, *closure.added}
    assert CSS_GRID not in served
    assert "architecture.cqrs" not in served  # recommends is soft: not closed over


def test_closure_is_transitive_in_bfs_order() -> None:
    graph = graph_of(
        TalentNode("a", requires=("b", "c")),
        TalentNode("b", requires=("d",)),
        TalentNode("c", includes=("e",)),
        TalentNode("d", requires=("f",)),
        TalentNode("e"),
        TalentNode("f"),
    )
    closure = requires_closure(["a"], graph, set(graph))
    assert closure.added == ["b", "c", "d", "e", "f"]


def test_closure_follows_requires_before_includes_and_kept_ids_in_order() -> None:
    graph = graph_of(
        TalentNode("x", requires=("r1",), includes=("i1",)),
        TalentNode("y", includes=("i2",), requires=("r2",)),
        TalentNode("r1"),
        TalentNode("r2"),
        TalentNode("i1"),
        TalentNode("i2"),
    )
    assert requires_closure(["y", "x"], graph, set(graph)).added == ["r2", "i2", "r1", "i1"]


def test_closure_never_adds_kept_ids_or_duplicates_and_survives_cycles() -> None:
    graph = graph_of(
        TalentNode("a", requires=("b", "c")),
        TalentNode("b", requires=("a", "c")),
        TalentNode("c", includes=("b",)),
    )
    closure = requires_closure(["a", "a"], graph, set(graph))
    assert closure.added == ["b", "c"]
    assert requires_closure(["a", "b", "c"], graph, set(graph)).added == []


def test_inactive_required_talent_is_missing_and_not_traversed() -> None:
    graph = graph_of(
        TalentNode("a", requires=("b", "c")),
        TalentNode("b", requires=("d",)),
        TalentNode("c", requires=("b",)),
        TalentNode("d"),
    )
    closure = requires_closure(["a"], graph, {"a", "c", "d"})
    assert closure.added == ["c"]
    assert closure.missing == ["b"]


def test_unknown_required_talent_is_missing() -> None:
    graph = graph_of(TalentNode("a", requires=("ghost",)))
    assert requires_closure(["a"], graph, {"a"}).missing == ["ghost"]


def test_closure_with_nothing_kept_adds_nothing() -> None:
    closure = requires_closure([], SEED_GRAPH, SEED_ACTIVE)
    assert (closure.added, closure.missing) == ([], [])


# --- doctor -------------------------------------------------------------------------------------


def test_doctor_reports_required_not_active_for_active_talents_only() -> None:
    talents = [
        TalentNode("a", requires=("b",), includes=("c",), recommends=("d",)),
        TalentNode("b"),
        TalentNode("c"),
        TalentNode("d"),
        TalentNode("e", requires=("b",)),
    ]
    assert diagnose(talents, {"a"}) == [
        Finding(
            FindingCode.REQUIRED_NOT_ACTIVE, "a", "includes c, which is not active on the project"
        ),
        Finding(
            FindingCode.REQUIRED_NOT_ACTIVE, "a", "requires b, which is not active on the project"
        ),
    ]


def test_doctor_reports_unknown_edge_targets_of_every_kind_once() -> None:
    talents = [
        TalentNode("a", requires=("ghost",), recommends=("phantom",)),
        TalentNode("b", includes=("ghost",)),
    ]
    assert diagnose(talents, {"a"}) == [
        Finding(FindingCode.UNKNOWN_EDGE_TARGET, "a", "recommends phantom"),
        Finding(FindingCode.UNKNOWN_EDGE_TARGET, "a", "requires ghost"),
        Finding(FindingCode.UNKNOWN_EDGE_TARGET, "b", "includes ghost"),
    ]


def test_doctor_reports_each_cycle_once_from_its_smallest_id() -> None:
    talents = [
        TalentNode("c", requires=("a",)),
        TalentNode("b", includes=("c",)),
        TalentNode("a", requires=("b",)),
        TalentNode("x", requires=("y",)),
        TalentNode("y", requires=("x",)),
        TalentNode("self", requires=("self",)),
    ]
    findings = diagnose(talents, set())
    assert findings == [
        Finding(FindingCode.REQUIRES_CYCLE, "a", "a -> b -> c -> a"),
        Finding(FindingCode.REQUIRES_CYCLE, "self", "self -> self"),
        Finding(FindingCode.REQUIRES_CYCLE, "x", "x -> y -> x"),
    ]


def test_doctor_reports_every_elementary_cycle_through_a_shared_node() -> None:
    talents = [
        TalentNode("a", requires=("b", "c")),
        TalentNode("b", requires=("a", "c")),
        TalentNode("c", requires=("a",)),
    ]
    details = [f.detail for f in diagnose(talents, {"a", "b", "c"})]
    assert details == ["a -> b -> a", "a -> b -> c -> a", "a -> c -> a"]


def test_doctor_ignores_cycles_through_recommends() -> None:
    talents = [TalentNode("a", requires=("b",)), TalentNode("b", recommends=("a",))]
    assert diagnose(talents, {"a", "b"}) == []


def test_doctor_caps_the_number_of_reported_cycles() -> None:
    ids = [f"t{i:02d}" for i in range(12)]
    complete = [TalentNode(i, requires=tuple(j for j in ids if j != i)) for i in ids]
    cycles = [f for f in diagnose(complete, set(ids)) if f.code is FindingCode.REQUIRES_CYCLE]
    assert len(cycles) == MAX_REPORTED_CYCLES


def test_doctor_reports_active_talents_no_known_role_can_reach() -> None:
    talents = [
        TalentNode("backend-only", roles=("backend",)),
        TalentNode("any-role"),
        TalentNode("shared", roles=("frontend", "reviewer")),
        TalentNode("inactive", roles=("designer",)),
    ]
    active = {"backend-only", "any-role", "shared"}
    assert diagnose(talents, active, roles_known={"frontend"}) == [
        Finding(
            FindingCode.UNREACHABLE_BY_ROLE,
            "backend-only",
            "roles ['backend'] match none of ['frontend']",
        )
    ]
    assert diagnose(talents, active, roles_known=None) == []


def test_doctor_findings_are_sorted_and_independent_of_input_order() -> None:
    talents = [
        TalentNode("z", requires=("y", "nowhere"), roles=("ops",)),
        TalentNode("y", requires=("z",)),
        TalentNode("m", requires=("off",)),
        TalentNode("off"),
    ]
    active = {"z", "y", "m"}
    findings = diagnose(talents, active, roles_known=["dev"])
    assert [(f.code, f.talent_id) for f in findings] == [
        (FindingCode.REQUIRED_NOT_ACTIVE, "m"),
        (FindingCode.REQUIRES_CYCLE, "y"),
        (FindingCode.UNKNOWN_EDGE_TARGET, "z"),
        (FindingCode.UNREACHABLE_BY_ROLE, "z"),
    ]
    assert diagnose(list(reversed(talents)), active, roles_known=["dev"]) == findings


def test_doctor_is_quiet_on_a_healthy_project() -> None:
    assert diagnose(SEED_GRAPH.values(), SEED_ACTIVE, roles_known={"backend"}) == []


# --- edge validation ----------------------------------------------------------------------------


def test_validate_edges_accepts_edges_to_other_talents() -> None:
    assert validate_edges("a", requires=["b"], includes=["c"], recommends=["d"]) is None


def test_validate_edges_rejects_self_edges_of_every_kind() -> None:
    with pytest.raises(InvalidEdgesError) as raised:
        validate_edges("a", requires=["b", "a"], includes=["a"], recommends=["a", " "])
    assert raised.value.violations == (
        EdgeViolation("requires", "a", "a requires itself"),
        EdgeViolation("includes", "a", "a includes itself"),
        EdgeViolation("recommends", "a", "a recommends itself"),
        EdgeViolation("recommends", " ", "edge target must be a talent id"),
    )
    assert isinstance(raised.value, ValueError)
    assert "requires: a requires itself" in str(raised.value)

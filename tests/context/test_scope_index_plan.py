"""Which scopes get indexes of their own: above the cut, kept down to half of it, the largest
under the cap; and their names."""

from __future__ import annotations

from satchel.server.context.domain.scope_indexes import ScopeIndexNames, plan_indexes

A, B, C = ("p", "a"), ("p", "b"), ("q", "c")


def test_a_scope_above_the_cut_is_built_and_one_at_it_is_not() -> None:
    plan = plan_indexes({A: 101, B: 100}, set(), min_facts=100, max_indexes=8)
    assert (plan.build, plan.drop) == ([A], [])


def test_an_indexed_scope_keeps_its_indexes_down_to_half_the_cut() -> None:
    assert plan_indexes({A: 50}, {A}, min_facts=100, max_indexes=8).drop == []
    assert plan_indexes({A: 49}, {A}, min_facts=100, max_indexes=8).drop == [A]
    # Absent from the sizes: fewer facts than half the cut (or deleted).
    assert plan_indexes({}, {A}, min_facts=100, max_indexes=8).drop == [A]
    # Not indexed yet, the same size does not qualify.
    assert plan_indexes({A: 99}, set(), min_facts=100, max_indexes=8).build == []


def test_the_cap_keeps_the_largest_scopes_and_builds_largest_first() -> None:
    sizes = {A: 150, B: 400, C: 300}
    assert plan_indexes(sizes, set(), min_facts=100, max_indexes=2).build == [B, C]
    # A larger newcomer takes the place of the smallest indexed scope.
    plan = plan_indexes(sizes, {A, C}, min_facts=100, max_indexes=2)
    assert (plan.build, plan.drop) == ([B], [A])
    assert plan_indexes(sizes, {A, B, C}, min_facts=100, max_indexes=0).drop == [A, B, C]


def test_names_are_fixed_per_scope_distinct_and_fit_postgresql() -> None:
    names = ScopeIndexNames.of(("project", "subject"))
    assert names == ScopeIndexNames.of(("project", "subject"))
    # The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert ScopeIndexNames.of(("ab", "c")).vector != ScopeIndexNames.of(("a", "bc")).vector
    assert [name.removeprefix(names.prefix) for name in names.all] == [
        "_hnsw",
        "_lexemes",
        "_words",
    ]
    long = ScopeIndexNames.of(("p" * 500, "é" * 500))
    assert max(len(name.encode()) for name in long.all) <= 63

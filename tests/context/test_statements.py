"""Named placeholders converted once to PostgreSQL's own (server/platform/storage/statements.py)."""

from __future__ import annotations

import pytest

from satchel.server.platform.storage.statements import Statement


def test_each_name_gets_one_number_in_order_of_first_use() -> None:
    statement = Statement.parse("SELECT %(b)s, %(a)s, %(b)s + 1 WHERE x LIKE 'a%%'")
    assert statement.text == "SELECT $1, $2, $1 + 1 WHERE x LIKE 'a%'"
    assert statement.names == ("b", "a")
    assert statement.args({"a": 1, "b": 2, "unused": 3}) == [2, 1]


def test_a_missing_parameter_is_named() -> None:
    with pytest.raises(KeyError, match="b"):
        Statement.parse("SELECT %(a)s, %(b)s").args({"a": 1})


def test_values_written_in_are_quoted_and_the_other_parameters_numbered_anew() -> None:
    statement = Statement.parse(
        "SELECT %(vector)s FROM facts WHERE project_id = %(project_id)s"
        " AND subject_id = %(subject_id)s AND k < %(k)s AND owner = %(project_id)s"
    )
    scoped = statement.with_literals({"project_id": "p", "subject_id": "o'k"})
    assert scoped.text == (
        "SELECT $1 FROM facts WHERE project_id = 'p' AND subject_id = 'o''k' AND k < $2"
        " AND owner = 'p'"
    )
    assert scoped.names == ("vector", "k")
    assert scoped.args({"vector": "v", "k": 3, "project_id": "ignored"}) == ["v", 3]


def test_a_scope_s_statement_is_written_once() -> None:
    from satchel.server.context.storage.candidates import CANDIDATES_SQL
    from satchel.server.context.storage.sql import for_scope

    shared = CANDIDATES_SQL[("hybrid", False)]
    scoped = for_scope(shared, "proj", "ana")
    assert for_scope(shared, "proj", "ana") is scoped
    assert "f.project_id = 'proj' AND f.subject_id = 'ana'" in scoped.text
    assert not {"project_id", "subject_id"} & set(scoped.names)
    assert len(scoped.names) == len(shared.names) - 2
    assert f"${len(scoped.names)}" in scoped.text and f"${len(shared.names)}" not in scoped.text


def test_the_context_statements_are_numbered_completely() -> None:
    from satchel.server.context.storage.candidates import CANDIDATES_SQL, EXACT_SQL
    from satchel.server.context.storage.episodes import HYBRID_EPISODES_SQL

    for statements in (EXACT_SQL, CANDIDATES_SQL, HYBRID_EPISODES_SQL):
        for statement in statements.values():
            assert "%(" not in statement.text
            assert f"${len(statement.names)}" in statement.text

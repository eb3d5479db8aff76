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


def test_the_context_statements_are_numbered_completely() -> None:
    from satchel.server.context.storage.candidates import CANDIDATES_SQL, EXACT_SQL
    from satchel.server.context.storage.episodes import HYBRID_EPISODES_SQL

    for statements in (EXACT_SQL, CANDIDATES_SQL, HYBRID_EPISODES_SQL):
        for statement in statements.values():
            assert "%(" not in statement.text
            assert f"${len(statement.names)}" in statement.text

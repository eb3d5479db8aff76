"""Statements written with named parameters, sent with PostgreSQL's own `$n` placeholders.

psycopg finds a query's `%(name)s` placeholders with a regular expression on every call once the
query is longer than 4 kB (it caches shorter ones); the context statements are longer, and
parsing them cost ~0.8 ms of the event loop each. A `Statement` is converted once, at import,
and runs through a raw cursor, which sends it as it is (prepared on its first run, see `fetch_all`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, AsyncRawCursor, sql
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_NUMBERED = re.compile(r"\$(\d+)")


@dataclass(frozen=True)
class Statement:
    """SQL with `$n` placeholders, and the parameter name each number stands for."""

    text: str
    names: tuple[str, ...]

    @classmethod
    def parse(cls, query: str) -> Statement:
        """Number the `%(name)s` placeholders of `query` (a name used twice keeps its number)."""
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:  # %%
                return "%"
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        return cls(_PLACEHOLDER.sub(number, query), tuple(names))

    def with_literals(self, values: Mapping[str, str]) -> Statement:
        """This statement with the parameters named in `values` written in as SQL literals
        (quoted by psycopg), the others numbered anew. A generic plan of it can use a partial
        index whose predicate names those values: a parameter cannot prove it."""
        names: list[str] = []

        def replace(match: re.Match[str]) -> str:
            name = self.names[int(match.group(1)) - 1]
            if name in values:
                return sql.Literal(values[name]).as_string(None)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        return Statement(_NUMBERED.sub(replace, self.text), tuple(names))

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The values of `params` in placeholder order (KeyError names a missing one)."""
        return [params[name] for name in self.names]


async def fetch_all(
    conn: AsyncConnection,
    statement: Statement,
    params: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Run `statement` with `params` and return its rows as dicts.

    The statement is prepared on its first run on a connection, not its sixth (psycopg's
    default), so that inside `generic_plans` it is planned once, on that first run.

    Ids (uuid) come back as strings: the callers compare and serve them as strings, and
    building a `UUID` then its string cost ~5 µs an id, hundreds of ids a context call.
    """
    cur = AsyncRawCursor(conn, row_factory=dict_row)
    cur.adapters.register_loader("uuid", TextLoader)
    await cur.execute(statement.text, statement.args(params), prepare=True)
    return await cur.fetchall()

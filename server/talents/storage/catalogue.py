"""All SQL of the talent catalogue: talents with their edges, activations, cached vectors.

Functions take an open async connection from the pool; the caller owns the transaction.
Edges are stored in `talent_edges` (one row per edge, `position` keeps the declared order);
vectors of talent texts are cached in `talent_embeddings` by (sha256 of the text, model id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import dict_row

EDGE_KINDS: tuple[str, ...] = ("requires", "includes", "recommends")


@dataclass(frozen=True)
class TalentRecord:
    """A catalogued talent with its edges, as stored."""

    id: str
    name: str
    summary: str = ""
    body: str = ""
    tags: tuple[str, ...] = ()
    triggers: tuple[str, ...] = ()
    task_types: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    updated_at: datetime | None = None
    pinned: bool = False
    input_schema: str = ""


@dataclass(frozen=True)
class TalentRef:
    """What resolution needs of an active talent before its content: version, roles, edges."""

    id: str
    updated_at: datetime
    roles: tuple[str, ...]
    requires: tuple[str, ...]
    includes: tuple[str, ...]
    recommends: tuple[str, ...]


# Edge lists of a talent `t`, in declared order (empty arrays when it has none).
_EDGES = """
    LEFT JOIN LATERAL (
        SELECT
            coalesce(array_agg(target_id ORDER BY position) FILTER (WHERE kind = 'requires'),
                     '{}') AS requires,
            coalesce(array_agg(target_id ORDER BY position) FILTER (WHERE kind = 'includes'),
                     '{}') AS includes,
            coalesce(array_agg(target_id ORDER BY position) FILTER (WHERE kind = 'recommends'),
                     '{}') AS recommends
        FROM talent_edges e WHERE e.talent_id = t.id
    ) edges ON true
"""
_COLUMNS = """
    t.id, t.name, t.summary, t.body, t.tags, t.triggers, t.task_types, t.roles, t.updated_at,
    t.pinned, t.input_schema, edges.requires, edges.includes, edges.recommends
"""


def _record(row: Mapping[str, Any]) -> TalentRecord:
    return TalentRecord(
        id=row["id"],
        name=row["name"],
        summary=row["summary"],
        body=row["body"],
        tags=tuple(row["tags"]),
        triggers=tuple(row["triggers"]),
        task_types=tuple(row["task_types"]),
        roles=tuple(row["roles"]),
        requires=tuple(row["requires"]),
        includes=tuple(row["includes"]),
        recommends=tuple(row["recommends"]),
        updated_at=row["updated_at"],
        pinned=row["pinned"],
        input_schema=row["input_schema"],
    )


async def upsert_talent(conn: AsyncConnection, talent: TalentRecord) -> tuple[TalentRecord, bool]:
    """Create or replace a talent and all its edges; return it as stored and whether it is new."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            INSERT INTO talents (id, name, summary, body, tags, triggers, task_types, roles,
                pinned, input_schema)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (id) DO UPDATE SET
                name = EXCLUDED.name, summary = EXCLUDED.summary, body = EXCLUDED.body,
                tags = EXCLUDED.tags, triggers = EXCLUDED.triggers,
                task_types = EXCLUDED.task_types, roles = EXCLUDED.roles,
                pinned = EXCLUDED.pinned, input_schema = EXCLUDED.input_schema,
                updated_at = clock_timestamp()
            RETURNING (xmax = 0) AS created
            """,
            (
                talent.id,
                talent.name,
                talent.summary,
                talent.body,
                list(talent.tags),
                list(talent.triggers),
                list(talent.task_types),
                list(talent.roles),
                talent.pinned,
                talent.input_schema,
            ),
        )
        row = await cur.fetchone()
        assert row is not None
        created = bool(row["created"])
        await cur.execute("DELETE FROM talent_edges WHERE talent_id = %s", (talent.id,))
        edges = [
            (talent.id, kind, target, position)
            for kind in EDGE_KINDS
            for position, target in enumerate(getattr(talent, kind))
        ]
        if edges:
            await cur.executemany(
                "INSERT INTO talent_edges (talent_id, kind, target_id, position)"
                " VALUES (%s, %s, %s, %s)",
                edges,
            )
    stored = await fetch_talents(conn, [talent.id])
    return stored[0], created


async def fetch_talents(conn: AsyncConnection, ids: Sequence[str]) -> list[TalentRecord]:
    """The talents with these ids (unknown ids are skipped), in the order of `ids`."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT {_COLUMNS} FROM talents t {_EDGES} WHERE t.id = ANY(%s)", (list(ids),)
        )
        by_id = {row["id"]: _record(row) for row in await cur.fetchall()}
    return [by_id[talent_id] for talent_id in ids if talent_id in by_id]


async def list_talents(
    conn: AsyncConnection,
    project_id: str | None = None,
    active_only: bool = False,
    *,
    after_id: str | None = None,
    limit: int | None = None,
) -> list[TalentRecord]:
    """The catalogue by id; with `project_id` and `active_only`, only the project's active set.
    Keyset-paged: ids strictly after `after_id`, at most `limit` talents (None: all)."""
    params: list[object] = []
    if project_id and active_only:
        source = f"talent_activations a JOIN talents t ON t.id = a.talent_id {_EDGES}"
        where = "WHERE a.project_id = %s AND a.active"
        params.append(project_id)
    else:
        source, where = f"talents t {_EDGES}", "WHERE true"
    if after_id is not None:
        where += " AND t.id > %s"
        params.append(after_id)
    sql = f"SELECT {_COLUMNS} FROM {source} {where} ORDER BY t.id"
    if limit is not None:
        sql += " LIMIT %s"
        params.append(limit)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, params)
        return [_record(row) for row in await cur.fetchall()]


async def active_talent_ids(
    conn: AsyncConnection, project_id: str, among: list[str] | None = None
) -> list[str]:
    """Ids of the talents active on a project (only those in `among` when given), sorted."""
    sql = "SELECT talent_id FROM talent_activations WHERE project_id = %s AND active"
    params: list[object] = [project_id]
    if among is not None:
        sql += " AND talent_id = ANY(%s)"
        params.append(among)
    cur = await conn.execute(sql + " ORDER BY talent_id", params)
    return [row[0] for row in await cur.fetchall()]


async def set_activation(
    conn: AsyncConnection, project_id: str, talent_id: str, active: bool
) -> bool:
    """Turn a talent on or off for a project; False when the talent is not catalogued."""
    cur = await conn.execute(
        """
        INSERT INTO talent_activations (project_id, talent_id, active)
        SELECT %s, id, %s FROM talents WHERE id = %s
        ON CONFLICT (project_id, talent_id)
        DO UPDATE SET active = EXCLUDED.active, updated_at = now()
        """,
        (project_id, active, talent_id),
    )
    return cur.rowcount == 1


async def talent_refs(conn: AsyncConnection, project_id: str | None = None) -> list[TalentRef]:
    """Version, roles and edges (no content) of the talents active on a project, or of the whole
    catalogue when `project_id` is None."""
    where = "WHERE t.id IN (SELECT talent_id FROM talent_activations a"
    where += " WHERE a.project_id = %s AND a.active)"
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"""
            SELECT t.id, t.updated_at, t.roles,
                   edges.requires, edges.includes, edges.recommends
            FROM talents t {_EDGES} {where if project_id is not None else ""}
            """,
            (project_id,) if project_id is not None else (),
        )
        rows = await cur.fetchall()
    return [
        TalentRef(
            id=row["id"],
            updated_at=row["updated_at"],
            roles=tuple(row["roles"]),
            requires=tuple(row["requires"]),
            includes=tuple(row["includes"]),
            recommends=tuple(row["recommends"]),
        )
        for row in rows
    ]


async def active_version(conn: AsyncConnection, project_id: str) -> str:
    """The version of a project's active set: it moves whenever a talent is activated or
    deactivated on the project, or any talent of the catalogue is upserted (triggers of
    migration 0020). Two one-row lookups."""
    cur = await conn.execute(
        "SELECT (SELECT v.version FROM talent_project_versions v WHERE v.project_id = %s),"
        " (SELECT c.version FROM talent_catalogue_version c)",
        (project_id,),
    )
    row = await cur.fetchone()
    assert row is not None
    return f"{row[0] or 0}:{row[1] or 0}"


async def cached_vectors(
    conn: AsyncConnection, text_hashes: Sequence[str], model_id: str
) -> dict[str, np.ndarray]:
    """Stored vectors of talent texts by sha256, for one model."""
    cur = await conn.execute(
        "SELECT text_sha256, embedding FROM talent_embeddings"
        " WHERE embedding_model = %s AND text_sha256 = ANY(%s)",
        (model_id, list(text_hashes)),
    )
    rows = await cur.fetchall()
    # pgvector >= 0.5 loads `vector` columns as pgvector.Vector, older versions as numpy arrays
    return {
        digest: np.asarray(
            vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float32
        )
        for digest, vector in rows
    }


async def store_vectors(
    conn: AsyncConnection, vectors: Mapping[str, np.ndarray], model_id: str
) -> None:
    """Keep vectors of talent texts by sha256 (first writer wins: same text, same vector)."""
    if not vectors:
        return
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO talent_embeddings (text_sha256, embedding_model, embedding)"
            " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            [(digest, model_id, vector) for digest, vector in vectors.items()],
        )


async def record_role(conn: AsyncConnection, project_id: str, role: str) -> None:
    """Remember that an agent of this role asked the project for talents."""
    await conn.execute(
        "INSERT INTO talent_project_roles (project_id, role) VALUES (%s, %s)"
        " ON CONFLICT DO NOTHING",
        (project_id, role),
    )


async def project_roles(conn: AsyncConnection, project_id: str) -> list[str]:
    """Roles that asked this project for talents, sorted."""
    cur = await conn.execute(
        "SELECT role FROM talent_project_roles WHERE project_id = %s ORDER BY role",
        (project_id,),
    )
    return [row[0] for row in await cur.fetchall()]

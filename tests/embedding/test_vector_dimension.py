"""A new database takes the embedder's dimension; one that holds vectors never changes it."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

from satchel.server.platform.config import ConfigError
from satchel.server.platform.storage.migrations import (
    VECTOR_COLUMNS,
    apply_migrations,
    check_embedding_schema,
)


@pytest.fixture
def migrated_database(fresh_database: str) -> str:
    apply_migrations(fresh_database)
    return fresh_database


def _dimensions(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT attrelid::regclass::text, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attname = 'embedding' AND attrelid = ANY(%s::regclass[])",
            (list(VECTOR_COLUMNS),),
        ).fetchall()
    return dict(rows)


def test_a_new_database_takes_a_768_dimension_model(migrated_database: str) -> None:
    check_embedding_schema(migrated_database, 768, "model-768")
    assert _dimensions(migrated_database) == dict.fromkeys(VECTOR_COLUMNS, "vector(768)")
    with psycopg.connect(migrated_database) as conn:
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE indexdef LIKE '%hnsw%' ORDER BY 1"
        ).fetchall()
        register_vector(conn)
        conn.execute(
            "INSERT INTO talent_embeddings (text_sha256, embedding_model, embedding)"
            " VALUES ('x', 'model-768', %s)",
            (np.ones(768, dtype=np.float32),),
        )
    assert [r[0] for r in indexes] == ["events_embedding_hnsw", "facts_embedding_hnsw"]
    with psycopg.connect(migrated_database) as conn:
        storage = conn.execute(
            "SELECT attrelid::regclass::text, attstorage FROM pg_attribute"
            " WHERE attname = 'embedding' AND attrelid = ANY('{events,facts}'::regclass[])"
        ).fetchall()
    assert dict(storage) == {"events": "m", "facts": "m"}, "vectors stay in their rows"
    check_embedding_schema(migrated_database, 768, "model-768")  # again: nothing changes
    with pytest.raises(ConfigError, match="vector\\(768\\)"):
        check_embedding_schema(migrated_database, 384, "model-768")
    with pytest.raises(ConfigError, match="model-768"):
        check_embedding_schema(migrated_database, 768, "another-768")


def test_a_database_claimed_by_a_model_keeps_its_dimension(migrated_database: str) -> None:
    check_embedding_schema(migrated_database, 384, "model-384")  # claimed, still empty
    with pytest.raises(ConfigError, match="vector\\(384\\)"):
        check_embedding_schema(migrated_database, 768, "model-768")
    assert _dimensions(migrated_database) == dict.fromkeys(VECTOR_COLUMNS, "vector(384)")

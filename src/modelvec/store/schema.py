"""The store's tables, and the changes that bring an older store file up to date in place."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from .vectorfile import VectorFile, checksum, vector_bytes

SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    model        VARCHAR NOT NULL,
    model_hash   VARCHAR NOT NULL,
    base         VARCHAR NOT NULL,
    base_hash    VARCHAR NOT NULL,
    params       VARCHAR NOT NULL,
    rank         INTEGER NOT NULL,
    factor       VARCHAR NOT NULL,
    pooling      VARCHAR NOT NULL,
    solver       VARCHAR NOT NULL,
    sign         VARCHAR NOT NULL,
    params_json  VARCHAR NOT NULL,
    architecture VARCHAR NOT NULL,
    dim          INTEGER NOT NULL,
    "offset"     BIGINT NOT NULL,
    vector_hash  VARCHAR NOT NULL,
    datasets     VARCHAR[] NOT NULL,
    label_source VARCHAR,
    author       VARCHAR,
    source       VARCHAR NOT NULL,
    seconds      DOUBLE NOT NULL,
    created_at   TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (model, base, base_hash, params)
);
CREATE TABLE IF NOT EXISTS failures (
    model      VARCHAR NOT NULL,
    base       VARCHAR NOT NULL,
    params     VARCHAR NOT NULL,
    error      VARCHAR NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (model, base, params)
);
CREATE TABLE IF NOT EXISTS catalogue (
    base          VARCHAR NOT NULL,
    model         VARCHAR NOT NULL,
    kept          BOOLEAN NOT NULL,
    reason        VARCHAR NOT NULL,
    sha           VARCHAR,
    author        VARCHAR,
    created_at    VARCHAR,
    downloads     BIGINT,
    likes         BIGINT,
    pipeline_tag  VARCHAR,
    library       VARCHAR,
    gated         VARCHAR,
    tags          VARCHAR[],
    files         VARCHAR[],
    formats       VARCHAR[],
    datasets      VARCHAR[],
    label_source  VARCHAR,
    labels_json   VARCHAR,
    discovered_at TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (base, model)
);
CREATE TABLE IF NOT EXISTS bases (
    base          VARCHAR PRIMARY KEY,
    sha           VARCHAR NOT NULL,
    discovered_at TIMESTAMP NOT NULL DEFAULT now()
);
"""

CATALOGUE_COLUMNS = (
    "base",
    "model",
    "kept",
    "reason",
    "sha",
    "author",
    "created_at",
    "downloads",
    "likes",
    "pipeline_tag",
    "library",
    "gated",
    "tags",
    "files",
    "formats",
    "datasets",
    "label_source",
    "labels_json",
)

META_COLUMNS = (
    "model",
    "base",
    "params",
    "architecture",
    "dim",
    "datasets",
    "label_source",
    "author",
    "source",
    "model_hash",
    "seconds",
    "created_at",
)
# Columns added after the first release: added in place to older store files.
MIGRATIONS = (
    "ALTER TABLE vectors ADD COLUMN IF NOT EXISTS label_source VARCHAR",
    "ALTER TABLE vectors ADD COLUMN IF NOT EXISTS author VARCHAR",
    "ALTER TABLE failures ADD COLUMN IF NOT EXISTS model_hash VARCHAR",
    "ALTER TABLE failures ADD COLUMN IF NOT EXISTS kind VARCHAR",
)


def migrate(con: duckdb.DuckDBPyConnection, heap: VectorFile) -> None:
    """Create the tables, or bring an older store's up to date (columns added; ``FLOAT[]`` vectors moved out)."""
    if "vector" in _columns(con, "vectors"):
        _move_vectors_out(con, heap)
    con.execute(SCHEMA)
    for statement in MIGRATIONS:
        con.execute(statement)


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    rows = con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position", [table]
    ).fetchall()
    return [r[0] for r in rows]


def _move_vectors_out(con: duckdb.DuckDBPyConnection, heap: VectorFile) -> None:
    """Migrate a store whose vectors are ``FLOAT[]`` in DuckDB: their bytes go to the vector file.

    One transaction: the new table replaces the old one only once every vector is fsynced.
    """
    for statement in MIGRATIONS:
        if statement.startswith("ALTER TABLE vectors "):
            con.execute(statement)
    keep = [c for c in _columns(con, "vectors") if c != "vector"]
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DROP TABLE IF EXISTS vectors_moved")
        con.execute(SCHEMA.split(";")[0].replace("vectors (", "vectors_moved (", 1))
        keys: dict[str, list[Any]] = {
            "model": [],
            "base": [],
            "base_hash": [],
            "params": [],
            "offset": [],
            "vector_hash": [],
        }
        reader = con.sql("SELECT model, base, base_hash, params, vector FROM vectors").to_arrow_reader(256)
        for batch in reader:  # 256 vectors in memory at a time
            vectors = [vector_bytes(np.asarray(v.values, np.float32)) for v in batch.column(4)]
            for name in ("model", "base", "base_hash", "params"):
                keys[name] += batch.column(name).to_pylist()
            keys["offset"] += heap.append(vectors)
            keys["vector_hash"] += [checksum(v) for v in vectors]
        con.register("moved", pa.table(keys))
        con.execute(
            f"""INSERT INTO vectors_moved ({", ".join(keep)}, "offset", vector_hash)
                SELECT {", ".join(f"v.{c}" for c in keep)}, m."offset", m.vector_hash
                FROM vectors v JOIN moved m USING (model, base, base_hash, params)"""
        )
        con.unregister("moved")
        con.execute("DROP TABLE vectors")
        con.execute("ALTER TABLE vectors_moved RENAME TO vectors")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("CHECKPOINT")

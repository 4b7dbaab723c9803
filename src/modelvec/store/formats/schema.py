"""The store's tables, and the changes that bring an older store file up to date in place."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from .vectorfile import VectorFile, checksum, vector_bytes


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """One transaction: committed when the block ends, rolled back when it raises.

    A COMMIT that fails (a full disk, an I/O error writing the WAL) has already ended the transaction: the
    ROLLBACK after it is refused, and its refusal must not hide why the write failed."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:  # no transaction is active any more (DuckDB ended it), or the database cannot go on
            pass
        raise


@dataclass(frozen=True)
class Table:
    """One table: its columns with their SQL types, in order, and its primary key. The CREATE and INSERT
    statements are made from it, so a column is declared in one place."""

    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]

    def create(self) -> str:
        cols = ",\n    ".join(f"{_quoted(name)} {kind}" for name, kind in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} (\n    {cols},\n    PRIMARY KEY ({', '.join(self.key)})\n);"

    def insert(self, columns: Sequence[str]) -> str:
        """``INSERT OR REPLACE`` of the given columns (each must be one of the table's), one row of parameters."""
        known = {name for name, _ in self.columns}
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise KeyError(f"{self.name} has no column {', '.join(unknown)}")
        names = ", ".join(_quoted(c) for c in columns)
        return f"INSERT OR REPLACE INTO {self.name} ({names}) VALUES ({', '.join('?' * len(columns))})"


def _quoted(name: str) -> str:
    return f'"{name}"' if name in ("offset",) else name


VECTORS = Table(
    "vectors",
    (
        ("model", "VARCHAR NOT NULL"),
        ("model_hash", "VARCHAR NOT NULL"),
        ("base", "VARCHAR NOT NULL"),
        ("base_hash", "VARCHAR NOT NULL"),
        ("params", "VARCHAR NOT NULL"),
        ("rank", "INTEGER NOT NULL"),
        ("factor", "VARCHAR NOT NULL"),
        ("pooling", "VARCHAR NOT NULL"),
        ("solver", "VARCHAR NOT NULL"),
        ("sign", "VARCHAR NOT NULL"),
        ("params_json", "VARCHAR NOT NULL"),
        ("architecture", "VARCHAR NOT NULL"),
        ("dim", "INTEGER NOT NULL"),
        ("offset", "BIGINT NOT NULL"),
        ("vector_hash", "VARCHAR NOT NULL"),
        ("datasets", "VARCHAR[] NOT NULL"),
        ("label_source", "VARCHAR"),
        ("author", "VARCHAR"),
        ("source", "VARCHAR NOT NULL"),
        ("seconds", "DOUBLE NOT NULL"),
        ("adapter", "BOOLEAN"),  # a LoRA adapter (True) or a full fine-tune (False); NULL: stored before it was kept
        ("quantized", "VARCHAR"),  # the block-quantized types of a GGUF's weights (Q4_K, ...); NULL: float weights
        ("created_at", "TIMESTAMP NOT NULL DEFAULT now()"),
        # What the model's card declares, read with it (NULL: stored by an earlier version, or no card): an xxh3 of the
        # card's bytes (a changed card is read again), its relation and the parents it names (``base_model``)
        ("card_hash", "VARCHAR"),
        ("relation", "VARCHAR"),
        ("parents", "VARCHAR[]"),
        ("created", "VARCHAR"),  # when the model was made (ISO): the Hub's date, a local model's files' oldest time
        ("files_id", "VARCHAR"),  # a local model's weight files as resolved paths (an xxh3): the same files, one model
    ),
    ("model", "base", "base_hash", "params"),
)
FAILURES = Table(
    "failures",
    (
        ("model", "VARCHAR NOT NULL"),
        ("base", "VARCHAR NOT NULL"),
        ("params", "VARCHAR NOT NULL"),
        ("error", "VARCHAR NOT NULL"),
        ("created_at", "TIMESTAMP NOT NULL DEFAULT now()"),
        ("model_hash", "VARCHAR"),
        ("kind", "VARCHAR"),
    ),
    ("model", "base", "params"),
)
CATALOGUE = Table(
    "catalogue",
    (
        ("base", "VARCHAR NOT NULL"),
        ("model", "VARCHAR NOT NULL"),
        ("kept", "BOOLEAN NOT NULL"),
        ("reason", "VARCHAR NOT NULL"),
        ("sha", "VARCHAR"),
        ("author", "VARCHAR"),
        ("created_at", "VARCHAR"),
        ("downloads", "BIGINT"),
        ("likes", "BIGINT"),
        ("pipeline_tag", "VARCHAR"),
        ("library", "VARCHAR"),
        ("gated", "VARCHAR"),
        ("tags", "VARCHAR[]"),
        ("files", "VARCHAR[]"),
        ("formats", "VARCHAR[]"),
        ("datasets", "VARCHAR[]"),
        ("label_source", "VARCHAR"),
        ("labels_json", "VARCHAR"),
        ("relation", "VARCHAR"),
        ("parents", "VARCHAR[]"),
        ("depth", "INTEGER"),
        ("discovered_at", "TIMESTAMP NOT NULL DEFAULT now()"),
    ),
    ("base", "model"),
)
BASES = Table(
    "bases",
    (("base", "VARCHAR"), ("sha", "VARCHAR NOT NULL"), ("discovered_at", "TIMESTAMP NOT NULL DEFAULT now()")),
    ("base",),
)
#: Each stored model's trace (:mod:`modelvec.represent.trace`): the tree of a base's derivatives is inferred from
#: it. Its sketch's float32 bytes are in the vector file (``offset``, ``dim``, checksum ``sketch_hash``), read as
#: the vectors are; ``scale``: the base's weights' size in the same map; ``parent``: the fine-tune an
#: adapter was embedded on (NULL: on the base).
TRACES = Table(
    "traces",
    (
        ("model", "VARCHAR NOT NULL"),
        ("base", "VARCHAR NOT NULL"),
        ("base_hash", "VARCHAR NOT NULL"),
        ("params", "VARCHAR NOT NULL"),
        ("offset", "BIGINT NOT NULL"),
        ("dim", "INTEGER NOT NULL"),
        ("sketch_hash", "VARCHAR NOT NULL"),
        ("levels", "DOUBLE"),
        ("scale", "DOUBLE NOT NULL"),
        ("parent", "VARCHAR"),
        ("created_at", "TIMESTAMP NOT NULL DEFAULT now()"),
        (
            "zeros",
            "DOUBLE",
        ),  # the share of entries left as the base's (NULL: an adapter, or kept by an earlier version)
        ("along", "DOUBLE"),  # the delta's component along the base's weights (the same)
        ("zeros_bf16", "DOUBLE"),  # the share left as the base's, both rounded to bf16 (the same)
        ("precision", "VARCHAR"),  # the model's stored dtype (the same)
        ("rounding", "DOUBLE"),  # rounding to that dtype against the base's weights (the same)
        ("norm", "DOUBLE"),  # the sketch's norm: how copies are found without reading every sketch (NULL: before)
        ("mini", "FLOAT[]"),  # the sketch in 64 buckets (analyse/copies.mini_of): the copies' candidates' filter
        # the delta's kept entries and the base's weights there, one float32 vector in the vector file at
        # entries_offset (entries_dim floats: twice the entries), checksum entries_hash (NULL: an adapter, or before)
        ("entries_offset", "BIGINT"),
        ("entries_dim", "INTEGER"),
        ("entries_hash", "VARCHAR"),
    ),
    ("model", "base", "base_hash", "params"),
)
#: Each version of a base that vectors were embedded against: its ``base_hash`` (a local base's content hash, a Hub
#: base's ``git:<sha>``) and the cheap identity of its files then (names, sizes, times, headers: what a report
#: checks to know the base is unchanged without hashing its content), each written by the run that embedded.
BASE_VERSIONS = Table(
    "base_versions",
    (
        ("base", "VARCHAR NOT NULL"),
        ("identity", "VARCHAR NOT NULL"),
        ("base_hash", "VARCHAR NOT NULL"),
        ("recorded_at", "TIMESTAMP NOT NULL DEFAULT now()"),
    ),
    ("base", "identity"),
)
#: How far a base's discovery went (:class:`modelvec.hub.discovery.Listing`): each listing's Hub query, the next
#: page's address and whether it is done, written with each page's catalogue entries, so a stopped discovery goes on
#: from there; row ``seq`` 0 is the whole discovery (its scope in ``query``, ``done`` once it ended).
DISCOVERY = Table(
    "discovery",
    (
        ("base", "VARCHAR NOT NULL"),
        ("seq", "INTEGER NOT NULL"),
        ("listing", "VARCHAR NOT NULL"),
        ("query", "VARCHAR"),
        ("cursor", "VARCHAR"),
        ("done", "BOOLEAN NOT NULL"),
    ),
    ("base", "seq"),
)
#: A second name of a stored model: the same weight files given another way (a folder and its weights file, a link):
#: one model in every report, stored once under ``model``.
ALIASES = Table(
    "aliases",
    (
        ("base", "VARCHAR NOT NULL"),
        ("alias", "VARCHAR NOT NULL"),
        ("model", "VARCHAR NOT NULL"),
        ("created_at", "TIMESTAMP NOT NULL DEFAULT now()"),
    ),
    ("base", "alias"),
)
TABLES = (VECTORS, FAILURES, CATALOGUE, BASES, TRACES, BASE_VERSIONS, DISCOVERY, ALIASES)
#: Tables added after the first release: a store opened read-only without one is read as if it were empty.
_TABLES_ADDED_LATER = {"traces", "base_versions", "discovery", "aliases"}
SCHEMA = "\n".join(t.create() for t in TABLES)
# Columns added after the first release: added in place to older store files (MIGRATIONS).
_ADDED_LATER = {
    ("vectors", "label_source"),
    ("vectors", "author"),
    ("vectors", "adapter"),
    ("vectors", "quantized"),
    ("vectors", "card_hash"),
    ("vectors", "relation"),
    ("vectors", "parents"),
    ("vectors", "created"),
    ("vectors", "files_id"),
    ("failures", "model_hash"),
    ("failures", "kind"),
    ("catalogue", "relation"),
    ("catalogue", "parents"),
    ("catalogue", "depth"),
    ("traces", "zeros"),
    ("traces", "along"),
    ("traces", "zeros_bf16"),
    ("traces", "precision"),
    ("traces", "rounding"),
    ("traces", "norm"),
    ("traces", "mini"),
    ("traces", "entries_offset"),
    ("traces", "entries_dim"),
    ("traces", "entries_hash"),
}

CATALOGUE_COLUMNS = tuple(name for name, _ in CATALOGUE.columns if name != "discovered_at")

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
    "adapter",
    "quantized",
    "created_at",
    "card_hash",
    "relation",
    "parents",
    "created",
    "files_id",
)
# Columns added after the first release: added in place to older store files.
MIGRATIONS = tuple(
    f"ALTER TABLE {t.name} ADD COLUMN IF NOT EXISTS {name} {kind}"
    for t in TABLES
    for name, kind in t.columns
    if (t.name, name) in _ADDED_LATER
)


def first_row(con: duckdb.DuckDBPyConnection, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
    """The first row of ``sql``, a query that gives at most one, its result read to the end (None: no row). DuckDB 2
    refuses a relation (``con.sql``, what the store's large reads use) on a connection whose last result is not read
    to its end, as a ``fetchone`` leaves it."""
    rows = con.execute(sql, list(args)).fetchall()
    return rows[0] if rows else None


def missing_tables(tables: Mapping[str, Sequence[str]], *, readable: bool = False) -> list[str]:
    """The tables and columns this version needs that a store with ``tables`` (its columns by table:
    :func:`columns_by_table`) lacks (none once :func:`migrate` ran).

    ``readable``: only those a reader cannot do without (a column added later reads as NULL: :func:`select_list`)."""
    missing = []
    for table in TABLES:
        have = set(tables.get(table.name, ()))
        if not have:
            if not (readable and table.name in _TABLES_ADDED_LATER):
                missing.append(f"table {table.name}")
            continue
        missing += [
            f"{table.name}.{name}"
            for name, _ in table.columns
            if name not in have and not (readable and (table.name, name) in _ADDED_LATER)
        ]
    return missing


def select_list(table: Table, columns: Sequence[str], tables: Mapping[str, Sequence[str]]) -> str:
    """The SELECT list of ``columns`` of ``table`` for a store with ``tables`` (its columns by table:
    :func:`columns_by_table`): a column added later that an older store (opened read-only, so not brought up to date)
    lacks reads as NULL of its type."""
    have = set(tables.get(table.name, ()))
    kinds = {name: kind.split()[0] for name, kind in table.columns}
    return ", ".join(name if name in have else f"NULL::{kinds[name]} AS {name}" for name in columns)


def migrate(con: duckdb.DuckDBPyConnection, vector_file: VectorFile, tables: Mapping[str, Sequence[str]]) -> None:
    """Create the tables, or bring an older store's up to date (columns added; ``FLOAT[]`` vectors moved out);
    ``tables``: its columns by table now (:func:`columns_by_table`)."""
    if "vector" in tables.get("vectors", ()):
        _move_vectors_out(con, vector_file)
    elif not missing_tables(tables):
        return  # up to date: nothing to write (the statements below cost ~10 ms a writer's open)
    con.execute(SCHEMA)
    for statement in MIGRATIONS:
        con.execute(statement)


def columns_by_table(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Every table of this store with its columns, in one query (a table it lacks is not there)."""
    rows = con.execute(  # DuckDB's own catalogue: information_schema took ~10 ms on a store just opened, this ~1
        "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND NOT internal ORDER BY table_name, column_index"  # 1.x lists its own views there
    ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def _move_vectors_out(con: duckdb.DuckDBPyConnection, vector_file: VectorFile) -> None:
    """Migrate a store whose vectors are ``FLOAT[]`` in DuckDB: their bytes go to the vector file.

    One transaction: the new table replaces the old one only once every vector is fsynced.
    """
    for statement in MIGRATIONS:
        if statement.startswith("ALTER TABLE vectors "):
            con.execute(statement)
    keep = [c for c in columns_by_table(con)["vectors"] if c != "vector"]
    with transaction(con):
        con.execute("DROP TABLE IF EXISTS vectors_moved")
        con.execute(Table("vectors_moved", VECTORS.columns, VECTORS.key).create())
        keys: dict[str, list[Any]] = {
            "model": [],
            "base": [],
            "base_hash": [],
            "params": [],
            "offset": [],
            "vector_hash": [],
        }
        relation = con.sql("SELECT model, base, base_hash, params, vector FROM vectors")
        reader = (getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader)(256)  # 1.x: fetch_
        for batch in reader:  # 256 vectors in memory at a time
            vectors = [vector_bytes(np.asarray(v.values, np.float32)) for v in batch.column(4)]
            for name in ("model", "base", "base_hash", "params"):
                keys[name] += batch.column(name).to_pylist()
            keys["offset"] += vector_file.append(vectors)
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
    con.execute("CHECKPOINT")

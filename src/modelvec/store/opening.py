"""How a :class:`~modelvec.store.Store` is opened: its DuckDB file checked whole, its vector file found and checked to
be its own, its identity (kept in the store and in its vector files' headers: a copy or a renamed store finds its
own files, and never writes another's)."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from ..core.errors import StoreError
from .formats.schema import TABLES, columns_by_table, first_row
from .formats.vectorfile import VectorFile, identity_of, new_identity, remove_leftovers, vector_path

#: DuckDB's file headers before its first block (one main and two database headers of 4 KiB).
_DUCKDB_HEADERS = 3 * 4096
#: The tables of a modelvec store: a DuckDB database that has tables and none of these is not one, and is not written
MODELVEC_TABLES = frozenset({t.name for t in TABLES} | {"store_meta"})
_IDENTITY = re.compile(r"modelvec store ([0-9a-f]{16})")


def open_vector_file(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> tuple[VectorFile, str | None]:
    """The store's vector file (:func:`~modelvec.store.formats.vectorfile.vector_path`: of this file's name, so a copy
    or a renamed store finds its own), its name kept in ``store_meta`` so a compaction swaps it in the commit that
    changes the offsets, and the store's identity. Another store's vector file is refused; a writer refuses rows that
    point into a vector file that is missing, rather than start an empty one under them, and removes the files a crashed
    compaction of this store left beside it (their header carries its identity; only the holder of the lock gets here).
    """
    tables = set(columns_by_table(con))
    if tables and not tables & MODELVEC_TABLES:  # refused before a table is made in it
        raise StoreError(
            str(path),
            "a DuckDB database, but not a modelvec store (none of its tables is modelvec's): nothing was written "
            "to it; name a store with --store",
        )
    meta = dict(con.execute("SELECT key, value FROM store_meta").fetchall()) if "store_meta" in tables else {}
    current = vector_path(path, meta.get("vector_file"))
    identity = _stored_identity(con) if "store_meta" in tables else None
    if not read_only:
        _check_present(con, path, current, tables)  # before anything is written
        identity = identity or _new_identity(con, path, current)
    vector_file = VectorFile(current, read_only=read_only, identity=identity)
    if vector_file.identity is not None and vector_file.identity != identity:
        vector_file.close()
        raise StoreError(str(current), together(path, f"the vector file of another store, not of {path.name}"))
    if not read_only and identity is not None:
        remove_leftovers(path, current, identity)
    return vector_file, identity


def together(path: Path, what: str) -> str:
    """``what`` is wrong with the store's files, and what to do: keep them together."""
    name = path.name
    together = f"a store's files are copied or renamed together ({name} and every {name}.* beside it)"
    return f"{what}: {together}; nothing was changed"


def _check_present(con: duckdb.DuckDBPyConnection, path: Path, current: Path, tables: set[str]) -> None:
    """Refuse to write a store whose rows point into a vector file that is missing or empty (its DuckDB file copied
    or renamed without it): a fresh file would take new vectors while every stored one stays lost."""
    try:
        size: int | None = current.stat().st_size
    except FileNotFoundError:
        size = None
    if size or not _points_into_vector_file(con, tables):
        return
    said = f"its vector file {current.name} is {'missing' if size is None else 'empty'}, though its rows point into it"
    alike = sorted(p.name for p in current.parent.glob(f"*.vectors{current.suffix}") if p != current)
    if current.suffix != ".vectors" and alike:  # the same compaction's file under another store's name
        said += f" (is it {alike[0]}?)"
    raise StoreError(str(path), together(path, said))


def _points_into_vector_file(con: duckdb.DuckDBPyConnection, tables: set[str]) -> bool:
    """Whether rows of the store point into its vector file (those of a store from before it, whose vectors are
    inside DuckDB, do not)."""
    offsets = "offset" in columns_by_table(con).get("vectors", ())
    pointing = (["vectors"] if offsets else []) + (["traces"] if "traces" in tables else [])
    return any(bool((first_row(con, f"SELECT EXISTS (SELECT 1 FROM {t})") or [0])[0]) for t in pointing)


def _stored_identity(con: duckdb.DuckDBPyConnection) -> str | None:
    """The store's identity, kept as the comment on its table ``store_meta`` (in DuckDB's catalogue: a row would cost
    every store two more blocks of 256 KiB); None: a store written before identities."""
    row = first_row(con, "SELECT comment FROM duckdb_tables() WHERE table_name = 'store_meta' AND schema_name = 'main'")
    found = _IDENTITY.fullmatch(row[0] or "") if row else None
    return found[1] if found else None


def _new_identity(con: duckdb.DuckDBPyConnection, path: Path, current: Path) -> str:
    """Give a store without an identity (a new one, or one written before identities) its identity; a vector file
    that carries one is another store's (this store never wrote one)."""
    if identity_of(current) is not None:
        raise StoreError(str(current), together(path, f"the vector file of another store, not of {path.name}"))
    identity = new_identity()
    con.execute("CREATE TABLE IF NOT EXISTS store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
    mark_identity(con, identity)
    return identity


def mark_identity(con: duckdb.DuckDBPyConnection, identity: str | None) -> None:
    """Write the store's identity as the comment on ``store_meta`` (again, on a store that has it: a change to its
    catalogue, so that its checkpoint on closing rewrites the file, which DuckDB's checkpoint of no change leaves)."""
    con.execute(f"COMMENT ON TABLE store_meta IS 'modelvec store {identity}'")  # hex digits: nothing to quote


def check_whole(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """Refuse a DuckDB file cut short inside a block it uses (by a copy, a download: DuckDB opens it, and writes into
    it, until it reads the missing block); the bytes past its blocks, which a write cut off left (a checkpoint on a
    full disk, a killed process): DuckDB's header names the blocks written before, its write-ahead log what was
    committed since, so they are no damage. DuckDB writes whole blocks and drops free ones at the end of the file: a
    file shorter than ``total_blocks`` is whole while it holds every block used."""
    row = first_row(
        con,
        "SELECT total_blocks, used_blocks, block_size FROM pragma_database_size() "
        "WHERE database_name = current_database()",
    )
    if row is None:
        return 0
    size, (total, used, block) = path.stat().st_size, (int(v) for v in row)
    past = size - (_DUCKDB_HEADERS + total * block)
    if past >= 0:
        return past
    whole, within = divmod(size - _DUCKDB_HEADERS, block)  # the blocks there, and what a write left of the next
    if whole < used or _highest_block(con) >= whole:  # a block it uses is cut short or missing
        raise StoreError(str(path), "damaged: the file is truncated")
    return within


def _highest_block(con: duckdb.DuckDBPyConnection) -> int:
    """The highest block DuckDB says its metadata and its tables' data use (-1: none; its indexes' blocks are not
    said)."""
    used = [r[0] for r in con.execute("SELECT block_id FROM pragma_metadata_info()").fetchall()]
    tables = con.execute(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
    ).fetchall()
    for (table,) in tables:
        try:
            rows = con.execute(
                "SELECT max(block_id), max(list_max(additional_block_ids)) FROM pragma_storage_info(?)", [table]
            ).fetchall()
        except duckdb.Error:  # a name it does not take: that table's blocks unknown
            continue
        used += [v for r in rows for v in r if v is not None]
    return max(used, default=-1)

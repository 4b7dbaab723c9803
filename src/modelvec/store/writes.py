"""What is written into a store: vectors and failures (directly, or by a background writer for a long run), the
catalogue of discovered models and how far a discovery went, and the compaction that drops what is stale."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import duckdb
import pandas as pd

from ..core.errors import Kind
from ..represent.representation import Representation
from .connection import Connection
from .formats.records import Failure, VectorRow
from .formats.schema import CATALOGUE, CATALOGUE_COLUMNS, DISCOVERY, transaction
from .formats.vectorfile import VectorFile
from .versions import Versions
from .writer import StoreWriter, write_rows


class Writes:
    """What is written into a :class:`~modelvec.store.Store` (``store.writes``); one process at a time (the store's
    lock)."""

    def __init__(self, db: Connection, versions: Versions) -> None:
        self._db, self._versions = db, versions

    def put(self, row: VectorRow) -> None:
        """Insert or replace one vector (its own transaction); clears any recorded failure of that model."""
        write_rows(self._db.con, self._db.vector_file, [row])

    def put_many(self, rows: Sequence[VectorRow | Failure]) -> None:
        """Insert or replace many vectors and failures in one transaction."""
        write_rows(self._db.con, self._db.vector_file, rows)

    def writer(self) -> StoreWriter:
        """A background writer for a long run: rows are committed as they come, off the compute thread."""
        return StoreWriter(self._db.con.cursor(), self._db.vector_file)

    def record_failure(
        self,
        model: str,
        base: str,
        representation: Representation,
        error: str,
        model_version: str | None = None,
        kind: Kind | str = Kind.CONTENT,
    ) -> None:
        """Record why a model failed; a ``content`` failure with ``model_version`` is skipped while the weights are unchanged."""
        write_rows(
            self._db.con,
            self._db.vector_file,
            [
                Failure(
                    model=model,
                    base=base,
                    representation=representation,
                    error=error,
                    model_version=model_version,
                    kind=kind,
                )
            ],
        )

    def put_catalogue(self, base: str, base_sha: str, entries: Sequence[Any]) -> None:
        """Insert or refresh discovered models (``CatalogueEntry``) in one transaction.

        Vectors are kept; their labels and author are refreshed from the new entries, so a
        re-discovery that learns better labels improves the analysis without re-embedding.
        """
        rows = _catalogue_rows(entries)
        with transaction(self._db.con):
            _put_catalogue_rows(self._db.con, base, base_sha, rows)

    def put_discovery_page(
        self,
        base: str,
        base_sha: str,
        entries: Sequence[Any],
        listings: Sequence[tuple[str, str, str | None, bool]],
        *,
        scope: str,
        done: bool,
    ) -> None:
        """One page of a discovery, in one transaction: its entries into the catalogue (as :meth:`put_catalogue`) and
        how far it went (``listings``: key, query JSON, next page's address, done; ``scope``: the discovery's settings;
        ``done``: it ended). Safe from another thread than the store's (a connection of its own)."""
        rows = _catalogue_rows(entries)
        progress = [[base, 0, "", scope, None, done]]
        progress += [
            [base, i + 1, key, query, cursor, finished] for i, (key, query, cursor, finished) in enumerate(listings)
        ]
        with self._db.for_thread() as view, transaction(view.con):
            _put_catalogue_rows(view.con, base, base_sha, rows)
            view.con.execute("DELETE FROM discovery WHERE base = ?", [base])
            view.con.executemany(DISCOVERY.insert([c for c, _ in DISCOVERY.columns]), progress)

    def forget_discovery(self, base: str) -> None:
        """Start the discovery of ``base`` afresh next time (its catalogue is kept until refreshed)."""
        self._db.con.execute("DELETE FROM discovery WHERE base = ?", [base])

    def compact(self, stale: pd.DataFrame | None = None) -> tuple[int, int]:
        """Drop the vectors and traces embedded against an earlier version of their base (``stale``, default
        :meth:`~modelvec.store.versions.Versions.stale`), then rewrite the vector file with only the bytes rows point
        at; (bytes before, bytes after).

        Replaced vectors (``--force``, changed weights, stale rows) leave their old bytes behind. The live ones
        are copied (checksums verified) to a new file and fsynced, then the offsets and the file's
        name change in one commit: a crash at any point leaves the old store or the new one whole.
        Not while a writer of this store is running.
        """
        traced = self._db.columns_by_table().get("traces", [])
        tables = [("vectors", "vector_hash")] + ([("traces", "sketch_hash")] if traced else [])
        pointers = [(t, d, "offset", "dim") for t, d in tables]
        if "entries_hash" in traced:  # a trace's kept entries: bytes of their own
            pointers.append(("traces", "entries_hash", "entries_offset", "entries_dim"))
        stale = self._versions.stale() if stale is None else stale
        before = self._db.vector_file.path.stat().st_size
        new = VectorFile(
            self._db.path.parent / f"{self._db.path.name}.vectors.{uuid.uuid4().hex[:12]}", identity=self._db.identity
        )
        try:
            with transaction(self._db.con):
                for row in stale.itertuples():
                    for table, _ in tables:
                        self._db.con.execute(
                            f"DELETE FROM {table} WHERE base = ? AND base_hash = ?", [row.base, row.base_hash]
                        )
                for table, digest, at, dim in pointers:
                    rows = self._copy_rows(table, digest, new, at, dim)
                    if rows:
                        self._db.con.executemany(
                            f'UPDATE {table} SET "{at}" = ? WHERE model = ? AND base = ? AND base_hash = ? AND params = ?',
                            rows,
                        )
                self._db.con.execute("INSERT OR REPLACE INTO store_meta VALUES ('vector_file', ?)", [new.path.name])
        except BaseException:
            new.close()
            new.path.unlink(missing_ok=True)
            raise
        old, self._db.vector_file = self._db.vector_file, new
        old.close()
        old.path.unlink(missing_ok=True)
        return before, new.path.stat().st_size

    def _copy_rows(
        self, table: str, digest: str, new: VectorFile, at: str = "offset", dim: str = "dim"
    ) -> list[list[Any]]:
        """Copy the bytes ``table``'s rows point at (column ``at``, ``dim`` floats, checksum ``digest``; a row whose
        ``digest`` is NULL points at none) to ``new`` (checksums verified), 256 at a time: their new offsets with
        their keys."""
        rows = self._db.con.execute(
            f'SELECT model, base, base_hash, params, "{at}", {dim}, {digest} FROM {table} '
            f'WHERE {digest} IS NOT NULL ORDER BY "{at}"'
        ).fetchall()
        moved = []
        for lo in range(0, len(rows), 256):
            part = rows[lo : lo + 256]
            arrays = [self._db.vector_file.read([r[4]], r[5], [r[6]], [r[0]])[0] for r in part]
            moved += [[offset, *r[:4]] for offset, r in zip(new.append(arrays), part)]
        return moved


def _catalogue_rows(entries: Sequence[Any]) -> list[dict[str, Any]]:
    rows = []
    for e in entries:
        d = e.as_dict() if hasattr(e, "as_dict") else dict(e)
        d["labels_json"] = json.dumps(d.pop("labels", []), sort_keys=True)
        rows.append({c: d.get(c) for c in CATALOGUE_COLUMNS})
    return rows


def _put_catalogue_rows(con: duckdb.DuckDBPyConnection, base: str, base_sha: str, rows: list[dict[str, Any]]) -> None:
    """Within a transaction: the base's revision, the rows, and the labels of stored vectors refreshed from them."""
    con.execute("INSERT OR REPLACE INTO bases (base, sha) VALUES (?, ?)", [base, base_sha])
    if rows:
        con.executemany(CATALOGUE.insert(CATALOGUE_COLUMNS), [[r[c] for c in CATALOGUE_COLUMNS] for r in rows])
        con.execute(
            """UPDATE vectors SET datasets = c.datasets, label_source = c.label_source, author = c.author,
                      relation = c.relation, parents = c.parents, created = c.created_at
               FROM catalogue c WHERE vectors.model = c.model AND vectors.base = c.base AND c.base = ?""",
            [base],
        )

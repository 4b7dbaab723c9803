"""What a :class:`~modelvec.store.Population` needs of the store, read in one query: the rows of its base's vectors
under one representation (every version of the base), each with the version it was embedded against, the base's
commit at its last discovery and the versions recorded with its files. Which base, its version now, the stale rows
and the rows of the version now are then worked out from that, in memory, not asked of the store again.

The rows of one version are taken from the snapshot by DuckDB (in memory, not the store) with the store's own query,
so they come out exactly as :meth:`~modelvec.store.reads.Reads.select` gives them (the same columns, the
same types: a column's type follows the rows it holds).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ...represent.representation import Representation
from ..connection import Connection
from ..formats.blocks import Selection
from ..formats.schema import META_COLUMNS, VECTORS, select_list
from ..versions import version_now


class Snapshot:
    """The rows of the vectors of the bases ``names`` (None: every base) under ``representation``, read once from
    ``db``, with what says each base's version now."""

    def __init__(self, db: Connection, names: Sequence[str] | None, representation: Representation) -> None:
        tables = db.columns_by_table()
        recorded = (
            "(SELECT list({'identity': r.identity, 'base_hash': r.base_hash} ORDER BY r.recorded_at DESC) "
            "FROM base_versions r WHERE r.base = v.base)"
            if "base_versions" in tables
            else "NULL"
        )
        where, args = db.clauses(
            [("list_contains(?, v.base)", list(names))] if names is not None else [], params=representation.key()
        )
        relation = db.con.sql(
            f"""SELECT "offset", vector_hash, base_hash, {select_list(VECTORS, META_COLUMNS, tables)},
                   (SELECT sha FROM bases b WHERE b.base = v.base) AS base_sha, {recorded} AS recorded
                FROM vectors v {where} ORDER BY model, base, params, base_hash""",
            params=args,
        )
        # read once: duckdb 2 names it to_arrow_table, 1.x arrow
        self.rows: pa.Table = (getattr(relation, "to_arrow_table", None) or relation.arrow)()
        self._bases = self.rows.column("base").to_pylist()

    def bases(self) -> list[str]:
        """The bases with rows, sorted."""
        return sorted(set(self._bases))

    def _of(self, base: str) -> pa.Table:
        return self.rows.filter(pc.equal(self.rows.column("base"), base))

    def stored(self, base: str) -> pd.DataFrame:
        """``base``'s versions as :meth:`~modelvec.store.versions.Versions.stored` gives them: ``base_hash``,
        ``vectors`` and ``newest``, by ``base_hash``."""
        return self._query(
            self._of(base),
            "SELECT base_hash, count(*) AS vectors, max(created_at) AS newest FROM rows "
            "GROUP BY base_hash ORDER BY base_hash",
        )

    def base_now(self, base: str) -> str | None:
        """``base``'s version now (:meth:`~modelvec.store.versions.Versions.base_now`), from the snapshot."""
        mine = self._of(base)
        sha = mine.column("base_sha")[0].as_py() if len(mine) else None
        listed: list[dict[str, Any]] = (mine.column("recorded")[0].as_py() if len(mine) else None) or []

        def recorded(stamp: str | None) -> str | None:
            return next((str(r["base_hash"]) for r in listed if stamp is None or r["identity"] == stamp), None)

        return version_now(base, sha, recorded)

    def models(self, base: str) -> set[str]:
        """The models with rows of ``base``, of any version."""
        return set(self._of(base).column("model").to_pylist())

    def select(self, base: str, base_hash: str) -> tuple[Selection, pd.DataFrame]:
        """The rows of ``base`` embedded against ``base_hash`` as :meth:`~modelvec.store.reads.Reads.select`
        gives them: where the vectors are, and their metadata, by model."""
        columns = ", ".join(f'"{c}"' for c in ("offset", "vector_hash", *META_COLUMNS))
        rows = self._query(
            self._of(base),
            f"SELECT {columns} FROM rows WHERE base_hash = ? ORDER BY model, base, params, base_hash",
            [base_hash],
        )
        meta = rows[list(META_COLUMNS)].reset_index(drop=True)
        if not rows.empty and rows["dim"].nunique() != 1:
            raise ValueError("the selected vectors have different dimensions: select one base and one representation")
        dim = int(rows["dim"].iloc[0]) if not rows.empty else 0
        return Selection(rows["model"].tolist(), rows["offset"].tolist(), rows["vector_hash"].tolist(), dim), meta

    @staticmethod
    def _query(rows: pa.Table, sql: str, args: Sequence[Any] = ()) -> pd.DataFrame:
        """``sql`` over ``rows`` (the table ``rows``) in an in-memory DuckDB, one a thread (a new one costs ~10 ms, a
        query 2-3 ms: a population asks twice, an evaluation's every variant does): the frame DuckDB gives."""
        con = getattr(_MEMORY, "con", None)
        if con is None:
            con = _MEMORY.con = duckdb.connect()
        con.register("rows", rows)
        try:
            return con.execute(sql, list(args)).df()
        finally:
            con.unregister("rows")


_MEMORY = threading.local()  # each thread's in-memory DuckDB for Snapshot._query

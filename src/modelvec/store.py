"""The store: one embedded DuckDB file holding every computed vector and every failure.

A vector row is keyed by (model, base, base_hash, params): one vector per model per base per
representation. ``model_hash`` is the fine-tune's identity (its commit sha, or its files' stat and
headers), so a re-run skips a model whose row is current and recomputes one whose weights changed.
Rows are committed as soon as they are computed (by :class:`StoreWriter` in a long run), so an
interrupted run loses nothing already committed.
Vectors are ``FLOAT[]``; loading goes through Arrow into one numpy matrix without per-row copies.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from .representation import Representation

DEFAULT_STORE = "modelvec.duckdb"

_SCHEMA = """
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
    vector       FLOAT[] NOT NULL,
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
    "base", "model", "kept", "reason", "sha", "author", "created_at", "downloads", "likes", "pipeline_tag", "library",
    "gated", "tags", "files", "formats", "datasets", "label_source", "labels_json",
)

META_COLUMNS = (
    "model", "base", "params", "architecture", "dim", "datasets", "label_source", "author", "source", "model_hash",
    "seconds", "created_at",
)
# Columns added after the first release: added in place to older store files.
_MIGRATIONS = ("ALTER TABLE vectors ADD COLUMN IF NOT EXISTS label_source VARCHAR",
               "ALTER TABLE vectors ADD COLUMN IF NOT EXISTS author VARCHAR",
               "ALTER TABLE failures ADD COLUMN IF NOT EXISTS model_hash VARCHAR")


def default_store_path() -> Path:
    """``$MODELVEC_STORE`` or ``./modelvec.duckdb``."""
    return Path(os.environ.get("MODELVEC_STORE") or DEFAULT_STORE)


@dataclass
class VectorRow:
    """One computed vector with what is known about its model."""

    model: str
    model_hash: str
    base: str
    base_hash: str
    params: Representation
    architecture: str
    vector: np.ndarray
    datasets: list[str]
    source: str
    seconds: float
    label_source: str | None = None  # where the dataset labels came from, e.g. "card"
    author: str | None = None


@dataclass
class Failure:
    """Why one model could not be embedded; ``model_hash`` is set for a failure of its content."""

    model: str
    base: str
    params: Representation
    error: str
    model_hash: str | None = None


def _write(con: duckdb.DuckDBPyConnection, rows: Sequence[VectorRow | Failure]) -> None:
    """Write vectors and failures in one transaction: all of them land, or none does."""
    con.execute("BEGIN TRANSACTION")
    try:
        for row in rows:
            if isinstance(row, Failure):
                con.execute(
                    "INSERT OR REPLACE INTO failures (model, base, params, error, model_hash) VALUES (?, ?, ?, ?, ?)",
                    [row.model, row.base, row.params.key(), row.error, row.model_hash],
                )
                continue
            vec = np.ascontiguousarray(row.vector, dtype=np.float32)
            p = row.params
            new_row = pa.table(
                {
                    "vector": pa.ListArray.from_arrays(pa.array([0, vec.size], pa.int32()), pa.array(vec)),
                    "datasets": pa.array([row.datasets], pa.list_(pa.string())),
                }
            )
            con.register("new_row", new_row)
            con.execute(
                """INSERT OR REPLACE INTO vectors
                   (model, model_hash, base, base_hash, params, rank, factor, pooling, solver, sign, params_json,
                    architecture, dim, vector, datasets, label_source, author, source, seconds)
                   SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, vector, datasets, ?, ?, ?, ? FROM new_row""",
                [
                    row.model, row.model_hash, row.base, row.base_hash, p.key(), p.rank, p.factor, p.pooling,
                    p.solver, p.sign, json.dumps(p.as_dict(), sort_keys=True), row.architecture, int(vec.size),
                    row.label_source, row.author, row.source, float(row.seconds),
                ],
            )
            con.unregister("new_row")
            con.execute("DELETE FROM failures WHERE model = ? AND base = ? AND params = ?", [row.model, row.base, p.key()])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


class StoreWriter:
    """Writes vectors and failures from a background thread, so the compute thread never waits on a commit.

    Rows queued while a commit is in flight are committed together in the next transaction
    (group commit): each row is durable within one commit of being computed, and a killed run
    loses at most the rows still queued, never a committed or a half-written one. ``close()``
    (also on Ctrl-C, through ``with``) commits everything queued; an error of the writer
    surfaces in the caller at the next ``put`` or at ``close``.
    """

    _STOP = object()

    def __init__(self, store: "Store", max_batch: int = 64) -> None:
        self._con = store.con.cursor()  # a connection of its own: DuckDB connections are not shared across threads
        self._queue: queue.Queue[Any] = queue.Queue()
        self._max_batch = max_batch
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="modelvec-store-writer", daemon=True)
        self._thread.start()

    def put(self, row: VectorRow | Failure) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(row)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            batch = [] if item is self._STOP else [item]
            stop = item is self._STOP
            while not stop and len(batch) < self._max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                stop = more is self._STOP
                if not stop:
                    batch.append(more)
            if batch and self._error is None:
                try:
                    _write(self._con, batch)
                except BaseException as exc:  # kept for the caller; later rows are not written after a failed one
                    self._error = exc
            if stop:
                return

    def close(self) -> None:
        """Commit everything queued, stop the thread, and raise the writer's error if it had one."""
        if self._thread.is_alive():
            self._queue.put(self._STOP)
            self._thread.join()
            self._con.close()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Store:
    """A DuckDB file of vectors and failures. Use as a context manager or call ``close()``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.con = duckdb.connect(str(self.path))
        self.con.execute(_SCHEMA)
        for statement in _MIGRATIONS:
            self.con.execute(statement)

    # --- writes -------------------------------------------------------------------------------
    def put(self, row: VectorRow) -> None:
        """Insert or replace one vector (its own transaction); clears any recorded failure of that model."""
        _write(self.con, [row])

    def writer(self) -> "StoreWriter":
        """A background writer for a long run: rows are committed as they come, off the compute thread."""
        return StoreWriter(self)

    def put_catalogue(self, base: str, base_sha: str, entries: Sequence[Any]) -> None:
        """Insert or refresh discovered models (``CatalogueEntry``) in one transaction.

        Vectors are kept; their labels and author are refreshed from the new entries, so a
        re-discovery that learns better labels improves the analysis without re-embedding.
        """
        rows = []
        for e in entries:
            d = e.as_dict() if hasattr(e, "as_dict") else dict(e)
            d["labels_json"] = json.dumps(d.pop("labels", []), sort_keys=True)
            rows.append({c: d.get(c) for c in CATALOGUE_COLUMNS})
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("INSERT OR REPLACE INTO bases (base, sha) VALUES (?, ?)", [base, base_sha])
            if rows:
                cols = ", ".join(CATALOGUE_COLUMNS)
                marks = ", ".join("?" for _ in CATALOGUE_COLUMNS)
                self.con.executemany(f"INSERT OR REPLACE INTO catalogue ({cols}) VALUES ({marks})",
                                     [[r[c] for c in CATALOGUE_COLUMNS] for r in rows])
                self.con.execute(
                    """UPDATE vectors SET datasets = c.datasets, label_source = c.label_source, author = c.author
                       FROM catalogue c WHERE vectors.model = c.model AND vectors.base = c.base AND c.base = ?""",
                    [base],
                )
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def catalogue(self, base: str | None = None, kept: bool | None = None, model: str | None = None) -> pd.DataFrame:
        """Discovered models (one row per base and model), most downloaded first."""
        where, args = self._clauses(base=base, kept=kept, model=model)
        return self.con.execute(
            f"SELECT {', '.join(CATALOGUE_COLUMNS)}, discovered_at FROM catalogue {where} "
            "ORDER BY base, downloads DESC NULLS LAST, model", args,
        ).df()

    def base_sha(self, base: str) -> str | None:
        """The base revision recorded at the last discovery."""
        rows = self.con.execute("SELECT sha FROM bases WHERE base = ?", [base]).fetchall()
        return rows[0][0] if rows else None

    def record_failure(self, model: str, base: str, params: Representation, error: str,
                       model_hash: str | None = None) -> None:
        """Record why a model failed; ``model_hash`` marks a failure of its content (not of fetching it)."""
        _write(self.con, [Failure(model, base, params, error, model_hash)])

    def known_failure(self, model: str, model_hash: str, base: str, params: Representation) -> str | None:
        """The recorded error when these very weights already failed with this base and representation."""
        rows = self.con.execute(
            "SELECT error FROM failures WHERE model = ? AND model_hash = ? AND base = ? AND params = ?",
            [model, model_hash, base, params.key()],
        ).fetchall()
        return rows[0][0] if rows else None

    # --- reads --------------------------------------------------------------------------------
    def has(self, model: str, model_hash: str, base: str, base_hash: str, params: Representation) -> bool:
        """Whether a current vector exists (same weights, same base weights, same representation)."""
        hit = self.con.execute(
            "SELECT 1 FROM vectors WHERE model = ? AND model_hash = ? AND base = ? AND base_hash = ? AND params = ?",
            [model, model_hash, base, base_hash, params.key()],
        ).fetchall()
        return bool(hit)

    @staticmethod
    def _clauses(extra: Sequence[tuple[str, Any]] = (), **equal: Any) -> tuple[str, list[Any]]:
        """A WHERE clause: each column given a value (None = any) equals it, plus ``extra`` (sql, arg) pairs."""
        items = [(f"{column} = ?", value) for column, value in equal.items() if value is not None] + list(extra)
        return ("WHERE " + " AND ".join(sql for sql, _ in items)) if items else "", [arg for _, arg in items]

    def _where(self, base: str | None, params: Representation | str | None, models: Sequence[str] | None) -> tuple[str, list[Any]]:
        key = params.key() if isinstance(params, Representation) else params
        extra = [("list_contains(?, model)", list(models))] if models is not None else []
        return self._clauses(extra, base=base, params=key)

    def metadata(self, base: str | None = None, params: Representation | str | None = None, models: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per stored vector (no vectors), ordered by model."""
        where, args = self._where(base, params, models)
        return self.con.execute(f"SELECT {', '.join(META_COLUMNS)} FROM vectors {where} ORDER BY model, base, params", args).df()

    def load(
        self, base: str | None = None, params: Representation | str | None = None, models: Sequence[str] | None = None
    ) -> tuple[np.ndarray, pd.DataFrame]:
        """Vectors as one float32 matrix and their metadata, rows ordered by model.

        All selected vectors must share a dimension: select one base and one representation. The
        vectors stream from DuckDB in Arrow batches straight into the preallocated matrix, with
        no ORDER BY over the payload (sorting 2 GB of lists is what makes a naive query slow).
        """
        where, args = self._where(base, params, models)
        n, n_dims, dim = self.con.execute(f"SELECT count(*), count(DISTINCT dim), max(dim) FROM vectors {where}", args).fetchall()[0]
        if n == 0:
            return np.zeros((0, 0), np.float32), self.metadata(base, params, models)
        if n_dims != 1:
            raise ValueError("the selected vectors have different dimensions: select one base and one representation")
        matrix = np.empty((n, dim), np.float32)
        metas, row = [], 0
        reader = self.con.sql(f"SELECT vector, {', '.join(META_COLUMNS)} FROM vectors {where}", params=args).to_arrow_reader(256)
        for batch in reader:
            k = batch.num_rows
            matrix[row : row + k] = batch.column(0).flatten().to_numpy().reshape(k, dim)
            metas.append(batch.drop_columns(["vector"]).to_pandas())
            row += k
        meta = pd.concat(metas, ignore_index=True)
        order = meta.sort_values(["model", "base", "params"], kind="stable").index.to_numpy()
        if not np.array_equal(order, np.arange(n)):
            matrix, meta = matrix[order], meta.iloc[order].reset_index(drop=True)
        return matrix, meta

    def failures(self) -> pd.DataFrame:
        return self.con.execute("SELECT model, base, params, error, created_at FROM failures ORDER BY model").df()

    def summary(self) -> pd.DataFrame:
        """Counts per base and representation."""
        return self.con.execute(
            """SELECT base, params, architecture, count(*) AS models, any_value(dim) AS dim,
                      round(avg(seconds), 3) AS mean_seconds
               FROM vectors GROUP BY base, params, architecture ORDER BY base, params"""
        ).df()

    def export_parquet(self, path: str | os.PathLike[str]) -> int:
        """One row per stored vector: model, base, the representation parameters, datasets, vector."""
        target = str(path).replace("'", "''")
        self.con.execute(
            f"""COPY (SELECT model, base, params, rank, factor, pooling, solver, sign, architecture, model_hash,
                             datasets, vector
                      FROM vectors ORDER BY model, base, params) TO '{target}' (FORMAT parquet)"""
        )
        return int(self.con.execute("SELECT count(*) FROM vectors").fetchall()[0][0])

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

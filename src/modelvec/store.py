"""The store: one embedded DuckDB file holding every computed vector and every failure.

A vector row is keyed by (model, base, base_hash, params): one vector per model per base per
representation. ``model_hash`` is the fine-tune's identity (its commit sha, or its files' stat and
headers), so a re-run skips a model whose row is current and recomputes one whose weights changed.
Rows are committed as soon as they are computed (by :class:`StoreWriter` in a long run), so an
interrupted run loses nothing already committed.

The vectors' bytes live beside the DuckDB file in an append-only float32 file
(``<store>.vectors``, see :class:`VectorFile`); each row holds its offset and an xxh3 of its
bytes. Kept in DuckDB as ``FLOAT[]``, they made the writer's memory grow with every row (the
buffer pool and checkpoints hold written list blocks: +250 MB per 600 bert-base vectors, and a
capped ``memory_limit`` made checkpoints fail fatally), and each insert cost 10-15 ms. The bytes
are fsynced before the row that points at them commits, so a committed row never points at
missing bytes; bytes written by a run killed before its commit are unreferenced, never read.

One process at a time writes a store: DuckDB locks its file for the process that opens it, and a
second process's ``Store(path)`` waits for that lock (``wait`` seconds, default
``$MODELVEC_STORE_WAIT`` or 600) before it opens the vector file, so only the lock holder ever
appends to it. Appends also take an ``flock`` on the vector file, so two ``Store`` objects of one
file in one process (which share DuckDB's database) never write over each other's bytes.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import queue
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from .representation import Representation

DEFAULT_STORE = "modelvec.duckdb"
DEFAULT_WAIT = 600.0  # seconds a Store waits for another process's lock on its file ($MODELVEC_STORE_WAIT)
_RETRY = (0.2, 0.4)  # seconds between two attempts to open a locked store (random, so waiters do not march in step)
_log = logging.getLogger(__name__)

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


def default_wait() -> float:
    """``$MODELVEC_STORE_WAIT`` (seconds; ``inf`` waits for ever) or 600."""
    text = os.environ.get("MODELVEC_STORE_WAIT")
    if not text:
        return DEFAULT_WAIT
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"MODELVEC_STORE_WAIT={text!r}: not a number of seconds") from None
    if value != value or value < 0:
        raise ValueError(f"MODELVEC_STORE_WAIT={text!r}: give a number of seconds >= 0")
    return value


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


class StoreError(Exception):
    """The store itself is damaged: a vector file that is not ours, truncated, or whose bytes changed."""


class StoreLockedError(Exception):
    """Another process still held the store's lock when ``Store(path, wait=...)`` gave up waiting for it."""

    def __init__(self, path: Path, pid: int | None, waited: float) -> None:
        self.path, self.pid, self.waited = path, pid, waited
        holder = f"another process (PID {pid})" if pid is not None else "another process"
        super().__init__(f"{path}: still in use by {holder} after waiting {waited:g} s; let it finish, "
                         "or wait longer (--wait SECONDS, $MODELVEC_STORE_WAIT)")


_LOCKED = re.compile(r"Could not set lock on file|Conflicting lock is held")
_HOLDER = re.compile(r"Conflicting lock is held in (?P<program>.*?) \(PID (?P<pid>\d+)\)")


def _lock_holder(exc: BaseException) -> tuple[str | None, int | None] | None:
    """For DuckDB's error on a file locked by another process: (its program, its PID), as far as told; else None."""
    text = str(exc)
    if not isinstance(exc, duckdb.IOException) or not _LOCKED.search(text):
        return None
    found = _HOLDER.search(text)
    return (found["program"], int(found["pid"])) if found else (None, None)


def _connect(path: Path, wait: float, on_wait: Callable[[str], None] | None) -> duckdb.DuckDBPyConnection:
    """Open the DuckDB file, retrying while another process holds its lock, for at most ``wait`` seconds."""
    start = time.monotonic()
    told = False
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as exc:
            holder = _lock_holder(exc)
            if holder is None:
                raise
            waited = time.monotonic() - start
            if waited >= wait:
                raise StoreLockedError(path, holder[1], round(waited, 1)) from None
            if not told:
                who = f"PID {holder[1]}" if holder[1] is not None else "another process"
                limit = "for ever" if math.isinf(wait) else f"up to {wait:g} s"
                message = f"{path}: in use by another process ({who}); waiting for it to finish, {limit}"
                (on_wait or _log.warning)(message)
                told = True
            time.sleep(min(random.uniform(*_RETRY), max(0.0, wait - waited)))


class VectorFile:
    """The append-only float32 file that holds the vectors' bytes; DuckDB holds the rows.

    Appends go to the end (aligned to 64 bytes) and are fsynced; only then does the caller commit
    the rows that point at them. Reads copy each vector once,
    from the page cache into the result, and writing keeps nothing in the process.
    """

    MAGIC = b"modelvec vectors float32-le v1\n".ljust(64, b"\0")
    ALIGN = 64

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        head = os.pread(self._fd, len(self.MAGIC), 0)
        if not head:
            os.pwrite(self._fd, self.MAGIC, 0)
            os.fsync(self._fd)
        elif head != self.MAGIC:
            os.close(self._fd)
            raise StoreError(f"{path}: not a modelvec vector file (bad header)")

    def append(self, vectors: Sequence[np.ndarray]) -> list[int]:
        """Write ``vectors`` (contiguous float32) at the end, fsync, and return their byte offsets.

        The thread lock orders the appends of this object's users (the compute thread and a
        :class:`StoreWriter`); the ``flock`` orders those of another ``VectorFile`` of the same file
        (another ``Store`` of one path in this process, or a process still writing after it lost
        DuckDB's lock), each of which would otherwise take the same end for its offset.
        """
        if not vectors:
            return []
        offsets = []
        with self._lock:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                end = os.fstat(self._fd).st_size
                for vec in vectors:
                    end += -end % self.ALIGN  # a run killed mid-append leaves an unaligned tail: skip past it
                    os.pwrite(self._fd, memoryview(vec).cast("B"), end)
                    offsets.append(end)
                    end += vec.nbytes
                os.fdatasync(self._fd)
            finally:
                if fcntl is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
        return offsets

    def read(self, offsets: Sequence[int], dim: int, hashes: Sequence[str], models: Sequence[str]) -> np.ndarray:
        """The vectors at ``offsets`` as one (n, dim) float32 matrix, each checked against its hash."""
        out = np.empty((len(offsets), dim), np.float32)
        if not len(offsets):
            return out
        nbytes = dim * 4
        for i in np.argsort(offsets, kind="stable"):  # in file order: sequential reads
            offset, digest, model = offsets[i], hashes[i], models[i]
            raw = out[i].view(np.uint8)
            if os.preadv(self._fd, [raw], offset) != nbytes:  # one copy, page cache -> result; no page faults
                raise StoreError(f"{model}: its stored vector is missing from {self.path} (the file is truncated); "
                                 "re-embed it with --force")
            if _checksum(raw) != digest:
                raise StoreError(f"{model}: its stored vector in {self.path} does not match its checksum; "
                                 "re-embed it with --force")
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _vector_bytes(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype="<f4").reshape(-1)


def _checksum(raw: np.ndarray) -> str:
    """A vector's checksum as its row stores it: xxh3-64 of its bytes."""
    return xxhash.xxh3_64_hexdigest(raw)


def _write(con: duckdb.DuckDBPyConnection, heap: VectorFile, rows: Sequence[VectorRow | Failure]) -> None:
    """Write vectors and failures: the bytes first (fsynced), then every row in one transaction."""
    vectors = [_vector_bytes(row.vector) for row in rows if isinstance(row, VectorRow)]
    offsets = iter(heap.append(vectors))
    hashes = iter([_checksum(v) for v in vectors])
    con.execute("BEGIN TRANSACTION")
    try:
        for row in rows:
            if isinstance(row, Failure):
                con.execute(
                    "INSERT OR REPLACE INTO failures (model, base, params, error, model_hash) VALUES (?, ?, ?, ?, ?)",
                    [row.model, row.base, row.params.key(), row.error, row.model_hash],
                )
                continue
            p = row.params
            con.execute(
                """INSERT OR REPLACE INTO vectors
                   (model, model_hash, base, base_hash, params, rank, factor, pooling, solver, sign, params_json,
                    architecture, dim, "offset", vector_hash, datasets, label_source, author, source, seconds)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    row.model, row.model_hash, row.base, row.base_hash, p.key(), p.rank, p.factor, p.pooling,
                    p.solver, p.sign, json.dumps(p.as_dict(), sort_keys=True), row.architecture,
                    int(np.size(row.vector)), next(offsets), next(hashes), list(row.datasets),
                    row.label_source, row.author, row.source, float(row.seconds),
                ],
            )
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
        self._heap = store.heap
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
                    _write(self._con, self._heap, batch)
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
    """A DuckDB file of vectors and failures. Use as a context manager or call ``close()``.

    One process at a time has a store open (DuckDB's lock). While another process holds it,
    opening waits for it, trying again every 0.2-0.4 s, for at most ``wait`` seconds (default
    ``$MODELVEC_STORE_WAIT`` or 600; ``0`` does not wait, ``math.inf`` waits for ever), then raises
    :class:`StoreLockedError` naming the holder's PID. ``on_wait`` gets one line when the wait
    begins (default: a warning on the ``modelvec.store`` logger).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, wait: float | None = None,
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        wait = default_wait() if wait is None else float(wait)
        if wait != wait or wait < 0:
            raise ValueError(f"wait={wait}: give a number of seconds >= 0")
        self.con = _connect(self.path, wait, on_wait)
        try:
            # only after DuckDB's lock is held: only the process holding it appends to the vector file
            self.heap = VectorFile(self._vector_file())
        except BaseException:
            self.con.close()  # a foreign vector file: release the lock now, not when the object is collected
            raise
        try:
            if "vector" in self._columns("vectors"):
                self._move_vectors_out()
            self.con.execute(_SCHEMA)
            for statement in _MIGRATIONS:
                self.con.execute(statement)
        except BaseException:
            self.close()
            raise

    def _vector_file(self) -> Path:
        """The current vector file. Its name is kept in the store, so :meth:`compact` swaps it in the
        commit that changes the offsets; files a crashed compaction left beside it are removed
        (only the holder of the store's lock gets here)."""
        self.con.execute("CREATE TABLE IF NOT EXISTS store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
        rows = self.con.execute("SELECT value FROM store_meta WHERE key = 'vector_file'").fetchall()
        current = self.path.parent / (rows[0][0] if rows else f"{self.path.name}.vectors")
        ours = re.compile(re.escape(f"{self.path.name}.vectors") + r"(\.[0-9a-f]{12})?")
        for other in self.path.parent.glob(f"{glob.escape(self.path.name)}.vectors*"):
            if other != current and ours.fullmatch(other.name):
                other.unlink(missing_ok=True)
        return current

    def compact(self) -> tuple[int, int]:
        """Rewrite the vector file with only the vectors rows point at; (bytes before, bytes after).

        Replaced vectors (``--force``, changed weights) leave their old bytes behind. The live ones
        are copied (checksums verified) to a new file and fsynced, then the offsets and the file's
        name change in one commit: a crash at any point leaves the old store or the new one whole.
        Not while a writer of this store is running.
        """
        rows = self.con.execute(
            'SELECT model, base, base_hash, params, "offset", dim, vector_hash FROM vectors ORDER BY "offset"'
        ).fetchall()
        before = self.heap.path.stat().st_size
        new = VectorFile(self.path.parent / f"{self.path.name}.vectors.{uuid.uuid4().hex[:12]}")
        try:
            moved = []
            for lo in range(0, len(rows), 256):  # 256 vectors in memory at a time
                part = rows[lo : lo + 256]
                vectors = [self.heap.read([r[4]], r[5], [r[6]], [r[0]])[0] for r in part]
                moved += [[offset, *r[:4]] for offset, r in zip(new.append(vectors), part)]
            self.con.execute("BEGIN TRANSACTION")
            try:
                self.con.executemany(
                    'UPDATE vectors SET "offset" = ? WHERE model = ? AND base = ? AND base_hash = ? AND params = ?', moved)
                self.con.execute("INSERT OR REPLACE INTO store_meta VALUES ('vector_file', ?)", [new.path.name])
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
        except BaseException:
            new.close()
            new.path.unlink(missing_ok=True)
            raise
        old, self.heap = self.heap, new
        old.close()
        old.path.unlink(missing_ok=True)
        return before, new.path.stat().st_size

    def _columns(self, table: str) -> list[str]:
        rows = self.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position", [table]
        ).fetchall()
        return [r[0] for r in rows]

    def _move_vectors_out(self) -> None:
        """Migrate a store whose vectors are ``FLOAT[]`` in DuckDB: their bytes go to the vector file.

        One transaction: the new table replaces the old one only once every vector is fsynced.
        """
        for statement in _MIGRATIONS:
            if statement.startswith("ALTER TABLE vectors "):
                self.con.execute(statement)
        keep = [c for c in self._columns("vectors") if c != "vector"]
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DROP TABLE IF EXISTS vectors_moved")
            self.con.execute(_SCHEMA.split(";")[0].replace("vectors (", "vectors_moved (", 1))
            keys: dict[str, list[Any]] = {"model": [], "base": [], "base_hash": [], "params": [], "offset": [],
                                          "vector_hash": []}
            reader = self.con.sql("SELECT model, base, base_hash, params, vector FROM vectors").to_arrow_reader(256)
            for batch in reader:  # 256 vectors in memory at a time
                vectors = [_vector_bytes(np.asarray(v.values, np.float32)) for v in batch.column(4)]
                for name in ("model", "base", "base_hash", "params"):
                    keys[name] += batch.column(name).to_pylist()
                keys["offset"] += self.heap.append(vectors)
                keys["vector_hash"] += [_checksum(v) for v in vectors]
            self.con.register("moved", pa.table(keys))
            self.con.execute(
                f"""INSERT INTO vectors_moved ({', '.join(keep)}, "offset", vector_hash)
                    SELECT {', '.join(f'v.{c}' for c in keep)}, m."offset", m.vector_hash
                    FROM vectors v JOIN moved m USING (model, base, base_hash, params)"""
            )
            self.con.unregister("moved")
            self.con.execute("DROP TABLE vectors")
            self.con.execute("ALTER TABLE vectors_moved RENAME TO vectors")
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("CHECKPOINT")

    # --- writes -------------------------------------------------------------------------------
    def put(self, row: VectorRow) -> None:
        """Insert or replace one vector (its own transaction); clears any recorded failure of that model."""
        _write(self.con, self.heap, [row])

    def put_many(self, rows: Sequence[VectorRow | Failure]) -> None:
        """Insert or replace many vectors and failures in one transaction."""
        _write(self.con, self.heap, rows)

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
        _write(self.con, self.heap, [Failure(model, base, params, error, model_hash)])

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

    def base_hashes(self, base: str, params: Representation) -> list[str]:
        """The identities of the base weights the stored vectors of ``base`` were computed against."""
        rows = self.con.execute("SELECT DISTINCT base_hash FROM vectors WHERE base = ? AND params = ? ORDER BY 1",
                                [base, params.key()]).fetchall()
        return [r[0] for r in rows]

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

        All selected vectors must share a dimension: select one base and one representation. Each
        vector is copied once, from the memory-mapped vector file into the matrix, and checked
        against its checksum (a damaged store raises :class:`StoreError` naming the model).
        """
        where, args = self._where(base, params, models)
        rows = self.con.execute(
            f"""SELECT "offset", vector_hash, {', '.join(META_COLUMNS)} FROM vectors {where}
                ORDER BY model, base, params""", args,
        ).df()
        meta = rows[list(META_COLUMNS)].reset_index(drop=True)
        if rows.empty:
            return np.zeros((0, 0), np.float32), meta
        if rows["dim"].nunique() != 1:
            raise ValueError("the selected vectors have different dimensions: select one base and one representation")
        matrix = self.heap.read(rows["offset"].tolist(), int(rows["dim"].iloc[0]), rows["vector_hash"].tolist(),
                                rows["model"].tolist())
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
        meta = self.con.sql(
            """SELECT model, base, params, rank, factor, pooling, solver, sign, architecture, model_hash, datasets,
                      dim, "offset", vector_hash FROM vectors ORDER BY model, base, params"""
        ).to_arrow_table()
        columns = [c for c in meta.column_names if c not in ("dim", "offset", "vector_hash")]
        schema = meta.select(columns).schema.append(pa.field("vector", pa.list_(pa.float32())))
        with pq.ParquetWriter(str(path), schema) as out:
            for lo in range(0, meta.num_rows, 256):  # a chunk at a time: the export never holds the whole store
                part = meta.slice(lo, 256)
                vectors = [self.heap.read([o], d, [h], [m])[0] for o, d, h, m in zip(
                    *(part.column(c).to_pylist() for c in ("offset", "dim", "vector_hash", "model")))]
                offsets = pa.array(np.cumsum([0] + [v.size for v in vectors]), pa.int32())
                flat = pa.array(np.concatenate(vectors) if vectors else np.zeros(0, np.float32))
                column = pa.ListArray.from_arrays(offsets, flat)
                out.write_table(pa.Table.from_arrays([part.column(c) for c in columns] + [column], schema=schema))
        return meta.num_rows

    def close(self) -> None:
        self.con.close()
        self.heap.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

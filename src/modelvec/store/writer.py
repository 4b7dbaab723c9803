"""Rows into the store: vectors and failures, committed in one transaction after their bytes are fsynced."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from ..core.errors import Kind
from ..represent.params import Representation
from .vectorfile import VectorFile, checksum, vector_bytes

if TYPE_CHECKING:
    from .store import Store


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
    """Why one model could not be embedded, and the failure's kind.

    A ``content`` failure with its ``model_hash`` is skipped by later runs while the weights are
    unchanged; ``resource`` and ``transient`` failures are shown but tried again.
    """

    model: str
    base: str
    params: Representation
    error: str
    model_hash: str | None = None
    kind: Kind | str = Kind.CONTENT


def write_rows(con: duckdb.DuckDBPyConnection, heap: VectorFile, rows: Sequence[VectorRow | Failure]) -> None:
    """Write vectors and failures: the bytes first (fsynced), then every row in one transaction."""
    vectors = [vector_bytes(row.vector) for row in rows if isinstance(row, VectorRow)]
    offsets = iter(heap.append(vectors))
    hashes = iter([checksum(v) for v in vectors])
    con.execute("BEGIN TRANSACTION")
    try:
        for row in rows:
            if isinstance(row, Failure):
                con.execute(
                    "INSERT OR REPLACE INTO failures (model, base, params, error, model_hash, kind) VALUES (?, ?, ?, ?, ?, ?)",
                    [row.model, row.base, row.params.key(), row.error, row.model_hash, Kind(row.kind).value],
                )
                continue
            p = row.params
            con.execute(
                """INSERT OR REPLACE INTO vectors
                   (model, model_hash, base, base_hash, params, rank, factor, pooling, solver, sign, params_json,
                    architecture, dim, "offset", vector_hash, datasets, label_source, author, source, seconds)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    row.model,
                    row.model_hash,
                    row.base,
                    row.base_hash,
                    p.key(),
                    p.rank,
                    p.factor,
                    p.pooling,
                    p.solver,
                    p.sign,
                    json.dumps(p.as_dict(), sort_keys=True),
                    row.architecture,
                    int(np.size(row.vector)),
                    next(offsets),
                    next(hashes),
                    list(row.datasets),
                    row.label_source,
                    row.author,
                    row.source,
                    float(row.seconds),
                ],
            )
            con.execute(
                "DELETE FROM failures WHERE model = ? AND base = ? AND params = ?", [row.model, row.base, p.key()]
            )
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

    def __init__(self, store: Store, max_batch: int = 64) -> None:
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
                    write_rows(self._con, self._heap, batch)
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

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

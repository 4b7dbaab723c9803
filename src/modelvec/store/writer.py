"""Rows into the store: vectors and failures, committed in one transaction after their bytes are fsynced."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

import duckdb

from .formats.records import Alias, CardUpdate, Failure, VectorRow, entry_vector
from .formats.schema import ALIASES, FAILURES, TRACES, VECTORS, transaction
from .formats.vectorfile import VectorFile, checksum, vector_bytes

Row = VectorRow | Failure | CardUpdate | Alias


def write_rows(con: duckdb.DuckDBPyConnection, vector_file: VectorFile, rows: Sequence[Row]) -> None:
    """Write vectors (and their traces), failures, cards read again and aliases: the bytes first (fsynced), then
    every row in one transaction."""
    vectors = [vector_bytes(row.vector) for row in rows if isinstance(row, VectorRow)]
    traced = [row.trace for row in rows if isinstance(row, VectorRow) and row.trace is not None]
    sketches = [vector_bytes(trace.sketch) for trace in traced]
    kept = [vector_bytes(e) for trace in traced if (e := entry_vector(trace)) is not None]
    written = vector_file.append(vectors + sketches + kept)  # one fsync for all
    offsets, sketch_offsets = iter(written[: len(vectors)]), iter(written[len(vectors) : len(vectors) + len(sketches)])
    kept_offsets = iter(written[len(vectors) + len(sketches) :])
    hashes, sketch_hashes = iter([checksum(v) for v in vectors]), iter([checksum(s) for s in sketches])
    kept_hashes = iter([checksum(e) for e in kept])
    with transaction(con):
        for row in rows:
            if isinstance(row, (CardUpdate, Alias)):
                _write_other(con, row)
                continue
            record = row.record() if isinstance(row, Failure) else row.record(next(offsets), next(hashes))
            table = FAILURES if isinstance(row, Failure) else VECTORS
            con.execute(table.insert(list(record)), list(record.values()))
            if isinstance(row, VectorRow) and row.trace is not None:
                entries = (next(kept_offsets), next(kept_hashes)) if entry_vector(row.trace) is not None else None
                trace = row.trace_record(next(sketch_offsets), next(sketch_hashes), entries)
                con.execute(TRACES.insert(list(trace)), list(trace.values()))
            if isinstance(row, VectorRow):  # a vector replaces its model's failure
                con.execute(
                    "DELETE FROM failures WHERE model = ? AND base = ? AND params = ?",
                    [record["model"], record["base"], record["params"]],
                )


def _write_other(con: duckdb.DuckDBPyConnection, row: CardUpdate | Alias) -> None:
    """A card read again (its columns set in every row of the model for its base), or an alias."""
    if isinstance(row, Alias):
        record = row.record()
        con.execute(ALIASES.insert(list(record)), list(record.values()))
        return
    sets = row.assignments()
    where = "model = ? AND base = ?" + (" AND model_hash = ?" if row.old_version is not None else "")
    args = [row.model, row.base] + ([row.old_version] if row.old_version is not None else [])
    con.execute(f"UPDATE vectors SET {', '.join(f'{c} = ?' for c in sets)} WHERE {where}", [*sets.values(), *args])


class StoreWriter:
    """Writes vectors and failures from a background thread, so the compute thread never waits on a commit.

    Rows queued while a commit is in flight are committed together in the next transaction
    (group commit): each row is durable within one commit of being computed, and a killed run
    loses at most the rows still queued, never a committed or a half-written one. ``close()``
    (also on Ctrl-C, through ``with``) commits everything queued; an error of the writer
    surfaces in the caller at the next ``put`` or at ``close``.
    """

    _STOP = object()

    def __init__(self, con: duckdb.DuckDBPyConnection, vector_file: VectorFile, max_batch: int = 64) -> None:
        """``con``: a connection of the writer's own (DuckDB connections are not shared across threads), closed
        by :meth:`close`; ``vector_file``: where the vectors' bytes go."""
        self._con = con
        self._vector_file = vector_file
        self._queue: queue.Queue[Any] = queue.Queue()
        self._max_batch = max_batch
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="modelvec-store-writer", daemon=True)
        self._thread.start()

    def put(self, row: Row) -> None:
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
                    write_rows(self._con, self._vector_file, batch)
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

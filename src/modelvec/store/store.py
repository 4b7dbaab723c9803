"""The store: one embedded DuckDB file holding every computed vector and every failure.

A vector row is keyed by (model, base, base_hash, params): one vector per model per base per
representation. The column ``model_hash`` holds the fine-tune's version (``model_version`` in the code: a Hub model's
``git:<sha>``, a local one's files' stamp, :meth:`~modelvec.read.Checkpoint.stamp`) and ``base_hash`` the base's
(``base_version``: a Hub base's ``git:<sha>``, a local one's content fingerprint), so a re-run skips a model whose row
is current and recomputes one whose weights changed. The columns keep their names: only the code's are new.
Rows are committed as soon as they are computed (by :class:`StoreWriter` in a long run), so an
interrupted run loses nothing already committed.

The vectors' bytes live beside the DuckDB file in an append-only float32 file
(``<store>.vectors``, see :class:`VectorFile`); each row holds its offset and an xxh3 of its
bytes. CacheFile in DuckDB as ``FLOAT[]``, they made the writer's memory grow with every row (the
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

import copy
import errno
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ..core import constants
from ..core.errors import NothingStoredError, ResourceError, StoreError
from ..represent.representation import Representation
from .connection import Connection
from .formats.lock import connect, default_wait, store_error
from .formats.schema import migrate, missing_tables
from .formats.vectorfile import VectorFile
from .opening import check_whole, mark_identity, open_vector_file
from .reads import Reads
from .versions import Versions
from .writes import Writes

DEFAULT_STORE = "modelvec.duckdb"


@contextmanager
def opened(store: Store | str | os.PathLike[str] | None, *, read_only: bool = False) -> Iterator[Store]:
    """``store`` itself when it is an open :class:`Store` (left open for its owner), else the store at
    that path (None: the default), closed on the way out; ``read_only`` for API functions that only read.
    For API functions that take either."""
    if isinstance(store, Store):
        yield store
        return
    with Store(store, read_only=read_only) as db:
        yield db


def default_store_path() -> Path:
    """``$MODELVEC_STORE`` or ``./modelvec.duckdb``."""
    return Path(constants.store_path() or DEFAULT_STORE)


def options_of(params_json: str) -> str:
    """The command-line options that select a stored representation (its parameters as JSON), against today's
    defaults: what to pass to read vectors stored under another representation (e.g. an older default)."""
    from ..core.settings import flags

    try:
        stored = Representation.from_stored(json.loads(params_json))
    except (TypeError, ValueError):  # a store written by a version with other settings: its key says enough
        return ""
    return " ".join(flags(stored)) or "(the defaults)"


_log = logging.getLogger("modelvec.store")


class Store:
    """A DuckDB file of vectors and failures. Use as a context manager or call ``close()``.

    One process at a time has a store open (DuckDB's lock). While another process holds it,
    opening waits for it, trying again every 0.2-0.4 s, for at most ``wait`` seconds (default
    ``$MODELVEC_STORE_WAIT`` or 600; ``0`` does not wait, ``math.inf`` waits for ever), then raises
    :class:`StoreLockedError` naming the holder's PID. ``on_wait`` gets one line when the wait
    begins (default: a warning on the ``modelvec.store`` logger), ``on_note`` one line for what opening recovered
    (default: ``on_wait``'s).

    Its parts are objects it holds, over one :class:`~modelvec.store.connection.Connection` (its DuckDB connection,
    vector file and identity): ``reads`` (:class:`~modelvec.store.reads.Reads`: the vectors, their products, the
    failures, the catalogue, the traces), ``versions`` (:class:`~modelvec.store.versions.Versions`: which version of
    each base the vectors were embedded against, and what is stale) and ``writes``
    (:class:`~modelvec.store.writes.Writes`: vectors, failures, the catalogue, compaction).

    A store is its DuckDB file and the files named after it beside it (``<name>.wal``, ``<name>.vectors`` or
    ``<name>.vectors.<12 hex>``, ``<name>.products/``): copied or renamed together, as ``cp``/``mv`` of ``<name>*``
    do, the copy works as the original. Its identity, in ``store_meta`` and in its vector files' headers, tells
    its own vector files from another store's.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        wait: float | None = None,
        on_wait: Callable[[str], None] | None = None,
        read_only: bool = False,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        """``read_only``: for commands that only read (show, cluster, neighbors, export): no store is created (a
        missing one is a :class:`NothingStoredError`), nothing is written, and a store on a read-only file system
        can be read."""
        self.path = Path(path) if path is not None else default_store_path()
        self.read_only = read_only
        self._closed = False
        wait = default_wait() if wait is None else float(wait)
        if wait != wait or wait < 0:
            raise ValueError(f"wait={wait}: give a number of seconds >= 0")
        if read_only:
            if not self.path.is_file():
                what = "a folder, not a store" if self.path.is_dir() else "no store here"
                raise NothingStoredError(
                    str(self.path),
                    f"{what}: embed models into it first, or name another with --store (or $MODELVEC_STORE)",
                )
        elif not self.path.parent.is_dir():
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                cause = "a file stands where its folder should be" if exc.errno == errno.EEXIST else exc.strerror
                raise StoreError(str(self.path), f"cannot create its folder: {(cause or str(exc)).lower()}") from None
        con = connect(self.path, wait, on_wait, read_only=read_only)
        try:
            past = check_whole(con, self.path)  # before anything is written beside it
            # only after DuckDB's lock is held: only the process holding it appends to the vector file
            vector_file, identity = open_vector_file(con, self.path, read_only)
        except BaseException:
            con.close()  # a foreign vector file: release the lock now, not when the object is collected
            raise
        self._assemble(Connection(self.path, con, read_only, vector_file, identity))
        try:
            if read_only:
                self._check_readable()
            else:
                migrate(con, vector_file, self.connection.columns_by_table())
                self.connection.forget_columns()  # asked again once brought up to date
            if past:
                self._recovered(past, on_note or on_wait or _log.warning)
        except BaseException:
            self._close(checkpoint=False)
            raise

    def _assemble(self, db: Connection) -> None:
        self.connection = db
        self.reads = Reads(db)
        self.versions = Versions(db, self.reads)
        self.writes = Writes(db, self.versions)

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The store's DuckDB connection (of the thread that opened it: :meth:`for_thread` for another)."""
        return self.connection.con

    @property
    def vector_file(self) -> VectorFile:
        """The vectors' bytes beside the DuckDB file (swapped by :meth:`~modelvec.store.writes.Writes.compact`)."""
        return self.connection.vector_file

    @property
    def identity(self) -> str | None:
        """The store's identity (None: a store written before identities, opened read-only)."""
        return self.connection.identity

    @contextmanager
    def for_thread(self) -> Iterator[Store]:
        """The same store through a DuckDB connection of its own, for another thread than the one that opened it
        (DuckDB connections are not shared across threads), closed on leaving; the vector file is shared (its
        reads are positional, its appends locked)."""
        with self.connection.for_thread() as db:
            view = copy.copy(self)
            view._assemble(db)
            yield view

    def _check_readable(self) -> None:
        """A store opened read-only must already have the tables of this version (a writing command adds them)."""
        missing = missing_tables(self.connection.columns_by_table(), readable=True)
        if missing:
            raise StoreError(
                str(self.path),
                f"not a modelvec store, or one from an older version (it lacks {', '.join(missing)}); "
                "a command that writes it (embed) brings it up to date",
            )

    def _recovered(self, past: int, tell: Callable[[str], None]) -> None:
        """Say in one line that ``past`` bytes an interrupted write left were ignored; a writer changes its catalogue
        (the same identity written again), so that its checkpoint on closing cuts them off (DuckDB's checkpoint of
        no change leaves the file as it is)."""
        cut = " (cut off as this command closes it)" if not self.read_only else ""
        tell(
            f"note: {self.path}: {past} bytes past its last block, left by a write that was cut off (a full disk, a "
            f"killed process), are ignored{cut}; what was stored is kept"
        )
        if not self.read_only:
            mark_identity(self.con, self.identity)

    def close(self) -> None:
        """Close the store. A writer's checkpoint is taken here rather than in DuckDB's close, which drops its
        failure: on a full disk it is a :class:`ResourceError` (what was committed is kept, in DuckDB's write-ahead
        log, and the next command that opens the store reads it)."""
        self._close(checkpoint=True)

    def _close(self, *, checkpoint: bool) -> None:
        if self._closed:
            return
        self._closed = True
        problem = self._checkpoint() if checkpoint and not self.read_only else None
        self.con.close()
        self.vector_file.close()
        if problem is not None:
            raise problem

    def _checkpoint(self) -> StoreError | ResourceError | None:
        """Write what was committed into the DuckDB file; why it could not, as one error (None: it did, or it was
        left for later to another connection's transaction)."""
        try:
            self.con.execute("CHECKPOINT")
        except duckdb.Error as exc:
            text = str(exc)
            if "No space left" in text or "Disk quota" in text:
                words = "no space left on the device" if "No space left" in text else "disk quota exceeded"
                return ResourceError(
                    str(self.path),
                    f"cannot write its checkpoint: {words}; what was stored is kept (free some space: the next "
                    "command reads it)",
                )
            if isinstance(exc, duckdb.IOException):
                return StoreError(str(self.path), f"cannot write its checkpoint: {store_error(self.path, exc).cause}")
        return None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self._close(checkpoint=kind is None)  # an error on its way out is the one said, not the checkpoint's after it

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

import errno
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ..core import constants
from ..core.errors import NothingStoredError, ResourceError, StoreError
from ..represent.representation import Representation
from .lock import connect, default_wait, store_error
from .schema import TABLES, first_row, migrate, missing_tables
from .vectorfile import VectorFile, identity_of, new_identity, remove_leftovers, vector_path
from .writes import StoreWrites

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


#: DuckDB's file headers before its first block (one main and two database headers of 4 KiB).
_DUCKDB_HEADERS = 3 * 4096
#: The tables of a modelvec store: a DuckDB database that has tables and none of these is not one, and is not written
MODELVEC_TABLES = frozenset({t.name for t in TABLES} | {"store_meta"})
_log = logging.getLogger("modelvec.store")
_IDENTITY = re.compile(r"modelvec store ([0-9a-f]{16})")


class Store(StoreWrites):
    """A DuckDB file of vectors and failures. Use as a context manager or call ``close()``.

    One process at a time has a store open (DuckDB's lock). While another process holds it,
    opening waits for it, trying again every 0.2-0.4 s, for at most ``wait`` seconds (default
    ``$MODELVEC_STORE_WAIT`` or 600; ``0`` does not wait, ``math.inf`` waits for ever), then raises
    :class:`StoreLockedError` naming the holder's PID. ``on_wait`` gets one line when the wait
    begins (default: a warning on the ``modelvec.store`` logger), ``on_note`` one line for what opening recovered
    (default: ``on_wait``'s).

    Its reads, the versions of its bases and its writes are its parents' (:class:`~modelvec.store.reads.StoreReads`,
    :class:`~modelvec.store.versions.BaseVersions`, :class:`~modelvec.store.writes.StoreWrites`).

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
        self.identity: str | None = None  # the store's (None: one written before identities, opened read-only)
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
        self.con = connect(self.path, wait, on_wait, read_only=read_only)
        try:
            past = self._check_whole()  # before anything is written beside it
            # only after DuckDB's lock is held: only the process holding it appends to the vector file
            self.vector_file = self._open_vector_file()
        except BaseException:
            self.con.close()  # a foreign vector file: release the lock now, not when the object is collected
            raise
        try:
            if read_only:
                self._check_readable()
            else:
                migrate(self.con, self.vector_file, self.columns_by_table())
                self._columns = None  # asked again once brought up to date
            if past:
                self._recovered(past, on_note or on_wait or _log.warning)
        except BaseException:
            self._close(checkpoint=False)
            raise

    def _check_readable(self) -> None:
        """A store opened read-only must already have the tables of this version (a writing command adds them)."""
        missing = missing_tables(self.columns_by_table(), readable=True)
        if missing:
            raise StoreError(
                str(self.path),
                f"not a modelvec store, or one from an older version (it lacks {', '.join(missing)}); "
                "a command that writes it (embed) brings it up to date",
            )

    def _open_vector_file(self) -> VectorFile:
        """The store's vector file (:func:`~modelvec.store.vectorfile.vector_path`: of this file's name, so a copy or
        a renamed store finds its own), its name kept in ``store_meta`` so :meth:`compact` swaps it in the commit that
        changes the offsets. Another store's vector file is refused; a writer refuses rows that point into a vector
        file that is missing, rather than start an empty one under them, and removes the files a crashed compaction
        of this store left beside it (their header carries its identity; only the holder of the lock gets here)."""
        tables = self._tables()
        if tables and not tables & MODELVEC_TABLES:  # refused before a table is made in it
            raise StoreError(
                str(self.path),
                "a DuckDB database, but not a modelvec store (none of its tables is modelvec's): nothing was written "
                "to it; name a store with --store",
            )
        meta = dict(self.con.execute("SELECT key, value FROM store_meta").fetchall()) if "store_meta" in tables else {}
        current = vector_path(self.path, meta.get("vector_file"))
        identity = self._stored_identity() if "store_meta" in tables else None
        if not self.read_only:
            self._check_present(current, tables)  # before anything is written
            identity = identity or self._new_identity(current)
        vector_file = VectorFile(current, read_only=self.read_only, identity=identity)
        if vector_file.identity is not None and vector_file.identity != identity:
            vector_file.close()
            raise StoreError(str(current), self._together(f"the vector file of another store, not of {self.path.name}"))
        if not self.read_only and identity is not None:
            remove_leftovers(self.path, current, identity)
        self.identity = identity
        return vector_file

    def _together(self, what: str) -> str:
        """``what`` is wrong with the store's files, and what to do: keep them together."""
        name = self.path.name
        together = f"a store's files are copied or renamed together ({name} and every {name}.* beside it)"
        return f"{what}: {together}; nothing was changed"

    def _check_present(self, current: Path, tables: set[str]) -> None:
        """Refuse to write a store whose rows point into a vector file that is missing or empty (its DuckDB file
        copied or renamed without it): a fresh file would take new vectors while every stored one stays lost."""
        try:
            size: int | None = current.stat().st_size
        except FileNotFoundError:
            size = None
        if size or not self._points_into_vector_file(tables):
            return
        said = (
            f"its vector file {current.name} is {'missing' if size is None else 'empty'}, though its rows point into it"
        )
        alike = sorted(p.name for p in current.parent.glob(f"*.vectors{current.suffix}") if p != current)
        if current.suffix != ".vectors" and alike:  # the same compaction's file under another store's name
            said += f" (is it {alike[0]}?)"
        raise StoreError(str(self.path), self._together(said))

    def _points_into_vector_file(self, tables: set[str]) -> bool:
        """Whether rows of the store point into its vector file (those of a store from before it, whose vectors are
        inside DuckDB, do not)."""
        offsets = "offset" in self.columns_by_table().get("vectors", ())
        pointing = (["vectors"] if offsets else []) + (["traces"] if "traces" in tables else [])
        return any(bool((first_row(self.con, f"SELECT EXISTS (SELECT 1 FROM {t})") or [0])[0]) for t in pointing)

    def _stored_identity(self) -> str | None:
        """The store's identity, kept as the comment on its table ``store_meta`` (in DuckDB's catalogue: a row would
        cost every store two more blocks of 256 KiB); None: a store written before identities."""
        row = first_row(
            self.con, "SELECT comment FROM duckdb_tables() WHERE table_name = 'store_meta' AND schema_name = 'main'"
        )
        found = _IDENTITY.fullmatch(row[0] or "") if row else None
        return found[1] if found else None

    def _new_identity(self, current: Path) -> str:
        """Give a store without an identity (a new one, or one written before identities) its identity; a vector
        file that carries one is another store's (this store never wrote one)."""
        if identity_of(current) is not None:
            raise StoreError(str(current), self._together(f"the vector file of another store, not of {self.path.name}"))
        identity = new_identity()
        self.con.execute("CREATE TABLE IF NOT EXISTS store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
        self.con.execute(f"COMMENT ON TABLE store_meta IS 'modelvec store {identity}'")  # hex digits: nothing to quote
        return identity

    def _check_whole(self) -> int:
        """Refuse a DuckDB file cut short inside a block it uses (by a copy, a download: DuckDB opens it, and writes
        into it, until it reads the missing block); the bytes past its blocks, which a write cut off left (a
        checkpoint on a full disk, a killed process): DuckDB's header names the blocks written before, its
        write-ahead log what was committed since, so they are no damage. DuckDB writes whole blocks and drops free
        ones at the end of the file: a file shorter than ``total_blocks`` is whole while it holds every block used."""
        row = first_row(
            self.con,
            "SELECT total_blocks, used_blocks, block_size FROM pragma_database_size() "
            "WHERE database_name = current_database()",
        )
        if row is None:
            return 0
        size, (total, used, block) = self.path.stat().st_size, (int(v) for v in row)
        past = size - (_DUCKDB_HEADERS + total * block)
        if past >= 0:
            return past
        whole, within = divmod(size - _DUCKDB_HEADERS, block)  # the blocks there, and what a write left of the next
        if whole < used or self._highest_block() >= whole:  # a block it uses is cut short or missing
            raise StoreError(str(self.path), "damaged: the file is truncated")
        return within

    def _highest_block(self) -> int:
        """The highest block DuckDB says its metadata and its tables' data use (-1: none; its indexes' blocks are
        not said)."""
        used = [r[0] for r in self.con.execute("SELECT block_id FROM pragma_metadata_info()").fetchall()]
        tables = self.con.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
        ).fetchall()
        for (table,) in tables:
            try:
                rows = self.con.execute(
                    "SELECT max(block_id), max(list_max(additional_block_ids)) FROM pragma_storage_info(?)", [table]
                ).fetchall()
            except duckdb.Error:  # a name it does not take: that table's blocks unknown
                continue
            used += [v for r in rows for v in r if v is not None]
        return max(used, default=-1)

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
            self.con.execute(f"COMMENT ON TABLE store_meta IS 'modelvec store {self.identity}'")

    def export_parquet(self, path: str | os.PathLike[str], damaged: dict[str, str] | None = None) -> int:
        """One row per stored vector: model, base, the representation parameters, datasets, vector; the rows
        written (``damaged``: a dict where vectors that fail their checksum are named and left out)."""
        from .export import export_parquet  # pyarrow's Parquet writer, only for an export

        return export_parquet(self.con, self.vector_file, path, damaged)

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

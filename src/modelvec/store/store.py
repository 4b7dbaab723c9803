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

import copy
import errno
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from ..core import constants
from ..core.errors import Kind, NothingStoredError, ResourceError, StoreError
from ..core.names import is_hub_id
from ..represent.representation import Representation
from .lock import connect, default_wait, store_error
from .products import BlockReader, Products, ProductsCache, Selection, feature_moments, gram
from .records import Failure, VectorRow
from .schema import (
    BASE_VERSIONS,
    CATALOGUE,
    CATALOGUE_COLUMNS,
    DISCOVERY,
    META_COLUMNS,
    TABLES,
    TRACES,
    VECTORS,
    catalogue_select,
    columns_of,
    meta_select,
    migrate,
    missing_tables,
    select_list,
    transaction,
)
from .vectorfile import VectorFile, identity_of, new_identity, remove_leftovers, vector_path
from .writer import StoreWriter, write_rows

DEFAULT_STORE = "modelvec.duckdb"


StoreLike = "Store | str | os.PathLike[str] | None"


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


@dataclass
class StoredTraces:
    """One base's stored traces: a row per model (model, base_hash, levels, scale, parent, zeros, along) and their
    sketches, one
    row of ``sketches`` each, in the same order; ``damaged``: the models whose sketch's bytes do not match their
    checksum (model -> one line), left out of both."""

    frame: pd.DataFrame
    sketches: np.ndarray
    damaged: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.frame.empty


@dataclass
class StoreOverview:
    """What ``modelvec show`` prints: counts per base and representation, the models, the failures."""

    path: str
    summary: pd.DataFrame
    models: pd.DataFrame  # one row per vector; ``state``: what the reports make of it (a copy, stale...) or None
    failures: pd.DataFrame
    stale: pd.DataFrame = field(default_factory=pd.DataFrame)  # :meth:`Store.stale`

    def as_json(self) -> dict[str, Any]:
        def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return json.loads(frame.to_json(orient="records", date_format="iso"))

        return {
            "store": self.path,
            "summary": records(self.summary),
            "models": records(self.models),
            "failures": records(self.failures),
            "stale": records(self.stale),
        }


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


class Store:
    """A DuckDB file of vectors and failures. Use as a context manager or call ``close()``.

    One process at a time has a store open (DuckDB's lock). While another process holds it,
    opening waits for it, trying again every 0.2-0.4 s, for at most ``wait`` seconds (default
    ``$MODELVEC_STORE_WAIT`` or 600; ``0`` does not wait, ``math.inf`` waits for ever), then raises
    :class:`StoreLockedError` naming the holder's PID. ``on_wait`` gets one line when the wait
    begins (default: a warning on the ``modelvec.store`` logger), ``on_note`` one line for what opening recovered
    (default: ``on_wait``'s).

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
                migrate(self.con, self.vector_file)
            if past:
                self._recovered(past, on_note or on_wait or _log.warning)
        except BaseException:
            self._close(checkpoint=False)
            raise

    def _check_readable(self) -> None:
        """A store opened read-only must already have the tables of this version (a writing command adds them)."""
        missing = missing_tables(self.con, readable=True)
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
        offsets = self.con.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'vectors' AND column_name = 'offset'"
        ).fetchone()
        pointing = (["vectors"] if offsets and offsets[0] else []) + (["traces"] if "traces" in tables else [])
        return any(
            bool((self.con.execute(f"SELECT EXISTS (SELECT 1 FROM {t})").fetchone() or [0])[0]) for t in pointing
        )

    def _stored_identity(self) -> str | None:
        """The store's identity, kept as the comment on its table ``store_meta`` (in DuckDB's catalogue: a row would
        cost every store two more blocks of 256 KiB); None: a store written before identities."""
        row = self.con.execute(
            "SELECT comment FROM duckdb_tables() WHERE table_name = 'store_meta' AND schema_name = 'main'"
        ).fetchone()
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

    def compact(self, stale: pd.DataFrame | None = None) -> tuple[int, int]:
        """Drop the vectors and traces embedded against an earlier version of their base (``stale``, default
        :meth:`stale`), then rewrite the vector file with only the bytes rows point at; (bytes before, bytes after).

        Replaced vectors (``--force``, changed weights, stale rows) leave their old bytes behind. The live ones
        are copied (checksums verified) to a new file and fsynced, then the offsets and the file's
        name change in one commit: a crash at any point leaves the old store or the new one whole.
        Not while a writer of this store is running.
        """
        tables = [("vectors", "vector_hash")] + ([("traces", "sketch_hash")] if "traces" in self._tables() else [])
        stale = self.stale() if stale is None else stale
        before = self.vector_file.path.stat().st_size
        new = VectorFile(self.path.parent / f"{self.path.name}.vectors.{uuid.uuid4().hex[:12]}", identity=self.identity)
        try:
            with transaction(self.con):
                for row in stale.itertuples():
                    for table, _ in tables:
                        self.con.execute(
                            f"DELETE FROM {table} WHERE base = ? AND base_hash = ?", [row.base, row.base_hash]
                        )
                moved = {table: self._copy_rows(table, digest, new) for table, digest in tables}
                for table, rows in ((t, r) for t, r in moved.items() if r):
                    self.con.executemany(
                        f'UPDATE {table} SET "offset" = ? WHERE model = ? AND base = ? AND base_hash = ? AND params = ?',
                        rows,
                    )
                self.con.execute("INSERT OR REPLACE INTO store_meta VALUES ('vector_file', ?)", [new.path.name])
        except BaseException:
            new.close()
            new.path.unlink(missing_ok=True)
            raise
        old, self.vector_file = self.vector_file, new
        old.close()
        old.path.unlink(missing_ok=True)
        return before, new.path.stat().st_size

    def stale(self) -> pd.DataFrame:
        """The stored vectors embedded against another version of their base than the one it is now (:meth:`base_now`),
        where vectors of the version it is now are stored: (base, base_hash, vectors), one row per base and version.
        A base whose version now has no vectors (changed since, nothing embedded again yet) has none: nothing
        says which of its versions the next run will keep."""
        out = []
        for base in self.con.execute("SELECT DISTINCT base FROM vectors ORDER BY base").fetchall():
            versions = self.versions(base[0])
            now = self.base_now(base[0]) if len(versions) > 1 else None
            if now is not None and now in set(versions["base_hash"]):
                out += [(base[0], v.base_hash, int(v.vectors)) for v in versions.itertuples() if v.base_hash != now]
        return pd.DataFrame(out, columns=["base", "base_hash", "vectors"])

    def _copy_rows(self, table: str, digest: str, new: VectorFile) -> list[list[Any]]:
        """Copy the bytes ``table``'s rows point at to ``new`` (checksums verified), 256 at a time: their new offsets
        with their keys."""
        rows = self.con.execute(
            f'SELECT model, base, base_hash, params, "offset", dim, {digest} FROM {table} ORDER BY "offset"'
        ).fetchall()
        moved = []
        for lo in range(0, len(rows), 256):
            part = rows[lo : lo + 256]
            arrays = [self.vector_file.read([r[4]], r[5], [r[6]], [r[0]])[0] for r in part]
            moved += [[offset, *r[:4]] for offset, r in zip(new.append(arrays), part)]
        return moved

    # --- writes -------------------------------------------------------------------------------
    def put(self, row: VectorRow) -> None:
        """Insert or replace one vector (its own transaction); clears any recorded failure of that model."""
        write_rows(self.con, self.vector_file, [row])

    def put_many(self, rows: Sequence[VectorRow | Failure]) -> None:
        """Insert or replace many vectors and failures in one transaction."""
        write_rows(self.con, self.vector_file, rows)

    def writer(self) -> StoreWriter:
        """A background writer for a long run: rows are committed as they come, off the compute thread."""
        return StoreWriter(self.con.cursor(), self.vector_file)

    @contextmanager
    def for_thread(self) -> Iterator[Store]:
        """The same store through a DuckDB connection of its own, for another thread than the one that opened it
        (DuckDB connections are not shared across threads), closed on leaving; the vector file is shared (its
        reads are positional, its appends locked)."""
        view = copy.copy(self)
        view.con = self.con.cursor()
        try:
            yield view
        finally:
            view.con.close()

    def count_traces(self, base: str, params: str, base_hash: str | None = None) -> int:
        """How many traces are stored for ``base`` under ``params`` (and ``base_hash``; 0 in a store older than
        traces)."""
        if "traces" not in self._tables():
            return 0
        where, args = self._clauses(base=base, params=params, base_hash=base_hash)
        row = self.con.execute(f"SELECT count(*) FROM traces {where}", args).fetchone()
        return int(row[0]) if row else 0

    def traces(
        self,
        base: str,
        params: str,
        base_hash: str | None = None,
        *,
        read: bool = True,
        models: Sequence[str] | None = None,
    ) -> StoredTraces:
        """The traces stored for ``base`` under the representation key ``params`` (and ``base_hash``: against that
        version of the base; None: any; ``models``: only theirs), in model order: their rows (model, base_hash,
        levels, scale, parent, zeros, along, sketch_hash, norm...) and their sketches, one (n, dim) float32 matrix
        read from the vector file, each checked against its checksum (a damaged one is named in ``damaged`` and left
        out). ``read=False``: the rows alone (no sketch read). Empty in a store older than traces."""
        columns = [
            "model",
            "base_hash",
            "levels",
            "scale",
            "parent",
            "zeros",
            "along",
            "zeros_bf16",
            "precision",
            "rounding",
            "norm",
            "mini",
            "sketch_hash",
        ]
        if "traces" not in self._tables():
            return StoredTraces(pd.DataFrame(columns=columns), np.zeros((0, 0)))
        extra = [("list_contains(?, model)", list(models))] if models is not None else []
        where, args = self._clauses(extra, base=base, params=params, base_hash=base_hash)
        listed = select_list(self.con, TRACES, columns)
        df = self.con.execute(
            f'SELECT {listed}, "offset", dim FROM traces {where} ORDER BY model, base_hash', args
        ).df()
        dim = int(df["dim"].max()) if len(df) else 0
        if len(df) and (df["dim"] != dim).any():
            raise StoreError(base, f"its stored traces under {params} differ in size: re-embed them with --force")
        if not read:
            return StoredTraces(df.drop(columns=["offset", "dim"]), np.zeros((0, dim), np.float32))
        selection = Selection(list(df["model"]), list(df["offset"]), list(df["sketch_hash"]), dim)
        reader = BlockReader(self.vector_file, selection, len(selection))
        sketches, sound = reader.read(range(len(selection)))
        damaged = {m: line.replace("stored vector", "stored trace") for m, line in reader.damaged.items()}
        frame = df.drop(columns=["offset", "dim"])[sound].reset_index(drop=True)
        return StoredTraces(frame, sketches if sound.all() else sketches[sound], damaged)  # read once, not copied

    def _check_whole(self) -> int:
        """Refuse a DuckDB file cut short inside a block it uses (by a copy, a download: DuckDB opens it, and writes
        into it, until it reads the missing block); the bytes past its blocks, which a write cut off left (a
        checkpoint on a full disk, a killed process): DuckDB's header names the blocks written before, its
        write-ahead log what was committed since, so they are no damage. DuckDB writes whole blocks and drops free
        ones at the end of the file: a file shorter than ``total_blocks`` is whole while it holds every block used."""
        row = self.con.execute(
            "SELECT total_blocks, used_blocks, block_size FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchone()
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

    def _tables(self) -> set[str]:
        return {r[0] for r in self.con.execute("SELECT table_name FROM information_schema.tables").fetchall()}

    def put_catalogue(self, base: str, base_sha: str, entries: Sequence[Any]) -> None:
        """Insert or refresh discovered models (``CatalogueEntry``) in one transaction.

        Vectors are kept; their labels and author are refreshed from the new entries, so a
        re-discovery that learns better labels improves the analysis without re-embedding.
        """
        rows = _catalogue_rows(entries)
        with transaction(self.con):
            _put_catalogue_rows(self.con, base, base_sha, rows)

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
        with self.for_thread() as view, transaction(view.con):
            _put_catalogue_rows(view.con, base, base_sha, rows)
            view.con.execute("DELETE FROM discovery WHERE base = ?", [base])
            view.con.executemany(DISCOVERY.insert([c for c, _ in DISCOVERY.columns]), progress)

    def discovery(self, base: str) -> pd.DataFrame:
        """How far the discovery of ``base`` went (see :data:`~modelvec.store.schema.DISCOVERY`): no rows when none was
        stored page by page (a catalogue stored whole, or none)."""
        if "discovery" not in self._tables():
            return pd.DataFrame(columns=[c for c, _ in DISCOVERY.columns])
        return self.con.execute("SELECT * FROM discovery WHERE base = ? ORDER BY seq", [base]).df()

    def forget_discovery(self, base: str) -> None:
        """Start the discovery of ``base`` afresh next time (its catalogue is kept until refreshed)."""
        self.con.execute("DELETE FROM discovery WHERE base = ?", [base])

    def catalogue(self, base: str | None = None, kept: bool | None = None, model: str | None = None) -> pd.DataFrame:
        """Discovered models (one row per base and model), most downloaded first."""
        where, args = self._clauses(base=base, kept=kept, model=model)
        return self.con.execute(
            f"SELECT {catalogue_select(self.con)}, discovered_at FROM catalogue {where} "
            "ORDER BY base, downloads DESC NULLS LAST, model",
            args,
        ).df()

    def base_sha(self, base: str) -> str | None:
        """The base revision recorded at the last discovery."""
        rows = self.con.execute("SELECT sha FROM bases WHERE base = ?", [base]).fetchall()
        return rows[0][0] if rows else None

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
            self.con,
            self.vector_file,
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

    def known_failure(self, model: str, model_version: str, base: str, representation: Representation) -> str | None:
        """The recorded error when these very weights already failed, by their content, with this base and representation.

        Resource and transient failures are not properties of the model: they are never returned here.
        """
        rows = self.con.execute(
            "SELECT error FROM failures WHERE model = ? AND model_hash = ? AND base = ? AND params = ? "
            "AND coalesce(kind, 'content') = 'content'",
            [model, model_version, base, representation.key()],
        ).fetchall()
        return rows[0][0] if rows else None

    # --- reads --------------------------------------------------------------------------------
    def has(self, model: str, model_version: str, base: str, base_version: str, representation: Representation) -> bool:
        """Whether a current vector exists (same weights, same base weights, same representation)."""
        hit = self.con.execute(
            "SELECT 1 FROM vectors WHERE model = ? AND model_hash = ? AND base = ? AND base_hash = ? AND params = ?",
            [model, model_version, base, base_version, representation.key()],
        ).fetchall()
        return bool(hit)

    def stored_version(self, model: str, base: str, base_version: str, representation: Representation) -> str | None:
        """The version of ``model`` (``model_hash``) whose vector is stored against this base and representation."""
        row = self.con.execute(
            "SELECT model_hash FROM vectors WHERE model = ? AND base = ? AND base_hash = ? AND params = ?",
            [model, base, base_version, representation.key()],
        ).fetchone()
        return str(row[0]) if row is not None else None

    def card_of(self, model: str, base: str) -> tuple[str | None, list[str], str | None] | None:
        """What is stored of ``model``'s card with ``base``: (its hash, the dataset labels, their source); None where
        the model has no vector of that base (a stored model's hash is None where it was stored before cards were)."""
        row = self.con.execute(
            f"SELECT {select_list(self.con, VECTORS, ['card_hash', 'datasets', 'label_source'])} FROM vectors "
            "WHERE model = ? AND base = ? ORDER BY created_at DESC LIMIT 1",
            [model, base],
        ).fetchone()
        return (row[0], list(row[1] or []), row[2]) if row is not None else None

    def same_files(
        self, files_id: str, model: str, base: str, base_version: str, representation: Representation
    ) -> str | None:
        """The stored model (another name than ``model``) whose vector was made from the very weight files
        ``files_id`` names, against this base and under this representation: ``model`` is its alias."""
        if "files_id" not in set(columns_of(self.con, "vectors")):
            return None
        row = self.con.execute(
            "SELECT model FROM vectors WHERE files_id = ? AND model <> ? AND base = ? AND base_hash = ? AND params = ? "
            "ORDER BY model LIMIT 1",
            [files_id, model, base, base_version, representation.key()],
        ).fetchone()
        return str(row[0]) if row is not None else None

    def same_vector(
        self, digest: str, model: str, base: str, base_version: str, representation: Representation
    ) -> str | None:
        """A stored model (another name than ``model``) whose vector has the checksum ``digest`` against this base and
        representation: the same weights, bit for bit, in every row read."""
        row = self.con.execute(
            "SELECT model FROM vectors WHERE vector_hash = ? AND model <> ? AND base = ? AND base_hash = ? "
            "AND params = ? ORDER BY model LIMIT 1",
            [digest, model, base, base_version, representation.key()],
        ).fetchone()
        return str(row[0]) if row is not None else None

    def aliases(self, base: str | None = None) -> dict[str, str]:
        """Every second name of a stored model (of ``base``; None: any): alias -> the model it names."""
        if "aliases" not in self._tables():
            return {}
        where, args = self._clauses(base=base)
        return dict(self.con.execute(f"SELECT alias, model FROM aliases {where} ORDER BY alias", args).fetchall())

    def model_versions(self, model: str, base: str, representation: Representation) -> list[str]:
        """The versions of ``base`` (``base_hash``) that ``model`` has vectors embedded against under
        ``representation``."""
        rows = self.con.execute(
            "SELECT base_hash FROM vectors WHERE model = ? AND base = ? AND params = ? ORDER BY base_hash",
            [model, base, representation.key()],
        ).fetchall()
        return [str(r[0]) for r in rows]

    def base_hashes(self, base: str, representation: Representation) -> list[str]:
        """The versions of the base weights the stored vectors of ``base`` were computed against."""
        return list(self.versions(base, representation)["base_hash"])

    def versions(self, base: str, representation: Representation | str | None = None) -> pd.DataFrame:
        """The versions of ``base`` its stored vectors (under ``representation``; None: any) were computed against:
        ``base_hash``, ``vectors`` (how many) and ``newest`` (when the last of them was stored), by ``base_hash``."""
        where, args = self._where(base, representation, None)
        return self.con.execute(
            f"SELECT base_hash, count(*) AS vectors, max(created_at) AS newest FROM vectors {where} "
            "GROUP BY base_hash ORDER BY base_hash",
            args,
        ).df()

    # --- the base as it is now ------------------------------------------------------------------------
    def record_base(self, base: str, stamp: str, base_version: str) -> None:
        """Record that vectors of ``base`` are embedded against ``base_version`` while its files' stamp is ``stamp``
        (a Hub base: both its ``git:<sha>``): how a report knows the base's version without hashing it. Nothing is
        written where that is already what the store says (the last recorded, with these files). The stamp is stored
        in the column ``identity``."""
        if self.recorded_base(base, stamp) == base_version and self.recorded_base(base) == base_version:
            return
        with transaction(self.con):
            self.con.execute(
                BASE_VERSIONS.insert(("base", "identity", "base_hash", "recorded_at")),
                [base, stamp, base_version, datetime.now()],
            )

    def recorded_base(self, base: str, stamp: str | None = None) -> str | None:
        """The version of ``base`` recorded for files of ``stamp`` (None: the one recorded last), else None."""
        if "base_versions" not in self._tables():
            return None
        where, args = self._clauses(base=base, identity=stamp)
        row = self.con.execute(
            f"SELECT base_hash FROM base_versions {where} ORDER BY recorded_at DESC LIMIT 1", args
        ).fetchone()
        return str(row[0]) if row else None

    def stamps(self, base: str, base_hash: str) -> list[str]:
        """The stamps of ``base``'s files recorded for its version ``base_hash``."""
        if "base_versions" not in self._tables():
            return []
        rows = self.con.execute(
            "SELECT identity FROM base_versions WHERE base = ? AND base_hash = ? ORDER BY recorded_at",
            [base, base_hash],
        ).fetchall()
        return [str(r[0]) for r in rows]

    def base_now(self, base: str) -> str | None:
        """The version (``base_hash``) of ``base`` as it is now: a local base's from its files' stamp (names,
        sizes, times and headers) as the run that embedded against it recorded it, else its content hashed; a Hub
        base's commit at its last discovery (or the version recorded with it, where that commit's weights are an
        earlier one's), else the one embedded against last; None where nothing says (a local
        base gone from this machine, stored by a version that did not record it)."""
        if is_hub_id(base):  # a commit recorded with the weights of an earlier one keeps that one's version
            sha = self.base_sha(base)
            return (self.recorded_base(base, f"git:{sha}") or f"git:{sha}") if sha else self.recorded_base(base)
        if not os.path.exists(base):
            return self.recorded_base(base)
        from ..read import Checkpoint

        files = Checkpoint(base, name=base)
        return self.recorded_base(base, files.stamp()) or files.fingerprint()

    @staticmethod
    def _clauses(extra: Sequence[tuple[str, Any]] = (), **equal: Any) -> tuple[str, list[Any]]:
        """A WHERE clause: each column given a value (None = any) equals it, plus ``extra`` (sql, arg) pairs."""
        items = [(f"{column} = ?", value) for column, value in equal.items() if value is not None] + list(extra)
        return ("WHERE " + " AND ".join(sql for sql, _ in items)) if items else "", [arg for _, arg in items]

    def _where(
        self,
        base: str | None,
        representation: Representation | str | None,
        models: Sequence[str] | None,
        base_hash: str | None = None,
    ) -> tuple[str, list[Any]]:
        key = representation.key() if isinstance(representation, Representation) else representation
        extra = [("list_contains(?, model)", list(models))] if models is not None else []
        return self._clauses(extra, base=base, params=key, base_hash=base_hash)

    def metadata(
        self,
        base: str | None = None,
        representation: Representation | str | None = None,
        models: Sequence[str] | None = None,
        base_hash: str | None = None,
    ) -> pd.DataFrame:
        """One row per stored vector (no vectors), ordered by model; ``base_hash``: only those embedded against that
        version of the base."""
        where, args = self._where(base, representation, models, base_hash)
        return self.con.execute(
            f"SELECT {meta_select(self.con)} FROM vectors {where} ORDER BY model, base, params, base_hash", args
        ).df()

    def select(
        self,
        base: str | None = None,
        representation: Representation | str | None = None,
        models: Sequence[str] | None = None,
        base_hash: str | None = None,
    ) -> tuple[Selection, pd.DataFrame]:
        """Where the selected vectors are (no vector read) and their metadata, rows ordered by model.

        All selected vectors must share a dimension: select one base and one representation."""
        where, args = self._where(base, representation, models, base_hash)
        rows = self.con.execute(
            f"""SELECT "offset", vector_hash, {meta_select(self.con)} FROM vectors {where}
                ORDER BY model, base, params, base_hash""",
            args,
        ).df()
        meta = rows[list(META_COLUMNS)].reset_index(drop=True)
        if not rows.empty and rows["dim"].nunique() != 1:
            raise ValueError("the selected vectors have different dimensions: select one base and one representation")
        dim = int(rows["dim"].iloc[0]) if not rows.empty else 0
        return Selection(rows["model"].tolist(), rows["offset"].tolist(), rows["vector_hash"].tolist(), dim), meta

    def load(
        self,
        base: str | None = None,
        representation: Representation | str | None = None,
        models: Sequence[str] | None = None,
    ) -> tuple[np.ndarray, pd.DataFrame]:
        """Vectors as one float32 matrix and their metadata, rows ordered by model (the analysis of many vectors
        reads them in blocks instead: :meth:`products`).

        Each vector is copied once, from the vector file into the matrix, and checked against its checksum (a
        damaged store raises :class:`StoreError` naming the model).
        """
        selection, meta = self.select(base, representation, models)
        if not len(selection):
            return np.zeros((0, 0), np.float32), meta
        matrix = self.vector_file.read(selection.offsets, selection.dim, selection.hashes, selection.models)
        return matrix, meta

    def products(
        self,
        selection: Selection,
        *,
        cache: str | None = None,
        progress: Callable[[int, int], None] | None = None,
        standardize: bool = False,
        verify: bool = True,
        device: str = "auto",
    ) -> Products:
        """The inner products of the selected vectors, read in blocks (:func:`~modelvec.store.products.gram`);
        with ``cache`` (a name for the selection, e.g. its base and representation) those of vectors seen before
        come from beside the store and the new ones are kept there. ``standardize``: of the vectors with every
        feature scaled to zero mean and unit variance over the selection (one more pass; their ``cache`` must name
        exactly these vectors, whose means they depend on: :meth:`Population.standardized`). ``verify``: read and
        check every vector even where all their products are kept (what catches bytes damaged since: a quick query
        may skip it). ``device``: the torch device of the float32 products (auto: CUDA where a GPU is visible; the
        CPU's are numpy's BLAS)."""
        transform = None
        if standardize:
            mean, sd = feature_moments(self.vector_file, selection)
            transform = lambda A: (A - mean) / sd
        kept = ProductsCache(self.path, cache) if cache is not None else None
        known = kept.known(selection) if kept is not None else None
        result = gram(
            self.vector_file,
            selection,
            known=known,
            progress=progress,
            transform=transform,
            verify=verify,
            device=device,
        )
        if kept is not None and (result.computed_rows or result.damaged):  # a damaged vector's products go too
            kept.save(selection, result)
        return result

    def failures(self) -> pd.DataFrame:
        return self.con.execute(
            "SELECT model, base, params, error, coalesce(kind, CASE WHEN model_hash IS NULL THEN 'transient' ELSE 'content' END) "
            "AS kind, created_at FROM failures ORDER BY model"
        ).df()

    def summary(self) -> pd.DataFrame:
        """Counts per base and representation; ``params_json``: the representation's fields (JSON), as the vectors table holds them."""
        return self.con.execute(
            """SELECT base, params, architecture, count(*) AS models, any_value(dim) AS dim,
                      round(avg(seconds), 3) AS mean_seconds, any_value(params_json) AS params_json
               FROM vectors GROUP BY base, params, architecture ORDER BY base, params"""
        ).df()

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

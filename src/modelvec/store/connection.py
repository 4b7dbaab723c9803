"""What the parts of an open :class:`~modelvec.store.Store` share: its path, its DuckDB connection, its vector file and
identity, the tables' columns (asked of DuckDB once), and the WHERE clauses its queries are built from."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ..represent.representation import Representation
from .formats.schema import META_COLUMNS, VECTORS, columns_by_table, select_list
from .formats.vectorfile import VectorFile


@dataclass(eq=False)
class Connection:
    """An open store's files: ``path`` (the DuckDB file), ``con`` (its connection), ``vector_file`` (its own, checked
    as it opened: :mod:`~modelvec.store.opening`; swapped by a compaction), ``identity`` (None: a store written before
    identities, opened read-only)."""

    path: Path
    con: duckdb.DuckDBPyConnection
    read_only: bool
    vector_file: VectorFile
    identity: str | None = None
    _columns: dict[str, list[str]] | None = None

    def columns_by_table(self) -> dict[str, list[str]]:
        """Every table of the store with its columns, asked of DuckDB once: they change only where a writer brings
        the store up to date as it opens it (:meth:`forget_columns` then), and no other process writes while it is
        open. A run asks which columns an older store has before many of its reads."""
        if self._columns is None:
            self._columns = columns_by_table(self.con)
        return self._columns

    def forget_columns(self) -> None:
        """Ask DuckDB for the tables' columns again (after a migration changed them)."""
        self._columns = None

    def tables(self) -> set[str]:
        return set(self.columns_by_table())

    def meta_select(self) -> str:
        """The SELECT list of the vectors' metadata this store has (an older store lacks some columns)."""
        return select_list(VECTORS, META_COLUMNS, self.columns_by_table())

    @staticmethod
    def clauses(extra: Sequence[tuple[str, Any]] = (), **equal: Any) -> tuple[str, list[Any]]:
        """A WHERE clause: each column given a value (None = any) equals it, plus ``extra`` (sql, arg) pairs."""
        items = [(f"{column} = ?", value) for column, value in equal.items() if value is not None] + list(extra)
        return ("WHERE " + " AND ".join(sql for sql, _ in items)) if items else "", [arg for _, arg in items]

    def where(
        self,
        base: str | None,
        representation: Representation | str | None,
        models: Sequence[str] | None,
        base_hash: str | None = None,
    ) -> tuple[str, list[Any]]:
        """The WHERE clause of the vectors of ``base`` under ``representation`` (a key), of ``models`` (None: any)."""
        key = representation.key() if isinstance(representation, Representation) else representation
        extra = [("list_contains(?, model)", list(models))] if models is not None else []
        return self.clauses(extra, base=base, params=key, base_hash=base_hash)

    @contextmanager
    def for_thread(self) -> Iterator[Connection]:
        """The same files through a DuckDB connection of its own, for another thread than the one that opened them
        (DuckDB connections are not shared across threads), closed on leaving; the vector file is shared (its
        reads are positional, its appends locked)."""
        view = copy.copy(self)
        view.con = self.con.cursor()
        try:
            yield view
        finally:
            view.con.close()

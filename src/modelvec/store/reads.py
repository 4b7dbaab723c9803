"""What a store holds, read: the vectors' rows, where their bytes are and the vectors themselves, their products,
the failures, the catalogue of discovered models, the traces."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.errors import StoreError
from ..represent.representation import Representation
from .connection import Connection
from .derived.cache import CacheFolder
from .derived.products import Products, gram
from .formats.blocks import BlockReader, Selection, feature_moments
from .formats.schema import (
    CATALOGUE,
    CATALOGUE_COLUMNS,
    DISCOVERY,
    META_COLUMNS,
    TRACES,
    VECTORS,
    first_row,
    select_list,
)


@dataclass
class StoredTraces:
    """One base's stored traces: a row per model (model, base_hash, levels, scale, parent, zeros, along) and their
    sketches, one row of ``sketches`` each, in the same order; ``damaged``: the models whose sketch's bytes do not
    match their checksum (model -> one line), left out of both."""

    frame: pd.DataFrame
    sketches: np.ndarray
    damaged: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.frame.empty


class Reads:
    """What a :class:`~modelvec.store.Store` holds, read (``store.reads``): over the store's :class:`Connection`."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    # --- the vectors ---------------------------------------------------------------------------------
    def metadata(
        self,
        base: str | None = None,
        representation: Representation | str | None = None,
        models: Sequence[str] | None = None,
        base_hash: str | None = None,
    ) -> pd.DataFrame:
        """One row per stored vector (no vectors), ordered by model; ``base_hash``: only those embedded against that
        version of the base."""
        where, args = self._db.where(base, representation, models, base_hash)
        return self._db.con.execute(
            f"SELECT {self._db.meta_select()} FROM vectors {where} ORDER BY model, base, params, base_hash", args
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
        where, args = self._db.where(base, representation, models, base_hash)
        rows = self._db.con.execute(
            f"""SELECT "offset", vector_hash, {self._db.meta_select()} FROM vectors {where}
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
        matrix = self._db.vector_file.read(selection.offsets, selection.dim, selection.hashes, selection.models)
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
        """The inner products of the selected vectors, read in blocks (:func:`~modelvec.store.derived.products.gram`);
        with ``cache`` (a name for the selection, e.g. its base and representation) those of vectors seen before
        come from beside the store and the new ones are kept there. ``standardize``: of the vectors with every
        feature scaled to zero mean and unit variance over the selection (one more pass; their ``cache`` must name
        exactly these vectors, whose means they depend on: :meth:`Population.standardized`). ``verify``: read and
        check every vector even where all their products are kept (what catches bytes damaged since: a quick query
        may skip it). ``device``: the torch device of the float32 products (auto: CUDA where a GPU is visible; the
        CPU's are numpy's BLAS)."""
        transform = None
        if standardize:
            mean, sd = feature_moments(self._db.vector_file, selection)
            transform = lambda A: (A - mean) / sd
        folder = CacheFolder(self._db.path)
        known = folder.known(cache, selection) if cache is not None else None
        result = gram(
            self._db.vector_file,
            selection,
            known=known,
            progress=progress,
            transform=transform,
            verify=verify,
            device=device,
        )
        if cache is not None and (result.computed_rows or result.damaged):
            # a damaged vector's products go too
            folder.keep_products(cache, [selection.hashes[i] for i in result.positions], result.gram)
        return result

    def summary(self) -> pd.DataFrame:
        """Counts per base and representation; ``params_json``: the representation's fields (JSON), as the vectors table holds them."""
        return self._db.con.execute(
            """SELECT base, params, architecture, count(*) AS models, any_value(dim) AS dim,
                      round(avg(seconds), 3) AS mean_seconds, any_value(params_json) AS params_json
               FROM vectors GROUP BY base, params, architecture ORDER BY base, params"""
        ).df()

    def has(self, model: str, model_version: str, base: str, base_version: str, representation: Representation) -> bool:
        """Whether a current vector exists (same weights, same base weights, same representation)."""
        hit = self._db.con.execute(
            "SELECT 1 FROM vectors WHERE model = ? AND model_hash = ? AND base = ? AND base_hash = ? AND params = ?",
            [model, model_version, base, base_version, representation.key()],
        ).fetchall()
        return bool(hit)

    def stored_version(self, model: str, base: str, base_version: str, representation: Representation) -> str | None:
        """The version of ``model`` (``model_hash``) whose vector is stored against this base and representation."""
        row = first_row(
            self._db.con,
            "SELECT model_hash FROM vectors WHERE model = ? AND base = ? AND base_hash = ? AND params = ? LIMIT 1",
            [model, base, base_version, representation.key()],
        )
        return str(row[0]) if row is not None else None

    def card_of(self, model: str, base: str) -> tuple[str | None, list[str], str | None] | None:
        """What is stored of ``model``'s card with ``base``: (its hash, the dataset labels, their source); None where
        the model has no vector of that base (a stored model's hash is None where it was stored before cards were)."""
        card = select_list(VECTORS, ["card_hash", "datasets", "label_source"], self._db.columns_by_table())
        row = first_row(
            self._db.con,
            f"SELECT {card} FROM vectors WHERE model = ? AND base = ? ORDER BY created_at DESC LIMIT 1",
            [model, base],
        )
        return (row[0], list(row[1] or []), row[2]) if row is not None else None

    def same_files(
        self, files_id: str, model: str, base: str, base_version: str, representation: Representation
    ) -> str | None:
        """The stored model (another name than ``model``) whose vector was made from the very weight files
        ``files_id`` names, against this base and under this representation: ``model`` is its alias."""
        if "files_id" not in self._db.columns_by_table().get("vectors", ()):
            return None
        row = first_row(
            self._db.con,
            "SELECT model FROM vectors WHERE files_id = ? AND model <> ? AND base = ? AND base_hash = ? AND params = ? "
            "ORDER BY model LIMIT 1",
            [files_id, model, base, base_version, representation.key()],
        )
        return str(row[0]) if row is not None else None

    def same_vector(
        self, digest: str, model: str, base: str, base_version: str, representation: Representation
    ) -> str | None:
        """A stored model (another name than ``model``) whose vector has the checksum ``digest`` against this base and
        representation: the same weights, bit for bit, in every row read."""
        row = first_row(
            self._db.con,
            "SELECT model FROM vectors WHERE vector_hash = ? AND model <> ? AND base = ? AND base_hash = ? "
            "AND params = ? ORDER BY model LIMIT 1",
            [digest, model, base, base_version, representation.key()],
        )
        return str(row[0]) if row is not None else None

    def aliases(self, base: str | None = None) -> dict[str, str]:
        """Every second name of a stored model (of ``base``; None: any): alias -> the model it names."""
        if "aliases" not in self._db.tables():
            return {}
        where, args = self._db.clauses(base=base)
        return dict(self._db.con.execute(f"SELECT alias, model FROM aliases {where} ORDER BY alias", args).fetchall())

    # --- failures, the catalogue, the traces ---------------------------------------------------------
    def failures(self) -> pd.DataFrame:
        return self._db.con.execute(
            "SELECT model, base, params, error, coalesce(kind, CASE WHEN model_hash IS NULL THEN 'transient' ELSE 'content' END) "
            "AS kind, created_at FROM failures ORDER BY model"
        ).df()

    def known_failure(self, model: str, model_version: str, base: str, representation: Representation) -> str | None:
        """The recorded error when these very weights already failed, by their content, with this base and representation.

        Resource and transient failures are not properties of the model: they are never returned here.
        """
        rows = self._db.con.execute(
            "SELECT error FROM failures WHERE model = ? AND model_hash = ? AND base = ? AND params = ? "
            "AND coalesce(kind, 'content') = 'content'",
            [model, model_version, base, representation.key()],
        ).fetchall()
        return rows[0][0] if rows else None

    def catalogue(self, base: str | None = None, kept: bool | None = None, model: str | None = None) -> pd.DataFrame:
        """Discovered models (one row per base and model), most downloaded first."""
        where, args = self._db.clauses(base=base, kept=kept, model=model)
        listed = select_list(CATALOGUE, CATALOGUE_COLUMNS, self._db.columns_by_table())
        return self._db.con.execute(
            f"SELECT {listed}, discovered_at FROM catalogue {where} ORDER BY base, downloads DESC NULLS LAST, model",
            args,
        ).df()

    def base_sha(self, base: str) -> str | None:
        """The base revision recorded at the last discovery."""
        rows = self._db.con.execute("SELECT sha FROM bases WHERE base = ?", [base]).fetchall()
        return rows[0][0] if rows else None

    def discovery(self, base: str) -> pd.DataFrame:
        """How far the discovery of ``base`` went (see :data:`~modelvec.store.formats.schema.DISCOVERY`): no rows when
        none was stored page by page (a catalogue stored whole, or none)."""
        if "discovery" not in self._db.tables():
            return pd.DataFrame(columns=[c for c, _ in DISCOVERY.columns])
        return self._db.con.execute("SELECT * FROM discovery WHERE base = ? ORDER BY seq", [base]).df()

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
            "entries_offset",
            "entries_dim",
            "entries_hash",
        ]
        tables = self._db.columns_by_table()
        if "traces" not in tables:
            return StoredTraces(pd.DataFrame(columns=columns), np.zeros((0, 0)))
        extra = [("list_contains(?, model)", list(models))] if models is not None else []
        where, args = self._db.clauses(extra, base=base, params=params, base_hash=base_hash)
        listed = select_list(TRACES, columns, tables)
        df = self._db.con.execute(
            f'SELECT {listed}, "offset", dim FROM traces {where} ORDER BY model, base_hash', args
        ).df()
        dim = int(df["dim"].max()) if len(df) else 0
        if len(df) and (df["dim"] != dim).any():
            raise StoreError(base, f"its stored traces under {params} differ in size: re-embed them with --force")
        if not read:
            return StoredTraces(df.drop(columns=["offset", "dim"]), np.zeros((0, dim), np.float32))
        selection = Selection(list(df["model"]), list(df["offset"]), list(df["sketch_hash"]), dim)
        reader = BlockReader(self._db.vector_file, selection, len(selection))
        sketches, sound = reader.read(range(len(selection)))
        damaged = {m: line.replace("stored vector", "stored trace") for m, line in reader.damaged.items()}
        frame = df.drop(columns=["offset", "dim"])[sound].reset_index(drop=True)
        return StoredTraces(frame, sketches if sound.all() else sketches[sound], damaged)  # read once, not copied

    def trace_entries(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
        """The kept entries of the traces in ``frame`` (rows of :meth:`traces`), read from the vector file and checked:
        each model's delta there, one row each (NaN: none kept, of another size, or damaged: named in the third
        value), and the base's weights there (empty where no model keeps entries)."""
        dims = frame["entries_dim"].dropna().astype(np.int64) if "entries_dim" in frame else pd.Series([], dtype=int)
        if dims.empty:
            return np.full((len(frame), 0), np.nan, np.float32), np.zeros(0, np.float32), {}
        dim = int(dims.mode().iloc[0])
        have = (frame["entries_dim"] == dim).fillna(False).to_numpy(bool) & frame["entries_hash"].notna().to_numpy()
        at = np.flatnonzero(have)
        selection = Selection(
            [frame["model"].iloc[i] for i in at],
            [int(frame["entries_offset"].iloc[i]) for i in at],
            [frame["entries_hash"].iloc[i] for i in at],
            dim,
        )
        reader = BlockReader(self._db.vector_file, selection, min(len(selection), 4096))  # a block at a time
        out, base = np.full((len(frame), dim // 2), np.nan, np.float32), np.zeros(0, np.float32)
        for lo in range(0, len(at), len(reader.buffer)):
            kept, sound = reader.read(range(lo, min(lo + len(reader.buffer), len(at))))
            out[at[lo : lo + len(sound)][sound]] = kept[: len(sound)][sound, : dim // 2]
            if not len(base) and sound.any():
                base = kept[: len(sound)][sound][0, dim // 2 :].copy()
        damaged = {m: line.replace("stored vector", "stored entries") for m, line in reader.damaged.items()}
        return out, base, damaged

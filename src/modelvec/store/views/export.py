"""Exports of the store for other tools: Parquet, one row per vector."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...core.errors import StoreError
from ..formats.vectorfile import VectorFile

if TYPE_CHECKING:
    from ..store import Store


def export_parquet(store: Store, path: str | os.PathLike[str], damaged: dict[str, str] | None = None) -> int:
    """One row per stored vector of ``store``: model, base, the representation parameters, datasets, vector; the rows
    written (``damaged``: a dict where vectors that fail their checksum are named and left out).

    A chunk of 256 vectors at a time: memory is bounded whatever the store's size. A vector that fails its
    checksum raises :class:`StoreError` naming its model, or with ``damaged`` (a dict) is left out and named there.
    A missing folder is created. The file is written beside ``path`` under a temporary name and renamed into place
    once whole, so an export that fails (a full disk) leaves no half file; its ``OSError`` names ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = store.con.sql(
        """SELECT model, base, params, rank, factor, pooling, solver, sign, architecture, model_hash, datasets,
                  dim, "offset", vector_hash FROM vectors ORDER BY model, base, params"""
    ).to_arrow_table()
    columns = [c for c in meta.column_names if c not in ("dim", "offset", "vector_hash")]
    schema = meta.select(columns).schema.append(pa.field("vector", pa.list_(pa.float32())))
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as file, pq.ParquetWriter(file, schema) as out:
            written = 0
            for lo in range(0, meta.num_rows, 256):  # a chunk at a time: the export never holds the whole store
                part, vectors = _readable(meta.slice(lo, 256), store.vector_file, damaged)
                written += part.num_rows
                offsets = pa.array(np.cumsum([0] + [v.size for v in vectors]), pa.int32())
                flat = pa.array(np.concatenate(vectors) if vectors else np.zeros(0, np.float32))
                column = pa.ListArray.from_arrays(offsets, flat)
                out.write_table(pa.Table.from_arrays([part.column(c) for c in columns] + [column], schema=schema))
        os.replace(tmp, path)
        return written
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # never created (a read-only folder)
            pass
        if isinstance(exc, OSError):  # said as the file asked for: a write on a full disk names none
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def _readable(
    part: pa.Table, vector_file: VectorFile, damaged: dict[str, str] | None
) -> tuple[pa.Table, list[np.ndarray]]:
    """The rows of ``part`` and their vectors, each checked against its checksum; with ``damaged`` a row whose
    vector fails is left out and named there, else the failure raises."""
    keep, vectors = [], []
    columns = (part.column(c).to_pylist() for c in ("offset", "dim", "vector_hash", "model"))
    for i, (offset, dim, digest, model) in enumerate(zip(*columns)):
        try:
            vectors.append(vector_file.read([offset], dim, [digest], [model])[0])
            keep.append(i)
        except StoreError as exc:
            if damaged is None:
                raise
            damaged[model] = str(exc)
    return (part if len(keep) == part.num_rows else part.take(pa.array(keep, pa.int64()))), vectors

"""The folder of files kept beside a store, ``<store>.products/``, and the one object that owns it.

A store keeps beside its DuckDB file what later runs would otherwise compute again: the vectors' pairwise products
(``<id>.products``), the arrays that follow from exactly those vectors (``<id>.<name>.kept``: each model's spread, every
pair's scaled distance, the map's layout), the model tree (``<id>.tree.kept``) and the base's probe inputs
(``<id>.probe.kept``). :class:`CacheFolder` is the only code that names a file in it; each file is a kept file
(:mod:`~modelvec.store.formats.cachefile`: written whole, then renamed, its temporary files left by a killed writer
removed as the folder is written next, every row checked as it is read), and what each was computed for is checked here,
so a file kept for other vectors or another version is stale: not used, computed again and replaced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.blocks import Selection
from ..formats.cachefile import CacheFile, read_cache_file, write_cache_file


def checksum_of(hashes: Sequence[str]) -> str:
    """One checksum of a list of vectors' checksums (a cache of standardised products holds for exactly them)."""
    return hashlib.sha1("\n".join(hashes).encode()).hexdigest()[:16]


def _name(key: str) -> str:
    """The file name (without its suffix) that ``key`` is kept under."""
    return hashlib.sha1(key.encode()).hexdigest()[:16]


@dataclass
class CachedProducts:
    """Products kept from an earlier run, laid out for a selection: ``gram`` (n x n; rows and columns of vectors the
    cache lacks, or whose kept row did not verify, are zeros, to be computed; a read-only memory map where it holds
    all of them, in order) and ``have``, which vectors it holds. ``note``: what did not verify, one line."""

    gram: np.ndarray
    have: np.ndarray
    note: str | None = None


class CacheFolder:
    """The files kept beside the store at ``store_path``: their names, what each must have been computed for, and
    their reading (verified) and writing (whole or not at all). A file that cannot be read or written is no cache,
    never an error: what it held is computed again.

    The products of one selection (its ``key``: e.g. the base and representation) are a kept file naming the
    checksums of its vectors and holding their n x n products (float64), each row with its own checksum, read
    through a memory map. A row that does not verify is computed again (one vector's products with every other), a
    file whose header does not is computed again whole, and either is said in one line (``CachedProducts.note``). Arrays
    that reports compute from the products are kept beside them the same way (:meth:`derived`)."""

    #: the first line of the unchecked files an earlier version kept: read as no cache, and replaced
    UNCHECKED = b"modelvec products float64 v1\n"

    def __init__(self, store_path: Path) -> None:
        self.folder = store_path.parent / f"{store_path.name}.products"

    # --- names ---------------------------------------------------------------------------------------
    def products_path(self, key: str) -> Path:
        """Where the products of the selection named ``key`` are kept."""
        return self.folder / f"{_name(key)}.products"

    def derived_path(self, key: str, name: str) -> Path:
        """Where the arrays ``name`` computed from the products of ``key`` are kept."""
        path = self.products_path(key)
        return path.with_name(f"{path.stem}.{name}.kept")

    def tree_path(self, key: str) -> Path:
        """Where the model tree named ``key`` is kept."""
        return self.folder / f"{_name(key)}.tree.kept"

    def inputs_path(self, base: str, tokens: int) -> Path:
        """Where ``base``'s inputs on ``tokens`` probe tokens are kept."""
        key = f"{base}\0{tokens}"
        return self.folder / f"{_name(key)}.probe.kept"

    # --- the products --------------------------------------------------------------------------------
    def known(self, key: str, selection: Selection) -> CachedProducts | None:
        """What is kept of the selection's products, every row verified (None: nothing)."""
        path = self.products_path(key)
        kept = self._read(path)
        if kept is None:
            return None
        if kept.problem is not None:
            return _none(path, kept.problem)
        hashes, cached = kept.meta.get("hashes"), kept.arrays.get("gram")
        if not isinstance(hashes, list) or cached is None or cached.shape != (len(hashes), len(hashes)):
            return _none(path, "its header does not describe its products")
        bad = {int(i) for i in kept.damaged["gram"]}
        note = None
        if bad:
            note = (
                f"{path}: {len(bad)} of its {len(hashes)} rows of kept products did not match their checksums: "
                "computed again and kept"
            )
        if not bad and hashes == list(selection.hashes):  # the selection it was kept for: read through the map
            return CachedProducts(cached, np.ones(len(hashes), dtype=bool))
        where = {h: i for i, h in enumerate(hashes) if i not in bad}
        cols = np.array([where.get(h, -1) for h in selection.hashes], dtype=np.int64)
        have = cols >= 0
        if not have.any():
            return CachedProducts(np.zeros((0, 0)), np.zeros(0, dtype=bool), note) if note else None
        n, mine = len(selection), np.flatnonzero(have)
        G = np.zeros((n, n))
        G[np.ix_(mine, mine)] = cached[np.ix_(cols[mine], cols[mine])]
        del cached
        return CachedProducts(G, have, note)

    def keep_products(self, key: str, hashes: Sequence[str], gram: np.ndarray) -> None:
        """Keep the products ``gram`` of the vectors ``hashes`` under ``key``."""
        write_cache_file(self.products_path(key), {"hashes": list(hashes)}, {"gram": gram})

    # --- what follows from exactly these vectors -----------------------------------------------------
    def derived(
        self, key: str, hashes: Sequence[str], name: str, *, mapped: bool = False
    ) -> tuple[dict[str, np.ndarray] | None, str | None]:
        """Arrays kept beside the products of ``key`` under ``name`` for exactly the vectors ``hashes`` (None: none
        kept, or they did not verify), and what did not verify, one line. ``mapped``: the verified file's memory
        maps, not copies (large arrays, read and never written)."""
        path = self.derived_path(key, name)
        kept, note = self._whole(path)
        if kept is None:
            return None, note
        if kept.meta.get("digest") != checksum_of(hashes):
            return None, None  # kept for other vectors
        return {k: v if mapped else np.array(v) for k, v in kept.arrays.items()}, None

    def keep_derived(self, key: str, hashes: Sequence[str], name: str, arrays: dict[str, np.ndarray]) -> None:
        """Keep ``arrays`` for exactly the vectors ``hashes`` (written whole, then renamed; a failure keeps nothing)."""
        write_cache_file(self.derived_path(key, name), {"digest": checksum_of(hashes)}, arrays)

    # --- what is kept row by row, for whichever vectors it was computed for -------------------------
    def rows(self, key: str, name: str) -> tuple[CacheFile | None, str | None]:
        """The arrays kept under ``name`` beside the products of ``key`` for the vectors its ``hashes`` name (any
        vectors: the caller takes the rows it can use), verified (None: none kept, or it did not verify), and what
        did not verify, one line."""
        path = self.derived_path(key, name)
        kept, note = self._whole(path)
        if kept is not None and not isinstance(kept.meta.get("hashes"), list):
            return None, f"{path}: its header does not say which vectors it holds: computed again"
        return kept, note

    def keep_rows(self, key: str, name: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Keep ``arrays`` computed for the vectors ``meta["hashes"]`` under ``name`` (written whole, then renamed)."""
        write_cache_file(self.derived_path(key, name), meta, arrays)

    # --- the model tree ------------------------------------------------------------------------------
    def tree(self, name: str, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """The model tree kept under ``name`` for exactly ``key`` (what it was inferred from), verified (None: none,
        or kept for another ``key``), and what did not verify, one line."""
        path = self.tree_path(name)
        kept = read_cache_file(path)
        if kept is None:
            return None, None
        if kept.problem is not None:
            return None, f"{path}: {kept.problem}: the tree inferred again"
        tree = kept.meta.get("tree")
        return (tree if kept.meta.get("key") == key and isinstance(tree, dict) else None), None

    def keep_tree(self, name: str, key: str, tree: dict[str, Any]) -> None:
        """Keep the model tree (its JSON) inferred from ``key`` under ``name``."""
        write_cache_file(self.tree_path(name), {"key": key, "tree": tree}, {})

    # --- what is stale -------------------------------------------------------------------------------
    @staticmethod
    def current(path: Path, meta: dict[str, Any]) -> tuple[CacheFile | None, str | None]:
        """The kept file at ``path`` where it verifies and was computed for ``meta`` (each of its keys the same in
        the file's header: e.g. the base's probe inputs, :mod:`~modelvec.store.derived.inputs`); else None and why it is
        stale (None: there was no file)."""
        kept = read_cache_file(path)
        if kept is None:
            return None, None
        if kept.problem is not None:
            return None, kept.problem
        if {k: kept.meta.get(k) for k in meta} != meta:
            changed = ", ".join(k for k in meta if kept.meta.get(k) != meta[k])
            return None, f"computed for another {changed}"
        if damaged := [name for name, rows in kept.damaged.items() if len(rows)]:
            return None, f"{len(damaged)} arrays do not match their checksums"
        return kept, None

    def _whole(self, path: Path) -> tuple[CacheFile | None, str | None]:
        """The kept file at ``path`` where every row of it verifies (None: none kept, or it does not verify), and
        what did not verify, one line."""
        kept = self._read(path)
        if kept is None:
            return None, None
        if kept.problem is None and any(len(rows) for rows in kept.damaged.values()):
            kept.problem = "its arrays do not match their checksums"
        if kept.problem is not None:
            return None, f"{path}: {kept.problem}: computed again"
        return kept, None

    def _read(self, path: Path) -> CacheFile | None:
        """The kept file at ``path``; None where there is none, or only an unchecked one of an earlier version."""
        try:
            with open(path, "rb") as fh:
                if fh.read(len(self.UNCHECKED)) == self.UNCHECKED:
                    return None
        except OSError:
            pass
        return read_cache_file(path)


def _none(path: Path, problem: str) -> CachedProducts:
    """Nothing of the file can be used: every product is computed again, and the note says why."""
    return CachedProducts(np.zeros((0, 0)), np.zeros(0, dtype=bool), f"{path}: {problem}: its products computed again")

"""Inner products of stored vectors, read from the vector file in blocks: what the analysis needs of them.

Every score, map and neighbour query compares vectors only through their inner products, so no analysis
holds the vectors: :func:`gram` reads them a block at a time (checked against their checksums) and
accumulates the n x n products, memory n^2 + two blocks; :func:`products_with` is one pass over the file for
one query. The products of a selection are kept beside the store (:class:`ProductsCache`), keyed by the
vectors' checksums: a later run computes only the rows of vectors it has not seen (a crawl that added 100
models to 10,000 costs 100 rows), and a vector replaced or removed is dropped.

A vector whose bytes do not match its checksum is left out and named (``damaged``): the others are analysed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .kept import Kept, read_kept, write_kept
from .vectorfile import VectorFile, checksum

#: Floats of the two blocks of vectors held at once while products are accumulated (1 GiB of float32).
BLOCK_FLOATS = 1 << 28
#: Up to this many multiply-adds products are taken in float64 (a few seconds); above, in float32 (twice as fast).
EXACT_UP_TO = 1 << 33


@dataclass(frozen=True)
class Selection:
    """Which stored vectors: their models, offsets in the vector file, checksums and dimension, in order."""

    models: list[str]
    offsets: list[int]
    hashes: list[str]
    dim: int

    def __len__(self) -> int:
        return len(self.models)


@dataclass
class Products:
    """The n x n inner products (float64) of the vectors of a selection, the models left out as damaged (model
    -> one line), and ``kept``: the positions in the selection of the rows and columns of ``gram``."""

    gram: np.ndarray
    kept: np.ndarray
    damaged: dict[str, str] = field(default_factory=dict)
    computed_rows: int = 0  # rows computed in this call (the others came from the cache)
    #: kept products that did not verify and were computed again, one line each
    notes: list[str] = field(default_factory=list)


def checksum_of(hashes: Sequence[str]) -> str:
    """One checksum of a list of vectors' checksums (a cache of standardised products holds for exactly them)."""
    return hashlib.sha1("\n".join(hashes).encode()).hexdigest()[:16]


def damaged_line(model: str, path: Path) -> str:
    return f"{model}: its stored vector in {path} does not match its checksum; re-embed it with --force"


class BlockReader:
    """Reads vectors of a selection a block at a time, each checked against its checksum (one copy, from the
    page cache into a reused buffer)."""

    def __init__(self, vector_file: VectorFile, selection: Selection, block_rows: int) -> None:
        self.file, self.sel = vector_file, selection
        self.buffer = np.empty((max(1, block_rows), selection.dim), np.float32)
        self.damaged: dict[str, str] = {}

    def read(self, positions: Sequence[int], into: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The vectors at ``positions`` (a view of the buffer, or ``into``) and which of them are sound."""
        out = (self.buffer if into is None else into)[: len(positions)]
        sound = np.ones(len(positions), dtype=bool)
        nbytes = self.sel.dim * 4
        for j, i in enumerate(positions):
            raw = out[j].view(np.uint8)
            if self.file.read_raw(self.sel.offsets[i], raw) != nbytes or checksum(raw) != self.sel.hashes[i]:
                self.damaged[self.sel.models[i]] = damaged_line(self.sel.models[i], self.file.path)
                out[j] = 0.0
                sound[j] = False
        return out, sound


def _transformed(
    transform: Callable[[np.ndarray], np.ndarray] | None,
) -> Callable[[BlockReader, Sequence[int], np.ndarray | None], tuple[np.ndarray, np.ndarray]]:
    """A block reader's ``read``, its vectors passed through ``transform`` (a damaged vector stays zeros)."""

    def read(reader: BlockReader, positions: Sequence[int], into: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        block, sound = reader.read(positions, into=into)
        if transform is None:
            return block, sound
        out = transform(block[: len(positions)])
        out[~sound] = 0.0
        return out, sound

    return read


def feature_moments(
    vector_file: VectorFile, selection: Selection, *, block_floats: int = BLOCK_FLOATS
) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's mean and standard deviation over the selection's sound vectors, in one pass (float64);
    a constant feature's deviation is 1, as scikit-learn's ``StandardScaler`` has it."""
    total, squares, count = np.zeros(selection.dim), np.zeros(selection.dim), 0
    reader = BlockReader(vector_file, selection, _block_rows(selection.dim, block_floats))
    order = sorted(range(len(selection)), key=lambda i: selection.offsets[i])
    for start in range(0, len(order), len(reader.buffer)):
        mine = order[start : start + len(reader.buffer)]
        A, sound = reader.read(mine)
        good = A[: len(mine)][sound].astype(np.float64)
        total += good.sum(axis=0)
        squares += np.einsum("ij,ij->j", good, good)
        count += len(good)
    mean = total / max(count, 1)
    sd = np.sqrt(np.clip(squares / max(count, 1) - mean**2, 0.0, None))
    sd[sd == 0] = 1.0
    return mean, sd


def _product(A: np.ndarray, B: np.ndarray, exact: bool) -> np.ndarray:
    """A B^T in float64: from float64 copies where that is cheap (the same bits whatever the blocks), else a float32
    product (half the time; each product within ~1e-6 of the float64 one, relative to the vectors' norms)."""
    if exact:
        return A.astype(np.float64) @ B.astype(np.float64).T
    return (A @ B.T).astype(np.float64)


def _block_rows(dim: int, block_floats: int) -> int:
    return max(1, block_floats // (2 * max(1, dim)))


def gram(
    vector_file: VectorFile,
    selection: Selection,
    *,
    known: Known | None = None,
    block_floats: int = BLOCK_FLOATS,
    progress: Callable[[int, int], None] | None = None,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    verify: bool = True,
) -> Products:
    """All inner products of the selection's vectors, accumulated block by block from the vector file.

    ``known`` holds the products already computed (the cache's, in the selection's order): only the other rows
    are read and multiplied, each block of them against every vector (and where there are none, every vector is still read once and checked, so bytes damaged
    since the products were kept are caught). Rows in file order, so reads are sequential. ``progress(done, total)`` after each block.
    ``transform`` maps each block of vectors before it is multiplied (e.g. standardised features).
    """
    read = _transformed(transform)
    n = len(selection)
    if known is not None and len(known.have) == n:
        G, todo = known.gram, [i for i in range(n) if not known.have[i]]  # its rows and columns of new vectors: below
    else:
        G, todo = np.zeros((n, n)), list(range(n))
    rows = _block_rows(selection.dim, block_floats)
    exact = len(todo) * n * selection.dim <= EXACT_UP_TO
    order = sorted(todo, key=lambda i: selection.offsets[i])
    everyone = sorted(range(n), key=lambda i: selection.offsets[i])
    reader = BlockReader(vector_file, selection, rows)
    other = np.empty((rows, selection.dim), np.float32)
    bad: set[int] = set()
    for start in range(0, len(order), rows):
        mine = order[start : start + rows]
        A, sound = read(reader, mine, None)
        bad.update(p for p, ok in zip(mine, sound) if not ok)
        for lo in range(0, n, rows):  # every vector, a block at a time (the new block's own rows among them)
            theirs = everyone[lo : lo + rows]
            B, ok = read(reader, theirs, other)
            bad.update(p for p, good in zip(theirs, ok) if not good)
            block = _product(A, B[: len(theirs)], exact)
            G[np.ix_(mine, theirs)] = block
            G[np.ix_(theirs, mine)] = block.T
        # a pair within one block was written twice, (i, j) then (j, i), whose roundings may differ: one of them
        for a, i in enumerate(mine[:-1]):  # row by row: memory O(n), not a copy of the block's square
            G[mine[a + 1 :], i] = G[i, mine[a + 1 :]]
        if progress is not None:
            progress(min(start + rows, len(order)), len(order))
    if not order and verify:  # every product from the cache: the vectors are still read once, to catch damage since
        for lo in range(0, n, rows):
            theirs = everyone[lo : lo + rows]
            _, ok = reader.read(theirs)
            bad.update(p for p, good in zip(theirs, ok) if not good)
    kept = np.array([i for i in range(n) if i not in bad], dtype=np.int64)
    notes = [known.note] if known is not None and known.note else []
    return Products(G[np.ix_(kept, kept)] if bad else G, kept, dict(reader.damaged), len(order), notes)


def products_with(
    vector_file: VectorFile, selection: Selection, query: np.ndarray, *, block_floats: int = BLOCK_FLOATS
) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """One pass over the selection's vectors: their inner products with ``query`` (float64), their squared norms,
    and the damaged ones (model -> line; their entries are NaN)."""
    n = len(selection)
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    dots, squares = np.full(n, np.nan), np.full(n, np.nan)
    rows = _block_rows(selection.dim, block_floats)
    reader = BlockReader(vector_file, selection, rows)
    order = sorted(range(n), key=lambda i: selection.offsets[i])
    for start in range(0, n, rows):
        mine = order[start : start + rows]
        A, sound = reader.read(mine)
        A = A[: len(mine)]
        good = np.array(mine)[sound]
        dots[good] = (A[sound] @ q).astype(np.float64)
        squares[good] = np.einsum("ij,ij->i", A[sound], A[sound], dtype=np.float64)
    return dots, squares, dict(reader.damaged)


@dataclass
class Known:
    """Products kept from an earlier run, laid out for a selection: ``gram`` (n x n; rows and columns of vectors the
    cache lacks, or whose kept row did not verify, are zeros, to be computed; a read-only memory map where it holds
    all of them, in order) and ``have``, which vectors it holds. ``note``: what did not verify, one line."""

    gram: np.ndarray
    have: np.ndarray
    note: str | None = None


class ProductsCache:
    """The products of one selection kept beside the store, ``<store>.products/<key>.products``: a kept file
    (:mod:`modelvec.store.kept`) naming the checksums of its vectors and holding their n x n products (float64),
    each row with its own checksum, read through a memory map. A row that does not verify is computed again (one
    vector's products with every other), a file whose header does not is computed again whole, and either is said
    in one line (``Known.note``); a cache that cannot be read or written is no cache, never an error. Arrays that
    reports compute from the products (each model's spread) are kept beside them the same way (:meth:`extra`)."""

    #: the first line of the unchecked files kept before 2026-11-26: read as no cache, and replaced
    UNCHECKED = b"modelvec products float64 v1\n"

    def __init__(self, store_path: Path, key: str) -> None:
        self.folder = store_path.parent / f"{store_path.name}.products"
        self.path = self.folder / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.products"

    def known(self, selection: Selection) -> Known | None:
        """What the cache holds of the selection's products, every row verified (None: nothing)."""
        kept = self._read(self.path)
        if kept is None:
            return None
        if kept.problem is not None:
            return self._none(kept.problem)
        hashes, cached = kept.meta.get("hashes"), kept.arrays.get("gram")
        if not isinstance(hashes, list) or cached is None or cached.shape != (len(hashes), len(hashes)):
            return self._none("its header does not describe its products")
        bad = {int(i) for i in kept.damaged["gram"]}
        note = None
        if bad:
            note = (
                f"{self.path}: {len(bad)} of its {len(hashes)} rows of kept products did not match their checksums: "
                "computed again and kept"
            )
        if not bad and hashes == list(selection.hashes):  # the selection it was kept for: read through the map
            return Known(cached, np.ones(len(hashes), dtype=bool))
        where = {h: i for i, h in enumerate(hashes) if i not in bad}
        cols = np.array([where.get(h, -1) for h in selection.hashes], dtype=np.int64)
        have = cols >= 0
        if not have.any():
            return Known(np.zeros((0, 0)), np.zeros(0, dtype=bool), note) if note else None
        n, mine = len(selection), np.flatnonzero(have)
        G = np.zeros((n, n))
        G[np.ix_(mine, mine)] = cached[np.ix_(cols[mine], cols[mine])]
        del cached
        return Known(G, have, note)

    def _none(self, problem: str) -> Known:
        """Nothing of the file can be used: every product is computed again, and the note says why."""
        return Known(np.zeros((0, 0)), np.zeros(0, dtype=bool), f"{self.path}: {problem}: its products computed again")

    def _read(self, path: Path) -> Kept | None:
        """The kept file at ``path``; None where there is none, or only an unchecked one of an earlier version."""
        try:
            with open(path, "rb") as fh:
                if fh.read(len(self.UNCHECKED)) == self.UNCHECKED:
                    return None
        except OSError:
            pass
        return read_kept(path)

    def extra(self, hashes: Sequence[str], name: str) -> tuple[dict[str, np.ndarray] | None, str | None]:
        """Arrays kept beside these products under ``name`` for exactly the vectors ``hashes`` (None: none kept, or
        they did not verify), and what did not verify, one line."""
        path = self._extra(name)
        kept = self._read(path)
        if kept is None:
            return None, None
        if kept.problem is None and any(len(rows) for rows in kept.damaged.values()):
            kept.problem = "its arrays do not match their checksums"
        if kept.problem is not None:
            return None, f"{path}: {kept.problem}: computed again"
        if kept.meta.get("digest") != checksum_of(hashes):
            return None, None  # kept for other vectors
        return {k: np.array(v) for k, v in kept.arrays.items()}, None

    def put_extra(self, hashes: Sequence[str], name: str, arrays: dict[str, np.ndarray]) -> None:
        """Keep ``arrays`` for exactly the vectors ``hashes`` (written whole, then renamed; a failure keeps nothing)."""
        write_kept(self._extra(name), {"digest": checksum_of(hashes)}, arrays)

    def _extra(self, name: str) -> Path:
        return self.path.with_name(f"{self.path.stem}.{name}.kept")

    def save(self, selection: Selection, products: Products) -> None:
        hashes = [selection.hashes[i] for i in products.kept]
        write_kept(self.path, {"hashes": hashes}, {"gram": products.gram})

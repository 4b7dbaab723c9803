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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.settings import setting, validate
from .kept import Kept, read_kept, write_kept
from .vectorfile import VectorFile

#: Floats of the block of vectors held while its products are accumulated (1 GiB of float32; two chunks of
#: :data:`CHUNK_ROWS` vectors are streamed past it).
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
        for j, i in enumerate(positions):
            raw = out[j].view(np.uint8)
            cause = self.file.problem(self.file.read_raw(self.sel.offsets[i], raw), raw, self.sel.hashes[i])
            if cause is not None:  # its file missing, cut short, or bytes that do not match: said as it is
                self.damaged[self.sel.models[i]] = f"{self.sel.models[i]}: {cause}"
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


def _block_rows(dim: int, block_floats: int) -> int:
    return max(1, block_floats // (2 * max(1, dim)))


#: Rows of the vectors multiplied against the held block at once: a float32 product runs at this machine's full
#: speed from about 512 columns (2 cores, OpenBLAS: 240 GFLOP/s at 512, 125 at 256).
CHUNK_ROWS = 512
#: Above this cosine a pair's float32 product is computed again in float64: its distance (1 - cos, or the euclidean
#: |a|^2 + |b|^2 - 2 a.b) cancels to a few units of the product's rounding (~1e-7 of the norms), which would then
#: be a share of it; below, the distance is at least this, and float32 rounding at most ~1e-5 of it.
RECHECK_COSINE = 0.99
DEVICE_HELP = (
    "torch device for the vectors' pairwise products (float32): auto (CUDA where a GPU is visible and the products "
    "are enough work to pay for starting it), cpu, cuda, cuda:N."
)


@dataclass(frozen=True)
class Compute:
    """Where the vectors' pairwise products are computed, declared once (the CLI's ``--device`` is made from it):
    ``device`` has the meaning it has for ``embed`` (:func:`modelvec.represent.resolve_device`)."""

    device: str = setting("auto", DEVICE_HELP, metavar="DEVICE")

    def __post_init__(self) -> None:
        validate(self)
        if self.device not in ("auto", "cpu"):  # CUDA asked for without a GPU: said before any work starts
            from ..represent import resolve_device

            resolve_device(self.device)


class Multiplier:
    """Products of a held block of vectors with chunks of others, ``H C^T``: float64 from float64 copies where
    ``exact`` (the same bits whatever the blocks), else float32 (a block given in float64, as standardised
    features are, multiplied as it is). On the CPU numpy's BLAS (both cores), on a torch device with torch there."""

    def __init__(self, exact: bool, device: str = "cpu", *, torch_on_cpu: bool = False) -> None:
        """``torch_on_cpu``: torch's product on the CPU as well (what tests the torch path without a GPU)."""
        self.exact, self.device, self.torch = exact, device, device != "cpu" or torch_on_cpu
        self.H: np.ndarray = np.zeros((0, 0), np.float32)
        self._held: Any = None  # the held block on the torch device

    def hold(self, H: np.ndarray) -> None:
        self.H = H.astype(np.float64) if self.exact else H
        if self.torch and self.H.dtype == np.float32:
            import torch

            try:
                self._held = torch.from_numpy(np.ascontiguousarray(self.H)).to(self.device)
            except torch.cuda.OutOfMemoryError:  # a GPU too small for the block (1 GiB): numpy's product instead
                self._held, self.torch = None, False
        else:
            self._held = None

    def times(self, C: np.ndarray | None, upto: int = -1, within: tuple[int, int] = (0, 0)) -> np.ndarray:
        """``H[:upto] C^T`` (``upto`` -1: every held row); with ``C`` None, of the held rows ``within`` instead."""
        rows = slice(None) if upto < 0 else slice(0, upto)
        if self._held is not None:
            return self._torch(C, rows, within)
        B = self.H[within[0] : within[1]] if C is None else (C.astype(np.float64) if self.exact else C)
        return np.asarray(self.H[rows] @ B.T)

    def _torch(self, C: np.ndarray | None, rows: slice, within: tuple[int, int]) -> np.ndarray:
        import torch

        held = self._held
        if C is None:
            B = held[within[0] : within[1]]
        else:
            B = torch.from_numpy(np.ascontiguousarray(C, dtype=np.float32)).to(self.device)
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # never TF32: float32 products, as on the CPU
        try:
            return np.asarray((held[rows] @ B.T).cpu().numpy())
        finally:
            torch.set_float32_matmul_precision(previous)


#: ``auto`` runs the products on a visible GPU only from this many multiply-adds: below, the CPU finishes before
#: CUDA has started (5 s to start on an H200 machine, where its 16 cores ran 10^13 multiply-adds in 15.5 s and the
#: GPU in 5.7 s: the GPU gains its start back from about 2.5 x 10^12).
GPU_FROM = 2_500_000_000_000


def resolved_device(device: str, work: int = 0) -> str:
    """The torch device the products run on: ``cpu`` (numpy) unless a CUDA device is named, or, for auto, one is
    visible and the ``work`` (multiply-adds) is enough to pay for starting it (:data:`GPU_FROM`)."""
    if device == "cpu" or (device == "auto" and work < GPU_FROM):
        return "cpu"
    from ..represent import resolve_device

    return str(resolve_device(device))


def _recheck(
    P: np.ndarray, H: np.ndarray, C: np.ndarray, sq_h: np.ndarray, sq_c: np.ndarray, diagonal: int | None = None
) -> int:
    """Recompute in float64, in place, the entries of ``P = H C^T`` (float64, from a float32 product) whose cosine is
    above :data:`RECHECK_COSINE` (where a distance would cancel to its rounding); the entries recomputed.
    ``diagonal``: where ``C`` is ``H[diagonal:]``, whose own pairs (cosine 1, set from the norms) are not counted."""
    bound = RECHECK_COSINE * np.sqrt(np.outer(sq_h, sq_c))
    near = np.greater(P, bound)
    if diagonal is not None:
        k = np.arange(min(len(C), len(H) - diagonal))
        near[diagonal + k, k] = False
    if not near.any():
        return 0
    rows, cols = np.flatnonzero(near.any(axis=1)), np.flatnonzero(near.any(axis=0))
    exact = H[rows].astype(np.float64) @ C[cols].astype(np.float64).T
    P[np.ix_(rows, cols)] = exact
    return int(near.sum())


def _squares(block: np.ndarray) -> np.ndarray:
    """Each row's squared norm in float64 (the diagonal of the products: every cosine is divided by it)."""
    return np.einsum("ij,ij->i", block, block, dtype=np.float64)


def vector_bytes(n: int, dim: int) -> int:
    """Bytes of the vectors ``gram`` holds at once for ``n`` vectors of ``dim`` floats: the held block and two
    chunks."""
    return 4 * min(BLOCK_FLOATS + 2 * CHUNK_ROWS * max(dim, 1), 2 * n * max(dim, 1))


def _held_rows(dim: int, block_floats: int) -> int:
    """Rows of the held block: ``block_floats`` of them (the two chunks streamed past it come on top)."""
    return max(1, block_floats // max(1, dim))


def _chunk_rows(dim: int, block_floats: int) -> int:
    return max(1, min(CHUNK_ROWS, _held_rows(dim, block_floats)))


@dataclass
class _Pass:
    """What one computation of products writes to: ``G`` (selection order), each position's squared norm (float64,
    NaN until read), the positions whose vectors are damaged, and the entries computed again in float64."""

    G: np.ndarray
    squares: np.ndarray
    bad: set[int] = field(default_factory=set)
    rechecked: int = 0

    def norms(self, positions: Sequence[int], block: np.ndarray) -> np.ndarray:
        at = np.asarray(positions, dtype=np.int64)
        need = np.isnan(self.squares[at])
        if need.all():
            self.squares[at] = _squares(block)
        elif need.any():
            self.squares[at[need]] = _squares(block[need])
        return self.squares[at]

    def put(self, rows: Sequence[int], cols: Sequence[int], P: np.ndarray) -> None:
        """Write ``P`` at (rows, cols) and its transpose at (cols, rows)."""
        self.G[np.ix_(rows, cols)] = P
        self.G[np.ix_(cols, rows)] = P.T


def _within(work: _Pass, mult: Multiplier, mine: list[int], H: np.ndarray, chunk: int, check: bool) -> None:
    """The products of the held block with itself, the upper triangle a chunk of columns at a time (``H[:c1]``
    against ``H[c0:c1]``): each pair computed once. With ``check`` (float32 products) the diagonal is each vector's
    squared norm in float64; float64 products keep their own (the bits they had before)."""
    sq = work.norms(mine, H)
    for c0 in range(0, len(mine), chunk):
        c1 = min(c0 + chunk, len(mine))
        P = np.asarray(mult.times(None, upto=c1, within=(c0, c1)), dtype=np.float64)
        if check:
            work.rechecked += _recheck(P, H[:c1], H[c0:c1], sq[:c1], sq[c0:c1], diagonal=c0)
        square = P[c0:c1]  # the chunk against itself: its upper triangle mirrored, so G is exactly symmetric
        diagonal = sq[c0:c1] if check else np.diagonal(square).copy()
        upper = np.triu(square, 1)
        square[...] = upper + upper.T
        square[np.diag_indices(c1 - c0)] = diagonal
        work.put(mine[:c1], mine[c0:c1], P)


def _streamed(
    read: Callable[[BlockReader, Sequence[int], np.ndarray | None], tuple[np.ndarray, np.ndarray]],
    reader: BlockReader,
    positions: list[int],
    buffers: list[np.ndarray],
) -> Iterator[tuple[list[int], np.ndarray, np.ndarray]]:
    """The vectors at ``positions`` a chunk at a time (as many rows as a buffer), each chunk read and checked in a
    second thread while the one before is multiplied (the read's copy and checksum overlap the product)."""
    chunk = len(buffers[0])
    pieces = [positions[i : i + chunk] for i in range(0, len(positions), chunk)]
    if not pieces:
        return
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(read, reader, pieces[0], buffers[0])
        for k, piece in enumerate(pieces):
            block, sound = future.result()
            if k + 1 < len(pieces):
                future = pool.submit(read, reader, pieces[k + 1], buffers[(k + 1) % 2])
            yield piece, block[: len(piece)], sound


def gram(
    vector_file: VectorFile,
    selection: Selection,
    *,
    known: Known | None = None,
    block_floats: int = BLOCK_FLOATS,
    progress: Callable[[int, int], None] | None = None,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    verify: bool = True,
    device: str = "cpu",
    exact_up_to: int | None = None,
) -> Products:
    """All inner products of the selection's vectors, from the vector file a block at a time: each pair once.

    ``known`` holds the products already computed (the cache's, in the selection's order): only the other rows
    are computed (and where there are none, every vector is still read once and checked, so bytes damaged since the
    products were kept are caught). The vectors to compute are held a block at a time (in file order, so reads are
    sequential) and multiplied with themselves (the upper triangle) and with every vector after them, streamed past
    in chunks: the symmetric product, half the work of a general one. ``progress(done, total)`` after each held
    block. ``transform`` maps each block of vectors before it is multiplied (e.g. standardised features).
    ``device``: the torch device of the float32 products (``cpu``: numpy's BLAS); up to ``exact_up_to``
    multiply-adds (default :data:`EXACT_UP_TO`) the products are float64 on the CPU."""
    read, n, dim = _transformed(transform), len(selection), selection.dim
    if known is not None and len(known.have) == n:
        G, todo = known.gram, [i for i in range(n) if not known.have[i]]  # its rows and columns of new vectors: below
    else:
        G, todo = np.zeros((n, n)), list(range(n))
    madds = len(todo) * n * dim
    exact = madds <= (EXACT_UP_TO if exact_up_to is None else exact_up_to)
    mult = Multiplier(exact, "cpu" if exact else resolved_device(device, madds))
    by_offset = lambda positions: sorted(positions, key=lambda i: selection.offsets[i])
    order, todo_set = by_offset(todo), set(todo)
    others = by_offset(i for i in range(n) if i not in todo_set)
    held, chunk = _held_rows(dim, block_floats), _chunk_rows(dim, block_floats)
    reader = BlockReader(vector_file, selection, held)
    buffers = [np.empty((chunk, dim), np.float32) for _ in range(2)]
    work = _Pass(G, np.full(n, np.nan))
    for start in range(0, len(order), held):
        mine = order[start : start + held]
        H, sound = read(reader, mine, None)
        H = H[: len(mine)]
        work.bad.update(p for p, ok in zip(mine, sound) if not ok)
        check = not exact and H.dtype == np.float32
        mult.hold(H)
        _within(work, mult, mine, H, chunk, check)
        for theirs, C, ok in _streamed(read, reader, order[start + held :] + others, buffers):
            work.bad.update(p for p, good in zip(theirs, ok) if not good)
            P = np.asarray(mult.times(C), dtype=np.float64)
            if check:
                work.rechecked += _recheck(P, H, C, work.norms(mine, H), work.norms(theirs, C))
            work.put(mine, theirs, P)
        if progress is not None:
            progress(min(start + held, len(order)), len(order))
    if not order and verify:  # every product from the cache: the vectors are still read once, to catch damage since
        for theirs, _, ok in _streamed(lambda r, p, into: r.read(p, into=into), reader, others, buffers):
            work.bad.update(p for p, good in zip(theirs, ok) if not good)
    bad = work.bad
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

    def extra(
        self, hashes: Sequence[str], name: str, *, mapped: bool = False
    ) -> tuple[dict[str, np.ndarray] | None, str | None]:
        """Arrays kept beside these products under ``name`` for exactly the vectors ``hashes`` (None: none kept, or
        they did not verify), and what did not verify, one line. ``mapped``: the verified file's memory maps, not
        copies (large arrays, read and never written)."""
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
        return {k: v if mapped else np.array(v) for k, v in kept.arrays.items()}, None

    def put_extra(self, hashes: Sequence[str], name: str, arrays: dict[str, np.ndarray]) -> None:
        """Keep ``arrays`` for exactly the vectors ``hashes`` (written whole, then renamed; a failure keeps nothing)."""
        write_kept(self._extra(name), {"digest": checksum_of(hashes)}, arrays)

    def _extra(self, name: str) -> Path:
        return self.path.with_name(f"{self.path.stem}.{name}.kept")

    def save(self, selection: Selection, products: Products) -> None:
        hashes = [selection.hashes[i] for i in products.kept]
        write_kept(self.path, {"hashes": hashes}, {"gram": products.gram})

"""Inner products of stored vectors, read from the vector file in blocks: what the analysis needs of them.

Every score, map and neighbour query compares vectors only through their inner products, so no analysis
holds the vectors: :func:`gram` reads them a block at a time (checked against their checksums,
:mod:`~modelvec.store.formats.blocks`) and accumulates the n x n products, memory n^2 + two blocks. The products of a
selection are kept beside the store (:class:`~modelvec.store.derived.cache.CacheFolder`), keyed by the vectors'
checksums: a later run computes only the rows of vectors it has not seen (a crawl that added 100 models to 10,000
costs 100 rows), and a vector replaced or removed is dropped.

A vector whose bytes do not match its checksum is left out and named (``damaged``): the others are analysed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.machine import cores
from ...core.settings import setting, validate
from ..formats.blocks import BLOCK_FLOATS, BlockReader, Selection, transformed
from ..formats.vectorfile import VectorFile
from .cache import CachedProducts

#: Up to this many multiply-adds products are taken in float64 (a few seconds); above, in float32 (twice as fast).
EXACT_UP_TO = 1 << 33


@dataclass
class Products:
    """The n x n inner products (float64) of the vectors of a selection, the models left out as damaged (model
    -> one line), and ``positions``: the positions in the selection of the rows and columns of ``gram`` (those of
    its sound vectors)."""

    gram: np.ndarray
    positions: np.ndarray
    damaged: dict[str, str] = field(default_factory=dict)
    computed_rows: int = 0  # rows computed in this call (the others came from the cache)
    #: kept products that did not verify and were computed again, one line each
    notes: list[str] = field(default_factory=list)


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


#: Up to this many models the reports read every pair's products (kept beside the store, n x n float64: 2 GiB);
#: above, each model's nearest lists from row blocks (:mod:`~modelvec.store.derived.neighbours`).
PAIRS_UP_TO = 16384
NEIGHBOURS = ("auto", "pairs", "lists")
NEIGHBOURS_HELP = (
    "How each model's nearest are found: pairs (every pair's products, kept beside the store: n x n in memory), "
    f"lists (each model's nearest, as deep as its dataset, from row blocks: n x k), auto (pairs up to {PAIRS_UP_TO:,} "
    "models, lists above)."
)


@dataclass(frozen=True)
class Compute:
    """Where and how the vectors' pairwise products are computed, declared once (the CLI's ``--device`` and
    ``--neighbours`` are made from it): ``device`` has the meaning it has for ``embed``
    (:func:`modelvec.represent.resolve_device`); ``neighbours`` whether the reports read every pair's products or
    each model's nearest lists."""

    device: str = setting("auto", DEVICE_HELP, metavar="DEVICE")
    neighbours: str = setting("auto", NEIGHBOURS_HELP, choices=NEIGHBOURS)

    def neighbours_for(self, n: int) -> str:
        """``pairs`` or ``lists`` for a population of ``n`` models (``auto`` resolved)."""
        if self.neighbours != "auto":
            return self.neighbours
        return "pairs" if n <= PAIRS_UP_TO else "lists"

    def __post_init__(self) -> None:
        validate(self)
        if self.device not in ("auto", "cpu"):  # CUDA asked for without a GPU: said before any work starts
            from ...represent import resolve_device

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
        if torch.get_float32_matmul_precision() == "highest":  # torch's default: float32 products, as on the CPU
            return np.asarray((held[rows] @ B.T).cpu().numpy())
        # the process allows TF32 (someone's setting, for every thread, left as it is): never reduced precision here,
        # this product alone is taken in float64
        return np.asarray((held[rows].double() @ B.T.double()).cpu().numpy())


#: ``auto`` runs the products on a visible GPU only from this many multiply-adds: below, the CPU finishes before
#: CUDA has started (5 s to start on an H200 machine, where its 16 cores ran 10^13 multiply-adds in 15.5 s and the
#: GPU in 5.7 s: the GPU gains its start back from about 2.5 x 10^12).
GPU_FROM = 2_500_000_000_000


def resolved_device(device: str, work: int = 0) -> str:
    """The torch device the products run on: ``cpu`` (numpy) unless a CUDA device is named, or, for auto, one is
    visible and the ``work`` (multiply-adds) is enough to pay for starting it (:data:`GPU_FROM`)."""
    if device == "cpu" or (device == "auto" and work < GPU_FROM):
        return "cpu"
    from ...represent import resolve_device

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


def held_bytes(n: int, dim: int) -> int:
    """Bytes of the vectors ``gram`` holds at once for ``n`` vectors of ``dim`` floats: the held block and two
    chunks."""
    return 4 * min(BLOCK_FLOATS + 2 * CHUNK_ROWS * max(dim, 1), 2 * n * max(dim, 1))


def held_blocks_of(todo: int, dim: int, block_floats: int = BLOCK_FLOATS) -> int:
    """How many blocks a pass holds to compute the products of ``todo`` vectors of ``dim`` floats."""
    return -(-todo // _held_rows(dim, block_floats))


def _held_rows(dim: int, block_floats: int) -> int:
    """Rows of the held block: ``block_floats`` of them (the two chunks streamed past it come on top)."""
    return max(1, block_floats // max(1, dim))


def _chunk_rows(dim: int, block_floats: int) -> int:
    return max(1, min(CHUNK_ROWS, _held_rows(dim, block_floats)))


#: What a pass of products hands each block of them to instead of an n x n matrix: ``(rows, columns, P, squares of
#: the rows, squares of the columns)``, each pair of positions in one block (rows and columns overlap only where a
#: held block meets itself: its entries are then in P both ways).
Consumer = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


@dataclass
class _Pass:
    """What one computation of products writes to: ``G`` (selection order; or a ``consumer`` takes each block), each
    position's squared norm (float64, NaN until read), the positions whose vectors are damaged, and the entries
    computed again in float64."""

    G: np.ndarray | None
    squares: np.ndarray
    bad: set[int] = field(default_factory=set)
    rechecked: int = 0
    consumer: Consumer | None = None
    #: the consumer's thread (each block handed to it while the next is multiplied) and the block it is taking
    beside: ThreadPoolExecutor | None = None
    taking: Future[None] | None = None
    buffers: list[np.ndarray] = field(default_factory=list)  # the two chunks streamed past the held block

    def norms(self, positions: Sequence[int], block: np.ndarray) -> np.ndarray:
        at = np.asarray(positions, dtype=np.int64)
        need = np.isnan(self.squares[at])
        if need.all():
            self.squares[at] = _squares(block)
        elif need.any():
            self.squares[at[need]] = _squares(block[need])
        return self.squares[at]

    def put(self, rows: Sequence[int], cols: Sequence[int], P: np.ndarray) -> None:
        """Write ``P`` at (rows, cols) and its transpose at (cols, rows), or hand it to the consumer."""
        if self.consumer is not None:
            r, c = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
            self.taken()  # one block at a time: the one before is taken before this one is handed on
            if self.beside is None:
                self.consumer(r, c, P, self.squares[r], self.squares[c])
            else:
                self.taking = self.beside.submit(self.consumer, r, c, P, self.squares[r].copy(), self.squares[c].copy())
            return
        assert self.G is not None
        self.G[np.ix_(rows, cols)] = P
        self.G[np.ix_(cols, rows)] = P.T

    def taken(self) -> None:
        """Wait for the consumer to take the block handed to it (its error raised here)."""
        if self.taking is not None:
            taking, self.taking = self.taking, None
            taking.result()


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


def _held_block(
    work: _Pass,
    mult: Multiplier,
    read: Callable[[BlockReader, Sequence[int], np.ndarray | None], tuple[np.ndarray, np.ndarray]],
    reader: BlockReader,
    positions: tuple[list[int], list[int]],
) -> None:
    """One held block's products: the block (``positions[0]``) with itself and with the vectors streamed past it
    (``positions[1]``), float32 products checked in float64 where a distance would cancel."""
    mine, rest = positions
    chunk = len(work.buffers[0])
    H, sound = read(reader, mine, None)
    H = H[: len(mine)]
    work.bad.update(p for p, ok in zip(mine, sound) if not ok)
    check = not mult.exact and H.dtype == np.float32
    mult.hold(H)
    _within(work, mult, mine, H, chunk, check)
    for theirs, C, ok in _streamed(read, reader, rest, work.buffers):
        work.bad.update(p for p, good in zip(theirs, ok) if not good)
        P = np.asarray(mult.times(C), dtype=np.float64)
        if check or work.consumer is not None:
            sq_h, sq_c = work.norms(mine, H), work.norms(theirs, C)
            if check:
                work.rechecked += _recheck(P, H, C, sq_h, sq_c)
        work.put(mine, theirs, P)


def gram(
    vector_file: VectorFile,
    selection: Selection,
    *,
    known: CachedProducts | None = None,
    block_floats: int = BLOCK_FLOATS,
    progress: Callable[[int, int], None] | None = None,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    verify: bool = True,
    device: str = "cpu",
    exact_up_to: int | None = None,
    consumer: Consumer | None = None,
    held_blocks: Sequence[int] | None = None,
) -> Products:
    """All inner products of the selection's vectors, from the vector file a block at a time: each pair once.

    ``known`` holds the products already computed (the cache's, in the selection's order): only the other rows
    are computed (and where there are none, every vector is still read once and checked, so bytes damaged since the
    products were kept are caught). The vectors to compute are held a block at a time (in file order, so reads are
    sequential) and multiplied with themselves (the upper triangle) and with every vector after them, streamed past
    in chunks: the symmetric product, half the work of a general one. ``progress(done, total)`` after each held
    block. ``transform`` maps each block of vectors before it is multiplied (e.g. standardised features).
    ``device``: the torch device of the float32 products (``cpu``: numpy's BLAS); up to ``exact_up_to``
    multiply-adds (default :data:`EXACT_UP_TO`) the products are float64 on the CPU. ``consumer``: each block of
    products is handed to it instead (:data:`Consumer`; no n x n matrix is made: ``gram`` is empty); with ``known``
    saying which vectors' products it has, only the others' are computed (each against every vector).
    ``held_blocks``: only these of the held blocks (by their place: :func:`held_blocks_of` says how many), each with
    every vector after it: the same products, the same blocks, as the whole pass makes (the pass split in tasks)."""
    read, n, dim = transformed(transform), len(selection), selection.dim
    if consumer is not None:
        G = None
        todo = [i for i in range(n) if known is None or not known.have[i]]
    elif known is not None and len(known.have) == n:
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
    beside = ThreadPoolExecutor(1, thread_name_prefix="modelvec-consumer") if consumer is not None else None
    work = _Pass(G, np.full(n, np.nan), consumer=consumer, beside=beside, buffers=buffers)
    try:
        for start in range(0, len(order), held):
            if held_blocks is None or start // held in held_blocks:
                _held_block(work, mult, read, reader, (order[start : start + held], order[start + held :] + others))
                if progress is not None:
                    progress(min(start + held, len(order)), len(order))
        work.taken()
    finally:
        if beside is not None:
            beside.shutdown(wait=True)
    if not order and verify:  # every product from the cache: the vectors are still read once, to catch damage since
        work.bad.update(reader.check(others, cores()))
    bad = work.bad
    sound = np.array([i for i in range(n) if i not in bad], dtype=np.int64)
    notes = [known.note] if known is not None and known.note else []
    if G is None:
        return Products(np.zeros((0, 0)), sound, dict(reader.damaged), len(order), notes)
    return Products(G[np.ix_(sound, sound)] if bad else G, sound, dict(reader.damaged), len(order), notes)

"""A UMAP-style layout of a nearest-neighbour graph (the map's), its compiled code kept across runs and checked.

umap-learn compiles its numba functions in every process: about 7 s of a fresh map of 10,000 models on 2 cores
(and 2 s of import), for a layout that then takes 4 s. This is the same method (McInnes, Healy & Melville 2018:
the fuzzy simplicial set of each row's nearest neighbours, laid out by stochastic gradient descent on its fuzzy
cross-entropy, umap-learn's defaults: ``min_dist`` 0.1, ``spread`` 1, 5 negative samples an edge, the learning rate
falling from 1 to 0) with the graph built in numpy and the descent in one numba kernel compiled once per machine
(``cache=True``: numba keeps it beside this file, or under ``NUMBA_CACHE_DIR`` where that is not writable, and
compiles again when this file changes).

Where it differs from umap-learn, and why (docs/evidence.md, "The map's layout", measures the maps against
umap-learn's):

- Each epoch moves every row against the positions the others had when the epoch began (umap-learn moves rows one
  edge at a time, in place): the rows are laid out in parallel, on every core, and the layout is the same bit for
  bit whatever the number of threads. Each directed edge moves its head only (umap-learn moves both ends; the graph
  holds each edge both ways), by :data:`PULL` of umap-learn's steps.
- Negative samples come from a random stream of each row's own (seeded), not one shared stream.
- The start is the top two principal coordinates given (umap-learn's ``init="pca"``), scaled as umap-learn scales
  its start, not the graph's spectral layout.

What is checked, once a process: numba's kept code of the descent, a file kept across runs that numba keeps no
checksum of, is trusted only where it lays out a small graph as the Python source does (:func:`_kernel`); else it is
compiled anew, and every report that lays out a map says so (:func:`kept_code_note`). The tests check the rest
(the graph against umap-learn's, the layout bit for bit across threads).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from ..core.machine import cores

MIN_DIST = 0.1  # umap-learn's defaults: how close points may pack, and the scale of the layout
SPREAD = 1.0

#: How far each directed edge pulls its head, in umap-learn's steps. umap-learn moves both ends of each edge, and the
#: graph holds each edge both ways, so 2 would pull as hard as it does; 1 (the rows' neighbours kept better, their
#: labels as well) was chosen on one half of docs/evidence.md's layout evidence, 1 and 2 tried.
PULL = 1.0
SMOOTH_STEPS = 64  # the bisection of each row's bandwidth (umap-learn's n_iter)
SMOOTH_TOLERANCE = 1e-5
MIN_BANDWIDTH_SCALE = 1e-3  # a row's bandwidth is at least this share of its mean distance


def layout(
    indices: np.ndarray, distances: np.ndarray, start: np.ndarray, *, n_epochs: int, seed: int = 0
) -> np.ndarray:
    """The 2-D (or ``start.shape[1]``-D) UMAP layout of the graph of each row's nearest rows.

    ``indices``, ``distances``: (n, k) each row's k nearest rows (itself first, at distance 0) and their distances;
    ``start``: (n, c) the coordinates to start from (e.g. the top principal coordinates); ``n_epochs`` of descent;
    ``seed`` fixes the negative samples. Returns (n, c) float64."""
    n = len(indices)
    graph = fuzzy_graph(indices, distances)
    graph.data[graph.data < graph.data.max() / n_epochs] = 0.0  # umap-learn's pruning: never sampled anyway
    graph.eliminate_zeros()
    graph.sort_indices()
    a, b = curve_parameters(SPREAD, MIN_DIST)
    Y = _scaled_start(start, seed)
    states = np.random.default_rng(seed).integers(1, 2**63 - 1, size=n, dtype=np.int64)
    _descend(Y, *_edges(graph), a, b, int(n_epochs), states, PULL)
    return Y


def _edges(graph: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The descent's view of ``graph``: each row's edges (``indptr``, their tails) and how many epochs apart each
    is sampled (the strongest every epoch)."""
    return graph.indptr.astype(np.int64), graph.indices.astype(np.int64), graph.data.max() / graph.data


def fuzzy_graph(indices: np.ndarray, distances: np.ndarray) -> sp.csr_matrix:
    """The fuzzy simplicial set of the rows' neighbourhoods (umap-learn's ``fuzzy_simplicial_set``): each row's
    memberships ``exp(-(d - rho) / sigma)`` with ``rho`` its nearest non-zero distance and ``sigma`` set so that
    they sum to log2(k), then the fuzzy union of the directed graph and its transpose, ``W + W' - W o W'``."""
    n, k = indices.shape
    distances = np.asarray(distances, np.float64)
    rho, sigma = _bandwidths(distances, k)
    weights = np.exp(-np.clip(distances - rho[:, None], 0.0, None) / sigma[:, None])
    weights[indices == np.arange(n)[:, None]] = 0.0
    weights[indices < 0] = 0.0
    W = sp.csr_matrix((weights.ravel(), (np.repeat(np.arange(n), k), np.clip(indices, 0, None).ravel())), (n, n))
    W.eliminate_zeros()
    T = W.T.tocsr()
    return (W + T - W.multiply(T)).tocsr()


def _bandwidths(distances: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``rho`` (its nearest non-zero distance) and ``sigma`` (bisected, as umap-learn's
    ``smooth_knn_dist``: ``sum_j exp(-max(d_j - rho, 0) / sigma)`` over the row's neighbours but itself equals
    log2(k), to :data:`SMOOTH_TOLERANCE`, from at least :data:`MIN_BANDWIDTH_SCALE` of its mean distance)."""
    n = len(distances)
    positive = np.where(distances > 0, distances, np.inf)
    rho = positive.min(axis=1)
    rho[~np.isfinite(rho)] = 0.0
    over = np.clip(distances[:, 1:] - rho[:, None], 0.0, None)
    target = np.log2(k)
    lo, hi, mid = np.zeros(n), np.full(n, np.inf), np.ones(n)
    going = np.ones(n, dtype=bool)
    for _ in range(SMOOTH_STEPS):
        rows = np.flatnonzero(going)
        if not len(rows):
            break
        total = np.exp(-over[rows] / mid[rows, None]).sum(axis=1)
        going[rows[np.abs(total - target) < SMOOTH_TOLERANCE]] = False
        rows, total = rows[going[rows]], total[going[rows]]
        above = total > target
        hi[rows[above]] = mid[rows[above]]
        lo[rows[~above]] = mid[rows[~above]]
        mid[rows] = np.where(np.isinf(hi[rows]), mid[rows] * 2, (lo[rows] + hi[rows]) / 2)
    floor = MIN_BANDWIDTH_SCALE * np.where(rho > 0, distances.mean(axis=1), distances.mean())
    return rho, np.maximum(mid, floor)


def curve_parameters(spread: float, min_dist: float) -> tuple[float, float]:
    """umap-learn's ``a``, ``b``: the curve ``1 / (1 + a d^2b)`` fitted to membership 1 up to ``min_dist``, then
    ``exp(-(d - min_dist) / spread)``."""
    from scipy.optimize import curve_fit

    x = np.linspace(0, spread * 3, 300)
    y = np.where(x < min_dist, 1.0, np.exp(-(x - min_dist) / spread))
    (a, b), _ = curve_fit(lambda d, a, b: 1.0 / (1.0 + a * d ** (2 * b)), x, y)
    return float(a), float(b)


def _scaled_start(start: np.ndarray, seed: int) -> np.ndarray:
    """The start as umap-learn scales it: largest coordinate 10, a little seeded noise (so that no two rows start
    at one point), then each axis to [0, 10]."""
    Y = np.array(start, np.float64)
    Y -= Y.mean(axis=0)
    top = np.abs(Y).max()
    Y = Y * (10.0 / top) if top > 0 else Y
    Y += np.random.default_rng(seed).normal(scale=1e-4, size=Y.shape)
    low, high = Y.min(axis=0), Y.max(axis=0)
    return np.ascontiguousarray(10.0 * (Y - low) / np.where(high > low, high - low, 1.0))


#: One descent at a time in a process: numba's workqueue threading layer (where neither TBB nor OpenMP is there)
#: aborts the process when two threads launch parallel code at once.
_ONE_AT_A_TIME = threading.Lock()


def _descend(*args: object) -> None:
    """The descent (:func:`modelvec.analyse.descent.descend`), numba's kept code where it does what its source does;
    one at a time (:data:`_ONE_AT_A_TIME`)."""
    import numba

    with _ONE_AT_A_TIME:
        if numba.get_num_threads() > cores():  # numba counts the machine's CPUs, not those this process may use
            numba.set_num_threads(cores())
        _kernel()[0](*args)


def kept_code_note() -> str | None:
    """Why this process lays out maps without numba's kept code (None: it runs it, or laid out no map yet).

    A state of the machine's numba cache, not an event: it holds until the kept files are removed, so each report
    that lays out a map says it."""
    return _kernel()[1] if _kernel.cache_info().currsize else None


@functools.cache  # called under _ONE_AT_A_TIME: made once
def _kernel() -> tuple[Callable[..., None], str | None]:
    """numba's compiled descent, loaded from its kept code where that is there, once a process: trusted only where
    it gives what the Python source gives on a small graph (numba keeps no checksum of the code it keeps), else
    compiled anew without it; and the line that says so (None: the kept code runs)."""
    from . import descent

    try:
        if _agrees(descent.descend, descent.descend_source):
            return descent.descend, None
        cause = "gives other layouts than its source"
    except Exception as exc:  # the kept code unreadable: numba's own error
        cause = f"could not be loaded ({type(exc).__name__})"
    note = (
        f"numba's kept code of the map's layout {cause}: compiled anew (kept again once its files, descent.descend-*"
        " in numba's cache beside modelvec/analyse/descent.py or under NUMBA_CACHE_DIR, are removed)"
    )
    return descent.compiled(cache=False), note


def _agrees(compiled: Callable[..., None], source: Callable[..., None]) -> bool:
    """Whether ``compiled`` lays out a small seeded graph (40 rows, 8 epochs) as ``source`` does."""
    rng = np.random.default_rng(0)
    n, k = 40, 5
    indices = np.hstack([np.arange(n)[:, None], rng.integers(0, n, size=(n, k - 1))])
    graph = fuzzy_graph(indices, np.hstack([np.zeros((n, 1)), np.sort(rng.random((n, k - 1)), axis=1)]))
    start = rng.random((n, 2)) * 10
    laid = [start.copy(), start.copy()]
    for run, Y in zip((compiled, source), laid):
        run(Y, *_edges(graph), 1.5, 0.9, 8, np.arange(1, n + 1, dtype=np.int64) * 7919, 2.0)
    return bool(np.allclose(laid[0], laid[1], rtol=1e-9, atol=1e-12))

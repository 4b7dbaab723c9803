"""Each stored model's nearest models, computed in row blocks streamed from the vector file: what the reports read
where a population's pairwise products would not fit (:data:`~modelvec.store.derived.products.PAIRS_UP_TO`),
O(n x k) in memory whatever n is.

Two passes over the vectors, each vector checked against its checksum as it is read:

- **landmarks** (:func:`~modelvec.store.derived.landmarks.landmarks`): every vector's inner products with a seeded
  sample of :data:`LANDMARKS` stored vectors (all of them in a smaller population). From them: each model's spread for
  mutual proximity (its distances to the landmarks: every other model's where the population is that small, so the same
  as from every pair), what "far" means for a prediction's closeness, the map's starting coordinates, and the exact rows
  against which an approximation is measured;
- **neighbours** (:func:`nearest_lists`): every pair's product once, in the blocks the pairwise products are computed
  in (:func:`~modelvec.store.derived.products.gram` with a consumer), each block's distances offered to every model's
  lists (:class:`~modelvec.analyse.graph.Nearest`): the nearest by the ranking (plain or mutual proximity) among
  all models, among those the scores count, and the plain nearest the map is laid out from.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...analyse.geometry import distances_of
from ...analyse.graph import Lists, Nearest
from ...analyse.proximity import Stats, ranked_by, side, spread_of
from ...core import constants
from ...core.machine import available_memory
from ..formats.blocks import BLOCK_FLOATS, Selection
from ..formats.cachefile import CacheFile
from ..formats.vectorfile import VectorFile
from .cache import CachedProducts
from .landmarks import scale_of
from .products import gram, held_blocks_of

#: How deep every model's list of nearest models goes (``neighbors --k`` up to this, the map's 15).
NEAR = 32
#: The map's neighbours (UMAP's 15, the row itself counted).
MAP_NEAR = 16
#: Floats of the block of vectors a pass of nearest lists holds (4 GiB of float32; at most a quarter of the memory
#: free): every pair's products are computed once, but each held block reads the vectors after it again, so the
#: larger it is, the fewer times a file larger than the memory is read (100,000 models: 40 GB, about 5 times).
LIST_BLOCK_FLOATS = 1 << 30


def list_block_floats() -> int:
    """The floats a pass of nearest lists holds at once here: ``$MODELVEC_BLOCK_MB``, else :data:`LIST_BLOCK_FLOATS`
    or a quarter of the memory free, at least the products' block."""
    asked = constants.block_mb()
    if asked is not None:
        return max(1, int(asked * 2**20 / 4))
    free = available_memory()
    return LIST_BLOCK_FLOATS if free is None else max(BLOCK_FLOATS, min(LIST_BLOCK_FLOATS, free // 16))


def earlier_lists(kept: CacheFile | None, names: Sequence[str]) -> Earlier | None:
    """The lists a kept file holds (:meth:`~modelvec.store.views.population.Population.nearest` keeps them), None where
    it lacks one of ``names``."""
    if kept is None or not names or any(f"{name}.indptr" not in kept.arrays for name in names):
        return None
    a = kept.arrays
    lists = {name: Lists(*(np.asarray(a[f"{name}.{part}"]) for part in PARTS)) for name in names}
    return Earlier(
        list(kept.meta["hashes"]),
        lists,
        {name: np.asarray(a[f"{name}.depths"]) for name in names},
        {name: np.asarray(a[f"{name}.eligible"], dtype=bool) for name in names},
        np.asarray(a["sums"]) if "sums" in a else None,
    )


#: The arrays a list is kept as.
PARTS = ("indptr", "index", "value", "distance")


@dataclass(frozen=True)
class Wanted:
    """One list every model keeps: its ``depth`` nearest (per model) among the ``eligible`` columns, ranked by
    ``ranking`` (``plain`` distance or the ``scaled`` one)."""

    name: str
    depths: np.ndarray
    eligible: np.ndarray
    ranking: str = "plain"


@dataclass
class Earlier:
    """Lists kept from an earlier pass: the checksums of the vectors they were computed for (their rows, in order),
    and, per list, the lists (columns: those rows), the depths and which columns were eligible."""

    hashes: list[str]
    lists: dict[str, Lists]
    depths: dict[str, np.ndarray]
    eligible: dict[str, np.ndarray]
    #: each row's sum of distances and of squared distances to every other row, and how many (None: not kept)
    sums: np.ndarray | None = None


class _Offers:
    """The consumer of a pass of products: each block's distances offered to every wanted list, both ways; a row
    ``fresh`` (computed anew) takes every column, the others only those ``changed`` for the list (new ones)."""

    def __init__(
        self,
        metric: str,
        wanted: Sequence[Wanted],
        stats: Stats | None,
        fresh: np.ndarray,
        changed: dict[str, np.ndarray],
        new: np.ndarray | None = None,
    ) -> None:
        self.metric, self.wanted, self.stats = metric, list(wanted), stats
        self.fresh, self.changed = fresh, changed
        self.nearest = {w.name: Nearest(w.depths) for w in self.wanted}
        #: each row's sum of distances, of squared distances and their count, over the pairs this pass computes that
        #: its kept sums do not hold (a fresh row: all; a kept one: those with ``new`` rows, absent before)
        self.sums = np.zeros((len(fresh), 3))
        self.new = fresh if new is None else new

    def __call__(self, rows: np.ndarray, cols: np.ndarray, P: np.ndarray, sq_r: np.ndarray, sq_c: np.ndarray) -> None:
        block = np.array(P, dtype=np.float64)
        if self.metric == "cosine":
            block *= np.multiply.outer(scale_of(sq_r), scale_of(sq_c))
        D = distances_of(block, self.metric, sq_r, sq_c)
        R = self._ranked(rows, cols, D)
        self._offer(rows, cols, D, R)
        self._sum(rows, cols, D)
        inside = np.isin(rows, cols)
        if (~inside).any():  # the pairs' other side (a held block against itself holds both already)
            self._offer(cols, rows[~inside], D[~inside].T, None if R is None else R[~inside].T)
            self._sum(cols, rows[~inside], D[~inside].T)

    def _sum(self, rows: np.ndarray, cols: np.ndarray, D: np.ndarray) -> None:
        """Each row's distances to these columns added to its sums (itself left out; a kept row's, only those to new
        columns: the others are in its kept sums)."""
        take = (rows[:, None] != cols[None, :]) & (self.fresh[rows][:, None] | self.new[cols][None, :])
        W = np.where(take, D, 0.0)
        self.sums[rows, 0] += W.sum(axis=1)
        self.sums[rows, 1] += np.einsum("ij,ij->i", W, W)
        self.sums[rows, 2] += np.count_nonzero(take, axis=1)

    def _ranked(self, rows: np.ndarray, cols: np.ndarray, D: np.ndarray) -> np.ndarray | None:
        """The pairs' -log mutual proximity (the same both ways), for the entries that may still enter a list ranked
        by it (+inf for the others: their own side alone already ranks them past the row's cut,
        :meth:`_within_reach`); None where no list is ranked by it."""
        if self.stats is None or all(w.ranking == "plain" for w in self.wanted):
            return None
        mu, sd = self.stats
        reach = self._within_reach()
        near = (reach[rows][:, None] >= D) | (reach[cols][None, :] >= D)
        R = np.full(D.shape, np.inf)
        r, c = np.nonzero(near)
        if len(r):
            d = D[r, c]
            R[r, c] = side(d, mu[rows][r], sd[rows][r]) + side(d, mu[cols][c], sd[cols][c])
        return R

    def _within_reach(self) -> np.ndarray:
        """Per row, the largest distance an entry may have and still enter one of its lists ranked by mutual
        proximity: the pair's value is at least the row's own side, -log P(X > d), which must not pass the list's
        cut (a little beyond it, for rounding); +inf while a list is not full."""
        mu, sd = self.stats  # type: ignore[misc]
        reach = np.full(len(mu), -np.inf)
        for w in self.wanted:
            if w.ranking == "plain":
                continue
            cut = self.nearest[w.name].cut
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                from scipy.special import ndtri  # only for a pass (its import is a third of a query's)

                q = ndtri(np.exp(-cut))  # side(d) <= cut  <=>  (mu - d) / sd >= q
                d = mu - sd * q
                d += 1e-9 * (np.abs(mu) + np.abs(sd * q)) + 1e-12
            flat = ~(sd > 0)  # a side of no spread is log 2 whatever the distance
            d = np.where(flat, np.where(np.log(2.0) <= cut * (1 + 1e-12), np.inf, -np.inf), d)
            d = np.where(np.isfinite(cut), d, np.inf)
            reach = np.maximum(reach, np.nan_to_num(d, nan=np.inf))
        return reach

    def _offer(self, rows: np.ndarray, cols: np.ndarray, D: np.ndarray, R: np.ndarray | None) -> None:
        own = rows[:, None] == cols[None, :]
        kept = ~self.fresh[rows]
        for w in self.wanted:
            V = D.copy() if w.ranking == "plain" else np.array(R)
            V[:, ~w.eligible[cols]] = np.inf
            V[own] = np.inf
            if kept.any():  # a row kept from before already holds every column but the new ones
                V[np.ix_(kept, ~self.changed[w.name][cols])] = np.inf
            self.nearest[w.name].offer(rows, cols, V, D)


def _from_earlier(
    earlier: Earlier, selection: Selection, wanted: Sequence[Wanted]
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Lists], np.ndarray]:
    """What a pass must compute where ``earlier`` lists are kept: the rows computed anew (new vectors, newly
    eligible ones, and rows whose kept lists no longer hold what they need), per list the columns the other rows
    must be offered (new or newly eligible), and the kept lists in the selection's order (columns renumbered, the
    gone and no longer eligible dropped)."""
    n = len(selection)
    where = {h: i for i, h in enumerate(earlier.hashes)}
    source = np.array([where.get(h, -1) for h in selection.hashes], dtype=np.int64)
    position = np.full(len(earlier.hashes), -1, np.int64)
    position[source[source >= 0]] = np.flatnonzero(source >= 0)
    fresh = source < 0
    new = fresh.copy()
    changed, kept = {}, {}
    for w in wanted:
        was = np.zeros(n, dtype=bool)
        was[source >= 0] = earlier.eligible[w.name][source[source >= 0]]
        changed[w.name] = w.eligible & ~was
        fresh |= changed[w.name]
        lists = earlier.lists[w.name].placed(source)
        still = np.full(len(earlier.hashes), -1, np.int64)
        ok = position >= 0
        still[ok] = np.where(w.eligible[position[ok]], position[ok], -1)
        lists = lists.remapped(still)
        depth_then = np.zeros(n, np.int64)
        depth_then[source >= 0] = earlier.depths[w.name][source[source >= 0]]
        eligible_then = int(np.count_nonzero(earlier.eligible[w.name]))
        held_all = depth_then >= eligible_then - was  # the kept list held every eligible column
        short = (lists.lengths() < w.depths) & ~held_all
        fresh |= short | (w.depths > depth_then) & ~held_all
        kept[w.name] = lists
    return fresh, changed, kept, new


@dataclass(frozen=True)
class Task:
    """One held block of a pass of nearest lists, as a worker runs it (:func:`run_task`): the vector file's path,
    the selection, what is wanted, and which rows are computed anew (``fresh``) and which columns are new to the
    others (``changed``); the ``block`` held, of ``blocks``."""

    path: str
    selection: Selection
    wanted: tuple[Wanted, ...]
    metric: str
    stats: Stats | None
    fresh: np.ndarray
    changed: dict[str, np.ndarray]
    block_floats: int
    block: int
    new: np.ndarray | None = None


def run_task(task: Task) -> tuple[dict[str, Lists], dict[str, str], np.ndarray]:
    """One held block's part of every model's lists: its rows against every vector after them (the same products,
    in the same blocks, as the whole pass), the vectors it found damaged and its part of each row's sums of
    distances. The vector file is opened at ``task.path``: a worker on another machine reads it from a shared
    path."""
    vector_file = VectorFile(Path(task.path), read_only=True)
    try:
        offers = _Offers(task.metric, task.wanted, task.stats, task.fresh, task.changed, task.new)
        products = gram(
            vector_file,
            task.selection,
            known=CachedProducts(np.zeros((0, 0)), ~task.fresh),
            consumer=offers,
            block_floats=task.block_floats,
            held_blocks=[task.block],
        )
    finally:
        vector_file.close()
    return {name: nb.lists() for name, nb in offers.nearest.items()}, dict(products.damaged), offers.sums


#: How a pass's held blocks are run elsewhere (a Ray cluster: :mod:`modelvec.run.ray_blocks`): each task's result,
#: in any order.
TaskRunner = Callable[[Sequence[Task]], Iterable[tuple[dict[str, Lists], dict[str, str], np.ndarray]]]


@dataclass
class Found:
    """What a pass of nearest lists found: the ``lists``, the vectors ``damaged`` (model -> line), how many rows it
    ``computed`` anew, each row's ``sums`` (of distances, of squared distances, their count, over every other row)
    and, where lists are ranked by mutual proximity, each row's exact spread from them (``stats``: the lists'
    values ranked by it)."""

    lists: dict[str, Lists]
    damaged: dict[str, str]
    computed: int
    sums: np.ndarray
    stats: Stats | None = None
    #: the lists as the pass drew them (by the landmarks' spreads): what a later pass brings up to date
    drawn: dict[str, Lists] = field(default_factory=dict)


def nearest_lists(
    vector_file: VectorFile,
    selection: Selection,
    wanted: Sequence[Wanted],
    *,
    metric: str = "cosine",
    stats: Stats | None = None,
    earlier: Earlier | None = None,
    progress: Callable[[int, int], None] | None = None,
    runner: TaskRunner | None = None,
    block_floats: int | None = None,
    device: str = "cpu",
) -> Found:
    """Every model's ``wanted`` lists from one pass of products over the selection's vectors (each pair once).
    ``stats``: each model's spread from the landmarks, by which the lists ranked by mutual proximity are drawn; their
    values are then those of each model's exact spread, from its distances to every other (summed in the pass), each
    list sorted by them. ``earlier``: lists kept from before (for the same ranking): only the rows they cannot answer
    are computed, against every vector, and the others are offered the new columns alone: the same lists as a pass over
    all of them (a vector gone since: every row computed). ``runner``: the pass's held blocks run as tasks
    (:class:`Task`) elsewhere, their lists merged here (the nearest of the union is the nearest of each part's): the
    same lists. ``device``: where the pass's float32 products run here
    (:class:`~modelvec.store.derived.products.Compute`; a Ray cluster's tasks run theirs on their CPU)."""
    n = len(selection)
    if earlier is not None and (earlier.sums is None or set(earlier.hashes) - set(selection.hashes)):
        earlier = None  # a vector gone: its distances are in every kept sum
    kept: dict[str, Lists] = {}
    sums = np.zeros((n, 3))
    if earlier is None:
        fresh, changed, new = np.ones(n, dtype=bool), {w.name: w.eligible for w in wanted}, np.ones(n, dtype=bool)
    else:
        fresh, changed, kept, new = _from_earlier(earlier, selection, wanted)
        where = {h: i for i, h in enumerate(earlier.hashes)}
        source = np.array([where.get(h, -1) for h in selection.hashes], dtype=np.int64)
        assert earlier.sums is not None
        sums[~fresh] = np.asarray(earlier.sums)[source[~fresh]]
    offers = _Offers(metric, wanted, stats, fresh, changed, new)
    for w in wanted:
        if w.name in kept:
            offers.nearest[w.name].hold(kept[w.name], np.flatnonzero(~fresh))
    damaged = _passed(vector_file, selection, offers, runner, progress, block_floats, device)
    sums += offers.sums
    found = {name: nb.lists() for name, nb in offers.nearest.items()}
    if damaged:  # a damaged vector was read as zeros: out of every list
        keep = np.array([-1 if m in damaged else i for i, m in enumerate(selection.models)], dtype=np.int64)
        found = {name: lists.remapped(keep) for name, lists in found.items()}
    exact = spread_of(sums) if stats is not None else None
    return Found(reranked(found, ranked_names(wanted), exact), damaged, int(fresh.sum()), sums, exact, found)


def ranked_names(wanted: Sequence[Wanted]) -> set[str]:
    """The names of the ``wanted`` lists ranked by mutual proximity."""
    return {w.name for w in wanted if w.ranking == "rank"}


def reranked(
    lists: dict[str, Lists], ranked: Collection[str], stats: Stats | None, rows: np.ndarray | None = None
) -> dict[str, Lists]:
    """``lists``, those named in ``ranked`` ranked again by ``stats`` (each model's spread; None: all as they are),
    their plain distances kept; ``rows``: those lists for these rows alone (the others' come back empty)."""
    if stats is None:
        return dict(lists)
    out = {}
    for name, found in lists.items():
        if name in ranked and rows is not None:
            source = np.full(len(found), -1, np.int64)
            source[rows] = rows
            found = found.placed(source)
        out[name] = ranked_by(found, stats) if name in ranked else found
    return out


def _passed(
    vector_file: VectorFile,
    selection: Selection,
    offers: _Offers,
    runner: TaskRunner | None,
    progress: Callable[[int, int], None] | None,
    block_floats: int | None,
    device: str,
) -> dict[str, str]:
    """The pass itself, here or as a runner's tasks (merged into ``offers``): the vectors it found damaged."""
    floats = list_block_floats() if block_floats is None else block_floats
    fresh = offers.fresh
    if runner is None:
        known = CachedProducts(np.zeros((0, 0)), ~fresh)
        products = gram(
            vector_file, selection, known=known, consumer=offers, progress=progress, block_floats=floats, device=device
        )
        return dict(products.damaged)
    blocks = held_blocks_of(int(fresh.sum()), selection.dim, floats)
    path = os.path.abspath(vector_file.path)
    wanted, fresh, changed, new = tuple(offers.wanted), offers.fresh, offers.changed, offers.new
    tasks = [
        Task(path, selection, wanted, offers.metric, offers.stats, fresh, changed, floats, b, new)
        for b in range(blocks)
    ]
    damaged: dict[str, str] = {}
    for done, (part, bad, sums) in enumerate(runner(tasks), 1):
        for name, lists in part.items():
            owner = np.repeat(np.arange(len(lists)), lists.lengths())
            offers.nearest[name].add(owner, lists.index, lists.value, lists.distance)
        offers.sums += sums
        damaged.update(bad)
        if progress is not None:
            progress(done, blocks)
    return damaged

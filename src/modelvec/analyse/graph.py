"""Each model's nearest models as lists, never every pair: what the reports read where a population is too large for
its pairwise products (:mod:`modelvec.store.neighbours` fills them from row blocks streamed from the vector file).

:class:`Nearest` keeps, for every row, its ``depth`` nearest columns by (value, index), from blocks offered in any
order: each block's entries below the row's current cut are appended to a buffer twice the depth, compacted when it
fills. Memory is the rows' depths (twice), whatever the columns: O(n x depth). The lists it gives
(:class:`Lists`) are exactly the first ``depth`` columns a stable sort of each row's whole distances would give: ties
go to the lower index, as everywhere in :mod:`modelvec.analyse.scores`.

The scores read the lists (:func:`knn_from_lists`, :func:`predictions_from_lists`): the kNN dataset score needs
each model's k - 1 nearest, k its dataset's size, so a row's depth follows its labels (:func:`depths_for`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .inputs import label_sets, membership
from .neighbours import Yardstick
from .scores import KnnScore, Predictions

#: An index that sorts after every column (a slot that holds nothing).
_NONE = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Lists:
    """Each row's nearest columns, nearest first by (value, index): row ``i``'s are ``index[indptr[i]:indptr[i+1]]``
    with their ranking ``value`` and their plain ``distance`` (the same as ``value`` where neighbours are ranked by
    distance)."""

    indptr: np.ndarray
    index: np.ndarray
    value: np.ndarray
    distance: np.ndarray

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row ``i``'s columns, values and distances, nearest first."""
        a, b = self.indptr[i], self.indptr[i + 1]
        return self.index[a:b], self.value[a:b], self.distance[a:b]

    def lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def first(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``k`` nearest as (n, k) columns and distances (-1 and inf where a row holds fewer)."""
        n = len(self)
        index, distance = np.full((n, k), -1, np.int64), np.full((n, k), np.inf)
        take = np.minimum(self.lengths(), k)
        rows = np.repeat(np.arange(n), take)
        at = np.arange(len(rows)) - np.repeat(np.cumsum(take) - take, take)
        source = self.indptr[rows] + at
        index[rows, at], distance[rows, at] = self.index[source], self.distance[source]
        return index, distance

    def subset(self, rows: np.ndarray) -> Lists:
        """The lists of ``rows`` alone, in that order (columns as they are)."""
        rows = np.asarray(rows, np.int64)
        counts = self.lengths()[rows]
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        source = np.repeat(self.indptr[rows], counts) + (np.arange(counts.sum()) - np.repeat(indptr[:-1], counts))
        return Lists(indptr, self.index[source], self.value[source], self.distance[source])

    def placed(self, source: np.ndarray) -> Lists:
        """Lists in a new order of rows: row ``i`` holds what row ``source[i]`` held (nothing where it is -1)."""
        source = np.asarray(source, np.int64)
        counts = (
            np.where(source >= 0, self.lengths()[np.maximum(source, 0)], 0)
            if len(self)
            else np.zeros(len(source), np.int64)
        )
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        start = (
            np.where(source >= 0, self.indptr[np.maximum(source, 0)], 0)
            if len(self)
            else np.zeros(len(source), np.int64)
        )
        at = np.repeat(start, counts) + (np.arange(counts.sum()) - np.repeat(indptr[:-1], counts))
        return Lists(indptr, self.index[at], self.value[at], self.distance[at])

    def remapped(self, position: np.ndarray) -> Lists:
        """The lists with every column ``j`` renamed ``position[j]`` and the columns mapped to -1 dropped (rows are
        unchanged; each row stays sorted where ``position`` keeps the columns' order)."""
        new = np.asarray(position, np.int64)[self.index]
        keep = new >= 0
        owner = np.repeat(np.arange(len(self)), self.lengths())
        counts = np.bincount(owner[keep], minlength=len(self))
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return Lists(indptr, new[keep], self.value[keep], self.distance[keep])


class Nearest:
    """Every row's ``depth`` nearest columns by (value, index), from blocks offered in any order (see the module's
    docstring). ``depths``: per row (0: none kept)."""

    def __init__(self, depths: np.ndarray) -> None:
        self.depth = np.asarray(depths, dtype=np.int64).copy()
        if (self.depth < 0).any():
            raise ValueError("a row's depth is at least 0")
        capacity = 2 * self.depth
        self.start = np.concatenate(([0], np.cumsum(capacity)[:-1])).astype(np.int64)
        self.capacity = capacity
        size = int(capacity.sum())
        self.index = np.full(size, _NONE, np.int64)
        self.value = np.full(size, np.inf)
        self.distance = np.full(size, np.inf)
        self.fill = np.zeros(len(self.depth), np.int64)
        #: per row the (value, index) an entry must come before to be kept: the depth-th nearest held, once held
        self.cut = np.full(len(self.depth), np.inf)
        self.cut_index = np.full(len(self.depth), _NONE, np.int64)

    def __len__(self) -> int:
        return len(self.depth)

    def offer(
        self, rows: np.ndarray, columns: np.ndarray, values: np.ndarray, distances: np.ndarray | None = None
    ) -> None:
        """Offer each of ``rows`` the ``columns`` at ``values`` (len(rows) x len(columns); inf: not a neighbour it
        may have, such as itself) with their plain ``distances`` (default: the values)."""
        rows, columns = np.asarray(rows, np.int64), np.asarray(columns, np.int64)
        values = np.asarray(values, dtype=np.float64)
        if not len(rows) or not len(columns):
            return
        cut, cut_index = self.cut[rows, None], self.cut_index[rows, None]
        take = (values < cut) | ((values == cut) & (columns[None, :] < cut_index))
        take &= np.isfinite(values)
        take &= (self.depth[rows] > 0)[:, None]
        self._thin(take, values, self.depth[rows])
        r, c = np.nonzero(take)
        if not len(r):
            return
        value = values[r, c]
        distance = value if distances is None else np.asarray(distances, dtype=np.float64)[r, c]
        self.add(rows[r], columns[c], value, distance)

    @staticmethod
    def _thin(take: np.ndarray, values: np.ndarray, depth: np.ndarray) -> None:
        """Where a row is offered many more entries than its depth (a streamed row, offered a whole held block), keep
        only those at or below its ``depth``-th smallest value (ties all kept): none of the others can be among its
        nearest, and its buffer takes a few times its depth, not thousands. Rows are taken by depth rounded up to a
        power of two (a handful of partitions)."""
        offered = np.count_nonzero(take, axis=1)
        many = np.flatnonzero(offered > 4 * np.maximum(depth, 1))
        if not len(many):
            return
        width = 1 << np.ceil(np.log2(np.maximum(depth[many], 1))).astype(np.int64)
        for w in np.unique(width):
            at = many[width == w]
            sub = np.where(take[at], values[at], np.inf)
            bound = np.partition(sub, int(w) - 1, axis=1)[:, int(w) - 1]
            take[at] &= values[at] <= bound[:, None]

    def add(self, owner: np.ndarray, columns: np.ndarray, values: np.ndarray, distances: np.ndarray) -> None:
        """Offer each entry (``owner`` row, column, value, distance) to its row: what :meth:`offer` does with the
        entries of a block it keeps, and how lists found apart are merged (their rows' nearest of the union is
        the nearest of their nearest)."""
        owner, columns = np.asarray(owner, np.int64), np.asarray(columns, np.int64)
        if not len(owner):
            return
        keep = (self.depth[owner] > 0) & np.isfinite(values)
        keep &= (values < self.cut[owner]) | ((values == self.cut[owner]) & (columns < self.cut_index[owner]))
        owner, columns, values, distances = owner[keep], columns[keep], values[keep], distances[keep]
        if not len(owner):
            return
        order = np.argsort(owner, kind="stable")
        owner, columns, values, distances = owner[order], columns[order], values[order], distances[order]
        rows, counts = np.unique(owner, return_counts=True)
        over = rows[self.fill[rows] + counts > self.capacity[rows]]
        if len(over):  # rows whose buffer would overflow: compacted with what they are offered now
            self._compact(over, (owner, columns, values, distances))
            keep = ~np.isin(owner, over)
            owner, columns, values, distances = owner[keep], columns[keep], values[keep], distances[keep]
            rows, counts = np.unique(owner, return_counts=True)
        if not len(owner):
            return
        first = np.repeat(np.cumsum(counts) - counts, counts)
        at = self.start[owner] + self.fill[owner] + (np.arange(len(owner)) - first)
        self.index[at], self.value[at], self.distance[at] = columns, values, distances
        self.fill[rows] += counts

    def _compact(self, rows: np.ndarray, offered: tuple[np.ndarray, ...] | None = None) -> None:
        """Keep only each row's ``depth`` nearest of its buffer (and of ``offered``: (rows, columns, values,
        distances) entries for these rows), sorted, and move its cut to the last of them."""
        rows = np.unique(rows)
        mine, cols, vals, dists = offered if offered is not None else (np.zeros(0, np.int64),) * 4
        sel = np.isin(mine, rows)
        mine, cols, vals, dists = mine[sel], cols[sel], vals[sel], dists[sel]
        fill = self.fill[rows]
        # every row's buffer, then its offered entries, as one flat list grouped by row
        owner = np.concatenate((np.repeat(rows, fill), mine))
        slot = np.repeat(self.start[rows], fill) + (np.arange(fill.sum()) - np.repeat(np.cumsum(fill) - fill, fill))
        idx = np.concatenate((self.index[slot], cols))
        val = np.concatenate((self.value[slot], vals))
        dst = np.concatenate((self.distance[slot], dists))
        order = np.lexsort((idx, val, owner))
        owner, idx, val, dst = owner[order], idx[order], val[order], dst[order]
        firsts = np.searchsorted(owner, rows)
        counts = np.searchsorted(owner, rows, side="right") - firsts
        keep = np.minimum(counts, self.depth[rows])
        rank = np.arange(len(owner)) - np.repeat(firsts, counts)
        kept = rank < np.repeat(keep, counts)
        owner, idx, val, dst, rank = owner[kept], idx[kept], val[kept], dst[kept], rank[kept]
        at = self.start[owner] + rank
        self.index[at], self.value[at], self.distance[at] = idx, val, dst
        self.fill[rows] = keep
        full = keep == self.depth[rows]
        last = self.start[rows] + keep - 1
        self.cut[rows[full]] = self.value[last[full]]
        self.cut_index[rows[full]] = self.index[last[full]]

    def hold(self, lists: Lists, rows: np.ndarray) -> None:
        """Start each of ``rows`` (none offered anything yet) from its nearest in ``lists`` (sorted, as
        :meth:`lists` gives them; at most its depth kept)."""
        rows = np.asarray(rows, np.int64)
        counts = np.minimum(lists.lengths()[rows], self.depth[rows])
        source = np.repeat(lists.indptr[rows], counts) + (
            np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        )
        owner = np.repeat(rows, counts)
        rank = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
        at = self.start[owner] + rank
        self.index[at], self.value[at], self.distance[at] = (
            lists.index[source],
            lists.value[source],
            lists.distance[source],
        )
        self.fill[rows] = counts
        full = rows[counts == self.depth[rows]]
        last = self.start[full] + self.depth[full] - 1
        self.cut[full], self.cut_index[full] = self.value[last], self.index[last]

    def lists(self) -> Lists:
        """Every row's nearest, nearest first (the buffers compacted)."""
        busy = np.flatnonzero(self.fill > 0)
        if len(busy):
            self._compact(busy)
        counts = self.fill
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        slot = np.repeat(self.start, counts) + (np.arange(counts.sum()) - np.repeat(indptr[:-1], counts))
        return Lists(indptr, self.index[slot].copy(), self.value[slot].copy(), self.distance[slot].copy())


def depths_for(
    labels: Sequence[frozenset[str]] | Sequence[Sequence[str]],
    eligible: np.ndarray,
    *,
    groups: np.ndarray | None = None,
    votes: int = 0,
    slack: float = 0.0,
) -> np.ndarray:
    """Each row's depth among the ``eligible`` columns for the kNN score: the eligible models sharing one of its
    labels (its k - 1, itself not counted), plus, where ``groups`` (authors) are given, the eligible models of its
    own group (so that its k - 1 of other groups are held too), at least ``votes`` (the voters of a prediction), and
    ``slack`` more (a share: room for its dataset to grow without computing its row again)."""
    sets = [frozenset(s) for s in labels]
    n = len(sets)
    counts: dict[str, int] = {}
    for s, ok in zip(sets, eligible):
        if ok:
            for name in s:
                counts[name] = counts.get(name, 0) + 1
    depth = np.zeros(n, np.int64)
    for i, s in enumerate(sets):
        if s:
            if len(s) == 1:
                same = counts.get(next(iter(s)), 0)
            else:  # several labels: models sharing any of them (an upper bound: the sum)
                same = sum(counts.get(name, 0) for name in s)
            depth[i] = max(0, same - (1 if eligible[i] else 0))
    if groups is not None:
        mine = np.bincount(groups[(groups >= 0) & eligible], minlength=max(1, int(groups.max(initial=-1)) + 1))
        own = np.where(groups >= 0, mine[np.maximum(groups, 0)] - ((groups >= 0) & eligible), 0)
        depth = depth + own
    depth = np.maximum(depth, votes)
    depth = depth + np.ceil(depth * slack).astype(np.int64)
    return np.minimum(depth, int(np.count_nonzero(eligible)))


def label_codes(sets: Sequence[frozenset[str]]) -> tuple[list[str], np.ndarray] | None:
    """Each model's one label as a code (-1: none), or None where a model has several (the scores then compare
    sets)."""
    if any(len(s) > 1 for s in sets):
        return None
    names = sorted(set().union(*sets)) if sets else []
    code = {name: c for c, name in enumerate(names)}
    return names, np.array([code[next(iter(s))] if s else -1 for s in sets], dtype=np.int64)


def _entries(lists: Lists) -> np.ndarray:
    """The row of each entry of ``lists``."""
    return np.repeat(np.arange(len(lists)), lists.lengths())


def _shares(sets: Sequence[frozenset[str]], rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Whether each (row, column) pair shares a label."""
    codes = label_codes(sets)
    if codes is not None:
        code = codes[1]
        return (code[rows] == code[cols]) & (code[rows] >= 0)
    return np.array([bool(sets[r] & sets[c]) for r, c in zip(rows.tolist(), cols.tolist())], dtype=bool)


def hits_from_lists(
    lists: Lists,
    sets: Sequence[frozenset[str]],
    need: np.ndarray,
    groups: np.ndarray | None = None,
) -> np.ndarray:
    """For each row, how many of its ``need[r]`` nearest columns (those of its own group left out: ``groups``, -1 =
    none) share one of its labels: what a stable sort of the row's whole distances would count. A row whose list
    holds fewer than ``need[r]`` such columns was not kept deep enough: ValueError."""
    owner = _entries(lists)
    cols = lists.index
    ok = np.ones(len(cols), dtype=bool)
    if groups is not None:
        g = groups[owner]
        ok &= ~((g >= 0) & (g == groups[cols]))
    owner, cols = owner[ok], cols[ok]
    counts = np.bincount(owner, minlength=len(lists))
    short = np.flatnonzero(counts < need)
    if len(short):
        raise ValueError(f"{len(short)} rows' nearest lists are shallower than their datasets need (row {short[0]})")
    rank = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    within = rank < need[owner]
    same = _shares(sets, owner[within], cols[within])
    return np.bincount(owner[within][same], minlength=len(lists))


def _same_key(key: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """For each row, how many eligible rows have its ``key`` (0 for a key below 0; itself counted if eligible)."""
    uniq, counts = np.unique(key[eligible & (key >= 0)], return_counts=True)
    if not len(uniq):
        return np.zeros(len(key), np.int64)
    at = np.minimum(np.searchsorted(uniq, key), len(uniq) - 1)
    return np.where((key >= 0) & (uniq[at] == key), counts[at], 0)


def firsts(lists: Lists, k: int) -> list[np.ndarray]:
    """Each row's ``k`` nearest columns (fewer where it holds fewer)."""
    return [lists.index[a : min(b, a + k)] for a, b in zip(lists.indptr[:-1], lists.indptr[1:])]


def need_of(sets: Sequence[frozenset[str]], eligible: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Each row's k - 1 for the kNN score: the eligible columns sharing one of its labels, itself and (``groups``)
    its own group's left out, as :func:`~modelvec.analyse.scores.knn_dataset_score` counts them."""
    n = len(sets)
    eligible = np.asarray(eligible, dtype=bool)
    codes = label_codes(sets)
    need = np.zeros(n, np.int64)
    if codes is not None:
        code = codes[1]
        need = np.where(code >= 0, _same_key(code, eligible) - eligible, 0)
        if groups is not None:  # its own group's models of its label (itself already left out) left out too
            both = (code >= 0) & (groups >= 0)
            key = np.where(both, code * (int(groups.max(initial=0)) + 1) + groups, -1)
            need = need - np.where(both, _same_key(key, eligible) - eligible, 0)
        return need
    by_label: dict[str, list[int]] = {}
    for j, s in enumerate(sets):
        if eligible[j]:
            for name in s:
                by_label.setdefault(name, []).append(j)
    for i, s in enumerate(sets):
        if not s:
            continue
        cols = np.unique(np.concatenate([np.asarray(by_label.get(name, []), np.int64) for name in s]))
        cols = cols[cols != i]
        if groups is not None and groups[i] >= 0:
            cols = cols[groups[cols] != groups[i]]
        need[i] = len(cols)
    return need


def knn_from_lists(
    lists: Lists,
    labels: Sequence[Sequence[str]],
    eligible: np.ndarray,
    *,
    metric: str = "cosine",
    pool: str = "labelled",
    exclude_same: np.ndarray | None = None,
    scaling: str = "none",
) -> KnnScore:
    """:func:`~modelvec.analyse.scores.knn_dataset_score` from each row's nearest ``eligible`` columns (``lists``,
    ranked as ``scaling`` ranks them, deep enough: :func:`depths_for`): the same score, per model and per dataset.
    ``exclude_same``: group codes (:func:`~modelvec.analyse.inputs.group_codes`), as there."""
    n = len(lists)
    sets = label_sets(labels, n)
    names, member = membership(sets)
    labelled = member.any(axis=1)
    need = np.where(labelled, need_of(sets, eligible, exclude_same), 0)
    hits = hits_from_lists(lists, sets, need, exclude_same)
    per_model = np.full(n, np.nan)
    scored = need > 0
    per_model[scored] = hits[scored] / need[scored]
    per_dataset = {}
    for j, name in enumerate(names):
        mask = scored & member[:, j]
        if mask.any():
            per_dataset[name] = (float(per_model[mask].mean()), int(mask.sum()))
    return KnnScore(
        score=float(per_model[scored].mean()) if scored.any() else float("nan"),
        n_scored=int(scored.sum()),
        per_dataset=per_dataset,
        per_model=per_model,
        metric=metric,
        pool=pool,
        scaling=scaling,
    )


def predictions_from_lists(
    voters: Lists,
    labels: Sequence[Sequence[str]],
    stick: Yardstick,
    nearest_plain: np.ndarray,
    *,
    k: int = 5,
    metric: str = "cosine",
    scaling: str = "none",
) -> Predictions:
    """:func:`~modelvec.analyse.scores.predict_datasets` from each row's nearest labelled columns (``voters``, ranked
    as ``scaling`` ranks them, at least ``k`` deep), the labelled models' ``stick`` and each row's plain distance to
    its nearest labelled model (``nearest_plain``: where a cosine of 0 or less says it shares no direction)."""
    n = len(voters)
    names, member = membership(label_sets(labels, n))
    labelled = np.flatnonzero(member.any(axis=1))
    predicted: list[str | None] = [None] * n
    share, near = np.full(n, np.nan), np.full(n, np.nan)

    def vote(neighbours: np.ndarray) -> tuple[int, float]:  # nearest first, as predict_datasets votes
        votes = member[neighbours]
        counts = votes.sum(axis=0)
        tied = np.flatnonzero(counts == counts.max())
        winner = int(tied[np.argmin(np.argmax(votes[:, tied], axis=0))])
        return winner, float(counts[winner] / counts.sum())

    if len(labelled):
        top = min(k, len(labelled))
        for i in np.flatnonzero(~member.any(axis=1)):
            cols, values, _ = voters.row(int(i))
            winner, share[i] = vote(cols[:top])
            predicted[i] = names[winner]
            apart = metric == "cosine" and nearest_plain[i] >= 1.0
            near[i] = stick.closeness(float(values[0]), shares_direction=not apart)
    correct, n_loo = 0, len(labelled) if len(labelled) >= 2 else 0
    if n_loo:
        top = min(k, len(labelled) - 1)
        for i in labelled:
            winner, _ = vote(voters.row(int(i))[0][:top])
            correct += bool(member[i, winner])
    return Predictions(
        predicted=predicted,
        confidence=share * near,
        vote_share=share,
        closeness=near,
        loo_accuracy=correct / n_loo if n_loo else float("nan"),
        n_loo=n_loo,
        k=k,
        metric=metric,
        scaling=scaling,
    )


def nearest_rows(rows: np.ndarray, depth: int, *, block: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``depth`` nearest other rows by euclidean distance and its ``depth`` nearest by cosine, merged
    (n x 2 depth, -1 where fewer), with their inner products (float64, from the float32 rows' products), from the
    rows' products a block at a time, each pair once: what a model's parents are looked for among where every pair
    would be too many (the model tree of tens of thousands of traces). Memory: a block of products (``block`` x n)
    and the lists, beside the rows."""
    t = np.ascontiguousarray(rows, dtype=np.float32)
    n = len(t)
    squares = np.einsum("ij,ij->i", t, t, dtype=np.float64)
    norms = np.sqrt(squares)
    inverse = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    near, along = Nearest(np.full(n, min(depth, n - 1))), Nearest(np.full(n, min(depth, n - 1)))
    for a0 in range(0, n, block):
        a1 = min(n, a0 + block)
        P = (t[a0:a1] @ t[a0:].T).astype(np.float64)  # this block against itself and every row after it
        cols = np.arange(a0, n)
        mine = np.arange(a0, a1)
        D = np.sqrt(np.maximum(squares[mine, None] + squares[None, a0:] - 2 * P, 0.0))
        C = 1.0 - P * np.multiply.outer(inverse[mine], inverse[a0:])
        for V, nb in ((D, near), (C, along)):
            V[np.arange(a1 - a0), np.arange(a1 - a0)] = np.inf  # itself
            nb.offer(mine, cols, V, P)  # the product kept as the entry's "distance": what the tree asks
            if a1 < n:  # the other side of the pairs beyond the block (its own square holds both)
                nb.offer(cols[a1 - a0 :], mine, V[:, a1 - a0 :].T, P[:, a1 - a0 :].T)
    index, dots = np.full((n, 2 * depth), -1, np.int64), np.zeros((n, 2 * depth))
    for k, nb in enumerate((near, along)):
        index[:, k * depth : (k + 1) * depth], dots[:, k * depth : (k + 1) * depth] = nb.lists().first(depth)
    dots[index < 0] = 0.0
    return index, dots

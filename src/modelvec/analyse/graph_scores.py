"""The scores from each model's nearest lists (:mod:`modelvec.analyse.graph`): the kNN dataset score and the
predictions, the same as :mod:`modelvec.analyse.scores` gives them from every pair's distances, and how deep each
model's list must be for them (:func:`depths_for`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .graph import Lists
from .inputs import label_sets, membership
from .neighbours import Yardstick
from .scores import KnnScore, Predictions, knn_score_of


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
    return knn_score_of(per_model, names, member, metric=metric, pool=pool, scaling=scaling)


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

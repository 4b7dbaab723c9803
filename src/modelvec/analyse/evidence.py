"""Evidence that generalises: a split by dataset, bootstrap intervals, adapters beside full fine-tunes.

A representation chosen and scored on the same models proves little. ``split_datasets`` cuts a
collection by dataset into a selection half (where a representation is picked) and a report half
(where it is scored); ``bootstrap_interval`` puts a confidence interval over models on a score;
``mixed_scores`` says whether LoRA adapters and full fine-tunes share one map by dataset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .scores import distance_matrix, knn_dataset_score


def split_datasets(datasets: Iterable[str], selection: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """(selection half, report half) of the dataset names, disjoint, each sorted.

    Without ``selection`` the cut is fixed by the names alone: datasets ordered by the SHA-256 of
    their name, the first half (rounded down) selects. With ``selection`` those datasets select and
    every other one reports; naming a dataset that is not in the collection is an error.
    """
    names = sorted(set(datasets))
    if selection is None:
        ordered = sorted(names, key=lambda d: hashlib.sha256(d.encode()).hexdigest())
        chosen = set(ordered[: len(ordered) // 2])
    else:
        chosen = set(selection)
        unknown = sorted(chosen - set(names))
        if unknown:
            raise ValueError(f"selection names datasets no model has: {', '.join(unknown)}")
    select = [d for d in names if d in chosen]
    report = [d for d in names if d not in chosen]
    if len(select) < 2 or len(report) < 2:
        raise ValueError(
            f"a split needs at least 2 datasets in each half (selection {len(select)}, report {len(report)})"
        )
    return select, report


def bootstrap_interval(
    values: np.ndarray, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one per model; NaN ignored)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float(lo), float(hi)


@dataclass(frozen=True)
class MixedScores:
    """How adapters and full fine-tunes share one space (NaN where a part has too few models)."""

    knn_full: float  # kNN dataset score among full fine-tunes only
    knn_adapters: float  # among adapters only
    knn_mixed: float  # over both together
    adapter_to_full: float  # share of adapters whose nearest full fine-tune has the adapter's dataset
    n_adapters: int


def mixed_scores(
    X: np.ndarray,
    labels: Sequence[Sequence[str]],
    is_adapter: Sequence[bool],
    *,
    metric: str = "cosine",
    scaling: str = "none",
) -> MixedScores:
    """The kNN dataset score among full fine-tunes, among adapters and over both, and how often an
    adapter's nearest full fine-tune shares its dataset.

    Each kind's score treats that kind as the whole collection (for ``scaling``, too); the
    nearest full fine-tune is ranked within the mixed collection.
    """
    adapter = np.asarray(is_adapter, dtype=bool)
    M = np.asarray(X, dtype=np.float64)

    def knn(mask: np.ndarray) -> float:
        idx = np.flatnonzero(mask)
        return (
            knn_dataset_score(M[idx], [labels[i] for i in idx.tolist()], metric=metric, scaling=scaling).score
            if len(idx) > 1
            else np.nan
        )

    hits = []
    full = np.flatnonzero(~adapter & np.array([bool(lab) for lab in labels]))
    if len(full) and adapter.any():
        D = distance_matrix(M, metric=metric, scaling=scaling)
        for i in np.flatnonzero(adapter).tolist():
            if labels[i]:
                j = int(full[np.argmin(D[i, full])])  # first minimum: ties go to the lower index
                hits.append(bool(set(labels[i]) & set(labels[j])))
    return MixedScores(
        knn_full=knn(~adapter),
        knn_adapters=knn(adapter),
        knn_mixed=knn(np.ones(len(M), bool)),
        adapter_to_full=float(np.mean(hits)) if hits else np.nan,
        n_adapters=int(adapter.sum()),
    )

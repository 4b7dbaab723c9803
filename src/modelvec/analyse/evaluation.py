"""Which representation? The pure side of comparing them: scores of one representation's vectors, beside exact
references, over halves of the datasets.

Arrays in, numbers out. Embedding every variant and forming the exact task vectors from checkpoints is
:func:`modelvec.studies.compare.evaluate`'s; it hands what it computed to :func:`score_row`.
``ref_corr`` is the Pearson correlation between a variant's pairwise cosine similarities and the
reference's: 1.0 means the variant sees the same geometry as the full deltas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .clustering import clustering_scores
from .evidence import bootstrap_interval, mixed_scores, split_datasets
from .scores import Geometry, knn_dataset_score, predict_datasets

REFERENCE = "task vectors (exact reference)"
#: The same with every block (layer and matrix) unit-normed, as block normalisation does to the sketches.
REFERENCE_BN = "task vectors, block-normed (exact reference)"


@dataclass
class TaskVectors:
    """Inner products of the flattened deltas of every pair of models (float64), and their size."""

    gram: np.ndarray
    dim: int
    seconds_per_model: float
    is_adapter: np.ndarray  # per model: a LoRA adapter (its delta from its factors), not a full fine-tune
    gram_bn: np.ndarray | None = None  # the same with every matrix's delta unit-normed (a zero delta stays zero)

    def embedding(self) -> np.ndarray:
        """Rows whose inner products are the Gram matrix (X X^T = G), for distance-based scores."""
        return gram_embedding(self.gram)


def cosine_similarities(X: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    unit = np.divide(X, norms, out=np.zeros_like(X, dtype=np.float64), where=norms > 0)
    return unit @ unit.T


def gram_embedding(gram: np.ndarray) -> np.ndarray:
    """Rows whose inner products are ``gram`` (X X^T = G), for distance-based scores."""
    evals, evecs = np.linalg.eigh(gram)
    return (evecs * np.sqrt(np.clip(evals, 0, None))).astype(np.float64)


def score_row(
    name: str,
    X: np.ndarray | Sequence[np.ndarray],
    labels: Sequence[Sequence[str]],
    reference: np.ndarray | None,
    *,
    metric: str = "cosine",
    k: int = 5,
    seed: int = 0,
    is_adapter: Sequence[bool] | None = None,
    n_boot: int = 2000,
    scaling: str = "none",
    clustering: dict[str, float] | None = None,
) -> dict[str, object]:
    """The scores of one representation's vectors against the labels (and the reference geometry).

    ``X`` is one matrix of vectors, or one per seed of the representation (the same models): each
    score is then the mean over seeds, and ``knn_spread`` (with ``knn_full_spread``,
    ``knn_adapters_spread`` where adapters are present) is its range, max - min, over seeds.
    ``knn_lo``/``knn_hi``: 95 % bootstrap interval of the kNN score over models (each model's score
    averaged over seeds). With adapters among the models (``is_adapter``), also the kNN score among
    full fine-tunes and among adapters, and the share of adapters whose nearest full fine-tune has
    their dataset. ``scaling`` applies to the neighbour-based scores (kNN, leave-one-out, adapters);
    the clusterers and ``ref_corr`` see the vectors' own geometry (``clustering``: those scores already
    computed for the first X).
    """
    Xs = [X] if isinstance(X, np.ndarray) else list(X)
    geos = [Geometry(x, metric) for x in Xs]  # each seed's rows prepared, and their products taken, once
    knns = [knn_dataset_score(g, labels, metric=metric, scaling=scaling) for g in geos]
    per_model = np.nanmean(np.stack([kn.per_model for kn in knns]), axis=0) if len(knns) > 1 else knns[0].per_model
    lo, hi = bootstrap_interval(per_model, n_boot=n_boot, seed=seed)
    scores = [kn.score for kn in knns]
    row: dict[str, object] = {
        "method": name,
        "knn_score": float(np.mean(scores)),
        "knn_lo": lo,
        "knn_hi": hi,
        "knn_spread": float(np.ptp(scores)),
        "n_scored": knns[0].n_scored,
        "loo_accuracy": float(
            np.mean([predict_datasets(g, labels, k=k, metric=metric, scaling=scaling).loo_accuracy for g in geos])
        ),
    }
    row.update(clustering if clustering is not None else clustering_scores(geos[0], labels, metric=metric, seed=seed))
    if reference is not None:
        iu = np.triu_indices(len(Xs[0]), 1)
        row["ref_corr"] = float(np.mean([np.corrcoef(cosine_similarities(x)[iu], reference[iu])[0, 1] for x in Xs]))
    if is_adapter is not None and any(is_adapter):
        mixed = [mixed_scores(x, labels, is_adapter, metric=metric, scaling=scaling) for x in Xs]
        for field in ("knn_full", "knn_adapters", "adapter_to_full"):
            row[field] = float(np.mean([getattr(m, field) for m in mixed]))
        row["knn_full_spread"] = float(np.ptp([m.knn_full for m in mixed]))
        row["knn_adapters_spread"] = float(np.ptp([m.knn_adapters for m in mixed]))
    return row


def halves(
    labels: Sequence[Sequence[str]], split: bool | None, selection: Sequence[str] | None
) -> dict[str, np.ndarray]:
    """Model indices per half: {"all": ...}, or {"selection": ..., "report": ...} split by dataset.

    A model belongs to a half when all its datasets do; unlabelled models (and, rarely, models
    whose datasets straddle the cut) are in neither half of a split.
    """
    datasets = sorted({d for lab in labels for d in lab})
    if split is None:
        split = selection is not None or len(datasets) >= 4
    if not split:
        return {"all": np.arange(len(labels))}
    select, report = split_datasets(datasets, selection)
    out = {}
    for half, names in (("selection", set(select)), ("report", set(report))):
        out[half] = np.array([i for i, lab in enumerate(labels) if lab and set(lab) <= names], dtype=np.int64)
    return out


def centred(X: np.ndarray) -> np.ndarray:
    return X - X.mean(axis=0, keepdims=True)

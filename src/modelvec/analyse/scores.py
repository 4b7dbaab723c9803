"""Do the vectors cluster by the dataset each model was fine-tuned on?

Inputs everywhere: ``X`` (n_models, dim), float32 or float64, or a :class:`~modelvec.analyse.geometry.Geometry` of
them, and ``labels``: one sequence of dataset names per model (empty = unlabelled; usually one name; several
allowed), checked as :mod:`modelvec.analyse.inputs` says. The headline number is :func:`knn_dataset_score` (the
project description's k-NN measure); the rest answer the follow-up questions: what would the unlabelled models be
(:func:`predict_datasets`), do generic clusterers recover the datasets
(:func:`~modelvec.analyse.clustering.clustering_scores`), which models look alike
(:func:`~modelvec.analyse.neighbours.nearest`).

Rules shared by every function, so that two functions never disagree about a neighbour:

- Distances are computed in one module, :mod:`modelvec.analyse.geometry`, in float64 (its docstring says how, and
  how a zero vector counts); ``scaling="mutual-proximity"`` re-ranks them (:mod:`modelvec.analyse.proximity`).
- A model is never its own neighbour: its own distance is set to +inf explicitly, since with a
  duplicate vector elsewhere (distance 0) it need not be the first one in sorted order.
- Ties in distance (equal computed values) are broken by model index, lower first: every ranking
  is a full stable argsort, so results are deterministic.
- Memory: neighbours are ranked in row blocks (:mod:`modelvec.analyse.ranking`), O(block x n_models) beyond the
  float64 copy of X, except what a :class:`~modelvec.analyse.geometry.Geometry` keeps: every inner product up to
  4,096 rows, and, for mutual proximity, every pair's scaled distance up to 16,384 rows (n x n float64: 2 GiB).

The names of the modules this one was split from are importable from here, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..core.settings import validate_params
from .geometry import EXACT_COORDINATES, TOP_COORDINATES, Geometry, coordinates_of, geometry_of, query_distances
from .inputs import (
    AUTO,
    METRICS,
    NEIGHBORS_SCORING,
    POOLS,
    SCALINGS,
    Scoring,
    check_scaling,
    field_of,
    group_codes,
    label_sets,
    membership,
)
from .neighbours import (
    Yardstick,
    cosine_contributions,
    distance_matrix,
    majority_dataset,
    nearest,
    nearest_to,
    ruler,
    yardstick,
)
from .parallel import in_order
from .ranking import blocks, candidates, hits_within, nearest_distances, off_limits, ranked

__all__ = [
    "AUTO",
    "EXACT_COORDINATES",
    "METRICS",
    "NEIGHBORS_SCORING",
    "POOLS",
    "SCALINGS",
    "TOP_COORDINATES",
    "Geometry",
    "KnnScore",
    "Predictions",
    "Scoring",
    "Yardstick",
    "block_knn_scores",
    "coordinates_of",
    "cosine_contributions",
    "distance_matrix",
    "knn_dataset_score",
    "majority_dataset",
    "nearest",
    "nearest_to",
    "predict_datasets",
    "query_distances",
    "yardstick",
]


@dataclass(frozen=True, eq=False, kw_only=True)
class KnnScore:
    """The k-NN dataset score: ``score`` is the mean of ``per_model`` over the scored models."""

    score: float
    n_scored: int
    per_dataset: dict[str, tuple[float, int]]  # dataset -> (mean over its scored models, count)
    per_model: np.ndarray  # (n_models,), nan where a model is not scored
    metric: str
    pool: str
    scaling: str = "none"


@dataclass(frozen=True, eq=False, kw_only=True)
class Predictions:
    """Majority-vote datasets for the unlabelled models, and the same rule's leave-one-out accuracy."""

    predicted: list[str | None]  # None for labelled models (and when no labelled model exists)
    confidence: np.ndarray  # (n_models,), vote_share x closeness; nan where nothing was predicted
    vote_share: np.ndarray  # (n_models,), the winner's share of the votes
    closeness: np.ndarray  # (n_models,), see :meth:`Yardstick.closeness`
    loo_accuracy: float
    n_loo: int
    k: int
    metric: str
    scaling: str = "none"


@validate_params(pool=field_of(Scoring), scaling=check_scaling)
def knn_dataset_score(
    X: np.ndarray | Geometry,
    labels: Sequence[Sequence[str]],
    *,
    metric: str = "cosine",
    pool: str = "labelled",
    exclude_same: Sequence[object] | None = None,
    scaling: str = "none",
) -> KnnScore:
    """Share of each labelled model's k-1 nearest neighbours tuned on the same dataset, averaged.

    For a model f whose dataset has k >= 2 models, take its k-1 nearest neighbours (f excluded)
    and count the share tuned on f's dataset; ``score`` is the mean over scored models. Chance
    level for random labels is about (k-1)/(n-1) per model, so compare against that, not 0.

    - ``pool="labelled"``: neighbours are drawn from the labelled models only. ``pool="all"``:
      unlabelled models are candidates too and always count as misses (a model of unknown
      dataset sitting inside a cluster lowers that cluster's score).
    - Unlabelled models are never scored; nor is a model with no other labelled model sharing a
      label (k = 1). Both are nan in ``per_model`` and absent from the mean.
    - Multi-label rule: for f with label set L_f, k-1 is the number of other labelled models
      sharing at least one label with f, and a neighbour is a hit when it shares any label with
      f. In ``per_dataset`` a multi-label model counts under each of its labels. With one label
      per model this is exactly the definition above. Datasets with no scored model are absent.
    - ``exclude_same`` (e.g. each model's author): models sharing f's value are neither
      neighbours of f nor among its k-1, so the score measures whether f lands among *other
      uploaders'* models of its dataset — an author effect (one uploader's near-identical runs)
      cannot pass for a dataset effect. Models without a value exclude nothing.
    - ``scaling="mutual-proximity"`` ranks neighbours by mutual proximity over all rows of X
      (:mod:`~modelvec.analyse.proximity`): for collections that mix kinds of models, such as adapters and full
      fine-tunes, whose distances differ in scale.
    - Distances, zero vectors and ties: see the module docstring (ties go to the lower index).
    """
    geo = geometry_of(X, metric)
    n = len(geo)
    sets = label_sets(labels, n)
    names, member = membership(sets)
    labelled = member.any(axis=1)
    columns = np.flatnonzero(labelled) if pool == "labelled" else np.arange(n)
    per_model = np.full(n, np.nan)
    groups = group_codes(exclude_same, n)
    geo.rank_all(scaling)
    shares = sharing(member)

    def of_block(block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        off = off_limits(block, columns, groups)  # f itself is not one of "the other" k-1, nor its group's
        same = shares(block, columns)  # shares a label; unlabelled never do
        same[off] = False
        k_minus_1 = np.count_nonzero(same, axis=1)
        return block, hits_within(candidates(geo, block, columns, groups, scaling, off), same, k_minus_1), k_minus_1

    for block, hits, k_minus_1 in in_order(of_block, blocks(np.flatnonzero(labelled), len(columns))):
        scored = k_minus_1 > 0
        per_model[block[scored]] = hits[scored] / k_minus_1[scored]
    return knn_score_of(per_model, names, member, metric=metric, pool=pool, scaling=scaling)


def knn_score_of(
    per_model: np.ndarray, names: Sequence[str], member: np.ndarray, *, metric: str, pool: str, scaling: str
) -> KnnScore:
    """The :class:`KnnScore` of these models' own scores (``per_model``: nan where a model is not scored), each
    dataset's the mean of its members' (``names``, ``member``: :func:`~modelvec.analyse.inputs.membership`)."""
    scored = ~np.isnan(per_model)
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


def sharing(member: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Which rows share a label with which columns (``member``: models x datasets, boolean): codes compared where
    every model has at most one label, a product of memberships otherwise."""
    if member.sum(axis=1).max(initial=0) <= 1:
        code = np.where(member.any(axis=1), member.argmax(axis=1), -1) if member.shape[1] else np.full(len(member), -1)
        return lambda rows, columns: (code[rows][:, None] == code[columns][None, :]) & (code[rows][:, None] >= 0)
    member_f = member.astype(np.float32)
    return lambda rows, columns: (member_f[rows] @ member_f[columns].T) > 0


@validate_params(k=field_of(Scoring), scaling=check_scaling)
def predict_datasets(
    X: np.ndarray | Geometry,
    labels: Sequence[Sequence[str]],
    *,
    k: int = 5,
    metric: str = "cosine",
    scaling: str = "none",
) -> Predictions:
    """Majority dataset among each unlabelled model's k nearest labelled models.

    Each neighbour votes once for each of its labels; the winner has the most votes, ties going
    to the dataset of the nearest neighbour among them; ``vote_share`` is the winner's share of all votes cast.
    With fewer than k labelled models, all of them vote.

    ``closeness`` says whether those neighbours are near at all (:meth:`Yardstick.closeness`), and ``confidence`` is
    vote share x closeness: a unanimous vote of models that are far away is not a confident prediction.

    ``loo_accuracy`` applies the same rule to every labelled model, voting among the *other*
    labelled models, and counts it correct when the winner is one of its labels; ``n_loo`` is
    the number of models so predicted (all labelled models, when there are at least two). A
    model whose dataset has no other model can never be right: it counts as a miss, as it would
    in deployment. nan / 0 when fewer than two models are labelled. ``scaling``: as in
    :func:`knn_dataset_score`.
    """
    geo = geometry_of(X, metric)
    n = len(geo)
    names, member = membership(label_sets(labels, n))
    labelled = np.flatnonzero(member.any(axis=1))
    geo.rank_all(scaling)
    predicted: list[str | None] = [None] * n
    share, near = np.full(n, np.nan), np.full(n, np.nan)

    def vote(neighbours: np.ndarray) -> tuple[int, float]:  # ``neighbours`` nearest first
        votes = member[neighbours]
        counts = votes.sum(axis=0)
        tied = np.flatnonzero(counts == counts.max())
        winner = int(tied[np.argmin(np.argmax(votes[:, tied], axis=0))])  # the tied dataset seen nearest first
        return winner, float(counts[winner] / counts.sum())

    if len(labelled):
        unlabelled = np.flatnonzero(~member.any(axis=1))
        top = min(k, len(labelled))
        for block, order in ranked(geo, unlabelled, labelled, scaling=scaling, depth=top):
            for i, ranks in zip(block, order):
                winner, share[i] = vote(labelled[ranks[:top]])
                predicted[i] = names[winner]
        stick = ruler(geo, labelled, scaling)
        mine = nearest_distances(geo, unlabelled, labelled, scaling)
        apart = nearest_distances(geo, unlabelled, labelled, "none") >= 1.0 if metric == "cosine" else None
        for j, i in enumerate(unlabelled):
            near[i] = stick.closeness(float(mine[j]), shares_direction=apart is None or not apart[j])

    correct, n_loo = 0, len(labelled) if len(labelled) >= 2 else 0
    if n_loo:
        top = min(k, len(labelled) - 1)
        for block, order in ranked(geo, labelled, labelled, scaling=scaling, depth=top):
            for i, ranks in zip(block, order):
                winner, _ = vote(labelled[ranks[:top]])
                correct += bool(member[i, winner])
    loo = correct / n_loo if n_loo else float("nan")
    return Predictions(
        predicted=predicted,
        confidence=share * near,
        vote_share=share,
        closeness=near,
        loo_accuracy=loo,
        n_loo=n_loo,
        k=k,
        metric=metric,
        scaling=scaling,
    )


def block_knn_scores(
    X: np.ndarray,
    labels: Sequence[Sequence[str]],
    bounds: Sequence[tuple[int, int]],
    *,
    metric: str = "cosine",
    scaling: str = "none",
) -> np.ndarray:
    """The kNN dataset score of each block of the vectors alone (columns [start, stop)): which layers and
    families separate the datasets best."""
    score = lambda bound: knn_dataset_score(X[:, bound[0] : bound[1]], labels, metric=metric, scaling=scaling).score
    return np.array(list(in_order(score, bounds)), dtype=np.float64)  # the blocks on every core

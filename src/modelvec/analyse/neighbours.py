"""Which models look alike: the distances neighbours are ranked by (:func:`distance_matrix`), a query's nearest rows
(:func:`nearest`, :func:`nearest_to`), what near and far mean among labelled models (:class:`Yardstick`), the vote
of neighbours (:func:`majority_dataset`), and each block's share of a cosine (:func:`cosine_contributions`).

Rules shared with :mod:`modelvec.analyse.scores`, so that two functions never disagree about a neighbour: distances
as :mod:`modelvec.analyse.geometry` computes them; a model is never its own neighbour (its own distance is +inf,
since with a duplicate vector elsewhere at distance 0 it need not be first in sorted order); ties go to the lower
index (a full stable argsort); ``scaling="mutual-proximity"`` ranks by :mod:`modelvec.analyse.proximity`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.settings import validate_params
from .geometry import Geometry, geometry_of, prepare_rows, row_distances
from .inputs import Scoring, as_matrix, check_scaling, field_of, integer, label_sets, membership
from .proximity import scaled
from .ranking import nearest_distances


@validate_params(scaling=check_scaling)
def distance_matrix(X: np.ndarray | Geometry, *, metric: str = "cosine", scaling: str = "none") -> np.ndarray:
    """(n, n) distances between the rows of X, as every function here ranks them (diagonal 0)."""
    geo = geometry_of(X, metric)
    everyone = np.arange(len(geo))
    D = geo.distances(everyone, everyone)
    stats = geo.spread(scaling)
    if stats is not None:
        D = scaled(D, stats, stats)
    np.fill_diagonal(D, 0.0)
    return D


@dataclass(frozen=True)
class Yardstick:
    """What near and far mean among the stored labelled models, to judge a query's neighbours by.

    ``near``: the median distance of a labelled model to its nearest labelled neighbour; ``far``: the median
    distance between two labelled models (mostly unrelated ones). Both over every labelled model up to 256 of
    them; above, over 256 spread evenly (each against all): a query of 10,000 stored models reads 256 rows of their
    distances, not all of them. nan when fewer than two are labelled.
    """

    near: float
    far: float

    def closeness(self, distance: float, *, shares_direction: bool = True) -> float:
        """1 when ``distance`` (a query's to its nearest labelled model) is no more than ``near``; 0 from ``far``
        on, where a neighbour is no nearer than an unrelated model; linear between. 0 too when
        ``shares_direction`` is False (cosine: the neighbour's change points no way along the query's). A query
        unlike anything stored gets no confidence, however unanimous its neighbours' votes; nan: no yardstick."""
        if self.near != self.near or distance != distance:
            return float("nan")
        if not shares_direction or distance >= self.far:
            return 0.0
        if distance <= self.near:
            return 1.0
        return float((self.far - distance) / (self.far - self.near))


_FAR_SAMPLE = 256  # rows whose distances to every labelled model give ``Yardstick`` (all of them up to this many)


def ruler(geo: Geometry, labelled: np.ndarray, scaling: str) -> Yardstick:
    """The :class:`Yardstick` of the rows ``labelled`` of ``geo``, by the distances ranked under ``scaling``."""
    if len(labelled) < 2:
        return Yardstick(float("nan"), float("nan"))
    rows = labelled[np.linspace(0, len(labelled) - 1, min(len(labelled), _FAR_SAMPLE)).round().astype(int)]
    near = float(np.median(nearest_distances(geo, rows, labelled, scaling)))
    D = geo.ranked_distances(rows, labelled, scaling)
    far = float(np.median(D[labelled[None, :] != rows[:, None]]))
    return Yardstick(near, max(far, near))


@validate_params(scaling=check_scaling)
def yardstick(
    X: np.ndarray | Geometry,
    labels: Sequence[Sequence[str]],
    *,
    metric: str = "cosine",
    scaling: str = "none",
    exclude: int | None = None,
) -> Yardstick:
    """The :class:`Yardstick` of the labelled rows of X (``exclude``: a row left out, e.g. the query itself),
    distances as :func:`nearest` gives them."""
    geo = geometry_of(X, metric)
    _, member = membership(label_sets(labels, len(geo)))
    labelled = np.flatnonzero(member.any(axis=1))
    return ruler(geo, labelled[labelled != exclude] if exclude is not None else labelled, scaling)


def majority_dataset(neighbour_labels: Sequence[Sequence[str]]) -> tuple[str | None, float, dict[str, int]]:
    """The dataset most of these neighbours were tuned on: (winner, its vote share, votes per dataset).

    The rule of :func:`predict_datasets`: each neighbour (nearest first) votes once for each of its labels, ties go
    to the dataset of the nearest neighbour among them. (None, nan, {}) when no neighbour has a label.
    """
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, labels in enumerate(neighbour_labels):
        for name in sorted(set(labels)):
            votes[name] = votes.get(name, 0) + 1
            first.setdefault(name, i)
    if not votes:
        return None, float("nan"), {}
    winner = min(votes, key=lambda name: (-votes[name], first[name], name))
    order = sorted(votes, key=lambda name: (-votes[name], first[name], name))  # the winner first
    return winner, votes[winner] / sum(votes.values()), {name: votes[name] for name in order}


def nearest(
    X: np.ndarray | Geometry,
    query: np.ndarray,
    *,
    k: int = 10,
    metric: str = "cosine",
    exclude: int | None = None,
    scaling: str = "none",
) -> tuple[np.ndarray, np.ndarray]:
    """Indices and distances of the k rows of X nearest to ``query``, by (distance, index).

    ``exclude`` drops one row, typically the query model itself (by index, not by distance, so
    a duplicate of the query is still returned at distance 0). Fewer than k rows: all of them.
    ``scaling="mutual-proximity"``: distances are -log MP, the spreads taken over the rows of X,
    and the query's over the rows other than ``exclude``.
    """
    geo = geometry_of(X, metric)
    vectors = geo.vectors
    if vectors is None:
        raise ValueError("a Geometry made from products ranks a query by its distances: use nearest_to")
    dim = vectors.shape[1]
    q = as_matrix(np.asarray(query).reshape(1, -1) if np.ndim(query) == 1 else query, "query")
    if q.shape != (1, dim):
        raise ValueError(f"query must be one vector of length {dim}, not shape {np.shape(query)}")
    return nearest_to(
        geo, row_distances(prepare_rows(q, metric), vectors, metric)[0], k=k, exclude=exclude, scaling=scaling
    )


@validate_params(k=field_of(Scoring), scaling=check_scaling, exclude=integer(0))
def nearest_to(
    geo: Geometry, distances: np.ndarray, *, k: int = 10, exclude: int | None = None, scaling: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nearest` of a query given by its ``distances`` to the rows of ``geo`` (:func:`~modelvec.analyse.geometry.query_distances`)."""
    n = len(geo)
    D = np.asarray(distances, dtype=np.float64).reshape(1, -1)
    if D.shape[1] != n:
        raise ValueError(f"distances must hold one per row ({n}), not {D.shape[1]}")
    if exclude is not None and exclude >= n:
        raise ValueError(f"exclude must be a row index < {n}, not {exclude}")
    stats = geo.spread(scaling)
    if stats is not None:
        others = np.ones(n, dtype=bool)
        if exclude is not None:
            others[exclude] = False
        mine = D[:, others]
        own = (mine.mean(axis=1), mine.std(axis=1)) if others.any() else (np.zeros(1), np.zeros(1))
        D = scaled(D, own, stats)
    d = D[0]
    order = np.argsort(d, kind="stable")
    if exclude is not None:
        order = order[order != exclude]
    order = order[:k]
    return order, d[order]


def cosine_contributions(query: np.ndarray, others: np.ndarray, bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    """(n_others, n_blocks): block b's share of each cosine, q_b·x_b / (|q| |x|); the row sums are the cosines.

    Which layers and families carry the similarity between two models: a block's share is positive
    where the two fine-tunes moved that block alike, negative where they moved it in opposite ways.
    """
    q = np.asarray(query, dtype=np.float64)
    x = np.atleast_2d(np.asarray(others, dtype=np.float64))
    norms = np.linalg.norm(q) * np.linalg.norm(x, axis=1)
    out = np.zeros((len(x), len(bounds)))
    for j, (start, stop) in enumerate(bounds):
        out[:, j] = x[:, start:stop] @ q[start:stop]
    return np.divide(out, norms[:, None], out=np.zeros_like(out), where=norms[:, None] > 0)

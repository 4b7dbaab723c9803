"""The walk of the kept nearest lists that finds a query's nearest without reading every vector
(:func:`modelvec.analyse.graph.search`): exact where the lists reach every row, every distance it gives exact, and
on clustered rows it finds the exact nearest reading a share of them."""

from __future__ import annotations

import numpy as np
import pytest

from modelvec.analyse.graph import Lists, Nearest, search


def knn_lists(X: np.ndarray, depth: int) -> Lists:
    """Each row's ``depth`` nearest other rows by euclidean distance, from every pair (the test's reference)."""
    D = np.linalg.norm(X[:, None] - X[None], axis=2)
    np.fill_diagonal(D, np.inf)
    nearest = Nearest(np.full(len(X), depth))
    nearest.offer(np.arange(len(X)), np.arange(len(X)), D, D)
    return nearest.lists()


def clustered(n: int, dim: int, clusters: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    X = centres[rng.integers(0, clusters, n)] + 0.6 * rng.normal(size=(n, dim))
    return X, rng.normal(size=dim) * 0.3 + centres[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_walk_of_complete_lists_is_exact(seed):
    """Where a row's lists hold every other row, the walk finds the exact ``width`` nearest, ties to the lower row."""
    rng = np.random.default_rng(seed)
    X = np.round(rng.normal(size=(60, 5)), 1)  # rounded: ties among the distances
    X[7] = X[3]  # a duplicate
    q = np.round(rng.normal(size=5), 1)
    exact = np.linalg.norm(X - q, axis=1)
    calls: list[int] = []

    def distances(cols):
        calls.append(len(cols))
        return exact[cols]

    found = search([knn_lists(X, 59)], distances, np.array([int(rng.integers(60))]), width=10)
    order = np.lexsort((np.arange(60), exact))[:10]
    assert found.order.tolist() == order.tolist()
    assert np.array_equal(found.values, exact[found.order])
    assert found.computed == sum(calls) == 60  # each row's distance computed once


def test_a_walk_of_nearest_lists_finds_the_nearest_reading_a_share_of_the_rows():
    """Clustered rows (30 clusters that touch), each with its 16 nearest kept, entered from 64 rows (as a walk is
    entered from the landmarks): the 15 nearest found, every distance the exact one, nearest first, and fewer than
    a fifth of the rows' distances computed."""
    X, _ = clustered(1500, 16, 30, seed=4)
    lists = knn_lists(X, 16)
    rng = np.random.default_rng(9)
    recalls, computed = [], []
    for _ in range(20):
        q = X[rng.integers(len(X))] + 0.2 * rng.normal(size=16)
        exact = np.linalg.norm(X - q, axis=1)
        entries = rng.choice(len(X), 64, replace=False)
        found = search([lists], lambda cols, e=exact: e[cols], entries, width=32)
        assert np.array_equal(found.values, exact[found.order])
        assert np.all(np.diff(found.values) >= 0)
        recalls.append(len(set(found.order[:15].tolist()) & set(np.argsort(exact)[:15].tolist())) / 15)
        computed.append(found.computed)
    assert np.mean(recalls) >= 0.95, recalls
    assert max(computed) < len(X) / 5, computed


def test_rows_whose_distance_is_not_finite_are_not_kept():
    """A row the query cannot be compared with (a damaged vector: an infinite distance) is neither kept nor walked
    through."""
    X, q = clustered(200, 8, 4, seed=1)
    exact = np.linalg.norm(X - q, axis=1)
    exact[np.argsort(exact)[:3]] = np.inf
    found = search([knn_lists(X, 12)], lambda cols: exact[cols], np.arange(0, 200, 10), width=20)
    assert np.all(np.isfinite(found.values)) and len(found.order) == 20
    assert found.order.tolist() == np.argsort(exact, kind="stable")[:20].tolist()

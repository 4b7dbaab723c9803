"""The shortcuts of ranking give exactly what a stable full sort gives: the few nearest from under a bound, the
hits within a depth from the value at that depth, every pair's mutual proximity from each side once, and row blocks
run on several threads in order."""

from __future__ import annotations

import numpy as np
import pytest

from modelvec.analyse import ranking
from modelvec.analyse.geometry import Geometry
from modelvec.analyse.parallel import in_order
from modelvec.analyse.proximity import every_pair, scaled, spread
from modelvec.analyse.ranking import first, hits_within


def tied_rows(n_rows: int, n: int, seed: int) -> np.ndarray:
    """Distances with many exact ties (few distinct values), clustered by column so the nearest share chunks."""
    rng = np.random.default_rng(seed)
    D = np.round(rng.random((n_rows, n)) * 50) / 50
    D[:, : n // 10] *= 0.1  # the nearest crowd the first columns
    D[0, :] = 0.5  # a row that is one tie
    D[1, rng.choice(n, 3, replace=False)] = np.inf
    return D


@pytest.mark.parametrize("depth", [1, 2, 5, 16, 100, 127])
def test_first_equals_the_stable_sort(depth):
    D = tied_rows(40, 2048, depth)
    expected = np.argsort(D, axis=1, kind="stable")[:, :depth]
    np.testing.assert_array_equal(first(D, depth), expected)


def test_the_bound_is_used_and_falls_back_on_values_that_are_not_numbers():
    D = tied_rows(6, 4096, 0)
    assert ranking._few(D, 5) is not None
    D[2, 5:] = np.nan  # fewer numbers than asked in one row
    assert ranking._few(D, 8) is None
    np.testing.assert_array_equal(first(D, 8), np.argsort(D, axis=1, kind="stable")[:, :8])


@pytest.mark.parametrize("seed", range(4))
def test_hits_within_equal_counting_in_the_sorted_order(seed):
    rng = np.random.default_rng(seed)
    D = tied_rows(60, 500, seed)
    D[1] = np.round(rng.random(500) * 50) / 50  # row 1's infinities would pass its depth below
    wanted = rng.random(D.shape) < 0.3
    depth = rng.integers(0, 400, len(D))
    order = np.argsort(D, axis=1, kind="stable")
    expected = [int(np.take_along_axis(wanted, order, axis=1)[r, : depth[r]].sum()) for r in range(len(D))]
    np.testing.assert_array_equal(hits_within(D, wanted, depth), expected)


def test_off_limits_is_each_row_itself_and_its_group():
    columns = np.array([0, 2, 3, 5, 8, 9])
    block = np.array([1, 2, 3, 9])  # 1 is not a column: it excludes only its group
    groups = np.array([0, 1, 1, -1, 2, 0, 2, 2, 1, -1])
    expected = (columns[None, :] == block[:, None]) | ranking.same_group(groups, block, columns)
    np.testing.assert_array_equal(ranking.off_limits(block, columns, groups), expected)
    np.testing.assert_array_equal(ranking.off_limits(block, columns, None), columns[None, :] == block[:, None])
    assert ranking.off_limits(block, columns[:0], None).shape == (4, 0)


def test_take_reads_what_indexing_would(tmp_path):
    G = np.arange(120.0).reshape(12, 10)
    path = tmp_path / "g"
    G.tofile(path)
    mapped = np.memmap(path, dtype=np.float64, shape=(12, 10), mode="r")
    runs, scattered = np.arange(3, 7), np.array([0, 4, 5, 9])
    for rows in (runs, scattered, scattered[:0]):
        for columns in (runs, scattered, np.array([7])):
            np.testing.assert_array_equal(ranking.take(mapped, rows, columns), G[rows][:, columns])


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_every_pair_equals_each_pair_scaled(metric, monkeypatch):
    X = np.random.default_rng(3).normal(size=(70, 9))
    X[4] = 0.0
    G = X @ X.T
    geo = Geometry.from_products((G + G.T) / 2, metric)._rows
    stats = spread(geo, "mutual-proximity")
    assert stats is not None
    everyone = np.arange(70)
    monkeypatch.setattr("modelvec.analyse.proximity.BLOCK_TILE", 16 * 16)  # tiles of 16 x 16, some cut short
    full = every_pair(geo, stats)
    np.testing.assert_array_equal(full, full.T)
    np.testing.assert_array_equal(full, scaled(geo.distances(everyone, everyone), stats, stats))


def test_in_order_keeps_the_items_order_on_threads():
    def slow_first(i: int) -> int:
        if i == 0:
            import time

            time.sleep(0.05)
        return i * i

    assert list(in_order(slow_first, range(20), threads=4)) == [i * i for i in range(20)]
    assert list(in_order(slow_first, [], threads=4)) == []


def test_principal_coordinates_from_a_sample_keep_every_product_where_the_sample_spans_the_rows(monkeypatch):
    """Above EXACT_COORDINATES the directions come from a sample and every row is projected on them: where the
    vectors span fewer dimensions than the sample sees, Z Z^T is the whole Gram matrix."""
    from modelvec.analyse import geometry

    monkeypatch.setattr(geometry, "EXACT_COORDINATES", 50)
    monkeypatch.setattr(geometry, "COORDINATE_SAMPLE", 120)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 12)) @ rng.normal(size=(12, 300))  # rank 12
    G = X @ X.T
    Z = geometry.coordinates_of(G)
    assert Z.shape == (400, geometry.TOP_COORDINATES)
    np.testing.assert_allclose(Z @ Z.T, G, atol=1e-8 * np.abs(G).max())


def test_clusterers_above_the_exact_size_run_on_a_stratified_sample_with_intervals(monkeypatch):
    from modelvec.analyse import clustering, geometry

    monkeypatch.setattr(clustering, "EXACT_COORDINATES", 100)
    monkeypatch.setattr(geometry, "EXACT_COORDINATES", 100)
    monkeypatch.setattr(clustering, "CLUSTER_SAMPLE", 150)
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 40)) * 4
    truth = np.repeat([0, 1, 2], [300, 60, 40])
    X = centres[truth] + rng.normal(size=(400, 40))
    labels = [[f"d{t}"] for t in truth]
    out = clustering.clustering_scores(X, labels, seed=3)
    assert out["n_clustered"] == 150 and out["n_clusterable"] == 400
    for key in clustering.CLUSTERING_KEYS:
        assert out[f"{key}_low"] <= out[key] <= out[f"{key}_high"], key
    assert out["kmeans_ari"] > 0.9 and out["silhouette"] > 0.3  # three clear clusters found in the sample
    pick = clustering.stratified(truth, 150, 3)
    assert len(pick) == 150 and np.bincount(truth[pick]).tolist() == [113, 22, 15]  # each in its share
    assert out == clustering.clustering_scores(X, labels, seed=3)  # seeded


@pytest.mark.parametrize("seed", range(5))
def test_agreement_of_contingency_tables_is_scikit_learns(seed):
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from modelvec.analyse.clustering import _tables, agreement_of

    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 4, (6, 300))
    found = np.where(rng.random((6, 300)) < 0.6, truth, rng.integers(0, 5, (6, 300)))
    found[1] = 0  # one cluster
    truth[2], found[2] = 0, 0  # one class, one cluster
    nmi, ari = agreement_of(_tables(truth, found, 4, 5))
    for i in range(6):
        assert nmi[i] == pytest.approx(normalized_mutual_info_score(truth[i], found[i]), abs=1e-12), i
        assert ari[i] == pytest.approx(adjusted_rand_score(truth[i], found[i]), abs=1e-12), i

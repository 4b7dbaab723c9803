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

"""The maps' 2-D reduction (modelvec.analyse.reduction): ``reduce`` by PCA, t-SNE and UMAP (deterministic, finding
planted clusters, standardised features, validated parameters, tiny n), and long vectors mapped from their span
(``row_space``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.metrics import pairwise_distances, silhouette_score

from modelvec.analyse.reduction import REDUCERS, reduce


@pytest.fixture(scope="module")
def planted() -> tuple[np.ndarray, np.ndarray]:
    """30 points in 50 dimensions, three well-separated clusters of 10 (labels 0, 1, 2)."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 50)) * 4
    labels = np.repeat(np.arange(3), 10)
    return centers[labels] + rng.normal(size=(30, 50)), labels


@pytest.fixture(scope="module")
def reduced(planted) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each method run twice on the same input (the first UMAP call also compiles numba code: ~20 s)."""
    X, _ = planted
    return {method: (reduce(X, method), reduce(X.copy(), method)) for method in REDUCERS}


@pytest.mark.parametrize("method", REDUCERS)
def test_reduce_shape_finite_deterministic_and_finds_the_clusters(reduced, planted, method):
    first, second = reduced[method]
    assert first.shape == (30, 2) and first.dtype == np.float64
    assert np.isfinite(first).all()
    assert np.array_equal(first, second), f"{method} is not deterministic"
    assert silhouette_score(first, planted[1]) > 0.5


def test_reduce_seed_matters_for_umap(planted, reduced):
    # (t-SNE starts from PCA, so its result does not depend on the seed at all)
    X, labels = planted
    a, b = reduced["umap"][0], reduce(X, "umap", seed=1)
    assert not np.array_equal(a, b)
    assert silhouette_score(b, labels) > 0.5


def test_standardize_keeps_a_huge_feature_from_deciding_the_map(planted):
    X, labels = planted
    rng = np.random.default_rng(1)
    X = X.copy()
    X[:, 0] = rng.normal(size=len(X)) * 1e4  # noise, unrelated to the clusters, on a huge scale
    raw = reduce(X, "pca")
    assert abs(np.corrcoef(raw[:, 0], X[:, 0])[0, 1]) > 0.999  # PC 1 is that one feature
    assert silhouette_score(raw, labels) < 0.2
    scaled = reduce(X, "pca", standardize=True)
    assert abs(np.corrcoef(scaled[:, 0], X[:, 0])[0, 1]) < 0.5
    assert silhouette_score(scaled, labels) > 0.5


def test_reduce_validates_its_parameters(planted):
    X, _ = planted
    with pytest.raises(ValueError, match="unknown reducer 'mds'"):
        reduce(X, "mds")
    with pytest.raises(ValueError, match="n_components"):
        reduce(X, "pca", n_components=0)
    with pytest.raises(ValueError, match="2-D"):
        reduce(X[0], "pca")
    with pytest.raises(ValueError, match="2-D"):
        reduce(np.zeros((0, 5)), "pca")
    bad = X.copy()
    bad[3, 4] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        reduce(bad, "pca")


@pytest.mark.parametrize("method", REDUCERS)
def test_reduce_tiny_n(method):
    rng = np.random.default_rng(2)
    assert np.array_equal(reduce(rng.normal(size=(1, 8)), method), np.zeros((1, 2)))
    for n in (2, 3):
        X = rng.normal(size=(n, 8))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Y = reduce(X, method, metric="euclidean")
            again = reduce(X, method, metric="euclidean")
        assert Y.shape == (n, 2) and np.isfinite(Y).all()
        assert np.array_equal(Y, again)
        # 2 or 3 points: PCA keeps their distances exactly (2 points: PC 2 is 0); the neighbour
        # methods fall back to classical MDS of the metric's distances, also exact, and say so.
        assert np.allclose(pairwise_distances(Y), pairwise_distances(X), atol=1e-8)
        if method != "pca":
            assert any("too few" in str(w.message) for w in caught)
    if method != "pca":  # the fallback uses the metric asked for (PCA is always Euclidean)
        X = rng.normal(size=(2, 8))
        with pytest.warns(UserWarning, match="too few"):
            Y = reduce(X, method)  # cosine
        assert np.isclose(np.linalg.norm(Y[0] - Y[1]), pairwise_distances(X, metric="cosine")[0, 1])
    Y = reduce(rng.normal(size=(4, 8)), method)  # the first n with real neighbourhoods
    assert Y.shape == (4, 2) and np.isfinite(Y).all()


def test_long_vectors_are_mapped_from_their_span_with_the_same_geometry():
    """Vectors longer than there are models go through ``row_space`` first: the same inner products, so PCA gives
    the same coordinates (up to sign) and t-SNE as faithful a map as computed on the vectors themselves."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE, trustworthiness

    from modelvec.analyse.reduction import row_space

    rng = np.random.default_rng(4)
    X = np.repeat(rng.normal(size=(3, 5000)), 8, axis=0) + rng.normal(size=(24, 5000)) * 0.8
    Z = row_space(X)
    assert Z.shape == (24, 24)
    np.testing.assert_allclose(Z @ Z.T, X @ X.T, rtol=1e-10, atol=1e-8 * np.abs(X @ X.T).max())
    direct = PCA(n_components=2, random_state=0).fit_transform(X)
    mapped = reduce(X, "pca")
    np.testing.assert_allclose(np.abs(mapped), np.abs(direct), rtol=1e-6, atol=1e-8)
    # t-SNE's PCA start is a randomized SVD, which differs a little between the long vectors and their span: the
    # maps are not equal, but keep the neighbourhoods as well
    tsne = TSNE(n_components=2, perplexity=min(30.0, 23 / 3), init="pca", random_state=0, metric="cosine")
    kept = [trustworthiness(X, Y, n_neighbors=5, metric="cosine") for Y in (tsne.fit_transform(X), reduce(X, "tsne"))]
    assert kept[0] > 0.95 and kept[1] >= kept[0] - 0.01


def test_reduce_more_components_than_data_pads_with_zeros():
    X = np.random.default_rng(3).normal(size=(5, 2))
    Y = reduce(X, "pca", n_components=3)
    assert Y.shape == (5, 3) and np.array_equal(Y[:, 2], np.zeros(5))

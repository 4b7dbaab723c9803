"""analysis: k-NN dataset score, predictions, clustering scores and nearest(), against naive references
and against cases worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelvec.analyse import geometry, ranking
from modelvec.analyse import scores as analysis
from modelvec.analyse.clustering import clustering_scores
from modelvec.analyse.scores import (
    Yardstick,
    knn_dataset_score,
    nearest,
    predict_datasets,
    yardstick,
)

METRICS = ("cosine", "euclidean")


# --- naive references: Python loops, explicit formulas, full sorts with (distance, index) keys ---


def ref_distance(a, b, metric: str) -> float:
    a, b = [float(x) for x in a], [float(x) for x in b]
    if metric == "euclidean":
        return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        return 1.0  # the documented convention: a zero vector has cosine 0 with everything
    return 1.0 - sum(x * y for x, y in zip(a, b)) / (na * nb)


def ref_mp_distances(X, metric: str) -> list[list[float]]:
    """-log mutual proximity (Gaussian, independent), from the formula: the product over both
    models of P(N(mean, std of that model's distances to the others) > d)."""
    n = len(X)
    d = [[ref_distance(X[i], X[j], metric) for j in range(n)] for i in range(n)]
    mean = [sum(d[i][j] for j in range(n) if j != i) / (n - 1) for i in range(n)]
    std = [math.sqrt(sum((d[i][j] - mean[i]) ** 2 for j in range(n) if j != i) / (n - 1)) for i in range(n)]

    def tail(i, x):  # P(X_i > x); a model with no spread says nothing: 1/2
        return 0.5 if std[i] == 0 else 0.5 * math.erfc((x - mean[i]) / (std[i] * math.sqrt(2)))

    return [[-math.log(tail(i, d[i][j]) * tail(j, d[i][j])) for j in range(n)] for i in range(n)]


def ref_knn(X, labels, metric: str, pool: str, groups=None, scaling: str = "none"):
    n = len(X)
    mp = ref_mp_distances(X, metric) if scaling != "none" else None

    def dist(f, g):
        return ref_distance(X[f], X[g], metric) if mp is None else mp[f][g]

    sets = [set(ls) for ls in labels]
    per_model = [math.nan] * n

    def other(f, g):  # g may be f's neighbour: not f, and not in f's group (when f has one)
        return g != f and (groups is None or groups[f] is None or groups[g] != groups[f])

    for f in range(n):
        if not sets[f]:
            continue
        k_minus_1 = sum(1 for g in range(n) if other(f, g) and sets[g] & sets[f])
        if k_minus_1 == 0:
            continue
        candidates = [g for g in range(n) if other(f, g) and (pool == "all" or sets[g])]
        ranked = sorted(candidates, key=lambda g: (dist(f, g), g))
        hits = sum(1 for g in ranked[:k_minus_1] if sets[g] & sets[f])
        per_model[f] = hits / k_minus_1
    scored = [f for f in range(n) if not math.isnan(per_model[f])]
    per_dataset = {}
    for name in sorted(set().union(*sets)):
        values = [per_model[f] for f in scored if name in sets[f]]
        if values:
            per_dataset[name] = (sum(values) / len(values), len(values))
    score = sum(per_model[f] for f in scored) / len(scored)
    return score, len(scored), per_dataset, per_model


def ref_nearest(X, q, k: int, metric: str, exclude=None):
    ranked = sorted((ref_distance(q, X[i], metric), i) for i in range(len(X)) if i != exclude)[:k]
    return [i for _, i in ranked], [d for d, _ in ranked]


def random_case(seed: int, n: int = 30, dim: int = 6, zero_row: bool = True):
    """Random vectors (row 7 exactly zero unless ``zero_row`` is False), random labels from three
    datasets, unlabelled models and two multi-label models, one bringing a fourth dataset."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    if zero_row:
        X[7] = 0.0
    names = ["a", "b", "c", "d"]
    labels = [[str(rng.choice(names[:3]))] for _ in range(n)]
    for i in rng.choice(n, size=6, replace=False):
        labels[i] = []
    labels[3] = ["a", "d"]  # "d" exists only here: the multi-label model counts under it too
    labels[5] = ["b", "c"]
    return X, labels


def assert_matches_reference(result, X, labels, metric, pool, groups=None, scaling="none"):
    score, n_scored, per_dataset, per_model = ref_knn(X, labels, metric, pool, groups, scaling)
    assert result.n_scored == n_scored
    assert result.score == pytest.approx(score, abs=1e-12)
    np.testing.assert_allclose(result.per_model, per_model, atol=1e-12)  # nan where nan
    assert result.per_dataset.keys() == per_dataset.keys()
    for name, (mean, count) in per_dataset.items():
        assert result.per_dataset[name][0] == pytest.approx(mean, abs=1e-12)
        assert result.per_dataset[name][1] == count


# --- knn_dataset_score --------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["labelled", "all"])
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("seed", [0, 1])
def test_knn_matches_naive_reference(seed, metric, pool):
    X, labels = random_case(seed)
    result = knn_dataset_score(X.astype(np.float32) if seed else X, labels, metric=metric, pool=pool)
    X_used = X.astype(np.float32).astype(np.float64) if seed else X
    assert_matches_reference(result, X_used, labels, metric, pool)
    assert (result.metric, result.pool) == (metric, pool)
    assert "d" in result.per_dataset and result.per_dataset["d"][1] == 1  # via the multi-label model
    unlabelled = [i for i, ls in enumerate(labels) if not ls]
    assert np.isnan(result.per_model[unlabelled]).all()


@pytest.mark.parametrize("pool", ["labelled", "all"])
@pytest.mark.parametrize("metric", METRICS)
def test_knn_excluding_same_author_matches_naive_reference(metric, pool):
    X, labels = random_case(3)
    rng = np.random.default_rng(3)
    authors = [str(rng.choice(["u1", "u2", "u3", "u4"])) for _ in range(len(X))]
    authors[0] = authors[1] = None  # unknown authors exclude nothing
    result = knn_dataset_score(X, labels, metric=metric, pool=pool, exclude_same=authors)
    assert_matches_reference(result, X, labels, metric, pool, authors)
    plain = knn_dataset_score(X, labels, metric=metric, pool=pool)
    assert not np.allclose(np.nan_to_num(result.per_model, nan=-1), np.nan_to_num(plain.per_model, nan=-1))


def test_author_effect_is_told_from_a_dataset_effect():
    # each dataset: one author's three tight runs, and another author's run sitting by the other dataset
    X = np.array([[0, 0], [0, 0.1], [0.1, 0], [9, 9], [10, 0], [10, 0.1], [10.1, 0], [1, 1]], float)
    labels = [["a"]] * 4 + [["b"]] * 4
    authors = ["one"] * 3 + ["two"] + ["three"] * 3 + ["four"]
    plain = knn_dataset_score(X, labels, metric="euclidean")
    other = knn_dataset_score(X, labels, metric="euclidean", exclude_same=authors)
    assert plain.per_model[0] == pytest.approx(2 / 3)  # its two same-author runs, then model 7 ("b")
    assert other.per_model[0] == 0.0  # k-1 = 1 (model 3); its nearest other-author model is 7 ("b")
    assert plain.per_model[3] == other.per_model[3] == 0.0  # no same-author runs: nothing changes
    assert other.score < plain.score
    with pytest.raises(ValueError):
        knn_dataset_score(X, labels, exclude_same=authors[:-1])


def line(*xs: float) -> np.ndarray:
    """Points on a line in 2-D (exact small-integer distances for euclidean)."""
    return np.array([[x, 0.0] for x in xs])


@pytest.mark.parametrize("metric", METRICS)
def test_two_tight_clusters_score_one(metric):
    X = np.array([[10, 0], [10, 0.1], [10.1, 0], [0, 10], [0.1, 10], [0, 10.1]])
    labels = [["A"]] * 3 + [["B"]] * 3
    result = knn_dataset_score(X, labels, metric=metric)
    assert result.score == 1.0 and result.n_scored == 6
    assert result.per_dataset == {"A": (1.0, 3), "B": (1.0, 3)}


def test_point_nearer_the_other_cluster_gives_its_exact_share():
    # A at 0, 1, 2 and 13 (inside/beyond B); B at 10, 11, 12. k(A) = 4, k(B) = 3.
    X = line(0, 1, 2, 10, 11, 12, 13)
    labels = [["A"], ["A"], ["A"], ["B"], ["B"], ["B"], ["A"]]
    result = knn_dataset_score(X, labels, metric="euclidean")
    # A@0,1,2: 3 nearest = the two other A points + B@10 -> 2/3; A@13: 12, 11, 10 -> 0.
    # B@10, B@11: the other two B -> 1; B@12: 11 and 13 (both at 1; 10 is at 2) -> 1/2.
    expected = [2 / 3, 2 / 3, 2 / 3, 1, 1, 1 / 2, 0]
    np.testing.assert_allclose(result.per_model, expected)
    assert result.score == pytest.approx(sum(expected) / 7)
    assert result.per_dataset["A"] == (pytest.approx(0.5), 4)
    assert result.per_dataset["B"] == (pytest.approx(5 / 6), 3)


def test_singleton_dataset_and_unlabelled_models_are_not_scored():
    base_X, base_labels = line(0, 1, 2, 10, 11, 12, 13), [["A"], ["A"], ["A"], ["B"], ["B"], ["B"], ["A"]]
    base = knn_dataset_score(base_X, base_labels, metric="euclidean")
    # a dataset with one model (far away) and two unlabelled models (one inside A): nothing changes
    X = np.vstack([line(-500), base_X[:3], line(1.5), base_X[3:], line(800)])
    labels = [["C"]] + base_labels[:3] + [[]] + base_labels[3:] + [[]]
    result = knn_dataset_score(X, labels, metric="euclidean")
    assert np.isnan(result.per_model[[0, 4, 9]]).all()
    np.testing.assert_array_equal(np.delete(result.per_model, [0, 4, 9]), base.per_model)
    assert (result.score, result.n_scored, result.per_dataset) == (base.score, base.n_scored, base.per_dataset)
    assert "C" not in result.per_dataset


def test_pool_all_counts_an_unlabelled_model_inside_a_cluster_as_a_miss():
    # u at 1.5 inside A (0, 1, 2); B at 10, 11, 12; each model's k-1 = 2.
    X = np.vstack([line(1.5), line(0, 1, 2, 10, 11, 12)])
    labels = [[]] + [["A"]] * 3 + [["B"]] * 3
    labelled_only = knn_dataset_score(X, labels, metric="euclidean", pool="labelled")
    assert labelled_only.score == 1.0
    result = knn_dataset_score(X, labels, metric="euclidean", pool="all")
    # A@0: 1 (d=1), u (1.5) -> 1/2; A@1: u (0.5), then 0 (1) -> 1/2; A@2: u (0.5), 1 (1) -> 1/2.
    np.testing.assert_allclose(result.per_model, [np.nan, 0.5, 0.5, 0.5, 1, 1, 1])
    assert result.per_dataset == {"A": (0.5, 3), "B": (1.0, 3)}
    assert result.score == 0.75 and result.n_scored == 6


@pytest.mark.parametrize("metric", METRICS)
def test_model_is_excluded_even_with_a_duplicate_vector(metric):
    # rows 0 and 1 are identical but tuned on different datasets; their partners are far away
    X = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [-3.0, 1.0, 0.5], [0.5, -3.0, 1.0]])
    labels = [["A"], ["B"], ["A"], ["B"]]
    result = knn_dataset_score(X, labels, metric=metric)
    # k-1 = 1: each duplicate's nearest other model is the other duplicate (distance 0), a miss.
    # Dropping "the first sorted" instead of the model itself would give row 1 itself: a hit.
    np.testing.assert_array_equal(result.per_model[:2], [0.0, 0.0])
    idx, dist = nearest(X, X[1], k=2, metric=metric, exclude=1)
    assert idx[0] == 0 and dist[0] == pytest.approx(0.0, abs=1e-12)
    idx, _ = nearest(X, X[0], k=1, metric=metric, exclude=0)
    assert list(idx) == [1]


def test_ties_are_broken_by_model_index():
    # model 0 (dataset A, k = 3) has rows 1, 2, 3 all at distance exactly 1 and rows 4, 5 far
    # away; its k-1 = 2 neighbours are rows 1 and 2, so which of them are A decides its score
    X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [-1.0, 0.0], [5.0, 5.0], [5.0, 6.0]])
    for partners, expected in (((1, 2), 1.0), ((1, 4), 0.5), ((2, 4), 0.5), ((3, 4), 0.0)):
        labels = [["A"] if i == 0 or i in partners else ["B"] for i in range(6)]
        assert knn_dataset_score(X, labels, metric="euclidean").per_model[0] == expected, partners
    idx, dist = nearest(X, X[0], k=3, metric="euclidean", exclude=0)
    assert list(idx) == [1, 2, 3] and list(dist) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("scaling", ["none", "mutual-proximity"])
def test_row_blocks_do_not_change_results(metric, scaling, monkeypatch):
    X, labels = random_case(2)
    whole_knn = knn_dataset_score(X, labels, metric=metric, pool="all", scaling=scaling)
    whole_pred = predict_datasets(X, labels, k=3, metric=metric, scaling=scaling)
    monkeypatch.setattr(ranking, "BLOCK_ELEMENTS", 70)  # blocks of 2-3 rows
    knn = knn_dataset_score(X, labels, metric=metric, pool="all", scaling=scaling)
    pred = predict_datasets(X, labels, k=3, metric=metric, scaling=scaling)
    np.testing.assert_array_equal(knn.per_model, whole_knn.per_model)
    assert pred.predicted == whole_pred.predicted and pred.loo_accuracy == whole_pred.loo_accuracy
    np.testing.assert_array_equal(pred.confidence, whole_pred.confidence)
    assert_matches_reference(knn, X, labels, metric, "all", scaling=scaling)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("scaling", ["none", "mutual-proximity"])
def test_one_geometry_serves_every_score_with_or_without_stored_products(metric, scaling, monkeypatch):
    X, labels = random_case(2)
    geo = analysis.Geometry(X, metric)
    knn = knn_dataset_score(geo, labels, metric=metric, pool="all", scaling=scaling)
    pred = predict_datasets(geo, labels, k=3, metric=metric, scaling=scaling)
    clusters = clustering_scores(geo, labels, metric=metric)
    assert_matches_reference(knn, X, labels, metric, "all", scaling=scaling)
    assert geo._rows._gram is not None  # the products were taken once and kept
    monkeypatch.setattr(geometry, "_GRAM_MAX_N", 3)  # above it, products are computed per block
    blockwise = analysis.Geometry(X, metric)
    knn_b = knn_dataset_score(blockwise, labels, metric=metric, pool="all", scaling=scaling)
    assert blockwise._rows._gram is None
    assert_matches_reference(knn_b, X, labels, metric, "all", scaling=scaling)
    pred_b = predict_datasets(blockwise, labels, k=3, metric=metric, scaling=scaling)
    assert pred_b.predicted == pred.predicted and pred_b.loo_accuracy == pred.loo_accuracy
    np.testing.assert_allclose(pred_b.confidence, pred.confidence, atol=1e-12)
    assert clustering_scores(blockwise, labels, metric=metric) == pytest.approx(clusters, abs=1e-9, nan_ok=True)
    np.testing.assert_allclose(
        analysis.distance_matrix(blockwise, metric=metric, scaling=scaling),
        analysis.distance_matrix(X, metric=metric, scaling=scaling),
        atol=1e-12,
    )


def test_a_geometry_answers_only_for_its_metric():
    X, labels = random_case(0)
    with pytest.raises(ValueError, match="prepared for metric 'euclidean', not 'cosine'"):
        knn_dataset_score(analysis.Geometry(X, "euclidean"), labels)


@pytest.mark.parametrize("pool", ["labelled", "all"])
@pytest.mark.parametrize("metric", METRICS)
def test_permuting_models_changes_nothing(metric, pool):
    X, labels = random_case(3, zero_row=False)  # a zero row ties with everything under cosine
    perm = np.random.default_rng(4).permutation(len(X))
    base = knn_dataset_score(X, labels, metric=metric, pool=pool)
    moved = knn_dataset_score(X[perm], [labels[i] for i in perm], metric=metric, pool=pool)
    assert moved.score == pytest.approx(base.score, abs=1e-12) and moved.n_scored == base.n_scored
    np.testing.assert_allclose(moved.per_model, base.per_model[perm], atol=1e-12)
    assert moved.per_dataset.keys() == base.per_dataset.keys()
    for name, (mean, count) in base.per_dataset.items():
        assert moved.per_dataset[name] == (pytest.approx(mean, abs=1e-12), count)


def test_scaling_changes_nothing_for_cosine():
    X, labels = random_case(5)
    base = knn_dataset_score(X, labels, metric="cosine")
    row_scales = np.random.default_rng(6).uniform(1e-3, 1e3, size=(len(X), 1))
    for scaled in (X * 1e6, X * 1e-6, X * row_scales):
        result = knn_dataset_score(scaled, labels, metric="cosine")
        np.testing.assert_array_equal(result.per_model, base.per_model)
        assert result.score == base.score
    # whereas per-row scaling does move euclidean neighbours (so the check above can fail)
    eu = knn_dataset_score(X, labels, metric="euclidean").per_model
    assert not np.array_equal(knn_dataset_score(X * row_scales, labels, metric="euclidean").per_model, eu)


# --- mutual proximity -----------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["labelled", "all"])
@pytest.mark.parametrize("metric", METRICS)
def test_mutual_proximity_knn_matches_naive_reference(metric, pool):
    X, labels = random_case(11)  # with a zero row: no spread, a factor of 1/2
    result = knn_dataset_score(X, labels, metric=metric, pool=pool, scaling="mutual-proximity")
    assert_matches_reference(result, X, labels, metric, pool, scaling="mutual-proximity")
    assert result.scaling == "mutual-proximity"
    plain = knn_dataset_score(X, labels, metric=metric, pool=pool)
    assert not np.array_equal(result.per_model, plain.per_model, equal_nan=True)  # it does re-rank


@pytest.mark.parametrize("metric", METRICS)
def test_mutual_proximity_nearest_and_distance_matrix_match_the_reference(metric):
    X, _ = random_case(12, n=20)
    ref = np.array(ref_mp_distances(X, metric))
    np.fill_diagonal(ref, 0.0)
    D = analysis.distance_matrix(X, metric=metric, scaling="mutual-proximity")
    np.testing.assert_allclose(D, ref, rtol=1e-9, atol=1e-12)
    for i in (0, 4, 7):  # the query is one of the models: its spread leaves itself out, as the others' do
        idx, dist = nearest(X, X[i], k=5, metric=metric, exclude=i, scaling="mutual-proximity")
        order = sorted((j for j in range(len(X)) if j != i), key=lambda j: (ref[i, j], j))[:5]
        assert list(idx) == order
        np.testing.assert_allclose(dist, ref[i, order], rtol=1e-9)


def test_mutual_proximity_keeps_the_order_when_every_model_sees_the_same_distances():
    angles = 2 * np.pi * np.arange(12) / 12 + 0.3  # a regular polygon: every model's distances are the same multiset
    X = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = [[f"d{i // 3}"] for i in range(12)]
    for metric in METRICS:
        plain = analysis.distance_matrix(X, metric=metric)
        scaled = analysis.distance_matrix(X, metric=metric, scaling="mutual-proximity")
        for i in range(12):
            np.testing.assert_array_equal(  # rounded: equal distances stay ties, broken by index
                np.argsort(plain[i].round(9), kind="stable"), np.argsort(scaled[i].round(9), kind="stable")
            )
        np.testing.assert_array_equal(
            knn_dataset_score(X, labels, metric=metric, scaling="mutual-proximity").per_model,
            knn_dataset_score(X, labels, metric=metric).per_model,
        )


def test_mutual_proximity_demotes_a_hub():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 400)) / 20  # four datasets, faint in noise of the same dimension
    X = np.array([0.6 * centres[d] + rng.normal(size=400) / 20 for d in range(4) for _ in range(6)])
    labels = [[f"d{d}"] for d in range(4) for _ in range(6)]
    hub = (X / np.linalg.norm(X, axis=1, keepdims=True)).sum(axis=0)  # the direction every model leans towards
    X, labels = np.vstack([X, hub]), [*labels, []]

    def hub_is_nearest(scaling):
        D = analysis.distance_matrix(X, scaling=scaling)
        np.fill_diagonal(D, np.inf)
        return int((D[:-1].argmin(axis=1) == len(X) - 1).sum())

    assert hub_is_nearest("none") >= 12  # under cosine the hub is most models' nearest neighbour
    assert hub_is_nearest("mutual-proximity") <= 2
    plain = knn_dataset_score(X, labels, pool="all").score  # the unlabelled hub counts as a miss
    assert knn_dataset_score(X, labels, pool="all", scaling="mutual-proximity").score > plain + 0.1


# --- planted clusters ---------------------------------------------------------------------------


def planted(seed: int, n_datasets: int = 4, per_dataset: int = 8, dim: int = 48, rank: int = 2):
    """Each dataset: a shared direction plus a dataset-specific rank-``rank`` subspace, plus noise."""
    rng = np.random.default_rng(seed)
    X, labels = [], []
    for d in range(n_datasets):
        mean = rng.normal(size=dim)
        mean *= 3 / np.linalg.norm(mean)
        basis = np.linalg.qr(rng.normal(size=(dim, rank)))[0]
        for _ in range(per_dataset):
            X.append(mean + basis @ rng.normal(scale=0.3, size=rank) + rng.normal(scale=0.05, size=dim))
            labels.append([f"ds{d}"])
    return np.array(X), labels


@pytest.mark.parametrize("metric", METRICS)
def test_planted_clusters_are_found(metric):
    X, labels = planted(0)
    result = knn_dataset_score(X, labels, metric=metric)
    assert result.score == 1.0 and result.n_scored == len(X)
    assert predict_datasets(X, labels, k=5, metric=metric).loo_accuracy == 1.0
    scores = clustering_scores(X, labels, metric=metric, seed=0)
    assert scores["n_clustered"] == len(X)
    for key in ("kmeans_nmi", "kmeans_ari", "hdbscan_nmi", "hdbscan_ari"):
        assert scores[key] > 0.9, (key, scores)
    assert scores["silhouette"] > 0.5


def test_random_labels_score_near_chance():
    """With labels permuted at random, each model's k-1 neighbours are a random draw without
    replacement: hits ~ Hypergeometric(N=n-1, K=k-1, draws=k-1), mean share (k-1)/(n-1)."""
    n_datasets, size, seeds = 4, 8, range(20)
    n, k = n_datasets * size, size
    expected = (k - 1) / (n - 1)
    N, K = n - 1, k - 1
    var_hits = K * (K / N) * ((N - K) / N) * ((N - K) / (N - 1))
    sd_share = math.sqrt(var_hits) / K  # per model; the mean over correlated models is no wider
    tolerance = 4 * sd_share / math.sqrt(len(seeds))
    scores, planted_scores = [], []
    for seed in seeds:
        X, labels = planted(seed, n_datasets, size)
        perm = np.random.default_rng(1000 + seed).permutation(n)
        scores.append(knn_dataset_score(X, [labels[i] for i in perm]).score)
        planted_scores.append(knn_dataset_score(X, labels).score)
    assert abs(np.mean(scores) - expected) < tolerance, (np.mean(scores), expected, tolerance)
    assert min(planted_scores) == 1.0


# --- predict_datasets ---------------------------------------------------------------------------


def test_prediction_inside_a_cluster_and_between_two():
    # "zeta" at 0, 1, 2; "alpha" at 10, 11, 12; u1 inside zeta; u2 at 5.9: labelled neighbours
    # by distance: 2 (3.9), 10 (4.1), 1 (4.9), 11 (5.1), 0 (5.9), 12 (6.1)
    X = np.vstack([line(0, 1, 2), line(1.2), line(10, 11, 12), line(5.9)])
    labels = [["zeta"]] * 3 + [[]] + [["alpha"]] * 3 + [[]]
    p = predict_datasets(X, labels, k=3, metric="euclidean")
    assert p.predicted == [None, None, None, "zeta", None, None, None, "zeta"]
    assert p.vote_share[3] == 1.0 and p.vote_share[7] == pytest.approx(2 / 3)
    assert np.isnan(p.confidence[[0, 1, 2, 4, 5, 6]]).all()
    # every labelled model is 1 from its nearest, and two are 9 apart (median): u1, 0.2 from its nearest, is
    # close and confident; u2's nearest is 3.9 away, a fraction (9 - 3.9) / (9 - 1) of the way from near to far
    assert p.closeness[3] == 1.0 and p.confidence[3] == 1.0
    assert p.closeness[7] == pytest.approx(5.1 / 8) and p.confidence[7] == pytest.approx(2 / 3 * 5.1 / 8)
    p5 = predict_datasets(X, labels, k=5, metric="euclidean")
    assert p5.predicted[7] == "zeta" and p5.vote_share[7] == pytest.approx(3 / 5)
    p4 = predict_datasets(X, labels, k=4, metric="euclidean")  # 2 votes each: the nearest's dataset wins
    assert p4.predicted[7] == "zeta" and p4.vote_share[7] == 0.5
    u3 = predict_datasets(np.vstack([X, line(6.1)]), [*labels, []], k=4, metric="euclidean")  # nearest: 10
    assert u3.predicted[8] == "alpha" and u3.vote_share[8] == 0.5
    assert p.loo_accuracy == 1.0 and p.n_loo == 6
    big = predict_datasets(X, labels, k=100, metric="euclidean")  # all six vote
    assert big.predicted[7] == "zeta" and big.vote_share[7] == 0.5


def test_closeness_between_near_and_far():
    ruler = Yardstick(near=1.0, far=3.0)
    assert ruler.closeness(0.5) == 1.0 and ruler.closeness(1.0) == 1.0  # as near as stored models to theirs
    assert ruler.closeness(2.5) == pytest.approx(0.25) and ruler.closeness(3.0) == 0.0 and ruler.closeness(9) == 0.0
    assert ruler.closeness(0.5, shares_direction=False) == 0.0
    assert math.isnan(Yardstick(float("nan"), float("nan")).closeness(0.5))


def test_yardstick_of_two_clusters():
    # A at 0, 1, 2 and B at 10, 11, 12: a labelled model's nearest is 1 away; two models are 9 apart (median)
    X = line(0, 1, 2, 10, 11, 12, 50)
    ruler = yardstick(X, [["A"]] * 3 + [["B"]] * 3 + [[]], metric="euclidean")
    assert ruler.near == 1.0 and ruler.far == 9.0  # of the 15 pairs' distances 1,1,1,1,2,2,8,9,9,10,10,10,11,11,12
    assert yardstick(X, [["A"]] * 3 + [["B"]] * 3 + [[]], metric="euclidean", exclude=1).near == 1.0


def test_orthogonal_neighbours_give_no_confidence_under_cosine():
    # three labelled models along e1, close to each other; a query along e2: its votes are unanimous, its
    # neighbours point another way (cosine distance 1)
    X = np.array([[1.0, 0.0, 0.0], [1.0, 0.1, 0.0], [1.0, 0.0, 0.1], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    p = predict_datasets(X, [["a"], ["a"], ["a"], ["b"], []], k=3)
    assert p.predicted[4] == "a" and p.vote_share[4] == 1.0 and p.confidence[4] == 0.0


def test_multi_label_neighbour_votes_for_each_label():
    X = line(0, 0.5, 10, 20)
    labels = [["b", "a"], [], ["c"], ["c"]]
    p = predict_datasets(X, labels, k=1, metric="euclidean")
    assert p.predicted[1] == "a" and p.vote_share[1] == 0.5  # tie a/b -> a
    p2 = predict_datasets(X, labels, k=2, metric="euclidean")  # votes a, b, c
    assert p2.predicted[1] == "a" and p2.vote_share[1] == pytest.approx(1 / 3)


def test_leave_one_out_accuracy_by_hand():
    # A at 0, 1, 2, 13; B at 10, 11, 12. k=1: A@13 -> B@12 (miss); B@12 -> 11 and 13 tie at 1,
    # lower index (11) wins -> hit; everything else hits.
    X = line(0, 1, 2, 10, 11, 12, 13)
    labels = [["A"], ["A"], ["A"], ["B"], ["B"], ["B"], ["A"]]
    p = predict_datasets(X, labels, k=1, metric="euclidean")
    assert p.n_loo == 7 and p.loo_accuracy == pytest.approx(6 / 7)
    assert all(x is None for x in p.predicted) and np.isnan(p.confidence).all()
    # the same points with A@13 listed before B@11: B@12's tie now goes to A -> a second miss
    order = [0, 1, 2, 6, 3, 4, 5]
    p = predict_datasets(X[order], [labels[i] for i in order], k=1, metric="euclidean")
    assert p.loo_accuracy == pytest.approx(5 / 7)


def test_predictions_without_enough_labels():
    X = line(0, 1, 2)
    p = predict_datasets(X, [[], ["A"], []], k=3)
    assert p.predicted == ["A", None, "A"] and list(p.vote_share[[0, 2]]) == [1.0, 1.0]
    assert np.isnan(p.closeness[[0, 2]]).all()  # one labelled model: nothing to judge how near is near
    assert math.isnan(p.loo_accuracy) and p.n_loo == 0
    none = predict_datasets(X, [[], [], []])
    assert none.predicted == [None] * 3 and np.isnan(none.confidence).all() and none.n_loo == 0


# --- clustering_scores --------------------------------------------------------------------------


def test_clustering_uses_single_label_models_of_datasets_with_two():
    X, labels = planted(1)
    base = clustering_scores(X, labels, metric="cosine")
    extra_X = np.vstack([X, X[:3] + 0.01])
    extra = labels + [["ds0", "ds1"], ["lonely"], []]  # multi-label, singleton dataset, unlabelled
    assert clustering_scores(extra_X, extra, metric="cosine") == base
    assert base["n_clustered"] == len(X)


def test_cosine_clustering_ignores_vector_lengths():
    X, labels = planted(4)
    lengths = np.random.default_rng(5).permutation(np.geomspace(0.01, 100, len(X)))[:, None]
    base = clustering_scores(X, labels, metric="cosine")
    scaled = clustering_scores(X * lengths, labels, metric="cosine")
    for key in ("kmeans_nmi", "kmeans_ari", "hdbscan_nmi", "hdbscan_ari"):
        assert scaled[key] == base[key] == 1.0
    assert scaled["silhouette"] == pytest.approx(base["silhouette"], abs=1e-9)
    # the same lengths wreck the euclidean clustering, so the check above can fail
    assert clustering_scores(X * lengths, labels, metric="euclidean")["kmeans_ari"] < 0.5


def test_clustering_scores_are_nan_without_two_datasets_of_two():
    X, _ = planted(2, n_datasets=2, per_dataset=3)
    for labels in ([["a"]] * 5 + [["b"]], [["a"]] * 6, [[]] * 6):
        scores = clustering_scores(X, labels)
        assert scores["n_clustered"] == 0.0
        assert all(math.isnan(v) for key, v in scores.items() if key != "n_clustered")


def test_clustering_silhouette_matches_sklearn_and_kmeans_is_seeded():
    from sklearn.metrics import silhouette_score

    X, labels = planted(3)
    truth = [ls[0] for ls in labels]
    for metric in METRICS:
        scores = clustering_scores(X, labels, metric=metric, seed=7)
        assert scores["silhouette"] == pytest.approx(silhouette_score(X, truth, metric=metric), abs=1e-9)
        assert clustering_scores(X, labels, metric=metric, seed=7) == scores
    # random labels: the clusterers find the geometry, which no longer matches the labels
    perm = np.random.default_rng(0).permutation(len(X))
    shuffled = clustering_scores(X, [labels[i] for i in perm])
    assert shuffled["kmeans_ari"] < 0.3 and shuffled["silhouette"] < 0.2


# --- nearest --------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", METRICS)
def test_nearest_matches_brute_force(metric):
    X, _ = random_case(8, n=25)
    q = np.random.default_rng(9).normal(size=X.shape[1])
    for k, exclude in ((5, None), (5, 3), (100, 4), (1, None)):
        idx, dist = nearest(X, q, k=k, metric=metric, exclude=exclude)
        ref_idx, ref_dist = ref_nearest(X, q, k, metric, exclude)
        assert list(idx) == ref_idx
        np.testing.assert_allclose(dist, ref_dist, atol=1e-12)
    idx, dist = nearest(X, X[4], k=3, metric=metric, exclude=4)
    ref_idx, ref_dist = ref_nearest(X, X[4], 3, metric, 4)
    assert list(idx) == ref_idx and 4 not in idx
    idx, _ = nearest(X, X[4], k=1, metric=metric)
    assert list(idx) == [4]


def test_zero_vector_is_at_cosine_distance_one_from_everything():
    X, _ = random_case(10, n=8)  # row 7 is zero
    idx, dist = nearest(X, np.zeros(X.shape[1]), k=8, metric="cosine")
    assert list(idx) == list(range(8)) and np.all(dist == 1.0)
    idx, dist = nearest(X, X[0], k=8, metric="cosine")
    assert dist[list(idx).index(7)] == 1.0  # row 7 is the zero row


# --- validation -----------------------------------------------------------------------------------


def test_parameters_are_validated():
    X, labels = line(0, 1, 2), [["a"], ["a"], []]
    with pytest.raises(ValueError, match="metric"):
        knn_dataset_score(X, labels, metric="manhattan")
    with pytest.raises(ValueError, match="pool"):
        knn_dataset_score(X, labels, pool="unlabelled")
    with pytest.raises(ValueError, match="scaling must be one of"):
        knn_dataset_score(X, labels, scaling="csls")
    with pytest.raises(ValueError, match="scaling"):
        nearest(X, X[0], scaling="mp")
    for bad_k in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="k must be"):
            predict_datasets(X, labels, k=bad_k)
        with pytest.raises(ValueError, match="k must be"):
            nearest(X, X[0], k=bad_k)
    with pytest.raises(ValueError, match="metric"):
        clustering_scores(X, labels, metric="cos")
    with pytest.raises(ValueError, match="labels"):
        knn_dataset_score(X, ["a", "a", "b"])  # bare strings would be split into letters
    with pytest.raises(ValueError, match="labels"):
        knn_dataset_score(X, [["a"], ["a"]])
    with pytest.raises(ValueError, match="2-D"):
        knn_dataset_score(X[0], labels)
    with pytest.raises(ValueError, match="NaN"):
        knn_dataset_score(np.array([[np.nan, 0], [1, 0], [2, 0]]), labels)
    with pytest.raises(ValueError, match="query"):
        nearest(X, np.zeros(3))
    with pytest.raises(ValueError, match="exclude"):
        nearest(X, X[0], exclude=3)


def test_auto_scaling_is_mutual_proximity_only_where_kinds_mix():
    auto = analysis.Scoring()
    assert auto.scaling == "auto"
    assert auto.scaling_for([False, False, False]) == ("none", None)
    assert auto.scaling_for([True, True]) == ("none", None)
    scaling, note = auto.scaling_for([True, False, np.True_, False, False])
    assert scaling == "mutual-proximity" and "2 LoRA adapters and 3 full fine-tunes" in note
    scaling, note = auto.scaling_for([None, float("nan"), False])  # stored before the kinds were kept
    assert scaling == "none" and "2 models were stored before" in note
    assert analysis.Scoring(scaling="none").scaling_for([True, False]) == ("none", None)
    X, labels = random_case(0)
    with pytest.raises(ValueError, match="resolve it from the models' kinds first"):
        knn_dataset_score(X, labels, scaling="auto")


def test_products_geometry_ranks_as_the_vectors_geometry_and_finds_each_rows_neighbours():
    """A Geometry made from the vectors' inner products alone scores, predicts and finds neighbours exactly as one
    made from the vectors (ties, zero rows and mutual proximity included)."""
    from modelvec.analyse.scores import Geometry, knn_dataset_score, predict_datasets

    rng = np.random.default_rng(3)
    X = rng.standard_normal((240, 12))
    X[10:14] = X[0]  # ties
    X[30:33] = 0.0  # zero vectors
    labels = [[f"d{rng.integers(0, 4)}"] if rng.random() > 0.15 else [] for _ in range(240)]
    for metric in ("cosine", "euclidean"):
        rows, products = Geometry(X, metric), Geometry.from_products(X @ X.T, metric)
        for scaling in ("none", "mutual-proximity"):
            a = knn_dataset_score(rows, labels, metric=metric, scaling=scaling)
            b = knn_dataset_score(products, labels, metric=metric, scaling=scaling)
            np.testing.assert_allclose(a.per_model, b.per_model, equal_nan=True)
            pa = predict_datasets(rows, labels, metric=metric, scaling=scaling)
            pb = predict_datasets(products, labels, metric=metric, scaling=scaling)
            assert pa.predicted == pb.predicted and pa.loo_accuracy == pb.loo_accuracy
        index, dist = products.neighbours(6)
        D = products.distances(np.arange(240), np.arange(240))
        np.fill_diagonal(D, np.inf)
        brute = np.argsort(D, axis=1, kind="stable")[:, :5]
        assert (index[:, 0] == np.arange(240)).all() and (dist[:, 0] == 0).all()
        np.testing.assert_array_equal(index[:, 1:], brute)
        np.testing.assert_allclose(dist[:, 1:], np.take_along_axis(D, brute, axis=1))

"""Each model's nearest lists from row blocks: equal to what every pair's distances give (whatever the blocks, with
ties, duplicate vectors, zero vectors and datasets of one model), the scores read from them equal to the pairwise
ones, and kept lists brought up to date by computing only the rows that changed, as a fresh pass would give them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelvec import Representation, Store
from modelvec.analyse.geometry import Geometry
from modelvec.analyse.graph_scores import depths_for, knn_from_lists, predictions_from_lists
from modelvec.analyse.inputs import group_codes, label_sets
from modelvec.analyse.neighbours import ruler
from modelvec.analyse.scores import knn_dataset_score, predict_datasets
from modelvec.store import VectorRow
from modelvec.store.derived import landmarks as marks
from modelvec.store.derived import neighbours as module
from modelvec.store.derived import products
from modelvec.store.views import listed

PARAMS = Representation(rank=4)


def store_of(path, X, labels, authors=None):
    with Store(path) as db:
        db.writes.put_many(
            [
                VectorRow(f"m{i:04d}", f"h{i}", "base", "bh", PARAMS, "bert", x, lab, "local", 0.1, author=a)
                for i, (x, lab, a) in enumerate(zip(X, labels, authors or [None] * len(X)))
            ]
        )
    return path


def made(n: int, dim: int, seed: int, *, ties: bool = True):
    rng = np.random.default_rng(seed)
    X = rng.integers(-2, 3, (n, dim)).astype(np.float32) if ties else rng.standard_normal((n, dim)).astype(np.float32)
    if n > 4:
        X[3] = X[1]  # a duplicate
        X[4] = 0.0  # a zero vector
    labels = [[f"d{rng.integers(4)}"] if rng.random() < 0.8 else [] for _ in range(n)]
    if n > 6:
        labels[6] = ["alone"]  # a dataset of one model
    authors = [f"a{rng.integers(3)}" for _ in range(n)] if seed % 3 else [None] * n  # some stores know no authors
    return X, labels, authors


def every_pair(db):
    selection, meta = db.reads.select()
    G = products.gram(db.vector_file, selection).gram
    return selection, meta, Geometry.from_products(G)


def ranked_rows(geo, scaling, eligible):
    """Every row's columns by (ranked distance, index), the ineligible and itself left out: the stable sort."""
    n = len(geo)
    everyone = np.arange(n)
    D = geo.ranked_distances(everyone, everyone, scaling)
    out = []
    for i in range(n):
        order = np.argsort(D[i], kind="stable")
        out.append([j for j in order if j != i and eligible[j]])
    return out, D


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 45),
    dim=st.integers(1, 30),
    block=st.integers(1, 3000),
    seed=st.integers(0, 2**16),
    scaling=st.sampled_from(["none", "mutual-proximity"]),
)
def test_lists_from_blocks_are_the_stable_sort_of_every_pair(tmp_path_factory, n, dim, block, seed, scaling):
    X, labels, authors = made(n, dim, seed)
    path = store_of(tmp_path_factory.mktemp("s") / "s.duckdb", X, labels, authors)
    with Store(path, read_only=True) as db:
        selection, meta, geo = every_pair(db)
        rng = np.random.default_rng(seed)
        depths = rng.integers(0, n + 1, n)
        eligible = rng.random(n) < 0.7
        lm = marks.landmarks(db.vector_file, selection, marks.landmark_positions(selection))
        stats = lm.spread("cosine") if scaling != "none" else None
        if stats is not None:  # every vector a landmark: the spread of every pair
            expected_stats = geo.spread(scaling)
            np.testing.assert_allclose(stats[0], expected_stats[0], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(stats[1], expected_stats[1], rtol=1e-7, atol=1e-12)
            geo.use_spread(scaling, stats)
        ranking = "plain" if scaling == "none" else "rank"
        wanted = [module.Wanted("w", depths, eligible, ranking)]
        found = module.nearest_lists(db.vector_file, selection, wanted, stats=stats, block_floats=block)
    assert found.damaged == {} and found.computed == n
    if stats is not None:  # the lists ranked by every pair's spread, summed in the pass (to its last bits' order)
        np.testing.assert_allclose(found.stats[0], geo.spread(scaling)[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(found.stats[1], geo.spread(scaling)[1], rtol=1e-7, atol=1e-12)
        geo.use_spread(scaling, found.stats)
    expected, D = ranked_rows(geo, scaling, eligible)
    lists = found.lists["w"]
    for i in range(n):
        cols, values, distances = lists.row(i)
        if stats is None:
            assert cols.tolist() == expected[i][: depths[i]]
        else:  # mutual proximity's values tie within their last bits (vectors on a line: every distance 0 or 2):
            # the nearest by value, in order, ties in any order
            want = expected[i][: depths[i]]
            assert len(cols) == len(want)
            np.testing.assert_allclose(D[i, cols], D[i, want], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(values, D[i, cols], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scaling", ["none", "mutual-proximity"])
def test_scores_from_lists_are_the_pairwise_scores(tmp_path, scaling):
    X, labels, authors = made(60, 12, 5, ties=False)
    path = store_of(tmp_path / "s.duckdb", X, labels, authors)
    with Store(path, read_only=True) as db:
        selection, meta, geo = every_pair(db)
        labels = [list(d) for d in meta["datasets"]]
        sets = label_sets(labels, len(labels))
        labelled = np.array([bool(s) for s in sets])
        groups = group_codes(list(meta["author"]), len(labels))
        stats = geo.spread(scaling)
        depths = depths_for(sets, labelled, groups=groups, votes=5)
        ranking = "plain" if scaling == "none" else "rank"
        wanted = [module.Wanted("scored", depths, labelled, ranking)]
        lists = module.nearest_lists(db.vector_file, selection, wanted, stats=stats).lists["scored"]
    knn = knn_dataset_score(geo, labels, scaling=scaling)
    got = knn_from_lists(lists, labels, labelled, scaling=scaling)
    assert got.score == pytest.approx(knn.score) and got.per_dataset.keys() == knn.per_dataset.keys()
    for name, (score, count) in knn.per_dataset.items():
        assert got.per_dataset[name] == (pytest.approx(score), count)
    np.testing.assert_array_equal(np.isnan(got.per_model), np.isnan(knn.per_model))
    by_author = knn_dataset_score(geo, labels, scaling=scaling, exclude_same=list(meta["author"]))
    got = knn_from_lists(lists, labels, labelled, scaling=scaling, exclude_same=groups)
    assert got.score == pytest.approx(by_author.score) and got.n_scored == by_author.n_scored
    pred = predict_datasets(geo, labels, k=5, scaling=scaling)
    stick = ruler(geo, np.flatnonzero(labelled), scaling)
    plain = geo.distances(np.arange(len(labels)), np.flatnonzero(labelled))
    plain[np.arange(len(labels))[:, None] == np.flatnonzero(labelled)[None, :]] = np.inf
    mine = predictions_from_lists(lists, labels, stick, plain.min(axis=1), k=5, scaling=scaling)
    assert mine.predicted == pred.predicted and mine.loo_accuracy == pred.loo_accuracy
    np.testing.assert_allclose(mine.confidence, pred.confidence, equal_nan=True)


@pytest.mark.parametrize("scaling", ["none", "mutual-proximity", "moved"])
def test_kept_lists_are_brought_up_to_date_by_the_rows_that_changed(tmp_path, scaling):
    """New vectors, a label added and one taken away: only those rows (and rows whose datasets outgrew their lists)
    are computed, against every vector; the lists are those of a fresh pass. ``moved``: by mutual proximity, the
    landmarks' spreads changed by the new vectors (the kept lists restated by the new ones): the lists ranked by
    the exact spreads are still a fresh pass's."""
    X, labels, authors = made(80, 10, 7, ties=False)
    path = tmp_path / "s.duckdb"
    store_of(path, X[:60], labels[:60], authors[:60])

    def lists_of(db, earlier=None):
        selection, meta = db.reads.select()
        labs = [list(d) for d in meta["datasets"]]
        sets = label_sets(labs, len(labs))
        eligible = np.array([bool(s) for s in sets])
        depths = depths_for(sets, eligible, votes=3, slack=0.25)
        ranking = "plain" if scaling == "none" else "rank"
        stats = None  # the landmarks' spreads' stand-in: the same, or moved by the new vectors
        if scaling != "none":
            moved = scaling == "moved" and len(labs) > 60
            rng = np.random.default_rng(len(labs))
            stats = (np.full(len(labs), 0.5) + moved * rng.normal(0, 0.05, len(labs)), np.full(len(labs), 0.1))
        wanted = [
            module.Wanted("near", np.full(len(labs), 6), np.ones(len(labs), bool), ranking),
            module.Wanted("scored", depths, eligible, ranking),
        ]
        found = module.nearest_lists(db.vector_file, selection, wanted, earlier=earlier, stats=stats)
        depths, eligible = {w.name: w.depths for w in wanted}, {w.name: w.eligible for w in wanted}
        kept = module.Earlier(list(selection.hashes), found.drawn, depths, eligible, found.sums)
        return found, found.computed, kept

    with Store(path, read_only=True) as db:
        _, computed, kept = lists_of(db)
    assert computed == 60
    labels[10] = []  # a label taken away
    labels[11] = ["d0"]
    store_of(path, X, labels, authors)  # twenty new vectors, two cards edited
    with Store(path, read_only=True) as db:
        if scaling == "moved":
            now = (0.5 + np.random.default_rng(80).normal(0, 0.05, 80), np.full(80, 0.1))
            kept = listed.restated(kept, {"near", "scored"}, now, list(db.reads.select()[0].hashes))
        updated, computed, _ = lists_of(db, kept)
        fresh, _, _ = lists_of(db)
        labs = [list(d) for d in db.reads.select()[1]["datasets"]]
    labelled = np.array([bool(d) for d in labs])
    assert 20 <= computed < 80
    np.testing.assert_allclose(updated.sums, fresh.sums, rtol=1e-12)  # every row's sums, in another order
    for name in ("near", "scored"):
        for part in ("indptr", "index", "value", "distance"):  # the lists as drawn: bit for bit
            if scaling != "moved":  # (moved: drawn by other spreads before)
                np.testing.assert_array_equal(getattr(updated.drawn[name], part), getattr(fresh.drawn[name], part))
        a, b = updated.lists[name], fresh.lists[name]  # ranked by the exact spreads: to their rounding
        np.testing.assert_array_equal(a.indptr, b.indptr)
        same = [sorted(a.row(i)[0]) == sorted(b.row(i)[0]) for i in range(len(a))]
        if scaling == "moved":  # drawn by other spreads: a row's last entries may differ
            assert np.mean(same) >= 0.95, np.mean(same)
            if name == "scored":
                knn_a, knn_b = (knn_from_lists(x, labs, labelled, scaling="mutual-proximity").score for x in (a, b))
                assert knn_a == pytest.approx(knn_b, abs=0.02)
        for i in np.flatnonzero(same) if scaling == "moved" else range(len(a)):
            (ia, va, _), (ib, vb, _) = a.row(i), b.row(i)
            assert sorted(ia) == sorted(ib)
            np.testing.assert_allclose(va[np.argsort(ia)], vb[np.argsort(ib)], rtol=1e-9, atol=1e-15)

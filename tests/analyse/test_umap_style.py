"""UMAP's layout (modelvec.analyse.umap_style): the fuzzy graph is umap-learn's, the layout the same bit for bit on any
number of threads and as good a map as umap-learn's, and numba's kept code is trusted only where it does what its
source does."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.neighbors import NearestNeighbors

from modelvec.analyse import descent
from modelvec.analyse import umap_style as layout
from modelvec.analyse.reduction import reduce


def planted(n: int, groups: int, seed: int = 0, noise: float = 0.45) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points in 30 dimensions around ``groups`` centres (from 1.3 ``noise`` on, the groups overlap)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, groups, n)
    return rng.normal(size=(groups, 30))[labels] + noise * rng.normal(size=(n, 30)), labels


def neighbours(X: np.ndarray, k: int = 15) -> tuple[np.ndarray, np.ndarray]:
    distances, indices = NearestNeighbors(n_neighbors=k, metric="cosine", algorithm="brute").fit(X).kneighbors(X)
    return indices, distances


def same_label_share(Y: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """The share of each point's k nearest on the map (itself excluded) with its label."""
    _, near = NearestNeighbors(n_neighbors=k + 1).fit(Y).kneighbors(Y)
    return float((labels[near[:, 1:]] == labels[:, None]).mean())


def test_the_fuzzy_graph_is_umap_learns():
    umap_ = pytest.importorskip("umap.umap_")
    X, _ = planted(300, 4)
    indices, distances = neighbours(X)
    ours = layout.fuzzy_graph(indices, distances)
    theirs, _, _ = umap_.fuzzy_simplicial_set(X, 15, 0, "cosine", knn_indices=indices, knn_dists=distances)
    assert abs(ours - theirs.tocsr()).max() < 1e-5
    assert abs(ours - ours.T).max() == 0 and ours.diagonal().max() == 0


def test_each_rows_memberships_sum_to_log2_k():
    X, _ = planted(200, 3, seed=1)
    indices, distances = neighbours(X, 10)
    rho, sigma = layout._bandwidths(distances, 10)
    memberships = np.exp(-np.clip(distances[:, 1:] - rho[:, None], 0, None) / sigma[:, None]).sum(axis=1)
    assert np.allclose(memberships, np.log2(10), atol=1e-4)


def test_the_layout_is_the_same_on_any_number_of_threads_and_with_the_seed_only():
    numba = pytest.importorskip("numba")
    X, _ = planted(800, 5, seed=2)
    indices, distances = neighbours(X)
    start = X[:, :2]
    before = numba.get_num_threads()
    try:
        laid = []
        for threads in (1, before):
            numba.set_num_threads(threads)
            laid.append(layout.layout(indices, distances, start, n_epochs=100, seed=3))
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(laid[0], laid[1])
    assert not np.array_equal(laid[0], layout.layout(indices, distances, start, n_epochs=100, seed=4))


@pytest.mark.filterwarnings("ignore:precomputed_knn")
def test_the_map_is_as_good_as_umap_learns():
    """On overlapping groups, the map keeps each point's neighbours in its group as often as umap-learn's does (same
    neighbours, epochs and start: 0.84 both when this was written), within 0.03."""
    umap = pytest.importorskip("umap")
    X, labels = planted(2000, 8, seed=5, noise=1.6)
    indices, distances = neighbours(X)
    ours = reduce(X, "umap", metric="cosine", neighbours=(indices, distances))
    theirs = umap.UMAP(
        n_neighbors=15, metric="cosine", random_state=0, n_jobs=1, precomputed_knn=(indices, distances, None)
    )
    theirs = theirs.set_params(n_epochs=200, init="pca").fit_transform(X)
    share, reference = same_label_share(ours, labels), same_label_share(theirs, labels)
    assert share > 0.7 and share > reference - 0.03, (share, reference)


def test_kept_code_that_lays_out_otherwise_than_its_source_is_compiled_anew_and_said(monkeypatch):
    X, _ = planted(300, 3, seed=6)
    indices, distances = neighbours(X)
    right = layout.layout(indices, distances, X[:, :2], n_epochs=50)
    assert layout.kept_code_note() is None

    kept = descent.descend

    def damaged(Y, *args):  # code that runs, and lays out elsewhere
        kept(Y, *args)
        Y += 1e-3

    monkeypatch.setattr(descent, "descend", damaged)
    layout._kernel.cache_clear()
    try:
        again = layout.layout(indices, distances, X[:, :2], n_epochs=50)
        note = layout.kept_code_note()
    finally:
        layout._kernel.cache_clear()
    assert note is not None and "gives other layouts than its source: compiled anew" in note
    assert np.array_equal(again, right)


def test_kept_code_that_cannot_be_loaded_is_compiled_anew_and_said(monkeypatch):
    def unreadable(*args):
        raise EOFError("Ran out of input")

    monkeypatch.setattr(descent, "descend", unreadable)
    layout._kernel.cache_clear()
    try:
        X, _ = planted(100, 2, seed=7)
        Y = layout.layout(*neighbours(X, 8), X[:, :2], n_epochs=20)
        note = layout.kept_code_note()
    finally:
        layout._kernel.cache_clear()
    assert np.isfinite(Y).all()
    assert note is not None and "could not be loaded (EOFError): compiled anew" in note


def test_maps_laid_out_from_two_threads_at_once_on_any_threading_layer(tmp_path):
    """numba's workqueue layer (where neither TBB nor OpenMP is installed) aborts a process that launches parallel
    code from two threads at once: two maps asked at once are laid out in turn, each as if alone."""
    script = tmp_path / "two.py"
    script.write_text(
        "import threading, numpy as np\n"
        "from modelvec.analyse.reduction import reduce\n"
        "X = np.random.default_rng(0).normal(size=(600, 12))\n"
        "alone = [reduce(X, 'umap', seed=s) for s in (0, 1)]\n"
        "out = [None, None]\n"
        "def run(s): out[s] = reduce(X, 'umap', seed=s)\n"
        "threads = [threading.Thread(target=run, args=(s,)) for s in (0, 1)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "import numba; print(numba.threading_layer(), all(np.array_equal(a, b) for a, b in zip(alone, out)))\n"
    )
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["workqueue", "True"]


def test_maps_are_laid_out_where_numba_has_no_folder_to_keep_code_in(tmp_path):
    """numba refuses ``cache=True`` at decoration where none of its cache folders can be written (a read-only
    install and home): the kernel is then compiled in each process, and the map is the same."""
    script = tmp_path / "nowhere.py"
    script.write_text(
        "import numpy as np\n"
        "import numba.core.caching as caching\n"
        "impl = getattr(caching, 'CacheImpl', None) or caching._CacheImpl  # its name from numba 0.59\n"
        "impl._locator_classes = []  # no folder will do (numba's own list of them, emptied for the test)\n"
        "from modelvec.analyse import descent, umap_style as layout\n"
        "from modelvec.analyse.reduction import reduce\n"
        "X = np.random.default_rng(0).normal(size=(300, 8))\n"
        "Y = reduce(X, 'umap')\n"
        "print(descent.descend._cache.__class__.__name__, layout.kept_code_note() is None)\n"
        "np.save(__import__('sys').argv[1], Y)\n"
    )
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "Y.npy")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["NullCache", "True"]
    X = np.random.default_rng(0).normal(size=(300, 8))
    assert np.array_equal(np.load(tmp_path / "Y.npy"), reduce(X, "umap"))

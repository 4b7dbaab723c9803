"""The vectors' inner products read from the vector file in blocks: equal to the whole product whatever the
blocks, kept beside the store and extended by the rows of new vectors only, a damaged vector named and left out,
and a query answered in one pass that reads each vector once."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from modelvec import Representation, Store
from modelvec.store import VectorRow
from modelvec.store.derived import cache
from modelvec.store.derived import products as module
from modelvec.store.derived.cache import CacheFolder
from modelvec.store.formats import blocks

PARAMS = Representation(rank=4)


def rows(X: np.ndarray, prefix: str = "m") -> list[VectorRow]:
    return [
        VectorRow(f"{prefix}{i:04d}", f"h{prefix}{i}", "base", "bh", PARAMS, "bert", x, ["d"], "local", 0.1)
        for i, x in enumerate(X)
    ]


def vectors(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), dim=st.integers(1, 70), block=st.integers(1, 4000), seed=st.integers(0, 2**16))
def test_blockwise_products_equal_the_whole_product(tmp_path_factory, n, dim, block, seed):
    X = vectors(n, dim, seed)
    path = tmp_path_factory.mktemp("s") / "s.duckdb"
    with Store(path) as db:
        db.writes.put_many(rows(X))
        selection, _ = db.reads.select()
        got = module.gram(db.vector_file, selection, block_floats=block)
    whole = X.astype(np.float64) @ X.astype(np.float64).T
    assert got.damaged == {} and got.positions.tolist() == list(range(n))
    np.testing.assert_allclose(got.gram, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())
    np.testing.assert_array_equal(got.gram, got.gram.T)


def test_cached_products_are_reused_and_only_new_rows_computed(tmp_path):
    X, Y = vectors(30, 50, 1), vectors(7, 50, 2)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many(rows(X))
        first = db.reads.products(db.reads.select()[0], cache="base|key")
        assert first.computed_rows == 30
        db.writes.put_many(rows(Y, prefix="n"))
        selection, _ = db.reads.select()
        again = db.reads.products(selection, cache="base|key")
        assert again.computed_rows == 7  # only the new vectors' rows were read and multiplied
        fresh = module.gram(db.vector_file, selection)
        np.testing.assert_allclose(again.gram, fresh.gram, rtol=1e-6, atol=1e-6)
        assert not np.isnan(again.gram).any()
        db.writes.put_many(rows(X[:3] * 2))  # three vectors replaced: their old products are never reused
        selection, _ = db.reads.select()
        third = db.reads.products(selection, cache="base|key")
        assert third.computed_rows == 3
        np.testing.assert_allclose(third.gram, module.gram(db.vector_file, selection).gram, rtol=1e-6, atol=1e-6)
    assert len(list(CacheFolder(tmp_path / "s.duckdb").folder.iterdir())) == 1
    assert CacheFolder(tmp_path / "s.duckdb").products_path("base|key").suffix == ".products"


def test_a_damaged_vector_is_named_and_the_others_analysed(tmp_path):
    X = vectors(12, 40, 3)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many(rows(X))
        offset = db.con.execute("SELECT \"offset\" FROM vectors WHERE model = 'm0005'").fetchall()[0][0]
    with open(tmp_path / "s.duckdb.vectors", "r+b") as f:
        f.seek(offset + 9)
        byte = f.read(1)
        f.seek(offset + 9)
        f.write(bytes([byte[0] ^ 0x10]))
    with Store(tmp_path / "s.duckdb", read_only=True) as db:
        selection, _ = db.reads.select()
        got = db.reads.products(selection)
        dots, _, damaged = blocks.products_with(db.vector_file, selection, X[0])
    assert list(got.damaged) == ["m0005"] and "does not match its checksum" in got.damaged["m0005"]
    keep = [i for i in range(12) if i != 5]
    assert got.positions.tolist() == keep
    np.testing.assert_allclose(got.gram, X[keep].astype(np.float64) @ X[keep].T, rtol=1e-5, atol=1e-4)
    assert list(damaged) == ["m0005"] and np.isnan(dots[5]) and not np.isnan(np.delete(dots, 5)).any()


def flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def test_vectors_damaged_after_their_products_were_kept_are_caught_on_every_thread(tmp_path, monkeypatch):
    """Every product kept: each vector is still read once and checked (on two threads here, each a run of the
    file), and the damaged ones, one in each thread's run, are named in file order and left out."""
    X = vectors(20, 40, 6)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many(rows(X))
        db.reads.products(db.reads.select()[0], cache="base|key")
        offsets = dict(db.con.execute('SELECT model, "offset" FROM vectors').fetchall())
    for model in ("m0016", "m0003"):
        flip(tmp_path / "s.duckdb.vectors", offsets[model] + 5)
    monkeypatch.setattr(module, "cores", lambda: 2)
    with Store(tmp_path / "s.duckdb", read_only=True) as db:
        selection, _ = db.reads.select()
        reads: list[int] = []
        original = db.vector_file.read_raw
        monkeypatch.setattr(
            db.vector_file, "read_raw", lambda offset, raw: reads.append(offset) or original(offset, raw)
        )
        got = db.reads.products(selection, cache="base|key")
    assert got.computed_rows == 0 and sorted(reads) == sorted(selection.offsets)
    assert list(got.damaged) == ["m0003", "m0016"]
    keep = [i for i in range(20) if i not in (3, 16)]
    assert got.positions.tolist() == keep
    np.testing.assert_allclose(got.gram, X[keep].astype(np.float64) @ X[keep].T, rtol=1e-5, atol=1e-4)


def test_a_query_reads_each_vector_once(tmp_path, monkeypatch):
    X = vectors(25, 30, 4)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many(rows(X))
        selection, _ = db.reads.select()
        reads: list[int] = []
        original = db.vector_file.read_raw
        monkeypatch.setattr(
            db.vector_file, "read_raw", lambda offset, raw: reads.append(offset) or original(offset, raw)
        )
        q = vectors(1, 30, 5)[0]
        dots, squares, damaged = blocks.products_with(db.vector_file, selection, q, block_floats=20 * 30)
    assert sorted(reads) == sorted(selection.offsets) and len(reads) == 25
    np.testing.assert_allclose(dots, X.astype(np.float64) @ q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(squares, (X.astype(np.float64) ** 2).sum(1), rtol=1e-5)
    assert damaged == {}


#: The float32 products' stated tolerance, relative to the two vectors' norms: 8 sqrt(dim) units of a float32's
#: rounding (2^-24), the statistical bound of a float32 sum of dim terms (the blocked sums of BLAS do better).
def tolerance(dim: int) -> float:
    return 8 * np.sqrt(dim) * 2.0**-24


def near_duplicates(n: int, dim: int, seed: int) -> np.ndarray:
    """Random vectors, every third a near copy of the one before (cosine ~1 - 1e-8: its distance cancels)."""
    X = vectors(n, dim, seed)
    rng = np.random.default_rng(seed + 1)
    for i in range(2, n, 3):
        X[i] = X[i - 1] * rng.uniform(0.5, 2) + 1e-4 * rng.standard_normal(dim).astype(np.float32)
    return X


def check_float32_products(got: np.ndarray, X: np.ndarray) -> None:
    """Within :func:`tolerance` of float64 everywhere; float64's (to 1e-12 of the norms) where a distance cancels
    (cosine above ``RECHECK_COSINE``) and on the diagonal; exactly symmetric."""
    whole = X.astype(np.float64) @ X.astype(np.float64).T
    norms = np.sqrt(np.outer(np.diag(whole), np.diag(whole)))
    error = np.abs(got - whole)
    assert (error <= tolerance(X.shape[1]) * norms + 1e-30).all()
    near = whole > module.RECHECK_COSINE * norms
    assert (error[near] <= 1e-12 * norms[near]).all()
    np.testing.assert_array_equal(got, got.T)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 60), dim=st.integers(1, 400), block=st.integers(1, 20000), seed=st.integers(0, 2**16))
def test_blocked_float32_products_equal_float64_within_their_tolerance(tmp_path_factory, n, dim, block, seed):
    """The float32 path (forced: ``exact_up_to=0``) over random sizes and blocks, the held block's own upper
    triangle and the chunks streamed past it: float64 within the stated tolerance, near copies recomputed."""
    X = near_duplicates(n, dim, seed)
    path = tmp_path_factory.mktemp("s") / "s.duckdb"
    with Store(path) as db:
        db.writes.put_many(rows(X))
        selection, _ = db.reads.select()
        got = module.gram(db.vector_file, selection, block_floats=block, exact_up_to=0)
    assert got.positions.tolist() == list(range(n))
    check_float32_products(got.gram, X)


def test_the_torch_path_equals_numpys_within_float32_rounding(tmp_path, monkeypatch):
    """The torch product (what runs on a GPU), here on the CPU, against numpy's: both within the tolerance of float64
    and of each other, and new rows added to kept products the same way."""
    import functools

    X = near_duplicates(50, 300, 7)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many(rows(X[:40]))
        selection, _ = db.reads.select()
        numpy_path = module.gram(db.vector_file, selection, block_floats=12 * 300, exact_up_to=0)
        monkeypatch.setattr(module, "Multiplier", functools.partial(module.Multiplier, torch_on_cpu=True))
        torch_path = module.gram(db.vector_file, selection, block_floats=12 * 300, exact_up_to=0)
        db.writes.put_many(rows(X[40:], prefix="n"))
        more, _ = db.reads.select()
        known = cache.CachedProducts(np.zeros((50, 50)), np.zeros(50, dtype=bool))
        known.gram[:40, :40], known.have[:40] = torch_path.gram, True
        extended = module.gram(db.vector_file, more, known=known, block_floats=12 * 300, exact_up_to=0)
    check_float32_products(torch_path.gram, X[:40])
    whole = X[:40].astype(np.float64) @ X[:40].astype(np.float64).T
    scale = np.sqrt(np.outer(np.diag(whole), np.diag(whole)))
    assert (np.abs(torch_path.gram - numpy_path.gram) <= 2 * tolerance(300) * scale).all()
    assert extended.computed_rows == 10
    check_float32_products(extended.gram, X)


def test_on_a_gpu_the_products_equal_the_cpus_within_float32_rounding(tmp_path):
    """``device="cuda"``: the same products as the CPU's float32 ones, within float32 rounding (skipped without a
    GPU)."""
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible")
    X = near_duplicates(300, 2000, 11)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many(rows(X))
        selection, _ = db.reads.select()
        cpu = module.gram(db.vector_file, selection, block_floats=100 * 2000, exact_up_to=0, device="cpu")
        gpu = module.gram(db.vector_file, selection, block_floats=100 * 2000, exact_up_to=0, device="cuda")
    check_float32_products(gpu.gram, X)
    whole = X.astype(np.float64) @ X.astype(np.float64).T
    scale = np.sqrt(np.outer(np.diag(whole), np.diag(whole)))
    assert (np.abs(gpu.gram - cpu.gram) <= 2 * tolerance(2000) * scale).all()

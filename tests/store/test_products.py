"""The vectors' inner products read from the vector file in blocks: equal to the whole product whatever the
blocks, kept beside the store and extended by the rows of new vectors only, a damaged vector named and left out,
and a query answered in one pass that reads each vector once."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from modelvec import Representation, Store
from modelvec.store import VectorRow
from modelvec.store import products as module
from modelvec.store.products import ProductsCache

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
        db.put_many(rows(X))
        selection, _ = db.select()
        got = module.gram(db.vector_file, selection, block_floats=block)
    whole = X.astype(np.float64) @ X.astype(np.float64).T
    assert got.damaged == {} and got.kept.tolist() == list(range(n))
    np.testing.assert_allclose(got.gram, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())
    np.testing.assert_array_equal(got.gram, got.gram.T)


def test_cached_products_are_reused_and_only_new_rows_computed(tmp_path):
    X, Y = vectors(30, 50, 1), vectors(7, 50, 2)
    with Store(tmp_path / "s.duckdb") as db:
        db.put_many(rows(X))
        first = db.products(db.select()[0], cache="base|key")
        assert first.computed_rows == 30
        db.put_many(rows(Y, prefix="n"))
        selection, _ = db.select()
        again = db.products(selection, cache="base|key")
        assert again.computed_rows == 7  # only the new vectors' rows were read and multiplied
        fresh = module.gram(db.vector_file, selection)
        np.testing.assert_allclose(again.gram, fresh.gram, rtol=1e-6, atol=1e-6)
        assert not np.isnan(again.gram).any()
        db.put_many(rows(X[:3] * 2))  # three vectors replaced: their old products are never reused
        selection, _ = db.select()
        third = db.products(selection, cache="base|key")
        assert third.computed_rows == 3
        np.testing.assert_allclose(third.gram, module.gram(db.vector_file, selection).gram, rtol=1e-6, atol=1e-6)
    assert len(list(ProductsCache(tmp_path / "s.duckdb", "base|key").folder.iterdir())) == 1
    assert ProductsCache(tmp_path / "s.duckdb", "base|key").path.suffix == ".products"


def test_a_damaged_vector_is_named_and_the_others_analysed(tmp_path):
    X = vectors(12, 40, 3)
    with Store(tmp_path / "s.duckdb") as db:
        db.put_many(rows(X))
        offset = db.con.execute("SELECT \"offset\" FROM vectors WHERE model = 'm0005'").fetchall()[0][0]
    with open(tmp_path / "s.duckdb.vectors", "r+b") as f:
        f.seek(offset + 9)
        byte = f.read(1)
        f.seek(offset + 9)
        f.write(bytes([byte[0] ^ 0x10]))
    with Store(tmp_path / "s.duckdb", read_only=True) as db:
        selection, _ = db.select()
        got = db.products(selection)
        dots, _, damaged = module.products_with(db.vector_file, selection, X[0])
    assert list(got.damaged) == ["m0005"] and "does not match its checksum" in got.damaged["m0005"]
    keep = [i for i in range(12) if i != 5]
    assert got.kept.tolist() == keep
    np.testing.assert_allclose(got.gram, X[keep].astype(np.float64) @ X[keep].T, rtol=1e-5, atol=1e-4)
    assert list(damaged) == ["m0005"] and np.isnan(dots[5]) and not np.isnan(np.delete(dots, 5)).any()


def test_a_query_reads_each_vector_once(tmp_path, monkeypatch):
    X = vectors(25, 30, 4)
    with Store(tmp_path / "s.duckdb") as db:
        db.put_many(rows(X))
        selection, _ = db.select()
        reads: list[int] = []
        original = db.vector_file.read_raw
        monkeypatch.setattr(
            db.vector_file, "read_raw", lambda offset, raw: reads.append(offset) or original(offset, raw)
        )
        q = vectors(1, 30, 5)[0]
        dots, squares, damaged = module.products_with(db.vector_file, selection, q, block_floats=20 * 30)
    assert sorted(reads) == sorted(selection.offsets) and len(reads) == 25
    np.testing.assert_allclose(dots, X.astype(np.float64) @ q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(squares, (X.astype(np.float64) ** 2).sum(1), rtol=1e-5)
    assert damaged == {}

"""The products kept while a run stores vectors: what the first ``cluster`` then reads instead of computing."""

from __future__ import annotations

import time

import numpy as np
import pytest

import modelvec
from modelvec import Representation, Store
from modelvec.core.errors import ResourceError
from modelvec.run.cache_updates import ProductsCacheUpdater
from modelvec.store import Population, VectorRow
from modelvec.store.derived.cache import CacheFolder

PARAMS = Representation(rank=4)


def _rows(X: np.ndarray, start: int) -> list[VectorRow]:
    return [
        VectorRow(f"m{start + i:04d}", f"h{start + i}", "base", "bh", PARAMS, "bert", x, ["d"], "local", 0.1)
        for i, x in enumerate(X)
    ]


def _fresh(path, base: str, representation: Representation) -> np.ndarray:
    """The products a first ``cluster`` computes, with nothing kept."""
    with Store(path) as db:
        population = Population(db, base, representation)
        CacheFolder(db.path).products_path(population.cache_key()).unlink()
        products, _ = population.products()
        assert products.computed_rows == len(population.selection)
        return np.array(products.gram)


def test_an_embed_run_keeps_the_products_the_first_cluster_reads(tiny_bert, tiny_finetunes, tmp_path):
    path = tmp_path / "s.duckdb"
    result = modelvec.embed(tiny_bert, tiny_finetunes, rank=4, store=path, products_from=2)
    assert result.kept_products is not None and "products of 3 vectors are kept" in result.kept_products
    with Store(path) as db:
        population = Population(db, tiny_bert, PARAMS)
        kept, _ = population.products()
        assert kept.computed_rows == 0  # the first cluster computes nothing
        gram = np.array(kept.gram)
    np.testing.assert_array_equal(gram, _fresh(path, tiny_bert, PARAMS))
    steps: list[str] = []
    again = modelvec.embed(
        tiny_bert, tiny_finetunes, rank=4, store=path, products_from=2, on_step=lambda s: steps.append(s.status)
    )
    assert again.kept_products is None and "keeping" not in steps  # nothing stored by this run: nothing to keep
    forced = modelvec.embed(
        tiny_bert,
        tiny_finetunes,
        rank=4,
        store=path,
        products_from=2,
        force=True,
        on_step=lambda s: steps.append(s.status),
    )
    assert forced.kept_products is not None and steps[-1] == "keeping"  # said before the last update, once
    assert steps.count("keeping") == 1


def test_below_its_threshold_a_run_keeps_nothing(tiny_bert, tiny_finetunes, tmp_path):
    path = tmp_path / "s.duckdb"
    result = modelvec.embed(tiny_bert, tiny_finetunes, rank=4, store=path)  # the default: from 1,000 vectors
    assert result.kept_products is None
    assert not (tmp_path / "s.duckdb.products").exists()


def test_a_keeper_that_cannot_keep_says_so_and_the_run_goes_on(tiny_bert, tiny_finetunes, tmp_path, monkeypatch):
    def too_small(n: int, dim: int) -> None:
        raise ResourceError("store", "too little memory")

    monkeypatch.setattr("modelvec.store.views.population.check_fits", too_small)
    result = modelvec.embed(tiny_bert, tiny_finetunes, rank=4, store=tmp_path / "s.duckdb", products_from=1)
    assert len(result.embedded) == 3 and not result.failed
    assert result.kept_products is not None and "were not kept for the map" in result.kept_products
    assert "too little memory" in result.kept_products


def _wait_for(keeper: ProductsCacheUpdater, updates: int) -> None:
    deadline = time.monotonic() + 60
    while len(keeper.computed) < updates:
        assert time.monotonic() < deadline, "the keeper made no update"
        time.sleep(0.01)


def test_updates_during_a_run_compute_each_vector_once_and_equal_a_first_run(tmp_path):
    """Batches stored while the keeper runs: an update as each batch comes, each vector's row computed once over
    the run, and the kept products equal to those computed all at once (within float32 rounding, where the
    updates' products were float32)."""
    dim = 300
    X = np.random.default_rng(dim).standard_normal((50, dim)).astype(np.float32)
    path = tmp_path / "s.duckdb"
    with Store(path) as db:
        with ProductsCacheUpdater(db, "base", PARAMS, products_from=10, device="cpu", step=8) as keeper:
            for start, stop in [(0, 12), (12, 30), (30, 50)]:
                db.writes.put_many(_rows(X[start:stop], start))
                for _ in range(start, stop):
                    keeper.added()
                if stop < 50:
                    _wait_for(keeper, len(keeper.computed) + 1)
        assert len(keeper.computed) >= 3 and sum(keeper.computed) == 50
        population = Population(db, "base", PARAMS)
        kept, _ = population.products()
        assert kept.computed_rows == 0
        gram = np.array(kept.gram)
    whole = _fresh(path, "base", PARAMS)
    norms = np.sqrt(np.outer(np.diag(whole), np.diag(whole)))
    assert np.max(np.abs(gram - whole) / norms) <= 8 * np.sqrt(dim) * 2.0**-24
    np.testing.assert_array_equal(gram, gram.T)


def test_an_interrupted_run_makes_no_last_update(tmp_path):
    X = np.random.default_rng(0).standard_normal((20, 5)).astype(np.float32)
    db = Store(tmp_path / "s.duckdb")
    keeper = ProductsCacheUpdater(db, "base", PARAMS, products_from=1, step=1000)
    with db, pytest.raises(KeyboardInterrupt), keeper:
        db.writes.put_many(_rows(X, 0))
        for _ in range(20):
            keeper.added()
        raise KeyboardInterrupt
    assert keeper.computed == [] and keeper.line is None

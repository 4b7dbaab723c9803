"""A :class:`~modelvec.store.Population` reads the store's rows once (:mod:`~modelvec.store.views.snapshot`): which base,
its version now, the stale rows and the rows of the version now all follow from that one read, exactly as the
store's own queries give them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from modelvec import Representation, Store
from modelvec.store import Population, VectorRow
from modelvec.store.views.export import export_parquet
from modelvec.store.views.snapshot import Snapshot

PARAMS = Representation(rank=4)
BASE = "org/base"


def _row(model: str, base_version: str, x: np.ndarray, **more: Any) -> VectorRow:
    return VectorRow(model, f"h{model}", BASE, base_version, PARAMS, "bert", x, ["d"], "local", 0.1, **more)


def _store(path) -> Store:
    """Two versions of a Hub base (its commit now recorded with the second), an adapter, a fine-tune, a model of
    unknown kind, a quantization, a card's parents, a model only of the earlier version, and another base."""
    X = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    db = Store(path)
    db.writes.put_many(
        [
            _row("a", "v2", X[0], adapter=True, parents=["org/base"], relation="adapter"),
            _row("b", "v2", X[1], adapter=False),
            _row("c", "v2", X[2]),
            _row("q", "v2", X[3], quantized="Q4_K"),
            _row("a", "v1", X[0], adapter=True),
            _row("old", "v1", X[4]),
        ]
    )
    db.writes.put(VectorRow("o", "ho", "org/other", "w", PARAMS, "bert", X[5], ["d"], "local", 0.1))
    db.con.execute("INSERT INTO bases (base, sha) VALUES (?, ?)", [BASE, "f" * 40])
    db.versions.record_base(BASE, "git:" + "f" * 40, "v2")
    return db


def test_the_snapshot_gives_what_the_stores_queries_give(tmp_path):
    with _store(tmp_path / "s.duckdb") as db:
        snap = Snapshot(db.connection, [BASE], PARAMS)
        assert snap.bases() == [BASE]
        assert Snapshot(db.connection, None, PARAMS).bases() == [BASE, "org/other"]
        assert snap.base_now(BASE) == db.versions.base_now(BASE) == "v2"
        pd.testing.assert_frame_equal(snap.stored(BASE), db.versions.stored(BASE, PARAMS))
        assert snap.models(BASE) == set(db.reads.metadata(base=BASE, representation=PARAMS)["model"])
        for version in ("v1", "v2"):
            got, meta = snap.select(BASE, version)
            want, want_meta = db.reads.select(base=BASE, representation=PARAMS, base_hash=version)
            assert got == want
            pd.testing.assert_frame_equal(meta, want_meta)  # the same columns, the same types
            for column in meta.columns:
                assert [type(v) for v in meta[column]] == [type(v) for v in want_meta[column]], column


class _Counting:
    """The store's DuckDB connection, counting the statements run on it."""

    def __init__(self, con) -> None:
        self._con, self.statements = con, []

    def execute(self, sql, *args, **kwargs):
        self.statements.append(sql)
        return self._con.execute(sql, *args, **kwargs)

    def sql(self, sql, **kwargs):
        self.statements.append(sql)
        return self._con.sql(sql, **kwargs)

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_a_population_reads_the_stores_rows_once_before_its_first_product(tmp_path):
    """Before its first product a population runs 2 statements on the store: one read of its base's rows (every
    version's, with what says the base's version now: :mod:`~modelvec.store.views.snapshot`) and one of the traces' rows
    (which models are copies); the store's columns (an older store lacks some) were asked once, as it was opened
    (it ran 4: a look at them before each read). It read the vectors' rows 4 times (which base, its versions, the
    version now's rows, the stale models), the base's version twice more."""
    with _store(tmp_path / "s.duckdb") as db:
        db.con.execute("DELETE FROM vectors WHERE base = 'org/other'")  # the only base: found without naming it
        counting = _Counting(db.con)
        db.connection.con = counting  # type: ignore[assignment]
        for base in (BASE, None):
            counting.statements.clear()
            population = Population(db, base, PARAMS)
            reads = [s for s in counting.statements if "FROM vectors" in s]
            assert len(reads) == 1 and len(counting.statements) == 2, counting.statements
            assert population.name == BASE and population.base_hash == "v2"
            assert (population.stale, population.stale_only) == (2, 1)
            assert list(population.meta["model"]) == ["a", "b", "c"] and population.quantized == ["q"]


def test_a_population_reads_after_any_one_row_read_of_the_store(tmp_path):
    """The store's one-row reads leave no result half read: DuckDB 2 refuses the population's one read (a relation)
    on a connection whose last result was not read to its end. Each read, then a population, then an export."""
    with _store(tmp_path / "s.duckdb") as db:
        reads = [
            lambda: db.reads.stored_version("a", BASE, "v2", PARAMS),
            lambda: db.reads.card_of("a", BASE),
            lambda: db.reads.same_files("x", "a", BASE, "v2", PARAMS),
            lambda: db.reads.same_vector("x", "a", BASE, "v2", PARAMS),
            lambda: db.versions.base_now(BASE),
        ]
        for read in reads:
            read()
            population = Population(db, BASE, PARAMS)
            assert list(population.meta["model"]) == ["a", "b", "c"]
            read()
            assert export_parquet(db, tmp_path / "x.parquet") == 7

"""The store keeps vectors' bytes in an append-only file beside DuckDB: rows point at checksummed
bytes, damage is caught and named, bytes left by a killed run are never read, and stores whose
vectors were ``FLOAT[]`` in DuckDB are migrated on open without losing a bit."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import numpy as np
import pytest

from modelvec import Representation, Store
from modelvec.store import StoreError, VectorRow
from modelvec.store.formats.schema import columns_by_table
from modelvec.store.formats.vectorfile import VectorFile, header

PARAMS = Representation(rank=4)


def row(model: str, vector: np.ndarray, datasets=("sst2",)) -> VectorRow:
    return VectorRow(model, f"hash-{model}", "base", "base-hash", PARAMS, "bert", vector, list(datasets), "local", 0.5)


def vectors(n: int, dim: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def test_vectors_round_trip_through_the_writer_and_survive_reopen(tmp_path):
    X = vectors(20)
    with Store(tmp_path / "s.duckdb") as db, db.writes.writer() as w:
        for i, x in enumerate(X):
            w.put(row(f"m{i:02d}", x))
    with Store(tmp_path / "s.duckdb") as db:
        loaded, meta = db.reads.load(representation=PARAMS)
    np.testing.assert_array_equal(loaded, X)
    assert meta["model"].tolist() == [f"m{i:02d}" for i in range(20)]
    assert (tmp_path / "s.duckdb.vectors").stat().st_size >= X.nbytes


def test_duckdb_holds_rows_not_vector_bytes(tmp_path):
    """The point of the vector file: the DuckDB file (and its buffer pool) stays small however many
    vectors are written, so a long run's memory does not grow with the store."""
    X = vectors(200, dim=20_000)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many([row(f"m{i:03d}", x) for i, x in enumerate(X)])
        db.con.execute("CHECKPOINT")
        in_duckdb = sum(r[1] for r in db.con.execute("SELECT * FROM duckdb_memory()").fetchall())
    assert (tmp_path / "s.duckdb").stat().st_size < X.nbytes / 10  # ~0.5 MB at DuckDB 2, ~1 MB at 1.2: not 16 MB
    assert in_duckdb < X.nbytes / 10


def test_replacing_a_vector_points_at_the_new_bytes(tmp_path):
    old, new = vectors(2)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put(row("m", old))
        db.writes.put(row("m", new))
        loaded, meta = db.reads.load()
    assert len(meta) == 1
    np.testing.assert_array_equal(loaded[0], new)


def test_bytes_left_by_a_killed_append_are_never_read(tmp_path):
    """A run killed after writing bytes but before its commit leaves an unreferenced (and maybe
    unaligned) tail; later rows go after it and every committed row still reads back exactly."""
    X = vectors(3)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put(row("a", X[0]))
    with open(tmp_path / "s.duckdb.vectors", "ab") as f:
        f.write(b"\x7f" * 1001)  # half a vector, never committed
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many([row("b", X[1]), row("c", X[2])])
        loaded, meta = db.reads.load()
        offsets = [r[0] for r in db.con.execute('SELECT "offset" FROM vectors').fetchall()]
    np.testing.assert_array_equal(loaded, X)
    assert all(o % VectorFile.ALIGN == 0 for o in offsets)


def test_changed_bytes_are_caught_and_the_model_named(tmp_path):
    X = vectors(3)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X)])
        offset = db.con.execute("SELECT \"offset\" FROM vectors WHERE model = 'm1'").fetchall()[0][0]
    with open(tmp_path / "s.duckdb.vectors", "r+b") as f:
        f.seek(offset + 17)
        byte = f.read(1)
        f.seek(offset + 17)
        f.write(bytes([byte[0] ^ 0x01]))
    with Store(tmp_path / "s.duckdb") as db:
        with pytest.raises(StoreError, match=r"^m1: its stored vector .* does not match its checksum"):
            db.reads.load()
        loaded, _ = db.reads.load(models=["m0", "m2"])  # the others still load
    np.testing.assert_array_equal(loaded, X[[0, 2]])


def test_a_truncated_vector_file_is_caught(tmp_path):
    X = vectors(2)
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many([row("a", X[0]), row("b", X[1])])
    heap = tmp_path / "s.duckdb.vectors"
    os.truncate(heap, heap.stat().st_size - 8)
    with Store(tmp_path / "s.duckdb") as db, pytest.raises(StoreError, match=r"^b: .*truncated"):
        db.reads.load()


def test_a_foreign_vector_file_is_refused(tmp_path):
    (tmp_path / "s.duckdb.vectors").write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(StoreError, match="not a modelvec vector file"):
        Store(tmp_path / "s.duckdb")


OLD_VECTORS_TABLE = """
CREATE TABLE vectors (
    model VARCHAR NOT NULL, model_hash VARCHAR NOT NULL, base VARCHAR NOT NULL, base_hash VARCHAR NOT NULL,
    params VARCHAR NOT NULL, rank INTEGER NOT NULL, factor VARCHAR NOT NULL, pooling VARCHAR NOT NULL,
    solver VARCHAR NOT NULL, sign VARCHAR NOT NULL, params_json VARCHAR NOT NULL, architecture VARCHAR NOT NULL,
    dim INTEGER NOT NULL, vector FLOAT[] NOT NULL, datasets VARCHAR[] NOT NULL, source VARCHAR NOT NULL,
    seconds DOUBLE NOT NULL, created_at TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (model, base, base_hash, params)
)"""


def old_store(path: Path, rows: list) -> Path:
    """A store file as written before the vector file: rows of (model, base_hash, vector, datasets)."""
    con = duckdb.connect(str(path))
    con.execute(OLD_VECTORS_TABLE)
    con.executemany(
        "INSERT INTO vectors VALUES (?, 'h', 'base', ?, ?, 4, 'U', 'mean', 'randomized', 'max-abs', '{}', 'bert', "
        "?, ?, ?, 'local', 0.25, now())",
        [
            [model, base_hash, PARAMS.key(), len(vec), vec.tolist(), list(datasets)]
            for model, base_hash, vec, datasets in rows
        ],
    )
    con.close()
    return path


def test_a_store_with_vectors_inside_duckdb_is_migrated(tmp_path):
    """Stores written before the vector file (``FLOAT[]`` column, no label_source/author columns)
    open with every vector and its metadata intact, and take new rows afterwards."""
    X = vectors(300, dim=500)
    path = old_store(tmp_path / "old.duckdb", [(f"m{i:03d}", "bh", X[i], [f"ds{i % 3}"]) for i in range(len(X))])
    with Store(path) as db:
        assert "vector" not in columns_by_table(db.con)["vectors"]
        loaded, meta = db.reads.load(representation=PARAMS)
        np.testing.assert_array_equal(loaded, X)
        assert meta["datasets"].map(list).tolist() == [[f"ds{i % 3}"] for i in range(len(X))]
        assert meta["label_source"].isna().all()
        extra = vectors(1, dim=500, seed=1)[0]
        db.writes.put(row("zz-new", extra))
    with Store(path) as db:  # opening again migrates nothing more
        loaded, meta = db.reads.load(representation=PARAMS)
    assert len(meta) == 301
    np.testing.assert_array_equal(loaded[-1], extra)


def test_a_store_without_the_adapter_column_reads_and_is_brought_up_to_date(tmp_path):
    """A store written before the models' kinds were kept: read-only commands read it (kinds unknown, None) without
    changing it; a writer adds the column, and rows written since keep the kind."""
    path = tmp_path / "s.duckdb"
    X = vectors(3)
    with Store(path) as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X)])
        db.con.execute("ALTER TABLE vectors DROP COLUMN adapter")
    with Store(path, read_only=True) as db:
        loaded, meta = db.reads.load(representation=PARAMS)
        assert "adapter" not in columns_by_table(db.con)["vectors"]
    np.testing.assert_array_equal(loaded, X)
    assert meta["adapter"].isna().all()
    with Store(path) as db:
        db.writes.put(
            VectorRow("lora", "h", "base", "base-hash", PARAMS, "bert", X[0], ["sst2"], "local", 0.5, adapter=True)
        )
        db.writes.put(
            VectorRow("full", "h", "base", "base-hash", PARAMS, "bert", X[1], ["sst2"], "local", 0.5, adapter=False)
        )
        meta = db.reads.metadata(representation=PARAMS).set_index("model")["adapter"]
    assert meta["lora"] == True and meta["full"] == False and meta[["m0", "m1", "m2"]].isna().all()  # noqa: E712


def test_the_cli_reports_a_damaged_vector_in_one_line_and_exports_the_others(tmp_path):
    """A command that reads every vector (here ``export``) meets a damaged one as one line naming its model, goes
    on with the others and exits with status 1, not a traceback."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(vectors(3))])
        offset = db.con.execute("SELECT \"offset\" FROM vectors WHERE model = 'm1'").fetchall()[0][0]
    with open(tmp_path / "s.duckdb.vectors", "r+b") as f:
        f.seek(offset)
        f.write(b"\xff\xff\xff\xff")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from modelvec.cli import main; main()",
            "export",
            "--parquet",
            str(tmp_path / "v.parquet"),
            "--store",
            str(tmp_path / "s.duckdb"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Location" not in line]
    assert len(lines) == 1 and "m1: its stored vector" in lines[0] and "checksum" in lines[0]
    assert pq.read_table(tmp_path / "v.parquet").column("model").to_pylist() == ["m0", "m2"]
    assert "wrote 2 vectors" in done.stdout


def test_compaction_keeps_live_vectors_and_drops_replaced_bytes(tmp_path):
    """Replaced vectors leave dead bytes; compact rewrites the live ones to a new file whose name
    changes in the same commit as the offsets, so files left by a crash at any point are stray
    copies that the next open removes, and the store stays whole."""
    from typer.testing import CliRunner

    from modelvec.cli import app

    X = vectors(6)
    path = tmp_path / "s.duckdb"
    with Store(path) as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X[:3])])
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X[3:])])  # replaces all three
        before, after = db.writes.compact()
        loaded, _ = db.reads.load()
        db.writes.put(row("m9", X[0]))  # appends go to the new file
        ours = header(db.identity)
    np.testing.assert_array_equal(loaded, X[3:])
    assert after < before * 0.6 and not (tmp_path / "s.duckdb.vectors").exists()
    (current,) = [p.name for p in tmp_path.glob("s.duckdb.vectors*")]
    # a crash before the commit leaves a new file nobody names; one after it leaves the old file (both with the
    # store's identity in their header: what lets them be removed)
    (tmp_path / "s.duckdb.vectors.0123456789ab").write_bytes(ours + b"half written")
    (tmp_path / "s.duckdb.vectors").write_bytes(ours + b"\0" * 4096)
    (tmp_path / "s.duckdb.vectors.keep-me").write_bytes(b"not ours")
    with Store(path) as db:
        loaded, meta = db.reads.load()
    assert sorted(p.name for p in tmp_path.glob("s.duckdb.vectors*")) == sorted([current, "s.duckdb.vectors.keep-me"])
    np.testing.assert_array_equal(loaded, np.vstack([X[3:], X[:1]]))
    result = CliRunner().invoke(app, ["compact", "--store", str(path)])
    assert result.exit_code == 0 and "MB ->" in result.output
    with Store(path) as db:
        np.testing.assert_array_equal(db.reads.load()[0], np.vstack([X[3:], X[:1]]))


def test_migration_keeps_rows_that_differ_only_in_base_hash(tmp_path):
    """The old primary key includes base_hash: a model embedded against two revisions of its base
    has two rows, and each keeps its own vector."""
    X = vectors(2, dim=50)
    path = old_store(tmp_path / "old.duckdb", [("m", f"bh{i}", X[i], ["d"]) for i in range(2)])
    with Store(path) as db:
        rows = db.con.execute('SELECT base_hash, "offset", vector_hash FROM vectors ORDER BY base_hash').fetchall()
        got = db.vector_file.read([r[1] for r in rows], 50, [r[2] for r in rows], ["m", "m"])
    assert [r[0] for r in rows] == ["bh0", "bh1"]
    np.testing.assert_array_equal(got, X)


def test_the_columns_from_duckdbs_catalogue_are_information_schemas(tmp_path):
    """The store's columns by table, asked of DuckDB's own catalogue (fast), are what information_schema says (the
    standard's view: DuckDB 1.x's catalogue also lists its own views in the store's schema, which must not count)."""
    with Store(tmp_path / "s.duckdb") as db:
        db.con.execute("CREATE VIEW mine AS SELECT 1 AS x")
        standard: dict[str, list[str]] = {}
        for table, column in db.con.execute(
            "SELECT table_name, column_name FROM information_schema.columns ORDER BY table_name, ordinal_position"
        ).fetchall():
            standard.setdefault(table, []).append(column)
        assert columns_by_table(db.con) == standard and "vectors" in standard and "mine" in standard

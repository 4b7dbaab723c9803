"""A trace's kept entries in the store: their bytes in the vector file beside the sketch's, checksummed, read back
bit for bit, moved by compaction; a store written before they were kept opens read-only (its traces without
entries) and is brought up to date by a writer; damaged entries are named and the trace still read."""

from __future__ import annotations

import numpy as np

from modelvec import Representation, Store
from modelvec.represent.trace import Trace
from modelvec.store import VectorRow
from modelvec.store.formats.schema import columns_by_table

PARAMS = Representation(rank=4)
ENTRY_COLUMNS = ("entries_offset", "entries_dim", "entries_hash")


def traced(model: str, seed: int, entries: bool = True) -> VectorRow:
    """A stored vector with its trace; ``entries``: keeping 96 delta entries and the base's weights there."""
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(0).standard_normal(96).astype(np.float32)  # one base: the same for every model
    trace = Trace(
        rng.standard_normal(64),
        levels=1.0,
        scale=2.0,
        precision="float32",
        entries=rng.standard_normal(96).astype(np.float32) if entries else None,
        base_entries=base if entries else None,
    )
    vector = rng.standard_normal(40).astype(np.float32)
    return VectorRow(model, f"h-{model}", "base", "bh", PARAMS, "llama", vector, ["d"], "local", 0.1, trace=trace)


def entries_of(db: Store) -> tuple[list[str], np.ndarray, np.ndarray, dict[str, str]]:
    frame = db.reads.traces("base", PARAMS.key()).frame
    kept, base, damaged = db.reads.trace_entries(frame)
    return list(frame["model"]), kept, base, damaged


def test_kept_entries_read_back_bit_for_bit_and_survive_compaction(tmp_path):
    rows = [traced("m0", 1), traced("m1", 2), traced("adapter", 3, entries=False)]
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many(rows)
        db.writes.put_many([traced("m0", 4)])  # replaces m0: its old bytes are dead
        before = entries_of(db)
        db.writes.compact()
        after = entries_of(db)
    models, kept, base, damaged = after
    assert models == ["adapter", "m0", "m1"] and damaged == {}
    np.testing.assert_array_equal(kept[1], traced("m0", 4).trace.entries)
    np.testing.assert_array_equal(kept[2], traced("m1", 2).trace.entries)
    assert np.isnan(kept[0]).all()  # an adapter keeps none
    np.testing.assert_array_equal(base, traced("m1", 2).trace.base_entries)
    np.testing.assert_array_equal(before[1], kept)


def test_a_store_written_before_entries_were_kept_opens_and_is_brought_up_to_date(tmp_path):
    """Read-only, its traces read without entries (none kept: the tree fits merges on traces alone) and nothing is
    changed; a writer adds the columns, and traces written since keep their entries."""
    path = tmp_path / "s.duckdb"
    with Store(path) as db:
        db.writes.put_many([traced("old", 1)])
        for column in ENTRY_COLUMNS:
            db.con.execute(f"ALTER TABLE traces DROP COLUMN {column}")
    with Store(path, read_only=True) as db:
        assert not set(ENTRY_COLUMNS) & set(columns_by_table(db.con)["traces"])
        models, kept, base, damaged = entries_of(db)
        sketch = db.reads.traces("base", PARAMS.key()).sketches
    assert models == ["old"] and kept.shape == (1, 0) and len(base) == 0 and damaged == {}
    np.testing.assert_array_equal(sketch[0], traced("old", 1).trace.sketch.astype(np.float32))
    with Store(path) as db:
        assert set(ENTRY_COLUMNS) <= set(columns_by_table(db.con)["traces"])
        db.writes.put_many([traced("new", 2)])
        models, kept, base, _ = entries_of(db)
    assert models == ["new", "old"] and np.isnan(kept[1]).all()
    np.testing.assert_array_equal(kept[0], traced("new", 2).trace.entries)


def test_damaged_entries_are_named_and_their_trace_still_read(tmp_path):
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many([traced("m0", 1), traced("m1", 2)])
        offset = db.con.execute("SELECT entries_offset FROM traces WHERE model = 'm1'").fetchall()[0][0]
    with open(tmp_path / "s.duckdb.vectors", "r+b") as f:
        f.seek(offset)
        f.write(b"\xff\xff\xff\xff")
    with Store(tmp_path / "s.duckdb", read_only=True) as db:
        models, kept, base, damaged = entries_of(db)
        sketches = db.reads.traces("base", PARAMS.key()).sketches
    assert list(damaged) == ["m1"] and "stored entries" in damaged["m1"] and "checksum" in damaged["m1"]
    assert np.isnan(kept[1]).all() and not np.isnan(kept[0]).any() and len(sketches) == 2
    np.testing.assert_array_equal(base, traced("m0", 1).trace.base_entries)

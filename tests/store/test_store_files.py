"""A store is its DuckDB file and the files named after it beside it, and never loses what they hold.

A store copied or renamed with all its files (as ``cp``/``mv`` of ``S.duckdb*`` do) works as the original, and a
command on one never deletes a file of another. A DuckDB file copied or renamed without its vector file, a vector file
of another store, a file that is no DuckDB database or a DuckDB database of something else: each is refused in one
line and left as it is. Bytes a cut-off write left past the DuckDB file's last block are a note, not damage, and the
temporary files a killed process left among the kept products are removed, never one being written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest
from typer.testing import CliRunner

import modelvec
from builders import planted_finetune
from modelvec import Representation, Store
from modelvec.cli import app
from modelvec.store import StoreError, VectorRow
from modelvec.store.formats.cachefile import remove_leftovers, write_cache_file
from modelvec.store.formats.vectorfile import VectorFile, header, identity_of

PARAMS = Representation(rank=4)


def row(model: str, vector: np.ndarray) -> VectorRow:
    return VectorRow(model, f"hash-{model}", "base", "base-hash", PARAMS, "bert", vector, ["sst2"], "local", 0.5)


def vectors(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def files(folder: Path) -> dict[str, bytes | None]:
    """Every file in ``folder`` and below with its bytes (a folder: None), by relative path."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def store_files(store: Path) -> list[Path]:
    return sorted(p for p in store.parent.iterdir() if p.name.startswith(store.name))


def copy_store(src: Path, dst: Path, *, move: bool = False) -> Path:
    """Every file of the store ``src`` (``src*``) as ``dst*``: what ``cp -r`` or ``mv`` of them does."""
    for p in store_files(src):
        to = dst.parent / (dst.name + p.name[len(src.name) :])
        if move:
            p.rename(to)
        elif p.is_dir():
            shutil.copytree(p, to)
        else:
            shutil.copy2(p, to)
    return dst


def compacted(path: Path, n: int = 3) -> np.ndarray:
    """A store at ``path`` of ``n`` vectors, each replaced once, then compacted: its vector file is
    ``<path>.vectors.<12 hex>``; the vectors it holds."""
    with Store(path) as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(vectors(n, seed=1))])
        X = vectors(n, seed=2)
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X)])
        db.writes.compact()
    return X


def loaded(path: Path) -> np.ndarray:
    with Store(path, read_only=True) as db:
        return db.reads.load()[0]


def cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result, *words: str) -> str:
    """The command failed with status 2 and said why in exactly one line on stderr, with ``words`` in it."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and "a bug in modelvec" not in result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# --- copies and renames -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def four(tiny_bert, tiny_finetunes, tmp_path_factory) -> list[Path]:
    extra = planted_finetune(tiny_bert, tmp_path_factory.mktemp("fourth") / "ft3", seed=33, card_datasets=["imdb"])
    return [*tiny_finetunes, extra]


def test_a_copy_of_a_compacted_store_works_and_compacting_it_leaves_the_original_whole(tiny_bert, four, tmp_path):
    """The issue's case: S embedded and compacted, every ``S.duckdb*`` copied to ``T.duckdb*``, T compacted. T's
    compaction deleted S's vector file, and ``cluster --store S`` left every model out."""
    S = tmp_path / "S.duckdb"
    assert not modelvec.embed(tiny_bert, four[:3], store=S).failed
    assert modelvec.embed(tiny_bert, four[:3], store=S, force=True).embedded  # replaced: compaction has bytes to drop
    assert cli("compact", "--store", S).exit_code == 0
    assert cli("cluster", tiny_bert, "--reduce", "pca", "--out", tmp_path / "out", "--store", S).exit_code == 0
    assert (tmp_path / "S.duckdb.products").is_dir()  # its kept products travel with it
    held = loaded(S)
    T = copy_store(S, tmp_path / "T.duckdb")
    before = {p.name: p.read_bytes() for p in store_files(S) if p.is_file()}

    result = cli("compact", "--store", T)
    assert result.exit_code == 0, result.output
    assert {p.name: p.read_bytes() for p in store_files(S) if p.is_file()} == before  # S's files untouched
    np.testing.assert_array_equal(loaded(T), held)
    for store in (S, T):
        out = cli("cluster", tiny_bert, "--reduce", "pca", "--out", tmp_path / "out", "--store", store, "--json")
        assert out.exit_code == 0 and "left out" not in out.stderr, out.output
        answer = json.loads(out.stdout)
        assert answer["n_models"] == 3 and answer["damaged"] == {}
        assert cli("compact", "--store", store).exit_code == 0
    np.testing.assert_array_equal(loaded(S), held)
    np.testing.assert_array_equal(loaded(T), held)


def test_a_renamed_compacted_store_takes_more_models_and_keeps_every_vector(tiny_bert, four, tmp_path):
    """The issue's case: a compacted store's files all renamed to ``R.duckdb*``, then one more model embedded into R:
    the renamed vector file was deleted as a leftover, every earlier vector lost, with status 0."""
    S = tmp_path / "S.duckdb"
    assert not modelvec.embed(tiny_bert, four[:3], store=S).failed
    assert cli("compact", "--store", S).exit_code == 0
    with Store(S, read_only=True) as db:
        held = dict(zip(db.reads.load()[1]["model"], db.reads.load()[0]))
    R = copy_store(S, tmp_path / "R.duckdb", move=True)
    result = cli("embed", "--base", tiny_bert, four[3], "--store", R)
    assert result.exit_code == 0 and "embedded 1, skipped 0" in result.stdout, result.output
    with Store(R, read_only=True) as db:
        matrix, meta = db.reads.load()
    now = dict(zip(meta["model"], matrix))
    assert len(now) == 4 and set(held) < set(now)
    for model, vector in held.items():
        np.testing.assert_array_equal(now[model], vector)
    assert not list(tmp_path.glob("S.duckdb*"))


def test_the_recorded_name_of_a_vector_file_is_read_by_its_suffix(tmp_path):
    """Stores record their vector file's whole name (older versions read it so); a renamed one, whose record names
    the old store, reads only the 12 hex digits at its end."""
    X = compacted(tmp_path / "S.duckdb")
    with Store(tmp_path / "S.duckdb", read_only=True) as db:
        (recorded,) = db.con.execute("SELECT value FROM store_meta WHERE key = 'vector_file'").fetchone()
    assert recorded == db.vector_file.path.name and recorded.startswith("S.duckdb.vectors.")
    R = copy_store(tmp_path / "S.duckdb", tmp_path / "R.duckdb", move=True)
    with Store(R) as db:
        assert db.vector_file.path == tmp_path / f"R.duckdb.vectors.{recorded[-12:]}"
        np.testing.assert_array_equal(db.reads.load()[0], X)


@pytest.mark.parametrize("kind", ["compacted", "not-compacted", "without-store_meta"])
def test_a_store_renamed_without_its_vector_file_is_refused_and_nothing_is_deleted(tmp_path, kind):
    """Only the DuckDB file renamed: a writer refuses in one line naming the missing file and what to do (it used to
    start an empty vector file under rows that point into the missing one); nothing is created, written or deleted
    (a store from before ``store_meta`` gets no table). A reader still reads the rows, and a vector read from the
    missing file says it is missing, not that it is damaged."""
    S = tmp_path / "S.duckdb"
    compact = kind == "compacted"
    if compact:
        X = compacted(S)
    else:
        X = vectors(3)
        with Store(S) as db:
            db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X)])
            if kind == "without-store_meta":  # as written before 2026-11-28: no store_meta, the plain header
                db.con.execute("DROP TABLE store_meta")
        if kind == "without-store_meta":
            with open(tmp_path / "S.duckdb.vectors", "r+b") as f:
                f.write(VectorFile.MAGIC)
    (old,) = [p for p in store_files(S) if ".vectors" in p.name]
    S.rename(tmp_path / "R.duckdb")
    R = tmp_path / "R.duckdb"
    missing = "R.duckdb" + old.name[len("S.duckdb") :]
    before = files(tmp_path)

    with pytest.raises(StoreError, match=rf"^{R}: its vector file {missing} is missing, though its rows point"):
        Store(R)
    line = one_error_line(cli("compact", "--store", R), str(R), missing, "copied or renamed together")
    assert ("is it S.duckdb.vectors." in line) is compact  # a compacted store's file is found by its suffix
    one_error_line(cli("embed", "--base", tmp_path, tmp_path / "model", "--store", R), missing)
    assert files(tmp_path) == before

    assert cli("show", "--store", R).exit_code == 0  # the rows read
    with Store(R, read_only=True) as db:
        with pytest.raises(StoreError, match=rf"^m0: its stored vector is missing: there is no {tmp_path / missing}"):
            db.reads.load()
        selection, _ = db.reads.select()
        result = db.reads.products(selection)
    assert sorted(result.damaged) == ["m0", "m1", "m2"]
    assert all("is missing: there is no" in line and "checksum" not in line for line in result.damaged.values())
    assert files(tmp_path) == before
    R.rename(S)  # put back: the store is whole again
    np.testing.assert_array_equal(loaded(S), X)


def test_the_causes_of_an_unreadable_vector_are_told_apart(tmp_path):
    """A vector past the end of its file is missing from it (truncated), one whose bytes changed does not match its
    checksum: each read says which."""
    with Store(tmp_path / "s.duckdb") as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(vectors(3))])
        offset = db.con.execute("SELECT \"offset\" FROM vectors WHERE model = 'm0'").fetchone()[0]
    path = tmp_path / "s.duckdb.vectors"
    with open(path, "r+b") as f:
        f.seek(offset + 3)
        f.write(b"\xff")
    os.truncate(path, path.stat().st_size - 8)
    with Store(tmp_path / "s.duckdb", read_only=True) as db:
        damaged = db.reads.products(db.reads.select()[0]).damaged
    assert "does not match its checksum" in damaged["m0"] and "truncated" not in damaged["m0"]
    assert "is missing from" in damaged["m2"] and "(the file is truncated)" in damaged["m2"]
    assert "m1" not in damaged


# --- identities: another store's vector file, leftovers ------------------------------------------------------------


def test_another_stores_vector_file_is_refused_in_one_line_not_called_damaged(tmp_path):
    """A's vector file replaced by B's (a copy gone wrong): every command refuses it in one line, naming it as
    another store's, where it used to read every vector as damaged; nothing is changed."""
    for name, seed in (("A", 0), ("B", 1)):
        with Store(tmp_path / f"{name}.duckdb") as db:
            db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(vectors(3, seed=seed))])
    shutil.copy2(tmp_path / "B.duckdb.vectors", tmp_path / "A.duckdb.vectors")
    before = files(tmp_path)
    for read_only in (True, False):
        with pytest.raises(StoreError, match="the vector file of another store, not of A.duckdb"):
            Store(tmp_path / "A.duckdb", read_only=read_only)
    for command in ("show", "compact"):
        one_error_line(cli(command, "--store", tmp_path / "A.duckdb"), "A.duckdb.vectors", "another store")
    assert files(tmp_path) == before


def test_only_leftovers_that_carry_the_stores_identity_are_removed(tmp_path):
    """Of the files named like the store's vector files, a writer removes those a crashed compaction of this store
    left (their header carries its identity), and keeps a file of another store (renamed over this name), one written
    before identities, one that is not a vector file, and a link."""
    S = tmp_path / "S.duckdb"
    X = compacted(S)
    with Store(S, read_only=True) as db:
        mine, current = db.identity, db.vector_file.path
    assert mine is not None and identity_of(current) == mine
    ours = [tmp_path / "S.duckdb.vectors.aaaaaaaaaaaa", tmp_path / "S.duckdb.vectors"]
    for path in ours:
        path.write_bytes(header(mine) + b"\0" * 256)
    kept = {
        "S.duckdb.vectors.bbbbbbbbbbbb": header("0123456789abcdef") + b"\0" * 256,  # another store's
        "S.duckdb.vectors.cccccccccccc": VectorFile.MAGIC + b"\0" * 256,  # written before identities
        "S.duckdb.vectors.dddddddddddd": b"half written",  # not a vector file
        "S.duckdb.vectors.keep-me": header(mine),  # not a name modelvec writes
    }
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "S.duckdb.vectors.eeeeeeeeeeee").symlink_to(ours[0])
    with Store(S, read_only=True) as db:  # a reader removes nothing
        np.testing.assert_array_equal(db.reads.load()[0], X)
    assert all(p.exists() for p in ours)
    with Store(S) as db:
        np.testing.assert_array_equal(db.reads.load()[0], X)
    assert not any(p.exists() for p in ours)
    assert {n: (tmp_path / n).read_bytes() for n in kept} == kept
    assert (tmp_path / "S.duckdb.vectors.eeeeeeeeeeee").is_symlink() and current.exists()


def test_a_store_from_before_identities_keeps_working_and_gets_one(tmp_path):
    """A store written before identities (no comment on store_meta, vector file with the plain header) is read as
    ever; a writer gives it an identity, its old file keeps its header, and a compaction writes one that has it."""
    S = tmp_path / "S.duckdb"
    X = vectors(4)
    with Store(S) as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X[:2])])
        db.con.execute("COMMENT ON TABLE store_meta IS NULL")
    with open(tmp_path / "S.duckdb.vectors", "r+b") as f:
        f.write(VectorFile.MAGIC)
    with Store(S, read_only=True) as db:
        assert db.identity is None
        np.testing.assert_array_equal(db.reads.load()[0], X[:2])
    with Store(S) as db:
        assert db.identity is not None and db.vector_file.identity is None
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X[2:], start=2)])
        db.writes.compact()
        assert identity_of(db.vector_file.path) == db.identity
        mine = db.identity
    with Store(S, read_only=True) as db:
        assert db.identity == mine
        np.testing.assert_array_equal(db.reads.load()[0], X)
    assert [p.name for p in store_files(S)] == ["S.duckdb", db.vector_file.path.name]


# --- files that are no store ------------------------------------------------------------------------------------


def parquet_file(tmp_path: Path) -> Path:
    with Store(tmp_path / "made.duckdb") as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(vectors(2))])
    assert cli("export", "--parquet", tmp_path / "v.parquet", "--store", tmp_path / "made.duckdb").exit_code == 0
    for p in store_files(tmp_path / "made.duckdb"):
        p.unlink()
    return tmp_path / "v.parquet"


FOREIGN = {
    "t.csv": (lambda tmp: tmp / "t.csv", "it looks like a CSV or text file"),
    "v.parquet": (parquet_file, "it looks like a Parquet file"),
    "x.json": (lambda tmp: tmp / "x.json", "it looks like a JSON file"),
    "bytes.duckdb": (lambda tmp: tmp / "bytes.duckdb", "(not a DuckDB database file)"),  # refused before too
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_file_that_is_no_duckdb_database_is_refused_by_every_command_and_left_as_it_is(tmp_path, kind):
    """DuckDB opens a CSV or a Parquet file as an in-memory database of views: ``embed`` said "embedded 2" and kept
    nothing, growing ``t.csv.vectors`` each run; a Parquet file was a ZeroDivisionError. Now each command refuses it
    in one line saying what it looks like, and nothing is created beside it."""
    make, looks = FOREIGN[kind]
    path = make(tmp_path)
    if not path.exists():
        content = {"t.csv": b"model,vector\nbert,0.5\n", "x.json": b' {"model": "bert"}\n'}.get(path.name)
        path.write_bytes(content or bytes(range(256)) * 8)
    before = files(tmp_path)
    with pytest.raises(StoreError, match="not a DuckDB database file"):
        Store(path)
    commands = [
        ("show", "--store", path),
        ("export", "--parquet", tmp_path / "out.parquet", "--store", path),
        ("compact", "--store", path),
        ("embed", "--base", tmp_path, tmp_path / "model", "--store", path),
        ("discover", "bert-base-uncased", "--no-search", "--store", path),
        ("cluster", tmp_path, "--reduce", "pca", "--out", tmp_path / "out", "--store", path),
    ]
    for command in commands:
        one_error_line(cli(*command), str(path), "not a modelvec store (not a DuckDB database file)", looks)
    assert files(tmp_path) == before


def test_a_duckdb_database_of_something_else_is_not_written(tmp_path):
    """A DuckDB database with tables, none of them modelvec's: a writing command used to add its tables and a vector
    file beside it; now it is refused in one line, and gets no table."""
    path = tmp_path / "people.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE people (name VARCHAR, age INTEGER)")
    con.execute("INSERT INTO people VALUES ('ada', 36)")
    con.close()
    before = files(tmp_path)
    for command in (("compact", "--store", path), ("embed", "--base", tmp_path, tmp_path / "m", "--store", path)):
        one_error_line(cli(*command), str(path), "not a modelvec store", "nothing was written")
    one_error_line(cli("show", "--store", path), str(path), "not a modelvec store")
    assert files(tmp_path) == before
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [("people",)]
    con.close()


# --- bytes past the last block: a cut-off write, not damage --------------------------------------------------------


def test_bytes_past_the_last_block_are_a_note_not_damage(tmp_path):
    """A checkpoint cut off (a full disk, a killed process) leaves bytes past the blocks DuckDB's header names: the
    store opens with every row and one note, where it used to be "damaged: the file is truncated"; a writer cuts them
    off as it closes."""
    S = tmp_path / "S.duckdb"
    X = vectors(5)
    with Store(S) as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(X)])
    whole = S.stat().st_size
    with open(S, "ab") as f:
        f.write(b"\x5a" * 70_000)
    for read_only in (True, False):
        notes: list[str] = []
        with Store(S, read_only=read_only, on_note=notes.append) as db:
            np.testing.assert_array_equal(db.reads.load()[0], X)
        assert len(notes) == 1 and "70000 bytes past its last block" in notes[0] and "damaged" not in notes[0]
    assert S.stat().st_size <= whole
    notes = []
    with Store(S, read_only=True, on_note=notes.append) as db:
        np.testing.assert_array_equal(db.reads.load()[0], X)
    assert notes == []
    result = cli("show", "--store", S, "--json")
    assert result.exit_code == 0 and result.stderr == ""


@pytest.mark.parametrize("cut", [100_000, 262_144], ids=["inside-a-block", "a-whole-block"])
def test_a_store_cut_short_is_damaged(tmp_path, cut):
    """A DuckDB file cut short inside a block it uses, or by a whole block it uses (which a check of the size against
    the block size missed: DuckDB opened it, and failed later, at a read of that block), is refused as truncated by
    every kind of open."""
    S = tmp_path / "S.duckdb"
    with Store(S) as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(vectors(5))])
    os.truncate(S, S.stat().st_size - cut)
    for read_only in (True, False):
        with pytest.raises(StoreError, match="damaged: the file is truncated"):
            Store(S, read_only=read_only)


# --- temporary files left in the products folder ----------------------------------------------------------------

HOLD = """
import fcntl, sys, time
f = open(sys.argv[1], "rb")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_temporary_files_a_killed_process_left_are_removed_but_never_one_being_written(tmp_path):
    """``write_cache_file`` writes ``.<name>.<8 hex>.tmp`` and renames it; a killed process left it for ever (up to 800 MB
    at 10,000 models). The next write of the products folder removes such a file where no process holds its lock;
    one another process is writing (its lock held), a fresh one, and any other name are left."""
    S = tmp_path / "S.duckdb"
    with Store(S) as db:
        db.writes.put_many([row(f"m{i}", x) for i, x in enumerate(vectors(4))])
    folder = tmp_path / "S.duckdb.products"
    folder.mkdir()
    hour_ago = time.time() - 3600
    left = folder / ".0123456789abcdef.products.1a2b3c4d.tmp"
    live = folder / ".0123456789abcdef.products.5e6f7a8b.tmp"
    fresh = folder / ".fedcba9876543210.products.9c0d1e2f.tmp"
    others = [folder / ".x.tmp", folder / "notes.tmp", folder / ".a.products.1a2b3c4.tmp", folder / "a.products"]
    for path in [left, live, fresh, *others]:
        path.write_bytes(b"\0" * 1000)
    for path in [left, live, *others]:
        os.utime(path, (hour_ago, hour_ago))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(live)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with Store(S, read_only=True) as db:  # a report keeps its products: the folder is written
            db.reads.products(db.reads.select()[0], cache="the selection")
        assert not left.exists()
        assert live.exists() and fresh.exists() and all(p.exists() for p in others)
        assert len(list(folder.glob("*.products"))) == 2  # the kept products, beside the other file
    finally:
        holder.kill()
        holder.wait()
    assert remove_leftovers(folder) == [live]  # its writer gone, its lock is too


def test_a_kept_file_is_locked_while_it_is_written(tmp_path, monkeypatch):
    """The writer holds the ``flock`` of its temporary file until the file has its name: a sweep that runs meanwhile
    (another process keeping products of the same store) leaves it."""
    import fcntl

    import modelvec.store.formats.cachefile as kept

    seen = []
    replace = os.replace

    def check_then_replace(src, dst):
        fd = os.open(src, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        seen.append(remove_leftovers(Path(src).parent, age=-1))
        replace(src, dst)

    monkeypatch.setattr(kept.os, "replace", check_then_replace)
    assert write_cache_file(tmp_path / "a.kept", {"k": 1}, {"x": np.arange(5.0)})
    assert seen == [[]] and [p.name for p in tmp_path.iterdir()] == ["a.kept"]

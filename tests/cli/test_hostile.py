"""Every command against hostile environments: one line, exit status 2, nothing stored lost.

Each case runs a real command in a process of its own (what a user sees: forked from one that has imported the
commands once, :mod:`zygote`) against one environment built for it: a store on
a read-only file system, a file that is no DuckDB database, a truncated store, outputs into a missing folder, a
read-only folder, a path through a regular file, a full disk under the outputs or under the store. A command that
cannot do its work says so in exactly one line on stderr, ``error: <the path>: <the cause in words>``, and exits with
status 2: no traceback, no Python or DuckDB exception names. What the store held before is still there after, and
the store still opens. The commands that only read the store work where it cannot be written.

The read-only file systems are bind mounts remounted read-only and the full disks are small tmpfs: both need root
(``mount``); without it those cases are skipped, saying why.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import modelvec
from builders import planted_finetune
from modelvec.store import Store
from modelvec.testing.localhub import LocalHub
from zygote import Zygote

# --- the world: a real store of four tiny fine-tunes, a fifth to embed, a local Hub for discover --------------------


@dataclass
class World:
    base: Path
    stored: list[Path]  # the fine-tunes in the store
    new: Path  # a fine-tune not in it
    store: Path  # the store as embed left it; each case works on a copy
    env: dict[str, str]  # the environment of the commands' processes
    commands: Zygote  # what starts them

    def copy_store(self, folder: Path) -> Path:
        """The store's files (the DuckDB file, its vectors) copied into ``folder``, written out in full (no sparse
        file), so a small file system holds exactly what they take."""
        folder.mkdir(parents=True, exist_ok=True)
        for f in self.store.parent.glob(f"{self.store.name}*"):
            shutil.copyfile(f, folder / f.name)
        return folder / self.store.name


@pytest.fixture(scope="module")
def world(tiny_bert, tmp_path_factory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("hostile")
    stored = [
        planted_finetune(tiny_bert, root / f"ft{i}", seed=60 + i, card_datasets=["imdb" if i % 2 else "glue/sst2"])
        for i in range(4)
    ]
    new = planted_finetune(tiny_bert, root / "new", seed=77, card_datasets=["imdb"])
    store = root / "pristine" / "store.duckdb"
    result = modelvec.embed(tiny_bert, stored, store=store)
    assert not result.failed and len(result.embedded) == 4
    hub = LocalHub(root / "hub")  # for discover: the catalogue it writes is what a full disk refuses
    hub.publish("google-bert/bert-base-uncased", {p.name: p for p in tiny_bert.iterdir() if p.is_file()})
    card = b"---\nbase_model: google-bert/bert-base-uncased\ndatasets: [imdb]\n---\n"
    hub.publish("alice/bert-imdb", {**{p.name: p for p in stored[0].iterdir()}, "README.md": card})
    with hub.serve() as server:
        env = {k: v for k, v in os.environ.items() if k not in ("MODELVEC_DEBUG", "MODELVEC_STORE")}
        env.update(COLUMNS="80", HF_ENDPOINT=server.endpoint, HF_HUB_CACHE=str(root / "hub-cache"))
        with Zygote(env) as commands:
            yield World(tiny_bert, stored, new, store, env, commands)


def test_modelvec_registers_no_exit_functions():
    """The commands here leave their forked processes as soon as their files are flushed (:mod:`zygote`): that is
    their whole exit only while nothing of modelvec waits for the interpreter's exit functions."""
    src = Path(modelvec.__file__).parent
    assert not [p for p in src.rglob("*.py") if re.search(r"\batexit\b", p.read_text())]


# --- mounts --------------------------------------------------------------------------------------------------------


class Mounts:
    """Read-only bind mounts and small tmpfs, unmounted when the test ends."""

    def __init__(self) -> None:
        self.points: list[Path] = []

    def _mount(self, *args: str, point: Path) -> None:
        out = subprocess.run(["mount", *args], capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(
                f"cannot mount ({(out.stderr or out.stdout).strip()}): this case needs root and a kernel that lets it "
                "mount (not an unprivileged container)"
            )

    def read_only(self, source: Path, point: Path) -> Path:
        """``source`` seen read-only at ``point``: a read-only file system, as far as a process can tell."""
        point.mkdir(parents=True, exist_ok=True)
        self._mount("--bind", str(source), str(point), point=point)
        self.points.append(point)
        self._mount("-o", "remount,ro,bind", str(point), point=point)
        return point

    def small(self, point: Path, size: str) -> Path:
        """An empty file system of ``size`` at ``point``."""
        point.mkdir(parents=True, exist_ok=True)
        self._mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point), point=point)
        self.points.append(point)
        return point

    def undo(self) -> None:
        for point in reversed(self.points):
            if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(point)], capture_output=True)  # busy: detach it all the same


@pytest.fixture
def mounts() -> Iterator[Mounts]:
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("read-only and full file systems are made with Linux's mount")
    if os.geteuid() != 0:
        pytest.skip("read-only and full file systems are made with mount, which needs root")
    made = Mounts()
    yield made
    made.undo()


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to its last byte; the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


# --- the environments ----------------------------------------------------------------------------------------------


@dataclass
class Place:
    """Where a case's command works: its store, its output folder, its Parquet file."""

    store: Path
    out: Path
    parquet: Path | None = None  # default: out/vectors.parquet
    damaged: bool = False  # the store cannot be opened (its files must stay byte for byte)
    notes: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.parquet is None:
            self.parquet = self.out / "vectors.parquet"


Env = Callable[[World, Path, Mounts], Place]


def read_only_store(w: World, tmp: Path, m: Mounts) -> Place:
    w.copy_store(tmp / "src")
    return Place(m.read_only(tmp / "src", tmp / "ro") / w.store.name, tmp / "out")


def not_duckdb(w: World, tmp: Path, m: Mounts) -> Place:
    store = tmp / "s" / "store.duckdb"
    store.parent.mkdir()
    store.write_bytes(b"model,vector\nbert,0.5\n" * 200)  # a CSV named like a store
    return Place(store, tmp / "out", damaged=True)


def truncated(w: World, tmp: Path, m: Mounts) -> Place:
    store = w.copy_store(tmp / "s")
    os.truncate(store, store.stat().st_size // 3)
    return Place(store, tmp / "out", damaged=True)


def corrupt_blocks(w: World, tmp: Path, m: Mounts) -> Place:
    """A store whose data blocks (all but DuckDB's headers and first block) are overwritten at their start: it opens,
    and the first read of a table fails DuckDB's checksum."""
    store = w.copy_store(tmp / "s")
    header, block = 12288, 262144  # DuckDB's file headers and block size
    with open(store, "r+b") as f:
        for start in range(header + block, store.stat().st_size, block):
            f.seek(start + 8)  # past the block's checksum
            f.write(b"\xff" * 4096)
    return Place(store, tmp / "out", damaged=True)


def store_is_folder(w: World, tmp: Path, m: Mounts) -> Place:
    (tmp / "store.duckdb").mkdir()
    return Place(tmp / "store.duckdb", tmp / "out", damaged=True)


def vectors_not_ours(w: World, tmp: Path, m: Mounts) -> Place:
    store = w.copy_store(tmp / "s")
    (store.parent / f"{store.name}.vectors").write_bytes(b"\x00\x01" * 5000)
    return Place(store, tmp / "out", damaged=True)


def out_missing(w: World, tmp: Path, m: Mounts) -> Place:
    return Place(w.copy_store(tmp / "s"), tmp / "missing" / "deep" / "folder")


def out_read_only(w: World, tmp: Path, m: Mounts) -> Place:
    (tmp / "src").mkdir()
    return Place(w.copy_store(tmp / "s"), m.read_only(tmp / "src", tmp / "ro"))


def out_is_file(w: World, tmp: Path, m: Mounts) -> Place:
    out = tmp / "a-file"
    out.write_text("not a folder\n")
    return Place(w.copy_store(tmp / "s"), out)


def parquet_is_folder(w: World, tmp: Path, m: Mounts) -> Place:
    (tmp / "out").mkdir()
    return Place(w.copy_store(tmp / "s"), tmp / "out", parquet=tmp / "out")


def out_full(w: World, tmp: Path, m: Mounts) -> Place:
    disk = m.small(tmp / "disk", "200k")
    fill(disk)
    return Place(w.copy_store(tmp / "s"), disk / "out")


def store_full(w: World, tmp: Path, m: Mounts) -> Place:
    """The store on a disk with no byte left: a new vector cannot be written."""
    disk = m.small(tmp / "disk", "4m")
    store = w.copy_store(disk)
    filler = fill(disk)
    return Place(store, tmp / "out", notes={"filler": filler})


def store_full_but_one_vector(w: World, tmp: Path, m: Mounts) -> Place:
    """The store on a disk with room for one more vector's bytes and not a byte more: the vector file takes them, then
    DuckDB cannot write the row that points at them (its commit fails)."""
    place = store_full(w, tmp, m)
    with Store(w.store, read_only=True) as db:
        dim = db.con.execute("SELECT max(dim) FROM vectors").fetchone()[0]
        trace = db.con.execute("SELECT max(dim) FROM traces").fetchone()[0]  # its trace's bytes follow the vector's
        entries = db.con.execute("SELECT coalesce(max(entries_dim), 0) FROM traces").fetchone()[0]  # then its entries
    page = os.sysconf("SC_PAGE_SIZE")
    size = (place.store.parent / f"{place.store.name}.vectors").stat().st_size
    end = size + (-size % 64) + 4 * dim
    end += -end % 64 + 4 * trace
    if entries:
        end += -end % 64 + 4 * entries
    pages = -(-end // page) - -(-size // page)
    filler = place.notes["filler"]
    assert isinstance(filler, Path)
    os.truncate(filler, filler.stat().st_size - pages * page)
    return place


def store_full_but_the_log(w: World, tmp: Path, m: Mounts) -> Place:
    """The store on a disk with room for one more vector's bytes and 128 KiB: the rows DuckDB logs as they commit (its
    write-ahead log) fit, the checkpoint that writes them into the DuckDB file as the store closes (new blocks of
    256 KiB) does not."""
    place = store_full_but_one_vector(w, tmp, m)
    filler = place.notes["filler"]
    assert isinstance(filler, Path)
    os.truncate(filler, filler.stat().st_size - 128 * 1024)
    return place


# --- the commands --------------------------------------------------------------------------------------------------

COMMANDS: dict[str, list[str]] = {
    "show": ["show", "--store", "{store}"],
    "export": ["export", "--parquet", "{parquet}", "--store", "{store}"],
    "cluster": ["cluster", "{base}", "--reduce", "pca", "--out", "{out}", "--store", "{store}"],
    "neighbors": ["neighbors", "{ft0}", "--k", "3", "--store", "{store}"],
    "rank": ["rank", "--over-finetunes", "{base}", "--threshold", "0.9", "--out", "{out}", "--store", "{store}"],
    "rank-model": ["rank", "{ft0}", "--base", "{base}", "--of", "delta", "--threshold", "0.9", "--out", "{out}"],
    "embed": ["embed", "--base", "{base}", "{new}", "--store", "{store}"],
    "discover": ["discover", "bert-base-uncased", "--no-search", "--store", "{store}"],
    "compact": ["compact", "--store", "{store}"],
    "evaluate": [
        *("evaluate", "{ft0}", "{ft1}", "{ft2}", "{ft3}", "--base", "{base}", "--no-svd"),
        *("--store", "{store}", "--markdown", "{out}/table.md"),
    ],
}
#: What a command that works writes (under the output folder, or the Parquet file).
WRITES = {
    "export": ["{parquet}"],
    "cluster": ["{out}/clusters-pca.png", "{out}/clusters-pca.html"],
    "rank": ["{out}/ranks.csv", "{out}/ranks.json", "{out}/rank-0.9.png"],
    "rank-model": ["{out}/ranks.csv", "{out}/ranks.json", "{out}/rank-0.9.png"],
    "evaluate": ["{out}/table.md"],
}
#: Commands that draw progress on stderr before the error line.
PROGRESS = {"embed", "evaluate"}

READERS = ["show", "export", "cluster", "neighbors", "rank"]
WRITERS = ["embed", "discover", "compact", "evaluate"]
OUTPUTS = ["export", "cluster", "rank", "rank-model", "evaluate"]
OK = ()  # the command works

CASES: list[tuple[str, Env, tuple[str, ...]] | object] = [
    # a store on a read-only file system: read, never written
    *[(c, read_only_store, OK) for c in READERS],
    *[(c, read_only_store, ("{store}", "read-only file system")) for c in WRITERS],
    # a file that is no DuckDB database, a truncated store: refused, left as they are
    *[(c, not_duckdb, ("{store}", "not a modelvec store (not a duckdb database file)")) for c in READERS + WRITERS],
    *[(c, truncated, ("{store}", "damaged: the file is truncated")) for c in READERS + WRITERS],
    *[
        (c, corrupt_blocks, ("{store}", "damaged: a block of it does not match"))
        for c in READERS + WRITERS
        if c != "discover"  # it writes the catalogue without reading a damaged block: it works
    ],
    *[(c, store_is_folder, ("{store}", "a folder, not a store")) for c in ("show", "embed")],
    *[(c, vectors_not_ours, ("{store}.vectors", "not a modelvec vector file")) for c in ("show", "embed")],
    # outputs: a missing folder is made; a read-only one, a path through a file, a full disk are one line
    *[(c, out_missing, OK) for c in OUTPUTS],
    *[(c, out_read_only, ("{out}", "read-only file system")) for c in OUTPUTS],
    *[(c, out_is_file, ("{out}", "a file stands where a folder is needed")) for c in OUTPUTS],
    ("export", parquet_is_folder, ("{parquet}", "a folder, not a file")),
    *[(c, out_full, ("{out}/", "no space left on")) for c in OUTPUTS],
    # the store's disk is full: what writes it is one line; what reads it works
    ("embed", store_full, ("{store}.vectors", "no space left on")),
    ("evaluate", store_full, ("{store}", "no space left on")),
    ("discover", store_full, ("{store}: ", "no space left on")),
    ("compact", store_full, ("{store}.vectors", "no space left on")),
    ("show", store_full, OK),
    ("embed", store_full_but_one_vector, ("{store}: ", "no space left on", "what was stored before is kept")),
]


def params(cases: list) -> list:
    """The cases as pytest parameters named ``command-environment``."""
    out = []
    for case in cases:
        values, marks = (case.values, case.marks) if hasattr(case, "values") else (case, ())
        out.append(pytest.param(*values, marks=marks, id=f"{values[0]}-{values[1].__name__}"))
    return out


def expand(template: str, w: World, place: Place) -> str:
    return template.format(
        store=place.store,
        out=place.out,
        parquet=place.parquet,
        base=w.base,
        new=w.new,
        **{f"ft{i}": m for i, m in enumerate(w.stored)},
    )


def run(w: World, place: Place, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``modelvec COMMAND ...`` in a process of its own, as a user runs it."""
    return w.commands.run([expand(a, w, place) for a in COMMANDS[command]], cwd)


def held(place: Place) -> dict[object, object]:
    """What the store holds: every vector's bytes by (model, base, representation), read through ``Store.reads.load``
    (which checks each against its checksum); a damaged store's files byte for byte."""
    if place.damaged:
        files = sorted(f for f in place.store.parent.glob(f"{place.store.name}*") if f.is_file())
        return {f.name: f.read_bytes() for f in files}
    vectors: dict[object, object] = {}
    with Store(place.store, read_only=True) as db:
        for base, params in db.con.execute("SELECT DISTINCT base, params FROM vectors").fetchall():
            matrix, meta = db.reads.load(base, params)
            for model, vector in zip(meta["model"], matrix):
                vectors[(model, base, params)] = vector.tobytes()
    return vectors


#: Python's and DuckDB's names for errors, a traceback: never what a user reads.
RAW = re.compile(r"Traceback|_duckdb|\bduckdb\.[A-Z]|\b[A-Z]\w*(Error|Exception)\b|\[Errno|a bug in modelvec")


def check_one_line(out: subprocess.CompletedProcess[str], command: str, words: list[str]) -> str:
    shown = out.stdout + out.stderr
    assert not RAW.search(shown), shown[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], out.stderr[-3000:]
    if command not in PROGRESS:
        assert lines == errors, out.stderr[-3000:]  # nothing else on stderr
    line = errors[0]
    for word in words:
        assert word.lower() in line.lower(), (word, line)
    return line


@pytest.mark.parametrize(("command", "env", "expect"), params(CASES))
def test_every_command_in_a_hostile_environment(world, tmp_path, mounts, command, env, expect):
    place = env(world, tmp_path, mounts)
    before = held(place)
    out = run(world, place, command, tmp_path)
    if expect is OK:
        assert out.returncode == 0, out.stderr[-3000:]
        assert not RAW.search(out.stdout + out.stderr), out.stderr[-3000:]
        for written in WRITES.get(command, []):
            assert Path(expand(written, world, place)).is_file(), written
    else:
        assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
        line = check_one_line(out, command, [expand(word, world, place) for word in expect])
        print(f"{command} x {env.__name__}: {line}")  # what the user reads (pytest -rP shows it)
    after = held(place)  # the store still opens and every vector reads back, checksum checked
    if place.damaged:  # left byte for byte as it was; a vector file may have taken bytes past its end that no row
        for name, data in before.items():  # points at (its commit failed): unreferenced, never read, compacted away
            kept = after.get(name)
            assert isinstance(kept, bytes) and isinstance(data, bytes), name
            assert kept.startswith(data) if name.endswith(".vectors") else kept == data, name
    else:
        assert before.items() <= after.items()  # nothing stored is lost (a command that works may add)
        if expect is not OK and command in ("embed", "discover", "compact"):
            assert after == before
    if place.out.is_dir() and os.access(place.out, os.W_OK):  # a write that failed leaves no temporary file behind
        assert not [p.name for p in place.out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("env", [store_full, store_full_but_one_vector])
def test_a_store_whose_disk_filled_up_takes_writes_again_once_there_is_room(world, tmp_path, mounts, env):
    """The vector file is cut back to what the rows point at when its write fails, and a commit DuckDB could not
    write leaves the rows as they were: once there is room, the same store takes the same model, and compacts."""
    place = env(world, tmp_path, mounts)
    vectors = place.store.parent / f"{place.store.name}.vectors"
    before, size = held(place), vectors.stat().st_size
    failed = run(world, place, "embed", tmp_path)
    assert failed.returncode == 2, failed.stderr[-3000:]
    if env is store_full:
        assert vectors.stat().st_size == size  # the bytes of the vector that did not fit are cut off again
    filler = place.notes["filler"]
    assert isinstance(filler, Path)
    filler.unlink()
    again = run(world, place, "embed", tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "embedded 1, skipped 0" in again.stdout
    after = held(place)
    assert before.items() <= after.items() and len(after) == len(before) + 1
    compacted = run(world, place, "compact", tmp_path)
    assert compacted.returncode == 0, compacted.stderr[-3000:]
    assert held(place) == after


def test_a_checkpoint_the_full_disk_cut_off_fails_the_command_and_the_next_reads_everything(world, tmp_path, mounts):
    """embed said "embedded 1" with status 0 while DuckDB's checkpoint on closing failed for space (DuckDB drops that
    failure), and once there was room again show and cluster called the store "damaged: the file is truncated" (the
    bytes the cut-off checkpoint left past its last block), though every row was there. Now the command fails in one
    line that says what was stored is kept, and the next commands read every row, saying in one line what they
    ignored."""
    place = store_full_but_the_log(world, tmp_path, mounts)
    before = held(place)
    failed = run(world, place, "embed", tmp_path)
    assert failed.returncode == 2, failed.stderr[-3000:]
    check_one_line(failed, "embed", [f"{place.store}: ", "no space left on", "what was stored is kept"])
    filler = place.notes["filler"]
    assert isinstance(filler, Path)
    filler.unlink()
    for command in ("show", "cluster"):
        args = [expand(a, world, place) for a in COMMANDS[command]] + ["--json"]
        out = world.commands.run(args, tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "damaged" not in out.stderr and not RAW.search(out.stdout + out.stderr), out.stderr[-3000:]
        said = [line for line in out.stderr.splitlines() if line.strip()]  # a reader leaves the bytes: said each time
        assert len(said) == 1 and said[0].startswith("note: ") and "past its last block" in said[0], out.stderr
        answer = json.loads(out.stdout)
        assert (len(answer["models"]) if command == "show" else answer["n_models"]) == len(before) + 1
    after = held(place)  # every vector, the new one too, its checksum checked
    assert before.items() <= after.items() and len(after) == len(before) + 1

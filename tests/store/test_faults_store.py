"""Store integrity under faults: two processes on one store, kill -9 at random moments, threads.

* Two ``modelvec embed`` processes started at once on one store, with overlapping model lists:
  the second waits for the first's lock (and says so), both succeed, every model is stored once,
  and the vectors equal a serial run's bit for bit. A wait that runs out is one clear error.
* ``modelvec embed`` killed with SIGKILL at seeded random moments (start-up, right after the store
  opens, spread over the run): after each kill the store opens, every row loads with its checksum,
  no row is doubled and nothing committed is lost; the last run embeds exactly the missing models
  and the store equals an uninterrupted run's bit for bit.
* A writer process killed at random moments inside ``put``/``put_many``/``StoreWriter`` writes
  (some with DuckDB checkpointing every few rows): transactions are all or nothing, the committed
  items are a prefix, and bytes appended but never committed are never read.
* Threads: ``Store.writes.put`` from the main thread while a ``StoreWriter`` writes, and two ``Store``
  objects of one file in one process writing from two threads: every row lands intact.

Run as a script, this file is the killed writer's parent (see ``_helper``): it imports modelvec
once and forks a fresh writer for each trial, so a trial costs milliseconds, not an import.
"""

from __future__ import annotations

import itertools
import json
import logging
import mmap
import os
import random
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from builders import planted_finetune
from modelvec.represent import Representation
from modelvec.store import Failure, Store, StoreError, StoreLockedError, VectorRow
from modelvec.store.formats.vectorfile import VectorFile
from zygote import Forked, Zygote

N_MODELS = 160
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
}  # builders and zygote for the helper
KEY = "model, base, base_hash, params"


# --- helpers -----------------------------------------------------------------------------------
def _embed_cmd(models, store: Path, *extra: str) -> list[str]:
    base = models[0].parent.parent / "base"
    return [
        sys.executable,
        "-m",
        "modelvec.cli",
        "embed",
        "--base",
        str(base),
        *map(str, models),
        "--store",
        str(store),
        *extra,
    ]


def _opened(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux /proc): a Store has its DuckDB lock and vector file."""
    target = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def _wait_opened(proc: subprocess.Popen | Forked, store: Path, timeout: float = 120) -> float:
    """Poll until ``proc`` has the store open; the monotonic time it was seen."""
    heap = Path(f"{store}.vectors")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if _opened(proc.pid, heap):
            return time.monotonic()
        time.sleep(0.002)
    raise AssertionError(f"the run never opened the store (exit status {proc.poll()})")


def _summary(stdout: str) -> tuple[int, int]:
    found = re.search(r"embedded (\d+), skipped (\d+)", stdout)
    assert found, stdout
    return int(found[1]), int(found[2])


def _check(store: Path, reference: Callable[[str], np.ndarray]) -> tuple[list[str], dict[str, str], int]:
    """Open the store as a user would and check it whole: every row loads (checksums), no key twice,
    each vector equal to ``reference(model)``. The stored models, the failures (model -> error), and
    how many bytes of the vector file follow the last committed vector (left by an uncommitted append)."""
    with Store(store, wait=10) as db:
        rows, keys = db.con.execute(f"SELECT count(*), count(DISTINCT ({KEY})) FROM vectors").fetchall()[0]
        assert rows == keys, f"{rows - keys} duplicate rows"
        fails = db.reads.failures()
        assert len(fails) == fails["model"].nunique()
        X, meta = db.reads.load()  # raises StoreError if any row's bytes are missing or changed
        end = db.con.execute('SELECT max("offset" + 4 * dim) FROM vectors').fetchall()[0][0] or len(VectorFile.MAGIC)
        tail = db.vector_file.path.stat().st_size - end
    models = meta["model"].tolist()
    assert len(models) == rows == len(set(models))
    for model, vector in zip(models, X):
        assert np.array_equal(vector, reference(model)), f"{model}: differs from what was written"
    return models, dict(zip(fails["model"], fails["error"])), tail


@dataclass
class Corpus:
    models: list[Path]
    reference: dict[str, np.ndarray]  # model -> vector, from one uninterrupted serial run
    order: list[str]
    t_run: float  # seconds that run took, once the store was open


@pytest.fixture(scope="module")
def corpus(tiny_bert, tmp_path_factory) -> Corpus:
    """N_MODELS fine-tunes and their vectors from one uninterrupted run (the API, in this process:
    the same code and one torch thread as the CLI's, without its start-up)."""
    from modelvec import embed

    root = tmp_path_factory.mktemp("faults")
    base = root / "base"
    base.mkdir()
    for f in tiny_bert.iterdir():
        (base / f.name).write_bytes(f.read_bytes())
    models = [planted_finetune(base, root / "ft" / f"m{i:03d}", seed=i) for i in range(N_MODELS)]
    start = time.monotonic()
    result = embed(base, models, store=root / "reference.duckdb")
    t_run = time.monotonic() - start
    assert len(result.embedded) == N_MODELS and not result.failed
    order = result.metadata["model"].tolist()
    return Corpus(models, dict(zip(order, result.vectors)), order, t_run)


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> Iterator[Zygote]:
    """``modelvec`` commands in processes forked from one that imported them once, with :data:`ENV` (the first kill
    of a run starts a fresh process: it lands while the command still imports)."""
    with Zygote(ENV) as zygote:
        yield zygote


# --- 1. two processes on one store --------------------------------------------------------------
def test_two_embed_processes_on_one_store_serialise(corpus, commands, tmp_path):
    """Started at once with overlapping lists: one waits for the other's lock (and says so with its
    PID), both exit 0, every model is stored exactly once, bit for bit as a serial run."""
    _two_at_once(corpus, commands, tmp_path / "shared.duckdb")


def _two_at_once(corpus: Corpus, commands: Zygote, store: Path) -> None:
    third = N_MODELS // 3
    lists = [corpus.models[: 2 * third], corpus.models[third:]]
    procs = [commands.start(_embed_cmd(models, store)[3:], store.parent) for models in lists]
    done = [p.completed(300) for p in procs]
    outs = [(d.stdout, d.stderr) for d in done]
    for d in done:
        assert d.returncode == 0, d.stderr
    waited = [i for i, (_, errs) in enumerate(outs) if "waiting for it to finish" in errs]
    assert len(waited) == 1, [errs for _, errs in outs]  # the runs overlap: one held the store, the other waited
    second, first = waited[0], 1 - waited[0]
    line = next(l for l in outs[second][1].splitlines() if "waiting" in l)
    assert f"{store}: in use by another process (PID {procs[first].pid})" in line
    counts = [_summary(out) for out, _ in outs]
    assert counts[first] == (len(lists[first]), 0)
    overlap = len(lists[0]) + len(lists[1]) - N_MODELS
    assert counts[second] == (len(lists[second]) - overlap, overlap)  # it saw everything the first stored
    models, failures, _ = _check(store, corpus.reference.get)
    assert models == corpus.order and not failures  # each model once, vectors as the serial run's


def test_embed_gives_up_waiting_with_one_clear_line(corpus, commands, tmp_path):
    """While this process holds the store, ``modelvec embed --wait 0.5`` says it waits, then fails
    with one line naming the store and the holder's PID, and writes nothing."""
    store = tmp_path / "held.duckdb"
    with Store(store) as db:
        heap_size = db.vector_file.path.stat().st_size
        out = commands.run(_embed_cmd(corpus.models[:3], store, "--wait", "0.5")[3:], tmp_path, timeout=120)
        assert db.con.execute("SELECT count(*) FROM vectors").fetchall() == [(0,)]
        assert db.vector_file.path.stat().st_size == heap_size  # only the lock holder appends to the vector file
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"{store}: in use by another process (PID {os.getpid()}); waiting for it to finish, up to 0.5 s",
        f"error: {store}: still in use by another process (PID {os.getpid()}) after waiting 0.5 s; "
        "let it finish, or wait longer (--wait SECONDS, $MODELVEC_STORE_WAIT)",
    ], out.stderr
    assert "embedded" not in out.stdout


HOLDER = (
    "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('locked', flush=True); "
    "time.sleep(float(sys.argv[2])); con.close(); time.sleep(30)"
)


def _holder(store: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the store's DuckDB lock for ``seconds`` (then idle, without it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(store), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_store_waits_for_another_process_then_opens(tmp_path):
    store = tmp_path / "s.duckdb"
    holder = _holder(store, 1.0)
    try:
        told: list[str] = []
        start = time.monotonic()
        with Store(store, wait=60, on_wait=told.append) as db:
            waited = time.monotonic() - start
            db.writes.put(
                VectorRow("m", "h", "b", "bh", Representation(rank=4), "bert", np.ones(8, np.float32), [], "x", 0.1)
            )
            assert db.reads.load()[0].tolist() == [[1.0] * 8]
    finally:
        holder.kill()
        holder.wait()
    assert told == [f"{store}: in use by another process (PID {holder.pid}); waiting for it to finish, up to 60 s"]
    assert 0.4 < waited < 10


def test_store_wait_runs_out(tmp_path, monkeypatch, caplog):
    store = tmp_path / "s.duckdb"
    holder = _holder(store, 60)
    try:
        start = time.monotonic()
        with pytest.raises(StoreLockedError) as info:
            Store(store, wait=0.6, on_wait=lambda line: None)
        assert 0.6 <= time.monotonic() - start < 3
        assert info.value.pid == holder.pid and info.value.path == store
        assert str(info.value).startswith(f"{store}: still in use by another process (PID {holder.pid}) after waiting")
        monkeypatch.setenv("MODELVEC_STORE_WAIT", "0.3")  # the default wait; the default message is a warning
        with caplog.at_level(logging.WARNING, logger="modelvec.store"), pytest.raises(StoreLockedError):
            Store(store)
        assert [r.getMessage() for r in caplog.records] == [
            f"{store}: in use by another process (PID {holder.pid}); waiting for it to finish, up to 0.3 s"
        ]
        told: list[str] = []
        start = time.monotonic()
        with pytest.raises(StoreLockedError, match=r"after waiting 0 s"):
            Store(store, wait=0, on_wait=told.append)  # no wait at all
        assert time.monotonic() - start < 0.5 and told == []
        assert not Path(f"{store}.vectors").exists()  # the vector file is opened only once the lock is held
        with pytest.raises(ValueError, match="wait"):
            Store(store, wait=-1)
    finally:
        holder.kill()
        holder.wait()
    with Store(store, wait=0) as db:  # the holder is gone: opens at once
        assert db.reads.failures().empty


def test_other_open_errors_are_not_waited_for(tmp_path):
    (tmp_path / "dir.duckdb").mkdir()
    start = time.monotonic()
    with pytest.raises(StoreError, match="dir.duckdb: a folder, not a store"):  # one line naming it, not DuckDB's error
        Store(tmp_path / "dir.duckdb", wait=30)
    assert time.monotonic() - start < 1


# --- 2. kill -9 at random moments ---------------------------------------------------------------
def test_embed_killed_at_random_moments_then_resumed(corpus, commands, tmp_path):
    """Five seeded kills of a real ``modelvec embed`` process: one during start-up (a fresh Python, still
    importing), one the moment the store is opened, three spread over what remains of the run (processes forked
    from one that imported the command: :mod:`zygote`). After each, the store is whole; the last run embeds exactly
    the missing models, and the store equals an uninterrupted run's."""
    log = _kill_and_resume(corpus, commands, tmp_path / "s.duckdb", seed=4)
    print("kills (trial, seconds after start, rows committed by that run, uncommitted bytes left):", log)


def _kill_and_resume(
    corpus: Corpus, commands: Zygote, store: Path, seed: int, trials: int = 5
) -> list[tuple[int, float, int, bool]]:
    rng = random.Random(seed)
    cmd = _embed_cmd(corpus.models, store)
    done: list[str] = []
    log = []
    for trial in range(trials):
        start = time.monotonic()
        proc: subprocess.Popen | Forked
        if trial == 0:
            proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            proc = commands.start(cmd[3:], store.parent)
        if trial == 0:  # start-up: imports, before the store is opened
            time.sleep(rng.uniform(0.3, 1.5))
            assert not _opened(proc.pid, Path(f"{store}.vectors"))
        else:
            _wait_opened(proc, store)
            left = corpus.t_run * (N_MODELS - len(done)) / N_MODELS
            time.sleep(0 if trial == 1 else rng.uniform(0.05, 0.7) * left)
        alive = proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert alive, f"trial {trial}: the run ended before the kill"
        moment = time.monotonic() - start
        models, failures, tail = _check(store, corpus.reference.get)
        assert set(done) <= set(models) and not failures  # nothing committed is lost; no model failed
        log.append((trial, round(moment, 2), len(models) - len(done), tail > 0))
        done = models
    assert 0 < len(done) < N_MODELS, log
    out = commands.run(cmd[3:], store.parent)
    assert out.returncode == 0, out.stderr
    assert _summary(out.stdout) == (N_MODELS - len(done), len(done))  # exactly the missing ones
    models, failures, _ = _check(store, corpus.reference.get)
    assert models == corpus.order and not failures
    return log


# The killed writer: items are vectors, every 7th a failure; their content is a function of the index.
DIM = 96
PARAMS = Representation(rank=4)
MODES = ("put", "put_many", "writer", "replace")
OPENING, BETWEEN = 0, 9  # the phases besides 1 + MODES.index(mode): inside that call


def _item(i: int) -> VectorRow | Failure:
    name = f"m{i:05d}"
    if i % 7 == 3:
        return Failure(name, "base", PARAMS, f"{name}: broken #{i}", model_version=f"h{i}")
    vector = np.random.default_rng(i).standard_normal(DIM).astype(np.float32)
    return VectorRow(name, f"h{i}", "base", "bh", PARAMS, "bert", vector, ["ds"], "local", 0.01)


def _schedule(seed: int, start: int):
    """The writer's calls from item ``start`` on, (mode, item indices), the same in the writer and the test."""
    rng = random.Random(seed)
    i = start
    while True:
        mode = rng.choice(MODES)
        if mode == "replace":  # rewrite committed items with the same content: new bytes, row repointed
            if i:
                yield mode, sorted(rng.sample(range(i), min(i, rng.randint(1, 8))))
            continue
        n = rng.randint(1, 24)
        yield mode, list(range(i, i + n))
        i += n


def _write_until_killed(store: str, start: int, seed: int, small_checkpoints: bool, shared: mmap.mmap) -> None:
    struct.pack_into("iii", shared, 0, OPENING, 0, 0)
    with Store(store, wait=10) as db:
        if small_checkpoints:  # DuckDB checkpoints every few rows: kills land inside checkpoints too
            db.con.execute("SET checkpoint_threshold = '8KB'")
        for mode, items in _schedule(seed, start):
            struct.pack_into("iii", shared, 0, 1 + MODES.index(mode), items[0], items[-1] + 1)
            rows = [_item(i) for i in items]
            if mode == "put":
                for r in rows:
                    db.writes.put(r) if isinstance(r, VectorRow) else db.writes.record_failure(
                        r.model, r.base, r.representation, r.error, r.model_version
                    )
            elif mode == "writer":
                with db.writes.writer() as w:
                    for r in rows:
                        w.put(r)
            else:
                db.writes.put_many(rows)
            struct.pack_into("iii", shared, 0, BETWEEN, 0, 0)


def _helper() -> None:
    """The killed writer's parent: for each ``trial`` line on stdin, fork a writer, SIGKILL it after
    ``delay`` seconds, and print what it was doing. Only this process's main thread exists when it
    forks (it never opens DuckDB), so each child starts clean."""
    shared = mmap.mmap(-1, 64)  # MAP_SHARED: the child's phase, read after its death
    for line in sys.stdin:
        store, start, seed, delay, small, after_open = line.split()
        struct.pack_into("iii", shared, 0, OPENING, 0, 0)
        pid = os.fork()
        if pid == 0:
            try:
                _write_until_killed(store, int(start), int(seed), small == "1", shared)
            finally:
                os._exit(3)  # never reached unless the writer failed: the test sees it was not killed
        deadline = time.monotonic() + 30
        while after_open == "1" and struct.unpack_from("i", shared, 0)[0] == OPENING and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(float(delay))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        phase, lo, hi = struct.unpack_from("iii", shared, 0)
        print(json.dumps({"killed": os.WIFSIGNALED(status), "phase": phase, "lo": lo, "hi": hi}), flush=True)


def test_writer_killed_inside_store_writes(tmp_path):
    """Sixteen seeded kills of a process writing small rows as fast as it can, through every write
    path (four aimed at its opening of the store, the rest once it writes), half of them with DuckDB
    checkpointing every few rows. After each: the store opens, the committed items are exactly a
    prefix (a ``put_many`` is all or nothing), every row loads with its exact vector, and replaced
    rows read their old bytes or their new, never a mix."""
    phases, torn, n = _kill_writer(tmp_path / "w.duckdb", seed=11)
    print(f"writer kills: {sum(phases.values())}, phases {phases}; uncommitted tails {torn}; items committed {n}")


def _kill_writer(store: Path, seed: int, trials: int = 16) -> tuple[dict[str, int], int, int]:
    heap = Path(f"{store}.vectors")
    rng = random.Random(seed)
    helper = subprocess.Popen(
        [sys.executable, __file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=Path(__file__).parent,
    )
    n, last_heap = 0, 0
    phases: dict[str, int] = {}
    torn = 0
    try:
        for trial in range(trials):
            after_open = int(trial % 4 != 0)
            seed, delay, small = rng.randrange(10**6), rng.uniform(0.0, 0.25 if after_open else 0.1), trial % 2
            helper.stdin.write(f"{store} {n} {seed} {delay} {small} {after_open}\n")
            helper.stdin.flush()
            report = json.loads(helper.stdout.readline())
            assert report["killed"], report
            phase = {OPENING: "opening", BETWEEN: "between calls"}.get(report["phase"])
            phase = phase or f"inside {MODES[report['phase'] - 1]}"
            phases[phase] = phases.get(phase, 0) + 1
            # opens; no duplicates; every checksum; each vector exactly as written
            models, failures, tail = _check(store, lambda model: _item(int(model[1:])).vector)
            committed = sorted(int(m[1:]) for m in [*models, *failures])
            assert committed == list(range(len(committed))), "a gap: a later write committed before an earlier one"
            assert len(committed) >= n, "committed items were lost"
            for i in committed:
                item = _item(i)
                if isinstance(item, Failure):
                    assert failures[item.model] == item.error
            new_n = len(committed)
            steps = _schedule(seed, n)
            while True:  # a put_many is one transaction: the prefix never ends inside one
                mode, items = next(steps)
                if mode != "replace" and items[0] >= new_n:
                    break
                if mode == "put_many" and items[0] < new_n <= items[-1]:
                    raise AssertionError(f"put_many of items {items[0]}..{items[-1]} committed in part")
            size = heap.stat().st_size
            if tail > 0 and size != last_heap:
                torn += 1  # new bytes after the last committed vector: killed between append and commit
            n, last_heap = new_n, size
    finally:
        helper.stdin.close()
        helper.wait(timeout=30)
    assert n > 0
    return phases, torn, n


# --- 3. threads in one process ------------------------------------------------------------------
def _rows(tag: str, n: int, dim: int = 64) -> list[VectorRow]:
    rng = np.random.default_rng(sum(map(ord, tag)))
    return [
        VectorRow(
            f"{tag}{i:04d}", "h", "b", "bh", PARAMS, "bert", rng.standard_normal(dim).astype(np.float32), [], "x", 0.1
        )
        for i in range(n)
    ]


def _assert_all_intact(db: Store, rows: list[VectorRow]) -> None:
    X, meta = db.reads.load()
    assert meta["model"].tolist() == sorted(r.model for r in rows)
    expected = {r.model: r.vector for r in rows}
    for model, x in zip(meta["model"], X):
        assert np.array_equal(x, expected[model])
    offsets = sorted(r[0] for r in db.con.execute('SELECT "offset" FROM vectors').fetchall())
    assert all(b - a >= X.shape[1] * 4 for a, b in itertools.pairwise(offsets))  # no two rows share bytes


@pytest.fixture
def fast_switching():
    """Switch threads every microsecond: interleavings that are rare otherwise happen every run."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_put_while_the_background_writer_writes(tmp_path, fast_switching):
    mine, its = _rows("main", 80), _rows("writer", 80)
    with Store(tmp_path / "s.duckdb") as db:
        with db.writes.writer() as writer:
            for a, b in zip(mine, its):
                writer.put(b)
                db.writes.put(a)
        _assert_all_intact(db, mine + its)


def test_two_vector_files_of_one_file_append_from_two_threads(tmp_path, fast_switching):
    """Two VectorFile objects of one file (what two Store objects of one path in one process have)
    do not share a thread lock: without the flock in ``append`` both took the same end as their
    offset and one overwrote the other's bytes (9 runs in 10 of this test failed)."""
    path = tmp_path / "v"
    for _ in range(2):
        files = [VectorFile(path), VectorFile(path)]
        written: list[list[tuple[int, np.ndarray]]] = [[], []]

        def append(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(20):
                vectors = list(rng.standard_normal((200, 64), dtype=np.float32))
                written[seed] += zip(files[seed].append(vectors), vectors)

        threads = [threading.Thread(target=append, args=(seed,)) for seed in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        written = written[0] + written[1]
        assert len({offset for offset, _ in written}) == len(written) == 8000
        for offset, vector in written:
            assert np.array_equal(np.fromfile(path, np.float32, 64, offset=offset), vector)
        for heap in files:
            heap.close()


def test_two_stores_of_one_file_written_from_two_threads(tmp_path, fast_switching):
    """Two Store objects of one path in one process share DuckDB's database, and their vector files
    the flock: rows from both threads all land, each with its own bytes."""
    path = tmp_path / "s.duckdb"
    batches = {"a": _rows("a", 60), "b": _rows("b", 60)}
    errors: list[BaseException] = []
    with Store(path) as one, Store(path) as two:

        def write(db: Store, rows: list[VectorRow]) -> None:
            try:
                for lo in range(0, len(rows), 10):
                    db.writes.put_many(rows[lo : lo + 10])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(db, batches[tag])) for db, tag in ((one, "a"), (two, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        _assert_all_intact(one, batches["a"] + batches["b"])
        offsets = one.con.execute('SELECT "offset" FROM vectors').fetchall()
        assert all(o % VectorFile.ALIGN == 0 for (o,) in offsets)


if __name__ == "__main__":
    _helper()

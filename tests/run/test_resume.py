"""A run killed (SIGKILL) or interrupted (Ctrl-C) mid-way loses nothing stored; the next run computes only the rest."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from builders import planted_finetune
from zygote import Zygote

N_MODELS = 240  # the run must still be going when the signal lands (the sketch got faster)


def _count(store: Path) -> tuple[int, int]:
    con = duckdb.connect(str(store))
    try:
        return tuple(con.execute("SELECT count(*), count(DISTINCT model) FROM vectors").fetchall()[0])
    finally:
        con.close()


def _embed(tiny_bert: Path, models: list[Path], store: Path) -> list[str]:
    """``modelvec embed`` of ``models`` into ``store``'s arguments, as a user types them."""
    return ["embed", "--base", str(tiny_bert), *map(str, models), "--store", str(store)]


@pytest.fixture(scope="module")
def commands() -> Iterator[Zygote]:
    """The commands in processes forked from one that imported them once (:mod:`zygote`; each takes SIGKILL, or
    SIGINT as Ctrl-C, as a fresh Python does), one torch thread."""
    with Zygote({**os.environ, "OMP_NUM_THREADS": "1"}) as zygote:
        yield zygote


@pytest.fixture(scope="module")
def finetunes(tiny_bert, tmp_path_factory) -> list[Path]:
    """The fine-tunes every case embeds (read only): made once for the module."""
    root = tmp_path_factory.mktemp("resume") / "ft"
    return [planted_finetune(tiny_bert, root / f"m{i:03d}", seed=i) for i in range(N_MODELS)]


@pytest.fixture(scope="module")
def clean(tiny_bert, finetunes, commands, tmp_path_factory) -> Path:
    """The store of one uninterrupted run over the fine-tunes: what every resumed store must hold."""
    store = tmp_path_factory.mktemp("resume-clean") / "clean.duckdb"
    out = commands.run(_embed(tiny_bert, finetunes, store), store.parent)
    assert out.returncode == 0, out.stderr
    return store


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_interrupted_mid_run_then_resume(sig, tiny_bert, finetunes, clean, commands, tmp_path):
    from modelvec.store import Store

    store = tmp_path / "s.duckdb"
    args = _embed(tiny_bert, finetunes, store)
    proc = commands.start(args, tmp_path)
    wal = Path(str(store) + ".wal")
    deadline = time.monotonic() + 120
    # kill as soon as a few rows are committed (the write-ahead log grows with each one)
    while time.monotonic() < deadline and proc.poll() is None:
        if wal.exists() and wal.stat().st_size > 12_000:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed: raise N_MODELS"
    os.kill(proc.pid, sig)
    assert proc.wait(timeout=60) != 0
    proc.outputs()
    done, distinct = _count(store)
    assert 0 < done < N_MODELS and done == distinct  # killed mid-run; what was committed survived, once
    out = commands.run(args, tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"embedded {N_MODELS - done}, skipped {done}" in out.stdout
    assert _count(store) == (N_MODELS, N_MODELS)
    # the resumed store holds exactly what one uninterrupted run computes
    with Store(store) as a, Store(clean, read_only=True) as b:
        Xa, ma = a.reads.load()
        Xb, mb = b.reads.load()
    assert list(ma["model"]) == list(mb["model"]) and np.array_equal(Xa, Xb)

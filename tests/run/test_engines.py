"""The local engine streams: the next models are fetched in I/O threads while one is computed, a
bounded number at a time; the store writer commits off the compute thread and loses nothing queued."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from builders import planted_finetune
from modelvec import Representation, Store, embed
from modelvec.core.settings import choices_of, settings_of
from modelvec.hub.client import HubSettings
from modelvec.run.engines import Execution, make_engine
from modelvec.run.local import LocalEngine
from modelvec.run.work import BaseSpec, Opened, Task
from modelvec.store import Failure, VectorRow

OPEN_SECONDS = 0.3


@dataclass(frozen=True)
class SlowTask(Task):
    """A task whose fetch takes OPEN_SECONDS (a download), recording where and when it ran."""

    log: list | None = None

    def open(self, hub_settings: HubSettings, params: Representation | None = None) -> Opened:
        start = time.monotonic()
        time.sleep(OPEN_SECONDS)
        self.log.append((self.name, threading.current_thread().name, start, time.monotonic()))
        return super().open(hub_settings, params)


@pytest.fixture(scope="module")
def finetunes(tiny_bert, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("engine-ft")
    return [planted_finetune(tiny_bert, root / f"m{i}", seed=i) for i in range(6)]


def _tasks(models: list[Path], log: list, consumed: list | None = None):
    for m in models:
        if consumed is not None:
            consumed.append(m.name)
        yield SlowTask(m.name, "id", str(m), path=str(m), log=log)


def test_downloads_overlap_computation_in_io_threads_and_stay_bounded(tiny_bert, finetunes):
    log: list = []
    consumed: list = []
    engine = LocalEngine(workers=2)
    base = BaseSpec(str(tiny_bert), "b", path=str(tiny_bert))
    outcomes = engine.run(base, Representation(), _tasks(finetunes, log, consumed), HubSettings())
    first = next(outcomes)
    assert len(consumed) <= 3  # at most workers + 1 models taken ahead of the one computed
    rest = list(outcomes)
    assert [o.task.name for o in [first, *rest]] == [m.name for m in finetunes]  # outcomes in task order
    assert all(o.error is None and o.vector is not None for o in [first, *rest])
    assert {thread for _, thread, *_ in log} <= {f"modelvec-io_{i}" for i in range(2)}  # fetched off the compute thread
    # two fetches at a time (they overlap, which the log shows without trusting the wall clock), never more
    events = sorted([(s, 1) for *_, s, e in log] + [(e, -1) for *_, s, e in log])
    running = np.cumsum([d for _, d in events])
    assert running.max() == 2


def test_vectors_do_not_depend_on_the_number_of_workers(tiny_bert, finetunes, tmp_path):
    one = embed(tiny_bert, finetunes, store=tmp_path / "a.duckdb", workers=1)
    four = embed(tiny_bert, finetunes, store=tmp_path / "b.duckdb", workers=4)
    assert one.embedded == four.embedded == [str(m.resolve()) for m in finetunes]
    assert np.array_equal(one.vectors, four.vectors)
    assert embed(tiny_bert, finetunes, store=tmp_path / "b.duckdb", workers=4, load=False).vectors.size == 0


def test_a_model_that_fails_to_open_in_an_io_thread_is_recorded_and_the_run_goes_on(tiny_bert, finetunes, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((finetunes[0] / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    result = embed(tiny_bert, [finetunes[0], broken, finetunes[1]], store=tmp_path / "s.duckdb", workers=2)
    assert len(result.embedded) == 2
    ((name, reason),) = result.failed.items()
    assert name == str(broken.resolve()) and reason.startswith(f"{broken.resolve()}: ") and "\n" not in reason


def test_engine_parameters_are_validated_once():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            LocalEngine(workers=bad)
    with pytest.raises(ValueError, match="engine must be one of local, ray, not 'spark'"):
        Execution(engine="spark")
    with pytest.raises(ValueError, match="--address is for --engine ray"):
        make_engine(Execution(engine="local", address="127.0.0.1:6379"))
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        Execution(workers=0)


def test_a_registered_engine_is_a_choice_of_the_settings_and_the_command(monkeypatch):
    """The engines' registry is where ``--engine``'s choices come from: one registered later is accepted by the
    settings (and the API), and the command line offers the engines known when it is built."""
    from modelvec.run import engines

    monkeypatch.setitem(engines.ENGINES, "here", "modelvec.run.local:LocalEngine")
    assert Execution(engine="here").engine == "here"
    assert isinstance(make_engine(Execution(engine="here", workers=1)), LocalEngine)
    engine = next(meta for field, meta in settings_of(Execution) if field.name == "engine")
    assert set(choices_of(engine)) == {"local", "ray", "here"}


def _row(i: int) -> VectorRow:
    return VectorRow(f"m{i}", "h", "b", "bh", Representation(), "bert", np.full(8, i, np.float32), ["d"], "src", 0.1)


def test_writer_commits_everything_queued_on_close(tmp_path):
    with Store(tmp_path / "s.duckdb") as db:
        with db.writes.writer() as writer:
            for i in range(200):
                writer.put(_row(i))
            writer.put(Failure("bad", "b", Representation(), "bad: broken", None))
        X, meta = db.reads.load()
        assert list(meta["model"]) == sorted(f"m{i}" for i in range(200))
        assert np.array_equal(X[:, 0], [int(m[1:]) for m in meta["model"]])
        assert list(db.reads.failures()["model"]) == ["bad"]


def test_a_writer_error_reaches_the_caller_and_nothing_half_written_lands(tmp_path):
    with Store(tmp_path / "s.duckdb") as db:
        writer = db.writes.writer()
        writer.put(_row(0))
        writer.put(VectorRow("x", "h", "b", "bh", None, "bert", np.zeros(3), [], "s", 0.0))  # type: ignore[arg-type]
        with pytest.raises(AttributeError):
            writer.close()
        assert db.reads.metadata().empty or list(db.reads.metadata()["model"]) == ["m0"]
        assert "x" not in set(db.reads.metadata()["model"])

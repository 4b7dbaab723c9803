"""Stores as people use them, by a state machine (hypothesis): random sequences of ``embed`` (new models, ``--force``,
cards edited between runs), ``compact``, whole stores copied and renamed with ``cp`` and ``mv``, and embeds killed
mid-run, over three stores in one folder. After each step every store answers ``cluster`` as a fresh store built
from the same models does, and no step touched a file of a store it was not run on (issue 47)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import modelvec
from builders import maps_not_drawn, planted_dataset_finetune
from modelvec.core.errors import ModelvecError
from modelvec.report import cluster
from modelvec.store import Store

NAMES = ("s0", "s1", "s2")


DATASETS = ("imdb", "glue/sst2", "squad")


def files_of(folder: Path, name: str) -> dict[str, tuple[int, str]]:
    """Every file of the store ``name`` (its DuckDB file and everything named after it), with its size and hash."""
    out = {}
    for path in sorted(folder.glob(f"{name}.duckdb*")):
        for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            data = file.read_bytes()
            out[str(file.relative_to(folder))] = (len(data), hashlib.sha1(data).hexdigest())
    return out


def answer(base: Path, store: Path, out: Path) -> dict:
    """``cluster``'s answer as JSON with its map's coordinates (``map``: :func:`maps_not_drawn`), floats rounded
    (products kept or computed may differ in their last bits), or the one line of its error."""
    try:
        with maps_not_drawn() as maps:
            report = cluster(base, store=store, out=out, reduce="pca").as_json()
    except ModelvecError as exc:
        return {"error": str(exc).replace(str(store), "STORE")}
    report.pop("files", None)
    report["map"] = maps[0] if maps else None

    def rounded(value):
        if isinstance(value, float):
            return None if value != value else round(value, 6)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    return rounded(json.loads(json.dumps(report, default=str)))


@pytest.fixture(scope="module")
def pool(tiny_bert, tmp_path_factory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("machine-models")
    return tiny_bert, [
        planted_dataset_finetune(tiny_bert, root / f"ft{d}{i}", d, 20 * d + i) for d in range(2) for i in range(3)
    ]


class Stores(RuleBasedStateMachine):
    """Three store names in one folder; each existing store holds a set of the pool's models."""

    base: Path
    models: list[Path]
    kills: dict[str, int]  # "mid-run": killed while its embed worked; "after": the embed had ended first

    @initialize()
    def start(self) -> None:
        self.folder = Path(os.environ["MACHINE_ROOT"]) / f"run{time.monotonic_ns()}"
        self.folder.mkdir(parents=True)
        self.held: dict[str, set[str]] = {}  # store name -> its models
        self.references: dict[tuple, dict] = {}
        for model in self.models:  # every run starts from the cards as made
            (model / "README.md").write_text(f"---\ndatasets:\n- {DATASETS[int(model.name[2])]}\n---\n")

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.duckdb"

    def others(self, *names: str) -> dict[str, dict]:
        return {n: files_of(self.folder, n) for n in self.held if n not in names}

    def untouched(self, before: dict[str, dict]) -> None:
        for name, files in before.items():
            assert files_of(self.folder, name) == files, f"a step touched the files of {name}"

    @rule(
        name=st.sampled_from(NAMES),
        picked=st.sets(st.integers(0, 5), min_size=3, max_size=6),
        force=st.booleans(),
    )
    def embed(self, name: str, picked: set[int], force: bool) -> None:
        before = self.others(name)
        chosen = [self.models[i] for i in sorted(picked)]
        result = modelvec.embed(self.base, chosen, store=self.path(name), force=force, load=False)
        assert result.failed == {}
        self.held.setdefault(name, set()).update(str(m) for m in chosen)
        self.untouched(before)

    @rule(name=st.sampled_from(NAMES), picked=st.sets(st.integers(0, 5), min_size=3), delay=st.floats(0.05, 1.5))
    def embed_killed(self, name: str, picked: set[int], delay: float) -> None:
        """An embed killed (SIGKILL) mid-run: it keeps what it committed, and loses nothing stored before."""
        before = self.others(name)
        chosen = [self.models[i] for i in sorted(picked)]
        pid = os.fork()
        if pid == 0:  # the child embeds until killed (or ends first)
            try:
                modelvec.embed(self.base, chosen, store=self.path(name), force=True, load=False)
            finally:
                os._exit(0)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        self.kills["mid-run" if os.WIFSIGNALED(status) else "after"] += 1
        had = self.held.get(name, set())
        if not self.path(name).exists():
            assert not had
            self.held.pop(name, None)
            self.untouched(before)
            return
        with Store(self.path(name), read_only=True) as db:
            stored = set(db.reads.metadata()["model"])
        assert had <= stored <= had | {str(m) for m in chosen}, "a killed embed lost or invented models"
        self.held[name] = stored
        self.untouched(before)

    @rule(model=st.integers(0, 5), dataset=st.sampled_from(DATASETS))
    def edit_card(self, model: int, dataset: str) -> None:
        (self.models[model] / "README.md").write_text(f"---\ndatasets:\n- {dataset}\n---\n")
        for name, held in self.held.items():  # the next embed of each store holding it reads it again
            if str(self.models[model]) in held:
                modelvec.embed(self.base, [self.models[model]], store=self.path(name), load=False)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def compact(self, data) -> None:
        name = data.draw(st.sampled_from(sorted(self.held)))
        before = self.others(name)
        with Store(self.path(name)) as db:
            db.writes.compact()
        self.untouched(before)

    @precondition(lambda self: 0 < len(self.held) < len(NAMES))
    @rule(data=st.data(), move=st.booleans())
    def copy_or_rename(self, data, move: bool) -> None:
        """All of a store's files copied (``cp -r S.duckdb* T...``) or renamed (``mv``) to a free name."""
        source = data.draw(st.sampled_from(sorted(self.held)))
        target = data.draw(st.sampled_from([n for n in NAMES if n not in self.held]))
        before = self.others(*([source] if move else []))  # a copy leaves its source as it was
        for path in list(self.folder.glob(f"{source}.duckdb*")):
            to = self.folder / (target + path.name[len(source) :])
            if move:
                path.rename(to)
            elif path.is_dir():
                shutil.copytree(path, to)
            else:
                shutil.copy2(path, to)
        self.held[target] = set(self.held[source])
        if move:
            del self.held[source]
        self.untouched(before)

    @invariant()
    def every_store_answers_as_a_fresh_one(self) -> None:
        for name, models in sorted(self.held.items()):
            cards = tuple((m, (Path(m) / "README.md").read_text()) for m in sorted(models))
            if cards not in self.references:
                fresh = self.folder / "fresh" / f"{len(self.references)}.duckdb"  # a new one for each answer
                modelvec.embed(self.base, sorted(models), store=fresh, load=False)
                self.references[cards] = answer(self.base, fresh, self.folder / "fresh-out")
            assert answer(self.base, self.path(name), self.folder / "out") == self.references[cards], name


def test_stores_as_people_use_them(pool, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MACHINE_ROOT", str(tmp_path))
    Stores.base, Stores.models = pool
    Stores.kills = {"mid-run": 0, "after": 0}
    rules = settings(
        max_examples=int(os.environ.get("MODELVEC_MACHINE_EXAMPLES", "12")),
        stateful_step_count=int(os.environ.get("MODELVEC_MACHINE_STEPS", "10")),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    run_state_machine_as_test(Stores, settings=rules)
    assert Stores.kills["mid-run"] > 0, f"no kill landed while an embed worked: {Stores.kills}"

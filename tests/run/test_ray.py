"""The Ray engine on a local ``ray.init``, and on a cluster of two nodes started with ``ray start``: ``embed``'s
actors, and the held blocks of ``cluster``'s nearest lists as tasks (the same lists, a worker killed in its block
redone).

The vectors must equal the local engine's; a bad model, a dead worker and a bad base must each do
what the local engine's contract says. Nothing of modelvec's or Ray's is mocked: the dead worker is
a real worker process that exits in the middle of a task.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

ray = pytest.importorskip("ray")

import modelvec  # noqa: E402
from builders import planted_finetune  # noqa: E402
from modelvec import Representation, Store  # noqa: E402
from modelvec.cli import app  # noqa: E402
from modelvec.core.errors import CheckpointError, Kind, ModelvecError  # noqa: E402
from modelvec.hub.client import HubSettings  # noqa: E402
from modelvec.read import Checkpoint  # noqa: E402
from modelvec.represent import DeltaEmbedder  # noqa: E402
from modelvec.run import ray_engine  # noqa: E402
from modelvec.run.ray_actors import IN_FLIGHT  # noqa: E402
from modelvec.run.ray_engine import RayEngine  # noqa: E402
from modelvec.run.tasks import base_spec, task_of  # noqa: E402
from modelvec.run.work import BaseSpec, Task  # noqa: E402
from modelvec.store import VectorRow  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_ray_at_a_time")  # one module with Ray at a time

PARAMS = Representation(rank=4)
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance for the module (2 CPUs: the machine's); the engine uses it and leaves it open."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 1024**2)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def finetunes(tiny_bert, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("ray-finetunes")
    return [
        planted_finetune(tiny_bert, root / f"ft{i}", seed=10 + i, card_datasets=["imdb" if i % 2 else "glue/sst2"])
        for i in range(4)
    ]


def corrupt_copy(good: Path, out: Path) -> Path:
    """A folder with a config and a model.safetensors that is not safetensors (found, hashed, unreadable)."""
    out.mkdir(parents=True)
    shutil.copy(good / "config.json", out / "config.json")
    (out / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json" + bytes(64))
    return out


def reference(base: Path, models: list[Path]) -> dict[str, np.ndarray]:
    embedder = DeltaEmbedder.from_representation(PARAMS, "cpu").fit(Checkpoint(base))
    return {str(m.resolve()): embedder.embed_one(Checkpoint(m)) for m in models}


def tasks_for(base: Path, models: list[Path], tmp_path: Path) -> tuple[BaseSpec, list[Task]]:
    with Store(tmp_path / "tasks.duckdb") as db:
        spec = base_spec(base, db, HubSettings())
        return spec, [task_of(m, spec.name, db, HubSettings()) for m in models]


def wait_for_cpus(total: float, seconds: float = 20.0) -> float:
    """The cluster's free CPUs once every actor has let its CPU go (or what is free after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= total or time.monotonic() > deadline:
            return free
        time.sleep(0.2)


def test_settings_and_representation_pickle():
    hub_settings = HubSettings(endpoint="http://127.0.0.1:1", cache_dir="/tmp/x", token=False, backoff=0.5)
    assert pickle.loads(pickle.dumps(hub_settings)) == hub_settings
    assert pickle.loads(pickle.dumps(PARAMS)) == PARAMS
    task = Task("m", "stat:1", "m", path="/m", datasets=("imdb",))
    assert pickle.loads(pickle.dumps(task)) == task


def test_engine_arguments_are_checked_once(monkeypatch):
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="workers must be an integer >= 1"):
            RayEngine(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="address must be"):
        RayEngine(2, address=" ")
    monkeypatch.setattr(ray_engine, "ray", None)
    with pytest.raises(ValueError) as missing:
        RayEngine(2)
    assert str(missing.value) == "the ray engine needs the optional extra: pip install 'modelvec[ray]'"


def test_ray_vectors_equal_local_failures_are_recorded_and_a_rerun_skips(cluster, tiny_bert, finetunes, tmp_path):
    broken = corrupt_copy(finetunes[0], tmp_path / "broken")
    models = [finetunes[0], finetunes[1], broken, finetunes[2], finetunes[3]]
    on_ray = modelvec.embed(
        tiny_bert, models, representation=PARAMS, engine="ray", workers=2, store=tmp_path / "ray.duckdb"
    )
    local = modelvec.embed(tiny_bert, models, representation=PARAMS, store=tmp_path / "local.duckdb")
    good = sorted(str(m.resolve()) for m in finetunes)
    assert sorted(on_ray.embedded) == good == sorted(local.embedded)
    assert on_ray.metadata["model"].tolist() == local.metadata["model"].tolist()
    assert (
        on_ray.vectors.shape
        == local.vectors.shape
        == (4, DeltaEmbedder.from_representation(PARAMS).fit(tiny_bert).dim_)
    )
    assert on_ray.vectors.dtype == np.float32
    assert np.allclose(on_ray.vectors, local.vectors, atol=1e-6)
    assert [list(d) for d in on_ray.metadata["datasets"]] == [list(d) for d in local.metadata["datasets"]]
    assert set(on_ray.metadata["architecture"]) == {"bert"}
    # the broken model: one line naming it, recorded in the store, as the local engine records it
    name = str(broken.resolve())
    assert list(on_ray.failed) == [name]
    reason = on_ray.failed[name]
    assert reason.startswith(f"{name}: ") and "model.safetensors" in reason and "\n" not in reason
    assert reason == local.failed[name]
    with Store(tmp_path / "ray.duckdb") as db:
        assert db.reads.failures()["model"].tolist() == [name]
    # a second run skips every stored model and does not read the broken one again
    again = modelvec.embed(
        tiny_bert, models, representation=PARAMS, engine="ray", workers=2, store=tmp_path / "ray.duckdb"
    )
    assert sorted(again.skipped) == good and not again.embedded
    assert again.failed == {name: reason}
    assert np.array_equal(again.vectors, on_ray.vectors)


def test_a_worker_that_dies_fails_only_its_model_and_is_replaced(cluster, tiny_bert, finetunes, tmp_path):
    class ExitsTheWorker(Task):  # local to the test, so Ray pickles it by value for the worker
        def open(self, hub_settings, representation=None):
            os._exit(3)  # the worker process ends in the middle of the task

    spec, tasks = tasks_for(tiny_bert, finetunes[:3], tmp_path)
    killer = ExitsTheWorker("killer", "x", "killer", path="/nowhere")
    # one actor, sent two tasks at once: the killer, and a model queued behind it on the same actor
    outcomes = list(RayEngine(workers=1).run(spec, PARAMS, [killer, *tasks], HubSettings()))
    assert sorted(o.task.name for o in outcomes) == sorted([t.name for t in tasks] + ["killer"])
    by_name = {o.task.name: o for o in outcomes}
    died = by_name.pop("killer")
    assert died.vector is None and died.kind is not Kind.CONTENT
    assert died.error.startswith("killer: the Ray worker died: ") and "\n" not in died.error
    expected = reference(tiny_bert, finetunes[:3])
    for name, outcome in by_name.items():  # the model queued behind it went to the replacement actor
        assert outcome.error is None, outcome.error
        assert np.allclose(outcome.vector, expected[name], atol=1e-6)
    assert wait_for_cpus(2) == 2  # no actor is left holding a CPU


def test_tasks_are_pulled_lazily_and_an_interrupted_run_lets_its_actors_go(cluster, tiny_bert, finetunes, tmp_path):
    spec, tasks = tasks_for(tiny_bert, finetunes, tmp_path)
    many = [Task(f"{t.name}#{i}", t.version, t.source, path=t.path) for i in range(5) for t in tasks]  # 20 tasks
    pulled = 0

    def stream():
        nonlocal pulled
        for task in many:
            pulled += 1
            yield task

    run = RayEngine(workers=1).run(spec, PARAMS, stream(), HubSettings())
    assert pulled == 0  # nothing happens until the driver asks for outcomes
    seen = []
    for outcome in run:
        seen.append(outcome)
        assert outcome.error is None
        assert pulled - len(seen) <= IN_FLIGHT - 1  # at most IN_FLIGHT per actor: this one and one more
        if len(seen) == 3:
            break
    run.close()  # what an interrupt does to the driver's loop
    assert pulled <= 3 + IN_FLIGHT
    assert wait_for_cpus(2) == 2  # the actor was killed, not left running


def test_more_workers_than_the_cluster_has_cpus_still_finishes(cluster, tiny_bert, finetunes, tmp_path):
    """Actors that never get a CPU are never sent tasks, so the run does not wait on them."""
    spec, tasks = tasks_for(tiny_bert, finetunes, tmp_path)
    done: list = []
    worker = threading.Thread(
        target=lambda: done.extend(RayEngine(workers=4).run(spec, PARAMS, tasks, HubSettings())), daemon=True
    )
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the run waited on actors the 2-CPU cluster cannot place"
    assert sorted(o.task.name for o in done) == sorted(t.name for t in tasks)
    assert all(o.error is None for o in done)
    assert wait_for_cpus(2) == 2


def test_a_base_the_workers_cannot_open_stops_the_run_with_one_error(cluster, tiny_bert, finetunes, tmp_path):
    # the driver can hash a corrupt base (it only hashes); the workers cannot read it
    base = corrupt_copy(tiny_bert, tmp_path / "base")
    store = tmp_path / "s.duckdb"
    with pytest.raises(CheckpointError) as err:
        modelvec.embed(base, finetunes, representation=PARAMS, engine="ray", workers=2, store=store)
    message = str(err.value)
    assert err.value.model == str(base.resolve())
    assert message.startswith(f"{base.resolve()}: cannot be opened on a Ray worker: ") and "\n" not in message
    assert "model.safetensors" in message
    with Store(store) as db:
        assert db.reads.failures().empty and db.reads.metadata().empty  # not one failure per model
    # a base path that exists nowhere (here: not on the workers' filesystem)
    missing = str(tmp_path / "not-on-this-node")
    _, tasks = tasks_for(tiny_bert, finetunes[:2], tmp_path)
    with pytest.raises(ModelvecError) as gone:
        list(RayEngine(workers=2).run(BaseSpec(missing, "x", path=missing), PARAMS, tasks, HubSettings()))
    assert str(gone.value).startswith(f"{missing}: cannot be opened on a Ray worker: no such file or folder")
    assert wait_for_cpus(2) == 2


def test_hub_models_are_fetched_by_the_workers_and_released(cluster, tiny_bert, tmp_path):
    from modelvec.testing.localhub import LocalHub

    hub = LocalHub(tmp_path / "hub")
    files = {p.name: p for p in tiny_bert.iterdir() if p.is_file()}
    hub.publish("org/tiny-base", files)
    made = {}
    for i in range(2):
        made[f"someone/ft-{i}"] = planted_finetune(tiny_bert, tmp_path / f"src{i}", seed=30 + i, card_datasets=["imdb"])
        hub.publish(f"someone/ft-{i}", {p.name: p for p in made[f"someone/ft-{i}"].iterdir()})
    cache = tmp_path / "hf-cache"
    with hub.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(cache), token=False, backoff=0.01)
        result = modelvec.embed(
            "org/tiny-base",
            list(made),
            representation=PARAMS,
            engine="ray",
            workers=2,
            store=tmp_path / "s.duckdb",
            hub_settings=hub_settings,
            keep_weights=False,
        )
    assert sorted(result.embedded) == sorted(made) and not result.failed
    expected = {name: reference(tiny_bert, [folder])[str(folder.resolve())] for name, folder in made.items()}
    for row, name in enumerate(result.metadata["model"]):
        assert np.allclose(result.vectors[row], expected[name], atol=1e-6), name
    assert [list(d) for d in result.metadata["datasets"]] == [["imdb"], ["imdb"]]  # read from the fetched cards
    for name in made:  # --no-keep-weights: the workers deleted the fine-tunes' files, the base stays
        repo = cache / f"models--{name.replace('/', '--')}"
        assert not list(repo.glob("snapshots/*/model.safetensors")), name
        assert not list(repo.glob(".modelvec/partial/*/model.safetensors")), name  # the default's partial download
    assert list(cache.glob("models--org--tiny-base/.modelvec/partial/*/model.safetensors"))  # its rows, read once


def test_cli_embed_with_the_ray_engine(cluster, tiny_bert, finetunes, tmp_path):
    runner = CliRunner()
    store = tmp_path / "cli.duckdb"
    broken = tmp_path / "empty"
    broken.mkdir()
    args = [
        "embed",
        "--engine",
        "ray",
        "--workers",
        "2",
        "--base",
        str(tiny_bert),
        *map(str, finetunes[:3]),
        str(broken),
        "--rank",
        "4",
        "--store",
        str(store),
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 1, first.output  # some models failed
    assert "embedded 3, skipped 0 (already stored), failed 1" in first.output
    assert "no weights found" in first.output
    again = runner.invoke(app, args)
    assert again.exit_code == 1 and "embedded 0, skipped 3 (already stored), failed 1" in again.output
    assert_store_holds_reference(store, tiny_bert, finetunes[:3])
    assert args[3:5] == ["--workers", "2"] and runner.invoke(app, args[:4] + ["0"] + args[5:]).exit_code != 0


def assert_store_holds_reference(store, base, models) -> None:
    """The store holds exactly ``models``, each with the vector the local engine computes."""
    with Store(store) as db:
        vectors, meta = db.reads.load(representation=PARAMS)
    expected = reference(base, models)
    assert sorted(meta["model"]) == sorted(expected)
    for row, name in enumerate(meta["model"]):
        assert np.allclose(vectors[row], expected[name], atol=1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_on_an_existing_cluster_started_with_ray_start(two_nodes, tiny_bert, finetunes, tmp_path):
    """A cluster of two nodes started by `ray start` in subprocesses, then `modelvec embed --engine ray --address`
    as another."""
    address, env = two_nodes
    store = tmp_path / "cluster.duckdb"
    run = subprocess.run(
        [
            str(BIN / "modelvec"),
            "embed",
            "--engine",
            "ray",
            "--address",
            address,
            "--base",
            str(tiny_bert),
            *map(str, finetunes[:3]),
            "--rank",
            "4",
            "--store",
            str(store),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "embedded 3, skipped 0 (already stored), failed 0" in run.stdout
    assert "Connecting to existing Ray cluster" in run.stderr  # not a local instance of its own
    assert_store_holds_reference(store, tiny_bert, finetunes[:3])


# --- the nearest lists' pass on a cluster of two nodes started by `ray start` ---------------------------


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", "--block", "--num-cpus", "1", "--disable-usage-stats", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log = []
    for line in proc.stdout:  # --block: it prints this, then stays until it is told to stop
        log.append(line)
        if "Ray runtime started" in line:
            return proc
    pytest.fail("ray start did not start:\n" + "".join(log[-20:]))


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes as it exits
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    proc.stdout.close()


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a second node, one CPU each, on this machine: the address and the environment to reach them."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="mvrl-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    head = _start(["--head", "--port", str(port), "--include-dashboard=false", "--temp-dir", temp_dir], env)
    try:
        node = _start(["--address", f"127.0.0.1:{port}"], env)
        try:
            yield f"127.0.0.1:{port}", env
        finally:
            _stop(node)
    finally:
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """300 vectors of 40 floats in 6 datasets, a fifth unlabelled, a third marked adapters (ranked by mutual
    proximity), several authors."""
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((6, 40))
    path = tmp_path_factory.mktemp("ray-lists") / "s.duckdb"
    rows = []
    for i in range(300):
        d = int(rng.integers(6))
        x = (centres[d] + 1.5 * rng.standard_normal(40)).astype(np.float32)
        labels = [f"ds{d}"] if rng.random() > 0.2 else []
        rows.append(
            VectorRow(
                f"m{i:04d}",
                f"h{i}",
                "base",
                "bh",
                PARAMS,
                "bert",
                x,
                labels,
                "card",
                0.1,
                author=f"a{i % 7}",
                adapter=i % 3 == 0,
            )
        )
    with Store(path) as db:
        db.writes.put_many(rows)
    return path


def cluster_json(store: Path, out: Path, env: dict[str, str], *engine: str) -> dict:
    """``modelvec cluster`` on the lists (each held block 8,000 floats: 50 vectors, six blocks of tasks) as JSON,
    its files' paths left out."""
    run = subprocess.run(
        [
            str(BIN / "modelvec"),
            "cluster",
            "base",
            "--store",
            str(store),
            "--out",
            str(out),
            "--json",
            "--neighbours",
            "lists",
            "--rank",
            "4",
            *engine,
        ],
        env=dict(env, MODELVEC_BLOCK_MB=str(8000 * 4 / 2**20)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    answer = json.loads(run.stdout)
    answer.pop("files")
    return answer


def test_cluster_on_two_ray_nodes_answers_as_the_pass_run_here(two_nodes, store, tmp_path):
    address, env = two_nodes
    here = cluster_json(store, tmp_path / "here", env)
    shutil.rmtree(f"{store}.products")  # nothing kept: the cluster's tasks compute every list
    there = cluster_json(store, tmp_path / "there", env, "--engine", "ray", "--address", address)
    assert there == here
    assert here["scaling"] == "mutual-proximity" and here["n_scored"] > 200


KILLED_ONCE = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from modelvec import Store
    from modelvec.store.derived import neighbours
    from modelvec.run.ray_blocks import ray_runner
    from modelvec.analyse.graph_scores import depths_for
    from modelvec.analyse.inputs import label_sets

    store, marker, address = sys.argv[1:4]

    def killed_once(task):
        # the first time block 2 runs, its worker dies in the middle of it (after the block's first products)
        if task.block == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return neighbours.run_task(task)

    with Store(store, read_only=True) as db:
        selection, meta = db.reads.select()
        sets = label_sets([list(d) for d in meta["datasets"]], len(meta))
        eligible = np.array([bool(s) for s in sets])
        wanted = [neighbours.Wanted("scored", depths_for(sets, eligible, votes=5), eligible)]
        common = dict(block_floats=50 * selection.dim)
        here = neighbours.nearest_lists(db.vector_file, selection, wanted, **common).lists["scored"]
        found = neighbours.nearest_lists(
            db.vector_file, selection, wanted, runner=ray_runner(address, fn=killed_once), **common
        )
    there, damaged = found.lists["scored"], found.damaged
    same = all(np.array_equal(getattr(here, p), getattr(there, p)) for p in ("indptr", "index", "value", "distance"))
    print(json.dumps({"same": same, "killed": os.path.exists(marker), "damaged": damaged}))
    """
)


def test_a_worker_killed_in_its_block_has_the_block_run_again(two_nodes, store, tmp_path):
    address, env = two_nodes
    marker = tmp_path / "killed"
    run = subprocess.run(
        [sys.executable, "-c", KILLED_ONCE, str(store), str(marker), address],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"same": True, "killed": True, "damaged": {}}

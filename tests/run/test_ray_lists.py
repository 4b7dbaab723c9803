"""The nearest lists' pass on a Ray cluster of two nodes started by ``ray start`` (two processes on this machine):
the same lists, the same scores and map as the pass run here, and a worker killed in the middle of its block has the
block run again, nothing lost. Nothing of modelvec's or Ray's is mocked."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

from modelvec import Representation, Store
from modelvec.store import VectorRow

BIN = Path(sys.executable).parent
PARAMS = Representation(rank=4)


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
    from test_ray import free_port

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
        db.put_many(rows)
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
    from modelvec.store import neighbours
    from modelvec.run.ray_blocks import ray_runner
    from modelvec.analyse.graph import depths_for
    from modelvec.analyse.inputs import label_sets

    store, marker, address = sys.argv[1:4]

    def killed_once(task):
        # the first time block 2 runs, its worker dies in the middle of it (after the block's first products)
        if task.block == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return neighbours.run_task(task)

    with Store(store, read_only=True) as db:
        selection, meta = db.select()
        sets = label_sets([list(d) for d in meta["datasets"]], len(meta))
        eligible = np.array([bool(s) for s in sets])
        wanted = [neighbours.Wanted("scored", depths_for(sets, eligible, votes=5), eligible)]
        common = dict(block_floats=50 * selection.dim)
        here = neighbours.nearest_lists(db.vector_file, selection, wanted, **common)[0]["scored"]
        there, damaged, _ = neighbours.nearest_lists(
            db.vector_file, selection, wanted, runner=ray_runner(address, fn=killed_once), **common
        )
    there = there["scored"]
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

"""The analysis at 1,000 to 10,000 models of an 8B base: seconds and peak memory of each stage and command, and how
they grow.

An 8B-shaped base (Llama-3.1-8B's dimensions) is written as headers over sparse files (its weights are never read:
``cluster`` lays out the per-block heat map from the headers alone), and the vector's dimension is read from the
representation over it (``blocks_of``), never typed in. A store is filled with N made vectors of that dimension: 6
datasets, each a direction plus noise, a third of them low-norm and marked LoRA adapters (so ``--scaling auto``
ranks by mutual proximity, as on a real Hub population), growing 1k -> 2k -> 5k -> 10k in one store.

At each N, each in a fresh process (peak RSS from ``/usr/bin/time``):
- ``modelvec cluster BASE`` with no products kept (the first run: every pairwise product read and computed; where a
  GPU is visible, also with ``--device cpu`` and ``--device cuda`` side by side), then again (the products and the
  map's layout read from beside the store: the run a user repeats), again held to 2 cores with ``taskset`` beside all
  the machine's cores, and again with the map and the per-block scores computed anew (what a store that gained models
  costs);
- ``modelvec neighbors model-00007`` (a stored model) and ``modelvec export --parquet``;
- the stages in one process (seconds and peak RSS of each): the products (kept), the libraries the scores and
  figures import (``cluster`` imports them beside the reading), the coordinates, the scores (every pair's mutual
  proximity, kNN, the author check, the predictions, the clusterers on their sample), the per-block scores, each
  reduction (PCA, UMAP, t-SNE: to choose ``auto``; laid out anew), the PNG and the HTML map.
Then the growth law of each (seconds = a N^b, fitted on log-log) and what 100,000 models would need.

The first run's products are also timed alone (``products, first run``), beside a general float32 ``X @ Y.T`` of up
to 2,000 by 1,000 vectors of the same dimension in the same process, just before and after: the machine's matrix-product
speed, and what a symmetric product of N would take at it (the ratio says how near the products run to it).

Run: ``python bench/bench_scale_analysis.py [--sizes 1000,2000,5000,10000] [--size 100000] [--json FILE]
[--first-only] [--cache DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from hollow import llama_config, llama_tensors, write_hollow

LLAMA_8B = {"layers": 32, "d": 4096, "ff": 14336, "heads": 32, "kv": 8, "hd": 128, "vocab": 128256}
BIN = Path(sys.executable).parent


def sparse_base(folder: Path) -> Path:
    """An 8B-shaped Llama checkpoint's layers (no embeddings: the vector reads none): real safetensors headers over
    sparse files, one shard a layer (:mod:`hollow`)."""
    if (folder / "config.json").exists():
        return folder
    config = llama_config(**LLAMA_8B)
    layers = llama_tensors(config)[1:]  # without the embeddings
    per_layer = sum(2 * a * b for _, (a, b) in layers[: len(layers) // config["num_hidden_layers"]])
    write_hollow(folder, config, layers, per_layer)
    return folder


def fill(store: Path, base: Path, start: int, stop: int, dim: int, size: int | str, *, keep: bool = False) -> dict:
    """Vectors ``start`` .. ``stop`` - 1: 6 datasets as directions plus noise; a third low-norm LoRA adapters.
    ``keep``: as ``embed`` stores them, its products keeper beside (its default threshold): what it computed, when
    and in how many seconds."""
    from modelvec import Representation, Store
    from modelvec.read import Checkpoint
    from modelvec.run.cache_updates import ProductsCacheUpdater
    from modelvec.run.engines import Execution

    params = Representation(size=size)
    with Store(store) as db:
        # as embed records the base it embeds against
        db.versions.record_base(str(base), Checkpoint(base).stamp(), "bh")
        keeper = ProductsCacheUpdater(db, str(base), params, Execution().products_from if keep else 0, "cpu")
        started = time.perf_counter()
        with keeper:
            for rows in _batches(base, start, stop, dim, params):
                db.writes.put_many(rows)
                for _ in rows:
                    keeper.added()
        return {
            "seconds": time.perf_counter() - started,
            "updates": keeper.computed,
            "update_seconds": keeper.seconds,
            "line": keeper.line,
        }


def _batches(base: Path, start: int, stop: int, dim: int, params: object) -> Iterator[list]:
    from modelvec.store import VectorRow

    centres = np.random.default_rng(0).standard_normal((6, dim)).astype(np.float32)
    for lo in range(start, stop, 200):
        rows = []
        for i in range(lo, min(stop, lo + 200)):
            rng = np.random.default_rng(1000 + i)
            v = centres[i % 6] + 3.0 * rng.standard_normal(dim).astype(np.float32)
            adapter = i % 3 == 2
            if adapter:
                v *= 0.05
            rows.append(
                VectorRow(
                    f"model-{i:05d}",
                    f"h{i}",
                    str(base),
                    "bh",
                    params,
                    "llama",
                    v,
                    [f"ds{i % 6}"],
                    "made",
                    0.1,
                    author=f"org{i % 40}",
                    adapter=adapter,
                )
            )
        yield rows


def timed(command: list[str], env: dict[str, str], fresh_map: Path | None = None) -> dict:
    """Wall seconds and peak RSS (GNU time's %M) of one command in a fresh process (``fresh_map``: the kept maps and
    per-block scores in that folder removed first, so both are computed again, as for a store that gained models)."""
    for kept in fresh_map.glob("*.kept") if fresh_map is not None else ():
        if ".map-" in kept.name or ".blocks-" in kept.name:  # what a store that gained models computes again
            kept.unlink()
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True, env=env)
    last = done.stderr.strip().splitlines()[-1].split()
    out = {"seconds": float(last[0]), "peak_rss_gib": int(last[1]) / 2**20, "status": done.returncode}
    if done.returncode not in (0, 1):
        out["error"] = (done.stderr.strip().splitlines() or ["?"])[-2][-300:]
    return out


STAGES = r"""
import json, sys, threading, time
def rss():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
peak = [0]; stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], rss()); time.sleep(0.01)
threading.Thread(target=sample, daemon=True).start()
store, base, size, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
size = int(size) if size.isdigit() else size
from modelvec import Representation, Store
from modelvec.analyse.reduction import reduce
from modelvec.analyse.clustering import clustering_scores
from modelvec.analyse.scores import Scoring, knn_dataset_score, predict_datasets
from modelvec.plots.maps import plot_html, plot_png
from modelvec.store import Population
from modelvec.store.formats.cachefile import read_cache_file
from modelvec.store.derived.cache import CacheFolder
stages = {}
def stage(name, fn):
    peak[0] = rss(); t = time.perf_counter(); value = fn()
    stages[name] = {"seconds": time.perf_counter() - t, "peak_rss_gib": max(peak[0], rss()) / 2**30}
    return value
rep = Representation(size=size)
with Store(store, read_only=True) as db:
    pop = stage("population (the base's version, the copies)", lambda: Population(db, base, rep))
    kept = CacheFolder(db.path).products_path(pop.cache_key())
    stage("verification: every kept row's checksum", lambda: read_cache_file(kept))
    products, meta = stage("products (kept beside the store, verified)", pop.products)
    scoring, _ = pop.resolve(Scoring(), list(meta["adapter"]))
    from modelvec.analyse.parallel import one_blas_thread
    one_blas_thread().__enter__()  # as cluster runs what follows the products
    geo = stage("geometry (spreads kept beside the store, verified)", lambda: pop.geometry(products, scoring))
labels = [list(d) for d in meta["datasets"]]
scaling = scoring.scaling
import importlib
from modelvec.report.cluster_parts import AHEAD
stage("imports (cluster takes them beside the reading)", lambda: [importlib.import_module(m) for m in AHEAD])
coords = stage("coordinates (64 principal above 1,024 models; computed once, for the clusterers and the map)", geo.coordinates)
t_scores = time.perf_counter()
stage("scores: every pair's mutual proximity", lambda: geo.rank_all(scaling))
stage("scores: kNN", lambda: knn_dataset_score(geo, labels, scaling=scaling))
stage("scores: kNN, other authors", lambda: knn_dataset_score(geo, labels, scaling=scaling, exclude_same=list(meta["author"])))
stage("scores: predictions", lambda: predict_datasets(geo, labels, k=5, scaling=scaling))
stage("scores: clusterers (a sample of 2,000)", lambda: clustering_scores(geo, labels))
stages["scores (all of the above)"] = {"seconds": time.perf_counter() - t_scores, "peak_rss_gib": max(v["peak_rss_gib"] for k, v in stages.items() if k.startswith("scores:"))}
stages["scores, every pair's mutual proximity kept (cluster again)"] = {"seconds": sum(v["seconds"] for k, v in stages.items() if k.startswith("scores:") and "every pair" not in k), "peak_rss_gib": stages["scores (all of the above)"]["peak_rss_gib"]}
from modelvec.report.cluster_parts import block_sample
from modelvec.represent import blocks_of
from modelvec.analyse.scores import block_knn_scores
def per_block():
    with Store(store, read_only=True) as db:
        X, rows = block_sample(Population(db, base, rep), products.positions, meta)
    bounds = [(b.start, b.stop) for b in blocks_of(base, rep) if X[:, b.start : b.stop].any()]
    return block_knn_scores(X, [labels[i] for i in rows], bounds, scaling=scaling)
stage("per-block scores (500 models; kept: 0 s)", per_block)
from modelvec.analyse.reduction import UMAP_KNOWN_FROM, UMAP_NEIGHBOURS
known = lambda m: geo.neighbours(UMAP_NEIGHBOURS + 1) if m == "umap" and len(meta) >= UMAP_KNOWN_FROM else None
maps = {m: stage(f"reduce: {m}", lambda m=m: reduce(coords, m, metric="cosine", neighbours=known(m))) for m in sys.argv[5].split(",")}
first = next(iter(maps.values()))
stage("PNG map", lambda: plot_png(first, meta, out + "/map.png", reducer="pca", title="t"))
stage("HTML map", lambda: plot_html(first, meta, out + "/map.html", reducer="pca", title="t"))
stop.set()
print(json.dumps(stages))
"""


FLOOR = r"""
import json, sys, time
import numpy as np
from modelvec import Representation, Store
from modelvec.store import Population
store, base, size, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
size = int(size) if size.isdigit() else size
with Store(store, read_only=True) as db:
    pop = Population(db, base, Representation(size=size))
    dim = pop.selection.dim
    m = min(n, 2000)
    X = np.random.default_rng(0).standard_normal((m, dim), dtype=np.float32)
    Y = np.random.default_rng(1).standard_normal((m // 2, dim), dtype=np.float32)
    def floor():  # a general product X Y^T (X X^T would be numpy's syrk: half the multiply-adds, so twice the rate)
        t = time.perf_counter(); X @ Y.T; return 2 * m * (m // 2) * dim / (time.perf_counter() - t)
    before = max(floor(), floor())
    t = time.perf_counter(); pop.products(device="cpu"); seconds = time.perf_counter() - t
    after = max(floor(), floor())
rate = max(before, after)
print(json.dumps({"seconds": seconds, "floor_gflops": rate / 1e9, "floor_gflops_before": before / 1e9,
                  "floor_gflops_after": after / 1e9, "symmetric_floor_s": n * n * dim / rate,
                  "general_floor_s": 2 * n * n * dim / rate}))
"""


def products_floor(n: int, store: Path, base: Path, size: int | str, env: dict[str, str]) -> dict:
    """The first run's products alone (every pair computed; peak RSS of the process) beside the machine's float32
    matrix-product speed, measured in the same process just before and after (a general ``X @ Y.T`` of up to 2,000
    by 1,000 vectors of the same dimension, best of two; not ``X @ X.T``, which numpy runs as a symmetric product at
    half the work): what a symmetric product of ``n`` (n^2 d flops) would take at that speed."""
    shutil.rmtree(Path(f"{store}.products"), ignore_errors=True)
    command = [sys.executable, "-c", FLOOR, str(store), str(base), str(size), str(n)]
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"seconds": float("nan"), "error": done.stderr[-500:]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["peak_rss_gib"] = int(done.stderr.strip().splitlines()[-1].split()[1]) / 2**20
    row["ratio_to_symmetric_floor"] = row["seconds"] / row["symmetric_floor_s"]
    shutil.rmtree(Path(f"{store}.products"), ignore_errors=True)
    return row


CRAWL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import bench_scale_analysis as bench
size = int(sys.argv[5]) if sys.argv[5].isdigit() else sys.argv[5]
print(json.dumps(bench.fill(Path(sys.argv[2]), Path(sys.argv[3]), 0, int(sys.argv[4]), int(sys.argv[6]), size, keep=True)))
"""


def after_a_crawl(n: int, base: Path, dim: int, size: int | str, cache: Path, env: dict[str, str]) -> dict:
    """A store filled from empty to ``n`` as ``embed`` stores vectors, with its products keeper beside it (its
    updates' rows and seconds, the filling process's peak RSS), then the first ``cluster`` of that store."""
    store = cache / "crawl.duckdb"
    for stale in cache.glob("crawl.duckdb*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    command = [sys.executable, "-c", CRAWL, str(Path(__file__).parent), str(store), str(base), str(n), str(size)]
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command, str(dim)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": done.stderr[-500:]}
    row = {"crawl": json.loads(done.stdout.strip().splitlines()[-1])}
    row["crawl"]["peak_rss_gib"] = int(done.stderr.strip().splitlines()[-1].split()[1]) / 2**20
    with tempfile.TemporaryDirectory() as out:
        option = [] if size == "none" else ["--size", str(size)]
        cluster = [str(BIN / "modelvec"), "cluster", str(base), "--store", str(store), "--out", out, *option]
        row["cluster first run after it"] = timed(cluster, env)
    for stale in cache.glob("crawl.duckdb*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    return row


def one_size(
    n: int, store: Path, base: Path, size: int | str, reducers: str, env: dict[str, str], first_only: bool = False
) -> dict:
    """Every command and stage at ``n`` stored vectors (``first_only``: the products and the first ``cluster``)."""
    products = Path(f"{store}.products")
    row: dict = {"n": n, "products, first run": products_floor(n, store, base, size, env)}
    shutil.rmtree(products, ignore_errors=True)
    with tempfile.TemporaryDirectory() as out:
        option = [] if size == "none" else ["--size", str(size)]
        cluster = [str(BIN / "modelvec"), "cluster", str(base), "--store", str(store), "--out", out, *option]
        row["cluster first run"] = timed(cluster, env)
        if gpu_visible():  # the first run on each device, side by side (auto took one of them above)
            for device in ("cpu", "cuda"):
                shutil.rmtree(products, ignore_errors=True)
                row[f"cluster first run, --device {device}"] = timed([*cluster, "--device", device], env)
        if first_only:
            return row
        row["cluster again"] = timed(cluster, env)
        if len(os.sched_getaffinity(0)) > 2:  # the same run held to 2 of the cores, side by side
            row["cluster again, 2 cores"] = timed(["taskset", "-c", "0,1", *cluster], env)
        row["cluster again, all cores"] = timed(cluster, env)
        row["cluster again, map and per-block anew"] = timed(cluster, env, fresh_map=Path(f"{store}.products"))
        row["neighbors"] = timed(
            [str(BIN / "modelvec"), "neighbors", "model-00007", "--store", str(store), *option], env
        )
        row["export"] = timed(
            [str(BIN / "modelvec"), "export", "--parquet", f"{out}/all.parquet", "--store", str(store)], env
        )
        done = subprocess.run(
            [sys.executable, "-c", STAGES, str(store), str(base), str(size), out, reducers],
            capture_output=True,
            text=True,
            env=env,
        )
        row["stages"] = (
            json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-500:]}
        )
    return row


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU here (then the first ``cluster`` is also run on each device)."""
    import torch

    return torch.cuda.is_available()


def growth(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Seconds = a N^b per command and stage, fitted on log-log, with what 100,000 models would take."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for name, value in row.items():
            if isinstance(value, dict) and "seconds" in value:
                series.setdefault(name, []).append((row["n"], value["seconds"]))
        for name, value in row.get("stages", {}).items():
            if isinstance(value, dict):
                series.setdefault(f"stage: {name}", []).append((row["n"], value["seconds"]))
    laws = {}
    for name, points in series.items():
        if len(points) >= 2 and all(t > 0 for _, t in points):
            x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
            b, a = np.polyfit(x, y, 1)
            laws[name] = {"exponent": float(b), "seconds_at_100k": float(np.exp(a) * 100_000**b)}
    return laws


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,2000,5000,10000")
    parser.add_argument("--size", default="100000", help="the representation's size (floats per vector), or none")
    parser.add_argument("--reducers", default="pca,umap,tsne", help="the reductions timed as stages")
    parser.add_argument("--cache", type=Path, default=Path(".cache/bench-scale"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--first-only", action="store_true", help="only the products and the first cluster")
    parser.add_argument(
        "--crawl", action="store_true", help="also a store filled as embed fills it, its products kept as they come"
    )
    args = parser.parse_args(argv)
    from modelvec import Representation
    from modelvec.represent import blocks_of

    size: int | str = int(args.size) if args.size.isdigit() else args.size
    base = sparse_base(args.cache / "llama-8b-headers")
    dim = blocks_of(str(base), Representation(size=size))[-1].stop
    today = blocks_of(str(base), Representation(size="none"))[-1].stop
    print(f"8B-shaped base: {dim:,} floats a vector with size {size} ({today:,} without a limit)", flush=True)
    store = args.cache / "analysis.duckdb"
    for stale in args.cache.glob("analysis.duckdb*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    rows, have = [], 0
    for n in (int(x) for x in args.sizes.split(",")):
        start = time.perf_counter()
        fill(store, base, have, n, dim, size)
        have = n
        print(
            f"\n== {n:,} models ({dim:,} floats each; store filled in {time.perf_counter() - start:.0f} s)", flush=True
        )
        row = one_size(n, store, base, size, args.reducers, env, args.first_only)
        if args.crawl:
            row.update(after_a_crawl(n, base, dim, size, args.cache, env))
            crawl = row.get("crawl", {})
            rows_each, seconds_each = crawl.get("updates", []), crawl.get("update_seconds", [])
            print(f"  a crawl's keeper: {crawl.get('line')}; updates (rows each): {rows_each}", flush=True)
            if seconds_each:
                print(f"  the run's end waited {seconds_each[-1]:.1f} s for the last update", flush=True)
        rows.append({"dim": dim, **row})
        for name, value in row.items():
            if isinstance(value, dict) and "peak_rss_gib" in value:
                print(f"  {name:26} {value['seconds']:8.1f} s  peak RSS {value['peak_rss_gib']:.2f} GiB", flush=True)
        first = row["products, first run"]
        if "floor_gflops" in first:
            print(
                f"  float32 product here {first['floor_gflops']:.0f} GFLOP/s (before {first['floor_gflops_before']:.0f}"
                f", after {first['floor_gflops_after']:.0f}): a symmetric product of {n:,} at that speed "
                f"{first['symmetric_floor_s']:.1f} s, a general one {first['general_floor_s']:.1f} s; the products "
                f"took {first['ratio_to_symmetric_floor']:.2f}x the symmetric one",
                flush=True,
            )
        for name, value in row.get("stages", {}).items():
            if isinstance(value, dict):
                print(f"  stage {name:40} {value['seconds']:8.1f} s  peak RSS {value['peak_rss_gib']:.2f} GiB")
    laws = growth(rows)
    print("\ngrowth (seconds = a N^b):")
    for name, law in laws.items():
        print(f"  {name:48} b = {law['exponent']:.2f}; at 100,000 models: {law['seconds_at_100k']:,.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "growth": laws}, indent=1))
    return rows


if __name__ == "__main__":
    main()

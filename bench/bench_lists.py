"""Each model's nearest lists at 1,000 to 100,000 models (``cluster --neighbours lists``): seconds and peak memory of
each command, how they grow (seconds = a N^b), and how the scores read from the lists compare with exact ones.

The population is :mod:`made_hub`'s (Zipf-sized datasets of about 20 models on average, 40 tasks, 8 recipes,
isotropic noise set so that the exact kNN same-dataset score is about 0.86 at the largest size; a third marked LoRA
adapters, so that ``--scaling auto`` ranks by mutual proximity; a fifth unlabelled), vectors of 99,998 floats (the 8B
default's size), in one store grown to each size in turn: the first N models of the largest population (a random
sample of it, each size's datasets in their share).

At each N, each command in a fresh process (``/usr/bin/time``: wall seconds, peak RSS):
- ``cluster --neighbours lists``, nothing kept beside the store (the first run), then again (everything kept);
- up to 16,384 models, ``cluster --neighbours pairs`` with nothing kept (every pair's products: the path below that
  size), side by side, and whether its answer is the lists' (the kNN scores, by distance and by mutual proximity);
- ``neighbors`` of a stored model (its lists kept);
- at the first size from 10,000 on: 1,000 more models stored, then ``cluster`` (the lists brought up to date: the
  rows computed, against a first run's);
- the exact kNN same-dataset score (ranked as `cluster` ranks: mutual proximity here) of 200 sampled labelled
  models, from one pass of their products with every stored vector, against the lists' score for the same models.

Run: ``python bench/bench_lists.py [--sizes 1000,10000,30000,100000] [--store DIR] [--json FILE] [--spare N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from made_hub import fill, noise_for, truth

BIN = Path(sys.executable).parent
BASE = "made-base"
LISTS = ("--neighbours", "lists")  # below 16,384 models ``auto`` reads every pair's products


def timed(command: list[str], env: dict[str, str]) -> dict:
    """Wall seconds and peak RSS (GNU time's %M) of one command in a fresh process, and its JSON answer."""
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True, env=env)
    last = done.stderr.strip().splitlines()[-1].split()
    out = {"seconds": float(last[0]), "peak_rss_gib": int(last[1]) / 2**20, "status": done.returncode}
    if done.returncode not in (0, 1):
        out["error"] = done.stderr.strip().splitlines()[-2][-300:] if len(done.stderr.splitlines()) > 1 else "?"
    else:
        try:
            out["answer"] = json.loads(done.stdout)
        except ValueError:
            pass
    return out


def cluster(store: Path, out: Path, env: dict[str, str], *extra: str) -> dict:
    return timed(
        [str(BIN / "modelvec"), "cluster", BASE, "--store", str(store), "--out", str(out), "--json", *extra], env
    )


def forget(store: Path) -> None:
    """Nothing kept beside the store: the next cluster is a first run."""
    shutil.rmtree(f"{store}.products", ignore_errors=True)


def exact_sample(store: Path, rows: int = 200, seed: int = 0) -> dict:
    """The exact kNN same-dataset score of ``rows`` sampled labelled models as ``cluster`` scores them (its default
    ranking: mutual proximity here, each model's exact spread kept with the lists), from their products with every
    stored vector (one pass), against the score the kept lists give the same models (read, not computed again)."""
    from modelvec import Representation, Store
    from modelvec.analyse.graph_scores import need_of
    from modelvec.analyse.inputs import Scoring, label_sets
    from modelvec.analyse.proximity import scaled
    from modelvec.report.lists import knn_scores
    from modelvec.store import Population
    from modelvec.store.derived.landmarks import landmarks
    from modelvec.store.views.listed import lists_of

    with Store(store, read_only=True) as db:
        pop = Population(db, BASE, Representation())
        meta = pop.meta
        scoring = pop.resolve(Scoring())[0]
        g = lists_of(pop, meta, scoring)
        assert g.computed == 0, "the lists were computed again"
        listed = knn_scores(g, meta.iloc[g.positions].reset_index(drop=True), scoring)[0].per_model
        sets = label_sets([list(d) for d in meta["datasets"]], len(meta))
        labelled = np.array([bool(s) for s in sets])
        need = need_of(sets, labelled)
        rng = np.random.default_rng(seed)
        pick = np.sort(rng.choice(np.flatnonzero(labelled & (need > 0)), rows, replace=False))
        lm = landmarks(db.vector_file, pop.selection, pick)  # every vector's products with the sample: one pass
        D = lm.distances("cosine").T  # rows x n
        if g.stats is not None:
            D = scaled(D, (g.stats[0][pick], g.stats[1][pick]), g.stats)
        exact = []
        for c, i in enumerate(pick):
            d = D[c].copy()
            d[i] = np.inf
            d[~labelled] = np.inf
            order = np.argsort(d, kind="stable")[: need[i]]
            exact.append(float(np.mean([bool(sets[j] & sets[i]) for j in order])))
    mine = listed[pick]
    diff = mine - np.array(exact)
    boot = rng.choice(diff, (1000, len(diff))).mean(axis=1)
    return {
        "rows": rows,
        "scaling": scoring.scaling,
        "exact": float(np.mean(exact)),
        "lists": float(np.mean(mine)),
        "difference": float(diff.mean()),
        "interval": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
    }


def grown(store: Path, made, sigma: float, dim: int, have: int, want: int) -> float:
    """Store models ``have`` .. ``want`` - 1; the seconds it took."""
    return fill(store, BASE, made, sigma, dim, start=have, stop=want)


def growth(sizes: list[int], seconds: list[float]) -> dict:
    """seconds = a N^b fitted on log-log, and what it says at 100,000."""
    if len(sizes) < 2:
        return {}
    b, log_a = np.polyfit(np.log(sizes), np.log(seconds), 1)
    return {"a": float(np.exp(log_a)), "b": float(b), "at_100000": float(np.exp(log_a) * 100000**b)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,30000,100000")
    ap.add_argument("--store", type=Path, default=Path(".cache/bench-lists"))
    ap.add_argument("--dim", type=int, default=99998)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--spare", type=int, default=0, help="made models beyond those stored (bench_search's queries)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.store.mkdir(parents=True, exist_ok=True)
    store = args.store / "made.duckdb"
    made = truth(max(sizes) + 1000 + args.spare)
    sigma = noise_for(type(made)(**{k: v[: max(sizes)] for k, v in made.__dict__.items()}), dim=args.dim)
    env = dict(os.environ)
    results: dict = {"noise": sigma, "sizes": {}}
    have = 0
    for n in sizes:
        row: dict = {"fill_seconds": grown(store, made, sigma, args.dim, have, n)}
        have = n
        forget(store)
        row["first"] = cluster(store, args.store / "out", env, *LISTS)
        row["again"] = cluster(store, args.store / "out", env, *LISTS)
        row["neighbors"] = timed(
            [
                str(BIN / "modelvec"),
                "neighbors",
                f"org{made.author[7]}/model-000007",
                "--store",
                str(store),
                "--json",
                *LISTS,
            ],
            env,
        )
        row["exact_sample"] = exact_sample(store)
        if n <= 16384:
            kept = Path(f"{store}.products")
            shutil.move(kept, f"{kept}.lists")
            row["pairs_first"] = cluster(store, args.store / "out-pairs", env, "--neighbours", "pairs")
            forget(store)
            shutil.move(f"{kept}.lists", kept)
            a, b = row["first"].get("answer", {}), row["pairs_first"].get("answer", {})
            row["pairs_same"] = {
                k: [a.get(k), b.get(k)] for k in ("knn_score", "knn_score_other_authors", "loo_accuracy")
            }
        if n >= 10000 and "added" not in results:
            grown(store, made, sigma, args.dim, n, n + 1000)
            again = cluster(store, args.store / "out", env, *LISTS)
            results["added"] = {"from": n, "to": n + 1000, "cluster": again}
            if n != sizes[-1]:
                forget(store)  # the next size starts with nothing kept
            have = n + 1000
        for part in row.values():
            if isinstance(part, dict):
                part.pop("answer", None)
        results["sizes"][n] = row
        print(json.dumps({n: row}), flush=True)
    done = [n for n in sizes if n in results["sizes"]]
    for stage in ("first", "again", "neighbors"):
        results[f"growth_{stage}"] = growth(done, [results["sizes"][n][stage]["seconds"] for n in done])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps({k: v for k, v in results.items() if k != "sizes"}, indent=1))


if __name__ == "__main__":
    main()

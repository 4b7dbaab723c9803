"""``neighbors`` of a model that is not stored, where the population's nearest lists are kept: the walk of the kept
lists (:func:`modelvec.report.nearest_lists.searched_of`) against every stored vector compared, on the made Hub-like
population of :mod:`made_hub` (the store :mod:`bench_lists` grows, its lists kept by its last ``cluster``).

The queries are the made population's models after those stored (``--queries`` of them: their datasets are the
stored ones', none of their vectors stored), ranked as ``neighbors`` ranks them (mutual proximity where the
population mixes adapters and full fine-tunes, as it does). For each query: the walk's 15 nearest against the exact
15 (every stored vector compared, in one pass for all the queries), the vectors it read, its seconds. The width is
chosen on the first half of the queries (the smallest whose mean recall@15 reaches 0.95) and reported on the second,
with a bootstrap interval.

Run: ``python bench/bench_search.py --store .cache/bench-lists/made.duckdb --size 30000 [--spare 0] [--queries 200]``
(``--size`` and ``--spare``: the store's ``bench_lists.py`` run's largest size and spare models).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from made_hub import noise_for, truth, vectors

BASE = "made-base"
WIDTHS = (16, 32, 64, 128)


def exact_distances(pop, Q: np.ndarray, metric: str, block: int = 2048) -> np.ndarray:
    """Every query's plain distance to every stored vector (queries x n), from one pass over the vector file."""
    from modelvec.analyse.geometry import query_distances

    n = len(pop.meta)
    dots, squares = np.empty((len(Q), n)), np.empty(n)
    for a in range(0, n, block):
        rows = pop.rows(np.arange(a, min(n, a + block))).astype(np.float64)
        dots[:, a : a + len(rows)] = Q @ rows.T
        squares[a : a + len(rows)] = np.einsum("ij,ij->i", rows, rows)
    own = np.einsum("ij,ij->i", Q, Q)
    return np.stack([query_distances(dots[i], squares, own[i], metric) for i in range(len(Q))])


def ranked(D: np.ndarray, positions: np.ndarray, stats) -> np.ndarray:
    """A query's stored models in the order ``neighbors`` gives them (as its scan ranks them)."""
    from modelvec.analyse.proximity import scaled

    if stats is not None:
        to = D[positions]
        D = scaled(D[None, :], (np.array([to.mean()]), np.array([to.std()])), stats)[0]
    return np.argsort(D, kind="stable")


def interval(x: np.ndarray, seed: int = 0) -> list[float]:
    boot = np.random.default_rng(seed).choice(x, (2000, len(x))).mean(axis=1)
    return [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=Path(".cache/bench-lists/made.duckdb"))
    ap.add_argument("--size", type=int, default=30000, help="bench_lists' largest size (its made population's)")
    ap.add_argument("--spare", type=int, default=0, help="bench_lists' --spare")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dim", type=int, default=99998)
    ap.add_argument("--scaling", default="auto", help="auto (as neighbors ranks), none, mutual-proximity")
    args = ap.parse_args()
    import json as _json

    from modelvec import Representation, Store
    from modelvec.analyse.scores import NEIGHBORS_SCORING
    from modelvec.report.nearest_lists import searched_of
    from modelvec.store import Population
    from modelvec.store.views.listed import kept_lists, landmarks_of

    made = truth(args.size + 1000 + args.spare)
    sigma = noise_for(type(made)(**{k: v[: args.size] for k, v in made.__dict__.items()}), dim=args.dim)
    with Store(args.store, read_only=True) as db:
        pop = Population(db, BASE, Representation())
        stored = len(pop.meta)
        assert stored + args.queries <= len(made.dataset), "too few made models beyond those stored: --spare"
        Q = np.stack(list(vectors(made, sigma, args.dim, stored, stored + args.queries))).astype(np.float64)
        scoring = replace(NEIGHBORS_SCORING, scaling=args.scaling)
        resolved, _ = pop.resolve(scoring, [*pop.meta["adapter"], False])
        lm = landmarks_of(pop, verify=False)
        marks = [pop.selection.hashes[i] for i in lm.positions] if resolved.scaling != "none" else []
        listed = kept_lists(pop, resolved.metric, _json.dumps([resolved.scaling, marks]))
        assert listed is not None, "no lists kept: run cluster --neighbours lists on the store first"
        kept, stats = listed
        stats = stats if resolved.scaling != "none" else None
        started = time.perf_counter()
        D = exact_distances(pop, Q, resolved.metric)
        scan = (time.perf_counter() - started) / len(Q)
        exact = [ranked(D[i], lm.positions, stats)[:15] for i in range(len(Q))]
        rows: dict[int, list] = {w: [] for w in WIDTHS}
        for w in WIDTHS:
            for i in range(len(Q)):
                t0 = time.perf_counter()
                found = searched_of(pop, lm, kept, stats, resolved.metric, Q[i], width=w)
                seconds = time.perf_counter() - t0
                got = len(set(found.order[:15].tolist()) & set(exact[i].tolist())) / 15
                rows[w].append((got, found.computed, seconds))
    half = len(Q) // 2
    chosen = next((w for w in WIDTHS if np.mean([r[0] for r in rows[w][:half]]) >= 0.95), WIDTHS[-1])
    out: dict = {
        "models": stored,
        "queries": len(Q),
        "scaling": resolved.scaling,
        "scan_seconds_a_query_in_one_pass": scan,
        "chosen_on_first_half": chosen,
    }
    for w in WIDTHS:
        part = np.array(rows[w][half:])
        out[f"width {w}"] = {
            "recall@15": float(part[:, 0].mean()),
            "interval": interval(part[:, 0]),
            "selection half recall@15": float(np.mean([r[0] for r in rows[w][:half]])),
            "vectors read": float(part[:, 1].mean()),
            "seconds": float(np.median(part[:, 2])),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""Why the nearest lists are exact: the recall of candidates found on a smaller sketch of each vector, against the
exact nearest, on the made Hub-like population (:mod:`made_hub`) and on the demo zoo's real fine-tunes.

Each vector (99,998 floats) is sketched by a CountSketch into ``d`` floats (one bucket and sign a coordinate, the
same for every vector: inner products unbiased, their error about |a||b|/sqrt(d)); each model's ``C`` nearest on the
sketches are its candidates; recall@15 is the share of its exact 15 nearest (cosine, every pair's products) among
them. A sketch preserves distances to about 1/sqrt(d) of the vectors' norms; where the neighbours differ by less
(isotropic noise at 1/sqrt(dim), as in a population whose datasets are told apart by many small deltas), no sketch
much smaller than the vector finds them, and the exact pass is the only one that does.

Run: ``python bench/bench_sketch_recall.py [--models 2000] [--zoo .cache/demo.duckdb]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from made_hub import TASKS, noise_for, truth, vectors


def recall(X: np.ndarray, sizes=(1024, 4096, 16384), candidates=(15, 64, 256), k: int = 15, seed: int = 5) -> dict:
    """Recall@k of sketch candidates against the exact nearest of the rows of ``X``."""
    U = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-30)
    G = U @ U.T
    np.fill_diagonal(G, -np.inf)
    k = min(k, len(X) - 1)
    exact = np.argsort(-G, axis=1)[:, :k]
    rng = np.random.default_rng(seed)
    out = {}
    for d in sizes:
        if d >= X.shape[1]:
            continue
        h, s = rng.integers(0, d, X.shape[1]), rng.choice([-1.0, 1.0], X.shape[1]).astype(np.float32)
        S = np.asarray(sp.csr_matrix((s, (np.arange(X.shape[1]), h)), shape=(X.shape[1], d)).T @ U.T).T
        S /= np.maximum(np.linalg.norm(S, axis=1, keepdims=True), 1e-30)
        Gs = S @ S.T
        np.fill_diagonal(Gs, -np.inf)
        for c in candidates:
            if c >= len(X):
                continue
            near = np.argpartition(-Gs, c, axis=1)[:, :c]
            out[f"d{d}-C{c}"] = float(np.mean([len(np.intersect1d(exact[i], near[i])) / k for i in range(len(X))]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=99998)
    ap.add_argument("--zoo", type=Path, default=Path(".cache/demo.duckdb"))
    args = ap.parse_args()
    made = truth(args.models)
    sigma = noise_for(made, dim=args.dim)
    X = np.stack(list(vectors(made, sigma, args.dim, 0, args.models)))
    found = {"made": {"models": args.models, "tasks": TASKS, "noise": sigma, "recall@15": recall(X)}}
    if args.zoo.exists():
        from modelvec import Store

        with Store(args.zoo, read_only=True) as db:
            Z = db.reads.load()[0]
        found["demo zoo"] = {"models": len(Z), "recall@15": recall(Z, candidates=(5, 10), k=4)}
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()

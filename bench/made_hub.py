"""A made population shaped like a base's Hub derivatives, for the benchmarks at 1,000 to 100,000 models.

Datasets of Zipf-distributed sizes (a power law fitted so that a dataset has about 20 models on average; the largest
has thousands at 100,000), each under one of 40 tasks (a dataset's direction shares 0.6 of its task's), every model
tuned with one of 8 recipes (a direction shared across datasets: LoRA r8, full fine-tune at a high rate, ...) and
isotropic noise, scaled so that the exact kNN same-dataset score is about ``score`` whatever the size
(:func:`noise_for`: the score simulated from the inner products' distribution, no vectors needed). A share of the
models are LoRA adapters (their vector a tenth as long, so that ``--scaling auto`` ranks by mutual proximity), a
share unlabelled; authors are Zipf-sized too.

Run as a script to fill a store: ``python bench/made_hub.py STORE --models 100000 [--dim 99998]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TASKS, RECIPES = 40, 8
TASK_SHARE, RECIPE = 0.6, 0.5


def zipf_sizes(n: int, rng: np.random.Generator, mean: float = 20.0) -> np.ndarray:
    """Dataset sizes summing to ``n``: a power law P(s) ~ s^-a on 1 .. n/20, ``a`` fitted to the ``mean``."""
    s = np.arange(1, max(2, n // 20) + 1, dtype=np.float64)
    lo, hi = 1.01, 4.0
    for _ in range(60):
        a = (lo + hi) / 2
        p = s**-a
        lo, hi = (a, hi) if (s * p).sum() / p.sum() > mean else (lo, a)
    p = s**-a
    draws = rng.choice(s.astype(np.int64), size=2 * n // int(mean) + 10, p=p / p.sum())
    total = np.cumsum(draws)
    sizes = draws[: int(np.searchsorted(total, n)) + 1].copy()
    sizes[-1] -= int(sizes.sum() - n)
    return sizes[sizes > 0]


@dataclass
class Made:
    """The population's truth: each model's dataset (-1: unlabelled), task, recipe, author and kind."""

    dataset: np.ndarray
    task: np.ndarray
    recipe: np.ndarray
    author: np.ndarray
    adapter: np.ndarray
    labelled: np.ndarray


def truth(n: int, seed: int = 0, *, adapters: float = 0.3, unlabelled: float = 0.2) -> Made:
    """Who is who in a population of ``n``."""
    rng = np.random.default_rng(seed)
    sizes = zipf_sizes(n, rng)
    dataset = np.repeat(np.arange(len(sizes)), sizes)
    task_of = rng.integers(0, TASKS, len(sizes))
    authors = zipf_sizes(n, rng, mean=8.0)
    author = rng.permutation(np.repeat(np.arange(len(authors)), authors))
    order = rng.permutation(n)  # models in no particular order, as a crawl stores them
    dataset = dataset[order]
    return Made(
        dataset=dataset,
        task=task_of[dataset],
        recipe=rng.integers(0, RECIPES, n),
        author=author,
        adapter=rng.random(n) < adapters,
        labelled=rng.random(n) >= unlabelled,
    )


def noise_for(made: Made, score: float = 0.86, dim: int = 99998, rows: int = 300, seed: int = 1) -> float:
    """The noise's norm (the signal's is ~1.1) at which the exact kNN same-dataset score of ``made`` is ``score``,
    from ``rows`` sampled models' inner products with every model simulated from their distribution (signal from
    shared dataset, task and recipe; the noise's share a Gaussian of the variance ``dim`` dimensions give it)."""
    rng = np.random.default_rng(seed)
    n = len(made.dataset)
    counts = np.bincount(made.dataset[made.labelled], minlength=made.dataset.max() + 1)
    pick = rng.choice(np.flatnonzero(made.labelled & (counts[made.dataset] > 1)), min(rows, n), replace=False)
    signal = 1 + RECIPE**2

    def knn(sigma: float) -> float:
        norm = np.sqrt(signal + sigma**2)
        out = []
        for i in pick:
            same = made.dataset == made.dataset[i]
            dot = np.where(same, 1.0, np.where(made.task == made.task[i], TASK_SHARE**2, 0.0))
            dot = dot + RECIPE**2 * (made.recipe == made.recipe[i])
            sd = np.sqrt(2 * signal * sigma**2 / dim + sigma**4 / dim)
            cos = (dot + sd * rng.standard_normal(n)) / norm**2
            cos[i] = -np.inf
            cos[~made.labelled] = -np.inf
            k = int(counts[made.dataset[i]]) - 1
            top = np.argpartition(-cos, k - 1)[:k]
            out.append(float(np.mean(made.dataset[top] == made.dataset[i])))
        return float(np.mean(out))

    lo, hi = 0.1, 60.0
    for _ in range(25):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if knn(mid) > score else (lo, mid)
    return (lo + hi) / 2


def vectors(made: Made, sigma: float, dim: int, start: int, stop: int, seed: int = 0) -> Iterator[np.ndarray]:
    """The vectors of models ``start`` .. ``stop`` - 1, one at a time (each from its own seed: any range alike)."""
    base = np.random.default_rng(seed)
    tasks = base.standard_normal((TASKS, dim)).astype(np.float32)
    tasks /= np.linalg.norm(tasks, axis=1, keepdims=True)
    recipes = base.standard_normal((RECIPES, dim)).astype(np.float32)
    recipes /= np.linalg.norm(recipes, axis=1, keepdims=True)
    for i in range(start, stop):
        d = int(made.dataset[i])
        own = np.random.default_rng((seed, 1, d)).standard_normal(dim, dtype=np.float32)
        own /= np.linalg.norm(own)
        u = TASK_SHARE * tasks[made.task[i]] + np.sqrt(1 - TASK_SHARE**2) * own
        noise = np.random.default_rng((seed, 2, i)).standard_normal(dim, dtype=np.float32)
        v = u + RECIPE * recipes[made.recipe[i]] + (sigma / np.sqrt(dim)) * noise
        yield (v * (0.1 if made.adapter[i] else 1.0)).astype(np.float32)


def fill(
    store: Path,
    base: str,
    made: Made,
    sigma: float,
    dim: int,
    start: int = 0,
    stop: int | None = None,
    batch: int = 128,
) -> float:
    """Store the population's models ``start`` .. ``stop`` - 1 (as ``embed`` stores their vectors) against ``base``;
    the seconds it took."""
    from modelvec import Representation, Store
    from modelvec.store import VectorRow

    params = Representation()
    started = time.perf_counter()
    n = len(made.dataset) if stop is None else stop
    with Store(store) as db:
        db.versions.record_base(base, "stamp", "bh")
        for lo in range(start, n, batch):
            hi = min(n, lo + batch)
            rows = [
                VectorRow(
                    f"org{made.author[i]}/model-{i:06d}",
                    f"h{i}",
                    base,
                    "bh",
                    params,
                    "llama",
                    v,
                    [f"ds{made.dataset[i]}"] if made.labelled[i] else [],
                    "made",
                    0.1,
                    author=f"org{made.author[i]}",
                    adapter=bool(made.adapter[i]),
                )
                for i, v in zip(range(lo, hi), vectors(made, sigma, dim, lo, hi))
            ]
            db.writes.put_many(rows)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=99998)
    ap.add_argument("--base", default="made-base")
    ap.add_argument("--score", type=float, default=0.86)
    args = ap.parse_args()
    made = truth(args.models)
    sigma = noise_for(made, args.score, args.dim)
    seconds = fill(args.store, args.base, made, sigma, args.dim)
    print(f"{args.models} models, noise {sigma:.2f}: stored in {seconds:.1f} s")


if __name__ == "__main__":
    main()

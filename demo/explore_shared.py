"""Exploration for issue 60: neighbours ranked by the neighbours they share, a label-free secondary distance.

Two fine-tunes of one task on two text collections trained with the same seed are near in weights (the same
dropout, order and initial head or LoRA factors), nearer than their own dataset's other seeds: the seed-matched
zoo's misses (docs/evidence.md). A seed twin is a pair, a dataset a group: the twins' other neighbours are their
own datasets', so they share few neighbours, where two models of one dataset share most. Ranked by the share of
their ``m`` nearest they have in common (a shared-nearest-neighbour similarity; mutual proximity's distances
below it), twins fall back. No label is used; ``m`` (and the blend with the distance) is chosen on the selection
half only, as explore_twins.py splits the zoo (by task: each half holds one task on both collections).

    python demo/explore_shared.py --zoo .cache/evidence-twins [--probe 32]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import explore_truncate as ex
import numpy as np
from explore_twins import SELECTION

import modelvec
from modelvec.analyse.evidence import bootstrap_interval
from modelvec.analyse.scores import distance_matrix


def per_model(D: np.ndarray, datasets: list[str]) -> np.ndarray:
    """Each model's kNN metric on a distance matrix: the share of its k - 1 nearest (itself excluded, ties by index)
    of its own dataset, k its dataset's size; nan for a dataset of one."""
    out = np.full(len(datasets), np.nan)
    for a, d in enumerate(datasets):
        k = sum(o == d for o in datasets) - 1
        if k:
            order = [b for b in np.argsort(D[a], kind="stable") if b != a][:k]
            out[a] = np.mean([datasets[b] == d for b in order])
    return out


def knn_score(D: np.ndarray, datasets: list[str], kinds: list[str]) -> tuple[float, float, float, float]:
    """The kNN metric on a distance matrix: mean, its 95 % interval, and the full fine-tunes' among themselves."""
    per = per_model(D, datasets)
    per = per[~np.isnan(per)]
    lo, hi = bootstrap_interval(per)
    full = [i for i, k in enumerate(kinds) if k == "full"]
    among = per_model(D[np.ix_(full, full)], [datasets[i] for i in full])
    return float(per.mean()), lo, hi, float(np.nanmean(among))


def shared(D: np.ndarray, m: int, blend: float, by_rank: bool = True) -> np.ndarray:
    """One minus the share of the ``m`` nearest (itself included) two rows have in common, blended with the
    distances' ranks scaled to [0, 1], or (``by_rank`` false) the distances (``blend``: the second's weight)."""
    n = len(D)
    near = np.argsort(D, axis=1, kind="stable")[:, :m]
    member = np.zeros((n, n))
    np.put_along_axis(member, near, 1.0, axis=1)
    common = member @ member.T / m
    if by_rank:
        ranks = np.argsort(np.argsort(D, axis=1, kind="stable"), axis=1) / max(1, n - 1)
        second = (ranks + ranks.T) / 2
    else:  # 1 - MP from the distance (-log MP): no row sorted whole, as at scale
        second = 1 - np.exp(-D)
    return (1 - blend) * (1 - common) + blend * second


def made_population(n: int, neighbours: list[int], blends: list[float], dim: int = 4096) -> None:
    """The same rankings on bench/made_hub.py's population of ``n`` (Zipf-sized datasets, most of 1-3 models, a few
    of hundreds; 8 recipes shared across datasets), scored on its labelled models."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import made_hub

    made = made_hub.truth(n)
    sigma = made_hub.noise_for(made, 0.86, dim=dim)
    X = np.stack(list(made_hub.vectors(made, sigma, dim, 0, n))).astype(np.float64)
    cos = ex.unit_cosines(X)
    D = distance_matrix(ex.coordinates(cos), metric="cosine", scaling="mutual-proximity")
    keep = np.flatnonzero(made.labelled)
    datasets = [str(d) for d in made.dataset[keep]]
    counts = np.bincount(made.dataset[keep])
    size = counts[made.dataset[keep]]  # each labelled model's dataset size
    print(f"made population of {n}: {len(keep)} labelled, datasets of 2+ holding {np.sum(counts[counts > 1])}")
    print("| ranking | population | kNN [95 % CI] | datasets of 2-5 models |")
    print("|:--|:--|:--|--:|")
    rows = {"mutual proximity (default)": D}
    for m in neighbours:
        for blend in blends:
            rows[f"shared of {m} nearest, distance weight {blend:g}"] = shared(D, m, blend)
            rows[f"shared of {m} nearest, MP distance weight {blend:g}"] = shared(D, m, blend, by_rank=False)
    for name, dist in rows.items():
        per = per_model(dist[np.ix_(keep, keep)], datasets)
        scored = ~np.isnan(per)
        lo, hi = bootstrap_interval(per[scored])
        small = np.mean(per[scored & (size <= 5)])
        print(f"| {name} | made {n} | {np.mean(per[scored]):.3f} [{lo:.2f}, {hi:.2f}] | {small:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path)
    ap.add_argument("--probe", default="auto")
    ap.add_argument("--neighbours", default="4,6,8,10,12,16")
    ap.add_argument("--blends", default="0,0.25,0.5")
    ap.add_argument("--made", type=int, default=0, help="score bench/made_hub.py's population of this many instead")
    args = ap.parse_args()
    if args.made:
        made_population(
            args.made, [int(x) for x in args.neighbours.split(",")], [float(x) for x in args.blends.split(",")]
        )
        return
    zoo = json.loads((args.zoo / "zoo.json").read_text())
    base, models = zoo["base"], zoo["models"]
    paths = [m["path"] for m in models]
    rep = modelvec.Representation(probe=args.probe if args.probe == "auto" else int(args.probe))
    cos, _ = ex.head_cosines(base, paths, args.zoo.with_suffix(".duckdb"), rep)
    halves = {
        "selection": [i for i, m in enumerate(models) if m["dataset"] in SELECTION],
        "report": [i for i, m in enumerate(models) if m["dataset"] not in SELECTION],
        "all": list(range(len(models))),
    }
    print(f"probe {args.probe}")
    print("| ranking | half | mixed [95 % CI] | full-only |")
    print("|:--|:--|:--|--:|")
    for half, idx in halves.items():
        sub = cos[np.ix_(idx, idx)]
        D = distance_matrix(ex.coordinates(sub), metric="cosine", scaling="mutual-proximity")
        datasets = [models[i]["dataset"] for i in idx]
        kinds = [models[i]["kind"] for i in idx]
        rows = {"mutual proximity (default)": D}
        for m in (int(x) for x in args.neighbours.split(",")):
            for blend in (float(x) for x in args.blends.split(",")):
                rows[f"shared of {m} nearest, distance weight {blend:g}"] = shared(D, m, blend)
                rows[f"shared of {m} nearest, MP distance weight {blend:g}"] = shared(D, m, blend, by_rank=False)
        for name, dist in rows.items():
            mean, lo, hi, full = knn_score(dist, datasets, kinds)
            print(f"| {name} | {half} | {mean:.3f} [{lo:.2f}, {hi:.2f}] | {full:.3f} |", flush=True)


if __name__ == "__main__":
    main()

"""Exploration for issue 60: each delta at the adapter's rank, exactly, before any sketch.

For every layer-and-matrix block of every model of a zoo (zoo.json: dataset, kind full/lora): the delta dW (or, with
the probe, the base's inputs times it, H dW: tokens x out), kept whole or truncated to its top r singular
directions, unit-normed; the cosine of two models is the mean of their blocks' inner products (the block-normed
task vectors, the sketch's exact reference). Where the base has a masked-LM head, its vocabulary prior (the default
vector's last block, `modelvec.embed`) is given half the weight, as the default vector does. Scored per half like
`cluster` (mutual proximity) and by plain cosine, with the default vector itself beside them.

    python demo/explore_truncate.py --zoo .cache/evidence-mixed --selection tweet-sentiment,tweet-simcse,tweet-mlm \\
        --ranks 4,8,16 [--probe 32] [--store S]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import modelvec
from modelvec.analyse.evidence import bootstrap_interval, mixed_scores
from modelvec.analyse.scores import distance_matrix, knn_dataset_score
from modelvec.core.names import model_id
from modelvec.read import open_checkpoint
from modelvec.represent import blocks_of
from modelvec.represent.probe import compute_inputs
from modelvec.studies.task_vectors import task_deltas


def coordinates(cos: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(cos)
    return v * np.sqrt(np.clip(w, 0, None))


def grams(base: str, paths: list[str], ranks: list[int | None], probe: int | None) -> dict[str, np.ndarray]:
    base_ck = open_checkpoint(base)
    cks = [open_checkpoint(p) for p in paths]
    h = None
    if probe:
        layout = base_ck.layout()
        inputs = compute_inputs(base, layout, probe, "base")
        h = {ref.tensor: torch.from_numpy(np.array(inputs.for_tensor(ref.tensor), np.float64)) for ref in layout.refs}
    out = {f"r{r or 'all'}": np.zeros((len(cks), len(cks))) for r in ranks}
    blocks = 0
    for ref, _, deltas in task_deltas(base_ck, cks):
        blocks += 1
        kept: dict[str, list[torch.Tensor]] = {k: [] for k in out}
        for i in range(len(cks)):
            d = deltas.get(i)
            if d is not None and h is not None:
                d = h[ref.tensor] @ d  # tokens x out: the change of the matrix's outputs on the base's inputs
            svd = torch.linalg.svd(d, full_matrices=False) if d is not None else None
            for r in ranks:
                if d is None or svd is None:
                    kept[f"r{r or 'all'}"].append(torch.zeros(1, dtype=torch.float64))
                    continue
                u, s, vh = svd
                t = d if r is None or r >= len(s) else (u[:, :r] * s[:r]) @ vh[:r]
                t = t.reshape(-1)
                n = torch.linalg.vector_norm(t)
                kept[f"r{r or 'all'}"].append(t / n if n > 0 else t)
        for key, rows in kept.items():
            width = max(x.numel() for x in rows)
            zero = torch.zeros(width, dtype=torch.float64)
            stacked = torch.stack([x if x.numel() == width else zero for x in rows])
            out[key] += (stacked @ stacked.T).numpy()
    return {k: g / blocks for k, g in out.items()}


def side_grams(base: str, paths: list[str]) -> dict[str, np.ndarray]:
    """Each block's delta seen from one side only: the cosine of two models' Gram matrices d d^T (its rows' side)
    and d^T d (its columns' side), the mean over blocks. A Gram is blind to any rotation of the other side: an
    adapter's B A, A drawn from the seed, has the Gram B (A A^T) B^T ~ B B^T on the side of B whatever A is, so two
    adapters of one seed no longer share A's frame (docs/evidence.md, "the seed")."""
    base_ck = open_checkpoint(base)
    cks = [open_checkpoint(p) for p in paths]
    out = {
        "rows' Gram (d d^T)": np.zeros((len(cks), len(cks))),
        "columns' Gram (d^T d)": np.zeros((len(cks), len(cks))),
    }
    blocks = 0
    for ref, _, deltas in task_deltas(base_ck, cks):
        blocks += 1
        for key, side in zip(out, (lambda d: d @ d.T, lambda d: d.T @ d)):
            rows = []
            for i in range(len(cks)):
                d = deltas.get(i)
                if d is None:
                    rows.append(None)
                    continue
                g = side(d.float()).reshape(-1)
                n = torch.linalg.vector_norm(g)
                rows.append(g / n if n > 0 else g)
            width = max((x.numel() for x in rows if x is not None), default=1)
            stacked = torch.stack([x if x is not None else torch.zeros(width) for x in rows])
            out[key] += (stacked @ stacked.T).double().numpy()
        if blocks == 1:
            print(f"first block {ref.key}: delta {tuple(next(iter(deltas.values())).shape)}", flush=True)
    return {k: g / blocks for k, g in out.items()}


def head_cosines(
    base: str, paths: list[str], store: Path, rep: modelvec.Representation | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The vectors' cosines (the default representation's where ``rep`` is None), and their head block's (None: no
    head)."""
    rep = rep or modelvec.Representation()
    got = modelvec.embed(base, paths, store=store, representation=rep)
    if got.failed:
        raise SystemExit(f"failed: {got.failed}")
    order = {name: i for i, name in enumerate(got.metadata["model"])}
    X = np.asarray(got.vectors[[order[model_id(p)] for p in paths]], np.float64)
    blocks = blocks_of(base, rep)
    end = max(b.stop for b in blocks)
    return unit_cosines(X), unit_cosines(X[:, end:]) if X.shape[1] > end else None


def unit_cosines(A: np.ndarray) -> np.ndarray:
    """The rows' cosines (a zero row: 0 with every row)."""
    n = np.linalg.norm(A, axis=1, keepdims=True)
    A = A / np.where(n > 0, n, 1)
    return A @ A.T


def score(cos: np.ndarray, models: list[dict], idx: list[int], scaling: str) -> tuple[float, float, float, float]:
    sub = cos[np.ix_(idx, idx)]
    labels = [[models[i]["dataset"]] for i in idx]
    X = coordinates(sub)
    knn = knn_dataset_score(X, labels, metric="cosine", scaling=scaling)
    lo, hi = bootstrap_interval(np.asarray(knn.per_model, dtype=np.float64))
    mixed = mixed_scores(X, labels, [models[i]["kind"] == "lora" for i in idx], metric="cosine", scaling=scaling)
    return knn.score, lo, hi, mixed.knn_full


def confusions(cos: np.ndarray, models: list[dict], idx: list[int]) -> list[str]:
    """Where the k - 1 nearest (mutual proximity) miss: (model's dataset, kind) -> (neighbour's dataset, kind)."""
    D = distance_matrix(coordinates(cos[np.ix_(idx, idx)]), metric="cosine", scaling="mutual-proximity")
    ms = [models[i] for i in idx]
    counts: dict[tuple[str, str], int] = {}
    for a, m in enumerate(ms):
        k = sum(o["dataset"] == m["dataset"] for o in ms) - 1
        order = [b for b in np.argsort(D[a], kind="stable") if b != a][:k]
        for b in order:
            if ms[b]["dataset"] != m["dataset"]:
                key = (f"{m['dataset']} {m['kind']}", f"{ms[b]['dataset']} {ms[b]['kind']}")
                counts[key] = counts.get(key, 0) + 1
    return [f"{a} -> {b}: {n}" for (a, b), n in sorted(counts.items(), key=lambda kv: -kv[1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, required=True)
    ap.add_argument("--selection", required=True)
    ap.add_argument("--ranks", default="4,8,16")
    ap.add_argument("--probe", type=int, default=0)
    ap.add_argument("--store", type=Path)
    ap.add_argument("--delta-ranks", default="", help="also the default vector at each --delta-rank (comma-separated)")
    ap.add_argument("--probes", default="", help="... and through each probe length, with and without them")
    ap.add_argument("--no-exact", action="store_true", help="only the vectors modelvec computes")
    ap.add_argument("--grams", action="store_true", help="also each block's delta seen from one side (its Grams)")
    args = ap.parse_args()
    zoo = json.loads((args.zoo / "zoo.json").read_text())
    base, models = zoo["base"], zoo["models"]
    paths = [m["path"] for m in models]
    selection = set(args.selection.split(","))
    halves = {
        "selection": [i for i, m in enumerate(models) if m["dataset"] in selection],
        "report": [i for i, m in enumerate(models) if m["dataset"] not in selection],
        "both halves (one population, as a user has it)": list(range(len(models))),
    }
    store = args.store or args.zoo.with_suffix(".duckdb")
    default, head = head_cosines(base, paths, store)
    ranks: list[int | None] = [None, *(int(r) for r in args.ranks.split(","))]
    methods = {"default vector": default}
    for probe in ["auto", *filter(None, args.probes.split(","))]:
        for r in ["none", *filter(None, args.delta_ranks.split(","))]:
            if (probe, r) == ("auto", "none"):
                continue
            rep = modelvec.Representation(
                delta_rank=r if r == "none" else int(r), probe=probe if probe == "auto" else int(probe)
            )
            methods[f"vector, probe {probe}, delta rank {r}"] = head_cosines(base, paths, store, rep)[0]
    for name, g in ({} if args.no_exact else grams(base, paths, ranks, args.probe or None)).items():
        tag = f"{'probe ' + str(args.probe) + ', ' if args.probe else ''}{name}"
        d = np.sqrt(np.clip(np.diag(g), 1e-300, None))
        g = g / d[:, None] / d[None, :]
        methods[tag] = g if head is None else (g + head) / 2
    for name, g in (side_grams(base, paths) if args.grams else {}).items():
        d = np.sqrt(np.clip(np.diag(g), 1e-300, None))
        g = g / d[:, None] / d[None, :]
        methods[name] = g if head is None else (g + head) / 2
    print("| variant | half | MP mixed [95 % CI] | MP full-only | cosine mixed |")
    print("|:--|:--|:--|--:|--:|")
    for half, idx in halves.items():
        for name, cos in methods.items():
            mp, lo, hi, full = score(cos, models, idx, "mutual-proximity")
            plain = score(cos, models, idx, "none")[0]
            print(f"| {name} | {half} | {mp:.3f} [{lo:.2f}, {hi:.2f}] | {full:.3f} | {plain:.3f} |", flush=True)
    for name in ("default vector", *(k for k in methods if k.endswith("rall") or "Gram" in k)):
        for half, idx in halves.items():
            print(f"misses of {name}, {half} half: " + "; ".join(confusions(methods[name], models, idx)[:8]))


if __name__ == "__main__":
    main()

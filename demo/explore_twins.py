"""Exploration for issue 60 on a seed-matched mixed zoo (`demo/build_evidence.py --full 5` without
``--unique-seeds``: run i has seed i on every dataset): how the default vector's parts weigh against each other.

The confusions of such a zoo join two models of one task on two text collections trained with the same seed (a
masked-LM head drawn from the seed, the same dropout and order): they only meet where both collections are in one
population, so the halves here split by task, not by texts: the selection half holds SimCSE on both collections and
the tweets' sentiment, the report half masked-LM on both and the BBC's topics. The default vector's delta blocks
and its vocabulary-prior block (a masked-LM head's, `modelvec.embed`) are weighed ``1 - w`` and ``w``.

    python demo/explore_twins.py --zoo .cache/evidence-twins --weights 0.5,0.67,0.75,0.9
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import explore_truncate as ex
import numpy as np

import modelvec
from modelvec.core.names import model_id
from modelvec.represent import blocks_of

SELECTION = ("tweet-simcse", "bbc-simcse", "tweet-sentiment")


def parts(base: str, paths: list[str], store: Path) -> tuple[np.ndarray, np.ndarray]:
    """The cosines of the default vectors' delta blocks and of their vocabulary-prior block (zero: none)."""
    rep = modelvec.Representation()
    got = modelvec.embed(base, paths, store=store, representation=rep)
    order = {name: i for i, name in enumerate(got.metadata["model"])}
    X = np.asarray(got.vectors[[order[model_id(p)] for p in paths]], np.float64)
    end = max(b.stop for b in blocks_of(base, rep))
    return ex.unit_cosines(X[:, :end]), ex.unit_cosines(X[:, end:])


def block_cosines(base: str, paths: list[str]) -> dict[tuple[int, str], np.ndarray]:
    """Each block's exact cosines (its delta unit-normed; zero where a model leaves it alone), by (layer, family)."""
    import torch

    from modelvec.read import open_checkpoint
    from modelvec.studies.task_vectors import task_deltas

    base_ck, cks = open_checkpoint(base), [open_checkpoint(p) for p in paths]
    out = {}
    for ref, _, deltas in task_deltas(base_ck, cks):
        width = next(iter(deltas.values())).numel() if deltas else 1
        rows = []
        for i in range(len(cks)):
            d = deltas[i].reshape(-1) if i in deltas else torch.zeros(width, dtype=torch.float64)
            n = torch.linalg.vector_norm(d)
            rows.append(d / n if n > 0 else d)
        stacked = torch.stack(rows)
        out[(ref.layer, ref.family)] = (stacked @ stacked.T).numpy()
    return out


def by_blocks(models: list[dict], halves: dict[str, list[int]], cosines: dict[tuple[int, str], np.ndarray]) -> None:
    """The score of the exact task vectors made of one layer's blocks, or one family's, or the layers from one on."""
    layers = sorted({layer for layer, _ in cosines})
    families = sorted({family for _, family in cosines})
    subsets = {f"layer {layer}": [k for k in cosines if k[0] == layer] for layer in layers}
    subsets |= {f"layers {layer}+": [k for k in cosines if k[0] >= layer] for layer in layers[1:]}
    subsets |= {f"layers 0-{layer}": [k for k in cosines if k[0] <= layer] for layer in layers[:-1]}
    subsets |= {f"family {family}": [k for k in cosines if k[1] == family] for family in families}
    subsets["all blocks"] = list(cosines)
    print("| blocks | " + " | ".join(halves) + " |")
    print("|:--|" + "--:|" * len(halves))
    for name, keys in subsets.items():
        cos = sum(cosines[k] for k in keys) / len(keys)
        cells = [ex.score(cos, models, idx, "mutual-proximity")[0] for idx in halves.values()]
        print(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, required=True)
    ap.add_argument("--weights", default="0.5,0.67,0.75,0.9")
    ap.add_argument("--blocks", action="store_true", help="also the exact task vectors by layer and by family")
    args = ap.parse_args()
    zoo = json.loads((args.zoo / "zoo.json").read_text())
    base, models = zoo["base"], zoo["models"]
    paths = [m["path"] for m in models]
    halves = {
        "selection": [i for i, m in enumerate(models) if m["dataset"] in SELECTION],
        "report": [i for i, m in enumerate(models) if m["dataset"] not in SELECTION],
        "all": list(range(len(models))),
    }
    if args.blocks:
        by_blocks(models, halves, block_cosines(base, paths))
    delta, head = parts(base, paths, args.zoo.with_suffix(".duckdb"))
    print("| head weight w | half | MP mixed [95 % CI] | MP full-only | cosine mixed |")
    print("|:--|:--|:--|--:|--:|")
    for w in (float(x) for x in args.weights.split(",")):
        cos = (1 - w) * delta + w * head
        for half, idx in halves.items():
            mp, lo, hi, full = ex.score(cos, models, idx, "mutual-proximity")
            plain = ex.score(cos, models, idx, "none")[0]
            print(f"| {w:g} | {half} | {mp:.3f} [{lo:.2f}, {hi:.2f}] | {full:.3f} | {plain:.3f} |", flush=True)
        for half, idx in halves.items():
            print(f"misses at w {w:g}, {half}: " + "; ".join(ex.confusions(cos, models, idx)[:6]))


if __name__ == "__main__":
    main()

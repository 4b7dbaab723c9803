"""Exploration behind docs/evidence.md ("Why the same task on two collections is confused: the seed"):
is it the text collection or the training run that the confused models share?

In the evidence zoo every wrong nearest neighbour joins two models of the same seed (which there
also fixes the learning rate, the length and, for adapters, the rank and target modules): bbc-mlm
seed s with tweet-mlm seed s, bbc-simcse adapter seed s with tweet-simcse adapter seed s. This
script separates the seed from the rest. It trains, with `make evidence`'s code and settings, new
models that differ from one another in one thing at a time:

- masked-LM full fine-tunes on BBC and on tweets, seeds 10 and 11, both with seed 0's settings
  (lr 2e-5, 120 steps);
- masked-LM and SimCSE LoRA adapters (r 4 on q, v) on BBC and on tweets, seeds 13 and 14, both with
  seed 3's settings (lr 1e-3, 120 steps).

Within each group the settings are identical, so a pair differs in its seed, in its texts, or in
both. Printed per group and representation: the mean cosine of the pairs of each kind, and the
nearest neighbour of each model within the group.

First, over the evidence zoo itself: how many nearest neighbours are on another dataset, and how
many of those share the model's seed; then where the seed sits in a delta: the kernel of the
input-side Gram matrices (dW dW^T, W in R^{in x out}: what the delta reads) against the
output-side ones (dW^T dW: what it writes), each block scaled to unit norm, scored like
`explore_activations.py` on the fixed split.

Run after `make evidence` (about 6 minutes on 2 cores the first time; models cached):

    .venv/bin/python demo/explore_seeds.py [--zoo .cache/evidence] [--zoo-only]

`--zoo` names another evidence zoo (e.g. the one `make evidence EVIDENCE_FLAGS=--unique-seeds`
builds, where every model has its own seed); `--zoo-only` skips the controlled rerun.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
from pathlib import Path

import numpy as np
import torch
from build_evidence import DATASETS, Run, build_one, load_data, run_name
from build_zoo import base_model_dir
from safetensors.numpy import load_file
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

import modelvec
from modelvec.analyse.evidence import mixed_scores
from modelvec.read import open_checkpoint
from modelvec.studies.task_vectors import task_deltas, task_vector_gram

SELECTION = ("tweet-sentiment", "tweet-simcse", "chat-qa", "chat-topic")  # as in `make evidence`

OUT = Path(".cache/evidence-seeds")
GROUPS = {  # group -> (datasets, runs): the runs of a group share every setting but the seed
    "masked-LM, full": (("bbc-mlm", "tweet-mlm"), (Run("full", 10, 2e-5, 120), Run("full", 11, 2e-5, 120))),
    "masked-LM, LoRA r4 q,v": (
        ("bbc-mlm", "tweet-mlm"),
        (Run("lora", 13, 1e-3, 120, 4, "qv"), Run("lora", 14, 1e-3, 120, 4, "qv")),
    ),
    "SimCSE, LoRA r4 q,v": (
        ("bbc-simcse", "tweet-simcse"),
        (Run("lora", 13, 1e-3, 120, 4, "qv"), Run("lora", 14, 1e-3, 120, 4, "qv")),
    ),
}


def build() -> dict[str, list[tuple[str, int, Path]]]:
    """Train what is missing; per group, (dataset, seed, folder) of its models."""
    torch.set_num_threads(2)
    hf_logging.set_verbosity_error()
    OUT.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(base_model_dir())
    by_name = {ds.name: ds for ds in DATASETS}
    groups: dict[str, list[tuple[str, int, Path]]] = {}
    for group, (names, runs) in GROUPS.items():
        for name, run in itertools.product(names, runs):
            ds = by_name[name]
            folder = OUT / run_name(ds, run)
            if not folder.is_dir():
                build_one(OUT.resolve(), ds, run, load_data(ds), tok)
            groups.setdefault(group, []).append((name, run.seed, folder))
    return groups


def kind_of(a: tuple[str, int, Path], b: tuple[str, int, Path]) -> str:
    same_text, same_seed = a[0] == b[0], a[1] == b[1]
    return {
        (True, False): "same texts, other seed",
        (False, True): "other texts, same seed",
        (False, False): "other texts, other seed",
    }[(same_text, same_seed)]


def cosines(X: np.ndarray) -> np.ndarray:
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    return unit @ unit.T


def kernel_cosines(K: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.diag(K))
    return K / np.outer(d, d)


def from_kernel(K: np.ndarray) -> np.ndarray:
    """Rows whose inner products are the kernel K."""
    w, V = np.linalg.eigh(K)
    return V * np.sqrt(np.clip(w, 0, None))


EXACT, READS, WRITES = "task vectors (exact)", "input side, dW dW^T", "output side, dW^T dW"


def kernels(base: str, paths: list[str]) -> dict[str, np.ndarray]:
    """In one pass over the deltas: the exact task vectors' inner products, and per side of a delta
    the sum over blocks of the cosines of its Gram matrices (a block a model leaves alone adds 0)."""
    out = {name: np.zeros((len(paths), len(paths))) for name in (EXACT, READS, WRITES)}
    for _ref, _w0, deltas in task_deltas(open_checkpoint(base), [open_checkpoint(p) for p in paths]):
        idx = sorted(deltas)
        flat = torch.stack([deltas[i].reshape(-1) for i in idx])
        out[EXACT][np.ix_(idx, idx)] += (flat @ flat.T).numpy()
        for name, gram in ((READS, lambda d: d @ d.T), (WRITES, lambda d: d.T @ d)):
            G = torch.stack([gram(deltas[i]).reshape(-1) for i in idx])
            G /= G.norm(dim=1, keepdim=True)
            out[name][np.ix_(idx, idx)] += (G @ G.T).numpy()
    return out


def zoo_wide(base: str, zoo: Path) -> None:
    """The evidence zoo: wrong nearest neighbours and their seeds, and the two sides of a delta."""
    entries = json.loads((zoo / "zoo.json").read_text())["models"]
    paths = [m["path"] for m in entries]
    K = kernels(base, paths)
    sims = {
        "default sketch": cosines(modelvec.DeltaEmbedder().fit(base).transform(paths).astype(np.float64)),
        "sketch, concat": cosines(modelvec.DeltaEmbedder(pooling="concat").fit(base).transform(paths).astype(float)),
        EXACT: kernel_cosines(K[EXACT]),
    }
    print(f"== the evidence zoo {zoo} ({len(entries)} models)")
    for name, S in sims.items():
        S = S.copy()
        np.fill_diagonal(S, -np.inf)
        wrong = [(i, int(np.argmax(S[i]))) for i in range(len(entries))]
        wrong = [(i, j) for i, j in wrong if entries[i]["dataset"] != entries[j]["dataset"]]
        seeds = sum(entries[i]["seed"] == entries[j]["seed"] for i, j in wrong)
        pairs = collections.Counter(f"{entries[i]['dataset']} -> {entries[j]['dataset']}" for i, j in wrong)
        print(f"  {name:>22}: {len(wrong)} nearest neighbours on another dataset, {seeds} of them the same seed")
        print(f"  {'':>22}  {dict(pairs.most_common())}")
    labels = [[m["dataset"]] for m in entries]
    adapter = np.array([m["kind"] == "lora" for m in entries])
    for name in (READS, WRITES):
        X = from_kernel(kernel_cosines(K[name]))
        for half in ("selection", "report"):
            keep = np.array([(m["dataset"] in SELECTION) == (half == "selection") for m in entries])
            s = mixed_scores(X[keep], [labels[i] for i in np.flatnonzero(keep)], adapter[keep])
            print(
                f"  {name:>22} {half:>9}: full {s.knn_full:.3f} adapters {s.knn_adapters:.3f} "
                f"mixed {s.knn_mixed:.3f} a->full {s.adapter_to_full:.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", type=Path, default=Path(".cache/evidence"))
    parser.add_argument("--zoo-only", action="store_true", help="skip the controlled rerun")
    args = parser.parse_args()
    base = str(base_model_dir())
    zoo_wide(base, args.zoo)
    if args.zoo_only:
        return
    groups = build()
    embedders = {
        "default sketch": modelvec.DeltaEmbedder().fit(base),
        "sketch, concat": modelvec.DeltaEmbedder(pooling="concat").fit(base),
    }
    for group, models in groups.items():
        print(f"\n== {group}: " + ", ".join(f"{d} s{s}" for d, s, _ in models))
        paths = [str(p) for _, _, p in models]
        sims = {name: cosines(emb.transform(paths).astype(np.float64)) for name, emb in embedders.items()}
        sims[EXACT] = kernel_cosines(task_vector_gram(base, paths).gram)
        for name, S in sims.items():
            cells: dict[str, list[float]] = {}
            for i, j in itertools.combinations(range(len(models)), 2):
                cells.setdefault(kind_of(models[i], models[j]), []).append(float(S[i, j]))
            nearest = []
            for i in range(len(models)):
                j = max((j for j in range(len(models)) if j != i), key=lambda j: S[i, j])
                nearest.append(kind_of(models[i], models[j]))
            means = ", ".join(f"{k} {np.mean(v):.3f}" for k, v in sorted(cells.items()))
            counts = {k: nearest.count(k) for k in sorted(set(nearest))}
            print(f"  {name:>22}: mean cosine: {means}; nearest: {counts}")
        if (models[0][2] / "adapter_config.json").is_file():  # how much of A's random draw is left after training
            factors = [load_file(str(p / "adapter_model.safetensors")) for _, _, p in models]
            cells = {}
            for i, j in itertools.combinations(range(len(models)), 2):
                for key in (k for k in factors[i] if ".lora_A." in k):
                    a, b = factors[i][key].ravel(), factors[j][key].ravel()
                    cell = cells.setdefault(kind_of(models[i], models[j]), [])
                    cell.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
            print(
                "  LoRA A factors, mean cosine: " + ", ".join(f"{k} {np.mean(v):.3f}" for k, v in sorted(cells.items()))
            )


if __name__ == "__main__":
    main()

"""Evidence for ``--probe`` (issue 48): the delta through the base's inputs against the delta itself, on evidence zoos.

For each zoo (a folder with zoo.json: every model's dataset, kind full/lora, text collection and task) and each
representation (the default with ``--probe none``, the delta itself; with ``--probe N`` for each N; and the exact task vectors, every
matrix's delta unit-normed), per half of the zoo's fixed split (``--selection``: those datasets select, the rest
report), cosine kNN dataset score:

- mixed (full fine-tunes and adapters together) with a 95 % bootstrap interval over models, full-only,
  adapters-only, and how often an adapter's nearest full fine-tune has its dataset;
- what the issue names as the miss: for each full fine-tune, its mean cosine with its own dataset's adapters
  ("own adapters") against its mean cosine with the full fine-tunes of the same texts under another task
  ("same texts, other task"), and the share of full fine-tunes for which every own adapter is nearer than every
  such full fine-tune ("kind second").

Vectors come through ``modelvec.embed`` into one store per zoo (stored ones are skipped), so the probe's H is
computed once per base and probe length and kept beside the store.

    python demo/evidence_probe.py --zoo .cache/llm-same-texts --selection tweet-clm,tweet-sentiment \\
        --probes 16,32,64,128 [--store S] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import modelvec
from modelvec.analyse.evidence import bootstrap_interval, mixed_scores
from modelvec.analyse.scores import knn_dataset_score
from modelvec.core.names import model_id
from modelvec.studies.task_vectors import task_vector_gram


def unit_rows(X: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(n > 0, n, 1)


def cosines_from_gram(gram: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.clip(np.diag(gram), 1e-300, None))
    return gram / d[:, None] / d[None, :]


def coordinates(cos: np.ndarray) -> np.ndarray:
    """Points whose cosines are ``cos`` (an eigendecomposition of the Gram matrix)."""
    w, v = np.linalg.eigh(cos)
    return v * np.sqrt(np.clip(w, 0, None))


def kind_second(cos: np.ndarray, models: list[dict]) -> tuple[float, float, float]:
    """(mean cosine of full fine-tunes with their own dataset's adapters, with the same texts' other-task full
    fine-tunes, share of full fine-tunes whose own adapters are all nearer than every such full fine-tune)."""
    own, other, wins = [], [], []
    for i, m in enumerate(models):
        if m["kind"] != "full":
            continue
        mine = [j for j, o in enumerate(models) if o["kind"] == "lora" and o["dataset"] == m["dataset"]]
        rival = [
            j
            for j, o in enumerate(models)
            if o["kind"] == "full" and o["collection"] == m["collection"] and o["dataset"] != m["dataset"]
        ]
        if not mine or not rival:
            continue
        own.append(cos[i, mine].mean())
        other.append(cos[i, rival].mean())
        wins.append(cos[i, mine].min() > cos[i, rival].max())
    if not own:
        return float("nan"), float("nan"), float("nan")
    return float(np.mean(own)), float(np.mean(other)), float(np.mean(wins))


def score(cos: np.ndarray, models: list[dict], idx: list[int]) -> dict:
    sub = cos[np.ix_(idx, idx)]
    ms = [models[i] for i in idx]
    labels = [[m["dataset"]] for m in ms]
    X = coordinates(sub)
    knn = knn_dataset_score(X, labels, metric="cosine")
    lo, hi = bootstrap_interval(np.asarray(knn.per_model, dtype=np.float64))
    mixed = mixed_scores(X, labels, [m["kind"] == "lora" for m in ms], metric="cosine")
    own, other, second = kind_second(sub, ms)
    return {
        "mixed": knn.score,
        "lo": lo,
        "hi": hi,
        "full": mixed.knn_full,
        "adapters": mixed.knn_adapters,
        "a_to_full": mixed.adapter_to_full,
        "own_adapters": own,
        "other_task": other,
        "kind_second": second,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, required=True)
    ap.add_argument("--selection", required=True, help="datasets of the selection half (comma-separated)")
    ap.add_argument("--probes", default="16,32,64,128")
    ap.add_argument("--store", type=Path, help="default: <zoo>.duckdb")
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    zoo = json.loads((args.zoo / "zoo.json").read_text())
    base, models = zoo["base"], zoo["models"]
    for m in models:
        m.setdefault("collection", m.get("texts", m["dataset"]))
    store = args.store or args.zoo.with_suffix(".duckdb")
    paths = [m["path"] for m in models]
    selection = set(args.selection.split(","))
    halves = {
        "selection": [i for i, m in enumerate(models) if m["dataset"] in selection],
        "report": [i for i, m in enumerate(models) if m["dataset"] not in selection],
    }
    methods: dict[str, np.ndarray] = {}
    for probe in ["none", *args.probes.split(",")]:
        rep = modelvec.Representation(probe=probe if probe == "none" else int(probe))
        got = modelvec.embed(base, paths, store=store, representation=rep)
        if got.failed:
            raise SystemExit(f"failed: {got.failed}")
        order = {name: i for i, name in enumerate(got.metadata["model"])}
        X = got.vectors[[order[model_id(p)] for p in paths]]
        methods["the delta itself (--probe none)" if probe == "none" else f"--probe {probe}"] = (
            unit_rows(X) @ unit_rows(X).T
        )
        print(f"embedded: {rep.label()}", flush=True)
    tv = task_vector_gram(base, paths)
    methods["task vectors, block-normed (exact)"] = cosines_from_gram(tv.gram_bn)
    lines = [
        "| method | half | mixed [95 % CI] | full-only | adapters | a→full | own adapters | same texts, other task "
        "| kind second |",
        "|:--|:--|:--|--:|--:|--:|--:|--:|--:|",
    ]
    for half, idx in halves.items():
        for name, cos in methods.items():
            s = score(cos, models, idx)
            lines.append(
                f"| {name} | {half} | {s['mixed']:.3f} [{s['lo']:.2f}, {s['hi']:.2f}] | {s['full']:.3f} | "
                f"{s['adapters']:.3f} | {s['a_to_full']:.3f} | {s['own_adapters']:.3f} | {s['other_task']:.3f} | "
                f"{s['kind_second']:.2f} |"
            )
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()

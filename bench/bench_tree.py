"""The model tree on 1,000 stored models (and more): seconds and peak memory of ``modelvec tree``, and of the tree
part of ``modelvec neighbors``, and how right the inferred tree is on the made population.

A store is filled with N made models of one base, each a trace of the default's size (16,384 floats, linear in the
weights as a real one is) and a small vector: 40 % fine-tunes of the base, 20 % fine-tunes of earlier fine-tunes
(their delta plus their own, smaller), 10 % merges of two earlier ones (weights 0.5/0.5 or 0.7/0.3; their cards name
their parents, as mergekit writes them), 10 % LoRA
adapters (on the base or embedded on a fine-tune), 10 % quantizations (a fine-tune plus rounding 5 x its delta, few
distinct values), 5 % unrelated weights (a delta the size of the base's weights) and 5 % copies. Each command runs in
a fresh process (peak RSS from ``/usr/bin/time``).

Run: ``python bench/bench_tree.py [--sizes 1000] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent
BASE = "bench-base"
SHA = "0" * 40


def population(n: int, dim: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """N made models: their truth (kind, parents) and traces, in the shares the module docstring gives."""
    rng = np.random.default_rng(seed)
    scale = 100.0
    truth: list[dict] = []
    traces = np.zeros((n, dim))
    full: list[int] = []
    kinds = rng.choice(
        ["fine-tune", "chain", "merge", "adapter", "quantization", "unrelated", "copy"],
        size=n,
        p=[0.4, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05],
    )
    for i, kind in enumerate(kinds):
        own = rng.standard_normal(dim) * rng.uniform(0.5, 1.5)
        if kind in ("chain", "merge", "quantization", "copy", "adapter") and len(full) < 2:
            kind = "fine-tune"
        if kind == "fine-tune":
            traces[i], row = own, {"kind": "fine-tune", "parents": [BASE]}
        elif kind == "chain":
            p = int(rng.choice(full))
            traces[i], row = traces[p] + 0.5 * own, {"kind": "fine-tune", "parents": [p]}
        elif kind == "merge":
            a, b = (int(x) for x in rng.choice(full, 2, replace=False))
            w = 0.5 if rng.random() < 0.5 else 0.7
            traces[i], row = w * traces[a] + (1 - w) * traces[b], {"kind": "merge", "parents": [a, b]}
        elif kind == "adapter":
            p = int(rng.choice(full)) if rng.random() < 0.5 else None
            low = rng.standard_normal(dim) * 0.3
            traces[i] = low + (traces[p] if p is not None else 0)
            row = {"kind": "adapter", "parents": [p if p is not None else BASE], "on": p}
        elif kind == "quantization":
            p = int(rng.choice(full))
            traces[i], row = traces[p] + 5 * own, {"kind": "quantization", "parents": [p]}
        elif kind == "unrelated":
            traces[i], row = rng.standard_normal(dim) * scale * 1.2, {"kind": "unrelated", "parents": []}
        else:  # a copy: the same weights again, of its original's kind
            p = int(rng.choice(full))
            traces[i], row = traces[p], {"kind": truth[p]["kind"], "parents": [p], "copy": p}
        if row["kind"] in ("fine-tune", "merge") and "copy" not in row:
            full.append(i)
        truth.append(row)
    return truth, traces


def fill(store: Path, truth: list[dict], traces: np.ndarray, scale: float) -> None:
    from modelvec.represent import Representation
    from modelvec.represent.trace import Trace
    from modelvec.store import Store, VectorRow

    rng = np.random.default_rng(1)
    names = [f"model-{i:05d}" for i in range(len(truth))]
    rows = []
    for i, row in enumerate(truth):
        levels = None if row["kind"] == "adapter" else (0.2 if row["kind"] == "quantization" else 1.0)
        on = row.get("on")
        rows.append(
            VectorRow(
                names[i],
                f"h{i}",
                BASE,
                f"git:{SHA}",  # the base's commit, as the catalogue records it
                Representation(),
                "llama",
                rng.standard_normal(256).astype(np.float32),
                [],
                "made",
                0.0,
                adapter=row["kind"] == "adapter",
                trace=Trace(traces[i], levels, scale),
                parent=names[on] if on is not None else None,
            )
        )
    from modelvec.hub.discovery import CatalogueEntry

    cards = [  # a merge's card names its parents, as mergekit writes it
        CatalogueEntry(
            model=names[i],
            base=BASE,
            kept=True,
            reason="",
            relation="merge",
            parents=[names[p] for p in row["parents"]],
        )
        for i, row in enumerate(truth)
        if row["kind"] == "merge" and "copy" not in row
    ]
    with Store(store) as db:
        db.writes.put_catalogue(BASE, SHA, cards)
        for lo in range(0, len(rows), 200):
            db.writes.put_many(rows[lo : lo + 200])


def timed(args: list[str]) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        start = time.perf_counter()
        out = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", t.name, *args], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        rss = int(Path(t.name).read_text().split()[-1]) * 1024
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return {"seconds": seconds, "peak_rss_gib": rss / 2**30, "stdout": out.stdout}


def accuracy(truth: list[dict], answer: dict) -> dict:
    names = {f"model-{i:05d}": i for i in range(len(truth))}
    right_parent = right_kind = 0
    for m in answer["models"]:
        t = truth[names[m["model"]]]
        want = {BASE if p == BASE else f"model-{p:05d}" for p in t["parents"]}
        right_parent += set(m["parents"]) == want
        right_kind += m["kind"] == t["kind"]
    n = len(answer["models"])
    return {"parent_right": right_parent / n, "kind_right": right_kind / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from modelvec.represent.trace import TRACE_FLOATS

    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        truth, traces = population(n, TRACE_FLOATS)
        with tempfile.TemporaryDirectory(prefix="bench-tree-") as tmp:
            store = Path(tmp) / "s.duckdb"
            fill(store, truth, traces, scale=100.0 * np.sqrt(TRACE_FLOATS))
            tree = timed([str(BIN / "modelvec"), "tree", BASE, "--store", str(store), "--json"])
            figure = timed([str(BIN / "modelvec"), "tree", BASE, "--store", str(store), "--out", str(Path(tmp) / "o")])
            query = timed([str(BIN / "modelvec"), "neighbors", "model-00007", "--store", str(store), "--json"])
            answer = json.loads(tree["stdout"])
        row = {
            "models": n,
            "tree_json_s": round(tree["seconds"], 2),
            "tree_json_rss_gib": round(tree["peak_rss_gib"], 2),
            "tree_figure_s": round(figure["seconds"], 2),
            "neighbors_s": round(query["seconds"], 2),
            "neighbors_rss_gib": round(query["peak_rss_gib"], 2),
            **{k: round(v, 3) for k, v in accuracy(truth, answer).items()},
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

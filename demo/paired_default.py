"""Paired bootstrap behind docs/evidence.md: how much better than the default are rank 16 and concatenation
on the evidence zoo's report half, and how much does ranking neighbours by mutual proximity add to
each? Run after `make evidence`:

    .venv/bin/python demo/paired_default.py [--zoo .cache/evidence-unique --store .cache/evidence-unique.duckdb]

Each model's kNN dataset score under a candidate minus its score under the default (or under the
same representation with plain cosine neighbours), on the same 30 report-half models; a 95 %
percentile bootstrap over models of the mean difference.
"""

import argparse
import json
from pathlib import Path

import numpy as np

import modelvec
from modelvec import Representation
from modelvec.analyse import knn_dataset_score
from modelvec.core.names import model_id

parser = argparse.ArgumentParser()
parser.add_argument("--zoo", default=".cache/evidence")
parser.add_argument("--store", default=".cache/evidence.duckdb")
args = parser.parse_args()
zoo = json.loads(Path(args.zoo, "zoo.json").read_text())
base = zoo["base"]
E = zoo["models"]
sel = {"tweet-sentiment", "tweet-simcse", "chat-qa", "chat-topic"}
rep = [m for m in E if m["dataset"] not in sel]
paths = [m["path"] for m in rep]
labels = [[m["dataset"]] for m in rep]


def per_model(p, scaling="none"):
    r = modelvec.embed(base, paths, representation=p, store=args.store)
    idx = {m: i for i, m in enumerate(r.metadata["model"])}
    X = r.vectors[[idx[model_id(m)] for m in paths]]
    return knn_dataset_score(X, labels, scaling=scaling).per_model


def paired(name, b, a, rng):
    d = b - a
    boots = d[rng.integers(0, len(d), (5000, len(d)))].mean(1)
    print(f"{name:45s} {d.mean():+.3f} {np.round(np.quantile(boots, [0.025, 0.975]), 3)}")


a = per_model(Representation())
rng = np.random.default_rng(0)
candidates = {
    "r16": Representation(rank=16),
    "concat r8": Representation(pooling="concat"),
    "concat r16": Representation(rank=16, pooling="concat"),
    "concat r32": Representation(rank=32, pooling="concat"),
}
for name, p in candidates.items():
    paired(f"{name} minus default", per_model(p), a, rng)
for name, p in {"default": Representation(), **candidates}.items():
    paired(f"{name}: mutual proximity minus cosine", per_model(p, "mutual-proximity"), per_model(p), rng)

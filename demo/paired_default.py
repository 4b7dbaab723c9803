"""Paired bootstrap behind docs/evidence.md: how much better than the default are rank 16 and concatenation
on the evidence zoo's report half? Run after `make evidence`: .venv/bin/python demo/paired_default.py

Each model's kNN dataset score under a candidate minus its score under the default, on the same
30 report-half models; a 95 % percentile bootstrap over models of the mean difference.
"""

import json
from pathlib import Path

import numpy as np

import modelvec
from modelvec import Representation
from modelvec.analyse import knn_dataset_score
from modelvec.core.names import model_id

zoo = json.loads(Path(".cache/evidence/zoo.json").read_text())
base = zoo["base"]
E = zoo["models"]
sel = {"tweet-sentiment", "tweet-simcse", "chat-qa", "chat-topic"}
rep = [m for m in E if m["dataset"] not in sel]
paths = [m["path"] for m in rep]
labels = [[m["dataset"]] for m in rep]


def per_model(p):
    r = modelvec.embed(base, paths, representation=p, store=".cache/evidence.duckdb")
    idx = {m: i for i, m in enumerate(r.metadata["model"])}
    X = r.vectors[[idx[model_id(m)] for m in paths]]
    return knn_dataset_score(X, labels).per_model


a = per_model(Representation())
rng = np.random.default_rng(0)
for name, p in (
    ("r16", Representation(rank=16)),
    ("concat r8", Representation(pooling="concat")),
    ("concat r32", Representation(rank=32, pooling="concat")),
):
    b = per_model(p)
    d = b - a
    boots = d[rng.integers(0, len(d), (5000, len(d)))].mean(1)
    print(name, "minus default:", round(d.mean(), 3), np.round(np.quantile(boots, [0.025, 0.975]), 3))

"""Exploration behind docs/evidence.md ("Adapters beside full fine-tunes"): can a collection-level
transform make LoRA adapters and full fine-tunes share one map by dataset?

Run after `make evidence` (it reads .cache/evidence/zoo.json and the vectors in .cache/evidence.duckdb):

    .venv/bin/python demo/explore_mixed.py [--zoo .cache/evidence-unique --store .cache/evidence-unique.duckdb]

For each representation it prints the kNN dataset score among full fine-tunes, among adapters, over
both, and the share of adapters whose nearest full fine-tune has their dataset, for the vectors as
they are, centred on the collection's mean, each kind (adapter, full) centred on its own mean, restricted to the blocks every model changes
("common support"), and with a pairwise cosine over the blocks both models change ("shared support"). Last, for the concatenated sketch at rank 32, the spread of each kind's cosines
(why mixing costs: docs/evidence.md, "Mutual proximity").
"""

import argparse
import collections
import json
from pathlib import Path

import numpy as np

import modelvec
from modelvec import Representation
from modelvec.analyse import knn_dataset_score
from modelvec.analyse.evaluation import gram_embedding
from modelvec.analyse.evidence import mixed_scores
from modelvec.core.names import model_id
from modelvec.represent import blocks_of
from modelvec.studies.task_vectors import task_vector_gram

parser = argparse.ArgumentParser()
parser.add_argument("--zoo", default=".cache/evidence")
parser.add_argument("--store", default=".cache/evidence.duckdb")
args = parser.parse_args()
zoo = json.loads(Path(args.zoo, "zoo.json").read_text())
base = zoo["base"]
entries = zoo["models"]
paths = [m["path"] for m in entries]
labels = [[m["dataset"]] for m in entries]
adapter = np.array([m["kind"] == "lora" for m in entries])
variants = {
    "default": Representation(),
    "concat": Representation(pooling="concat"),
    "r32": Representation(rank=32),
    "US-concat": Representation(factor="US", pooling="concat"),
    "concat-r32": Representation(pooling="concat", rank=32),
}


def knn_from_sim(S, labels, mask):
    idx = np.flatnonzero(mask)
    out = []
    for i in idx:
        same = np.array([labels[j] == labels[i] for j in idx])
        same[list(idx).index(i)] = False
        k1 = same.sum()
        if k1 == 0:
            continue
        s = S[i, idx].copy()
        s[list(idx).index(i)] = -np.inf
        order = np.argsort(-s, kind="stable")[:k1]
        out.append(same[order].mean())
    return float(np.mean(out))


def shared_sim(X, bounds):
    B = [X[:, a:b] for a, b in bounds]
    nz = np.stack([np.linalg.norm(b, axis=1) > 0 for b in B], 1).astype(float)  # n x nb
    n = len(X)
    num = np.zeros((n, n))
    ni = np.zeros((n, n))
    nj = np.zeros((n, n))
    for k, b in enumerate(B):
        both = np.outer(nz[:, k], nz[:, k])
        sq = (b * b).sum(1)
        num += both * (b @ b.T)
        ni += both * sq[:, None]
        nj += both * sq[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        S = num / np.sqrt(ni * nj)
    return np.nan_to_num(S, nan=0.0)


def report(name, S_or_X, sim=False):
    if sim:
        S = S_or_X
        full = knn_from_sim(S, labels, ~adapter)
        ad = knn_from_sim(S, labels, adapter)
        mx = knn_from_sim(S, labels, np.ones(len(labels), bool))
        fi = np.flatnonzero(~adapter)
        a2f = np.mean([labels[i] == labels[fi[np.argmax(S[i, fi])]] for i in np.flatnonzero(adapter)])
        print(f"{name:40s} full {full:.3f} adapters {ad:.3f} mixed {mx:.3f} a2f {a2f:.3f}")
    else:
        m = mixed_scores(S_or_X, labels, adapter)
        print(
            f"{name:40s} full {m.knn_full:.3f} adapters {m.knn_adapters:.3f} mixed {m.knn_mixed:.3f} a2f {m.adapter_to_full:.3f}"
        )


tv = task_vector_gram(base, paths)
R = gram_embedding(tv.gram)
report("task vectors", R)
G = tv.gram
H = np.eye(len(G)) - 1 / len(G)
report("task vectors centred", gram_embedding(H @ G @ H))
for name, p in variants.items():
    res = modelvec.embed(base, paths, representation=p, store=args.store)
    idx = {m: i for i, m in enumerate(res.metadata["model"])}
    X = res.vectors[[idx[model_id(m)] for m in paths]].astype(np.float64)
    bounds = [(b.start, b.stop) for b in blocks_of(base, p)]
    if name == "default":
        vecs_default = X
    if name == "concat-r32":
        vecs_concat32 = X
    report(name, X)
    report(name + " centred", X - X.mean(0))
    per_kind = X.copy()  # each kind centred on its own mean: removes an offset all adapters share
    per_kind[adapter] -= per_kind[adapter].mean(0)
    per_kind[~adapter] -= per_kind[~adapter].mean(0)
    report(name + " centred per kind", per_kind)
    nzall = np.array([all(np.linalg.norm(X[:, a:b], axis=1) > 0) for a, b in bounds])
    Xc = X.copy()
    for (a, b), keep in zip(bounds, nzall):
        if not keep:
            Xc[:, a:b] = 0
    report(name + " common-support", Xc)
    report(name + " common-support centred", Xc - Xc.mean(0))
    report(name + " shared-support", shared_sim(X, bounds), sim=True)

# Where the nearest neighbour goes wrong (default representation and exact task vectors), by dataset/kind.
kind = ["lora" if a else "full" for a in adapter]
for name, X in (("task vectors", R), ("default", vecs_default)):
    Z = X / np.linalg.norm(X, axis=1, keepdims=True)
    S = Z @ Z.T
    np.fill_diagonal(S, -np.inf)
    wrong = collections.Counter()
    for i in range(len(X)):
        j = int(np.argmax(S[i]))
        if labels[j] != labels[i]:
            wrong[f"{labels[i][0]}/{kind[i]} -> {labels[j][0]}/{kind[j]}"] += 1
    print(
        f"{name}: {sum(wrong.values())} of {len(X)} nearest neighbours on another dataset:", dict(wrong.most_common())
    )

# Among full fine-tunes only: the kNN dataset score per dataset.
full = np.flatnonzero(~adapter)
for name, X in (("task vectors", R), ("default", vecs_default)):
    score = knn_dataset_score(X[full], [labels[i] for i in full])
    print(f"{name}, full fine-tunes:", {d: round(v, 2) for d, (v, _) in score.per_dataset.items()})

# Each kind's cosines (concatenated sketch, r32): to its own dataset's models of each kind, and the
# spread (standard deviation) of its cosines to other datasets' models of each kind.
Z = vecs_concat32 / np.linalg.norm(vecs_concat32, axis=1, keepdims=True)
S = Z @ Z.T
ds = np.array([lab[0] for lab in labels])
same, off = ds[:, None] == ds[None, :], ~np.eye(len(ds), dtype=bool)
for a_kind, a_name in ((False, "full"), (True, "adapter")):
    for b_kind, b_name in ((False, "full"), (True, "adapter")):
        pair = (adapter[:, None] == a_kind) & (adapter[None, :] == b_kind) & off
        print(
            f"{a_name} -> {b_name}: own dataset {S[pair & same].mean():.3f}, "
            f"other datasets {S[pair & ~same].mean():.3f} +- {S[pair & ~same].std():.3f}"
        )

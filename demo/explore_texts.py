"""Exploration behind docs/evidence.md ("Where the texts are: the first layer and the head"): do the
weights of a masked-LM fine-tune record which texts it read, and where?

Run after `make evidence` (it reads the zoo's zoo.json and the concatenated sketches in its store):

    .venv/bin/python demo/explore_texts.py [--zoo .cache/evidence-unique --store .cache/evidence-unique.duckdb]

Two weight-only signals of the texts, each a vector over the vocabulary:
- the **first-layer read profile**: for every token t, |e_t dW| summed over the first layer's
  matrices that read the embeddings (q, k, v, ff1), e_t the base's embedding of t. Tokens the
  training texts used move that layer most. Log, standardised within the model, centred per kind.
- the **masked-LM head's vocabulary prior**: E beta, beta the trained bias of the head's LayerNorm
  (zero at its random initialisation), read through the tied vocabulary E of the base, centred
  over the vocabulary: the block that `Representation(head="vocabulary")` appends.
It prints the kNN dataset score of each among the 12 masked-LM models (full, adapters, both;
chance 0.4 within a kind), the read profile's score by text collection among all full fine-tunes,
and each half's scores with the read profile appended to the concatenated sketch (r32) at a few
weights (the head's block is scored by `make evidence`: `modelvec evaluate --vocabulary-head`).
"""

import argparse
import json
from pathlib import Path

import numpy as np

import modelvec
from modelvec import Representation
from modelvec.analyse import knn_dataset_score
from modelvec.analyse.evidence import mixed_scores
from modelvec.core.names import model_id
from modelvec.read import open_checkpoint
from modelvec.represent.embedder import VocabularyReadout
from modelvec.studies.task_vectors import task_deltas

SELECTION = {"tweet-sentiment", "tweet-simcse", "chat-qa", "chat-topic"}  # as in the Makefile
READS = {"q", "k", "v", "ff1"}  # first-layer matrices whose input is the embedding output

parser = argparse.ArgumentParser()
parser.add_argument("--zoo", default=".cache/evidence")
parser.add_argument("--store", default=".cache/evidence.duckdb")
args = parser.parse_args()
zoo = json.loads(Path(args.zoo, "zoo.json").read_text())
models = zoo["models"]
kind = np.array([m["kind"] for m in models])
dataset = [m["dataset"] for m in models]


base = open_checkpoint(zoo["base"])
readout = VocabularyReadout(base, base.layout())  # the head's block of Representation(head="vocabulary")
E = readout.embedding.double().numpy()  # (vocab, d), the base's embeddings
profiles = np.zeros((len(models), len(E)))
cks = [open_checkpoint(m["path"]) for m in models]
for ref, _, deltas in task_deltas(base, cks):
    if ref.layer == 0 and ref.family in READS:
        for i, d in deltas.items():  # d: in x out, in = the embedding width
            profiles[i] += ((E @ d.numpy()) ** 2).sum(1)
P = np.log(np.sqrt(profiles) + 1e-12)
P = (P - P.mean(1, keepdims=True)) / P.std(1, keepdims=True)
for k in ("full", "lora"):
    P[kind == k] -= P[kind == k].mean(0)

mlm = np.array(["mlm" in d for d in dataset])
prior = np.stack([readout.block(ck, 1.0).double().numpy() for ck in cks])  # zeros where there is no such head


def knn(X: np.ndarray, mask: np.ndarray, labels: list[str]) -> float:
    idx = np.flatnonzero(mask)
    return knn_dataset_score(X[idx], [[labels[i]] for i in idx]).score


print("kNN dataset score among the masked-LM models (chance 0.4 within a kind):")
for name, X in (("first-layer read profile", P), ("head's vocabulary prior E beta", prior)):
    cells = [f"{k} {knn(X, mlm & (kind == k), dataset):.3f}" for k in ("full", "lora")]
    print(f"  {name:32s} {'  '.join(cells)}  both {knn(X, mlm, dataset):.3f}")
collection = [m["collection"] for m in models]
print(
    "read profile among all full fine-tunes, by text collection:",
    f"{knn(P, kind == 'full', collection):.3f};",
    f"by dataset: {knn(P, kind == 'full', dataset):.3f}",
)

res = modelvec.embed(
    zoo["base"], [m["path"] for m in models], representation=Representation(pooling="concat", rank=32), store=args.store
)
row = {m: i for i, m in enumerate(res.metadata["model"])}
S = res.vectors[[row[model_id(m["path"])] for m in models]].astype(np.float64)
S /= np.linalg.norm(S, axis=1, keepdims=True)


def unit(X: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, n, out=np.zeros_like(X), where=n > 0)


print("concatenated sketch r32 + w x read profile (each unit length), per half:")
for half in ("selection", "report"):
    h = np.array([(d in SELECTION) == (half == "selection") for d in dataset])
    labels = [[d] for d, keep in zip(dataset, h) if keep]
    for w in (0.0, 0.5, 1.0):
        for scaling in ("none", "mutual-proximity"):
            m = mixed_scores(np.hstack([S[h], w * unit(P[h])]), labels, kind[h] == "lora", scaling=scaling)
            print(
                f"  {half:9s} w {w:<4} {scaling:16s} mixed {m.knn_mixed:.3f} full {m.knn_full:.3f} "
                f"adapters {m.knn_adapters:.3f} a->full {m.adapter_to_full:.3f}"
            )

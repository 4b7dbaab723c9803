"""A held-out check of the vocabulary head (docs/evidence.md, "Where the texts are"): masked-LM on a
third text collection, trained after ``head="vocabulary"`` was designed on the evidence zoo.

    .venv/bin/python demo/build_evidence.py --out .cache/evidence-heldout --unique-seeds --held-out
    .venv/bin/python demo/heldout_texts.py

The 6 new chat-mlm models (3 full fine-tunes, 3 LoRA adapters) join the unique-seed zoo: among
the 18 masked-LM models (bbc-mlm, tweet-mlm, chat-mlm) and over all 60 models, it prints the kNN
dataset score over the mixed collection, among full fine-tunes, among adapters, and adapters
whose nearest full fine-tune has their dataset, with and without the head, by cosine and by
mutual proximity, with a 95 % bootstrap interval over models for the mixed score.
"""

import argparse
import json
from pathlib import Path

import numpy as np

import modelvec
from modelvec import Representation
from modelvec.analyse import knn_dataset_score
from modelvec.analyse.evidence import bootstrap_interval, mixed_scores
from modelvec.core.names import model_id

parser = argparse.ArgumentParser()
parser.add_argument("--zoo", default=".cache/evidence-unique")
parser.add_argument("--held-out", default=".cache/evidence-heldout")
parser.add_argument("--store", default=".cache/evidence-heldout.duckdb")
args = parser.parse_args()
zoo = json.loads(Path(args.zoo, "zoo.json").read_text())
new = json.loads(Path(args.held_out, "zoo.json").read_text())["models"]
models = zoo["models"] + new
variants = {
    "concat r32": Representation(pooling="concat", rank=32),
    "concat r32 + vocabulary head": Representation(pooling="concat", rank=32, head="vocabulary"),
    "default (r8, mean)": Representation(),
    "default + vocabulary head": Representation(head="vocabulary"),
}
vectors = {}
for name, params in variants.items():
    res = modelvec.embed(zoo["base"], [m["path"] for m in models], representation=params, store=args.store)
    row = {m: i for i, m in enumerate(res.metadata["model"])}
    vectors[name] = res.vectors[[row[model_id(m["path"])] for m in models]].astype(np.float64)

dataset = [m["dataset"] for m in models]
adapter = np.array([m["kind"] == "lora" for m in models])
for group, keep in (
    ("18 masked-LM models (bbc, tweets, chat)", np.array(["mlm" in d for d in dataset])),
    ("all 60 models", np.ones(len(models), bool)),
):
    print(group)
    labels = [[d] for d, k in zip(dataset, keep) if k]
    for name, X in vectors.items():
        for scaling in ("none", "mutual-proximity"):
            m = mixed_scores(X[keep], labels, adapter[keep], scaling=scaling)
            per = knn_dataset_score(X[keep], labels, scaling=scaling)
            lo, hi = bootstrap_interval(per.per_model)
            chat = per.per_dataset["chat-mlm"][0]
            print(
                f"  {name:30s} {scaling:16s} mixed {m.knn_mixed:.3f} [{lo:.3f}, {hi:.3f}] full {m.knn_full:.3f} "
                f"adapters {m.knn_adapters:.3f} a->full {m.adapter_to_full:.3f}  chat-mlm {chat:.3f}"
            )

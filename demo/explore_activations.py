"""Exploration behind docs/evidence.md ("Beyond weights: activation deltas"): do the changes a
fine-tune makes to the base's hidden states put LoRA adapters and full fine-tunes on one map by dataset?

Run after `make evidence` (it reads .cache/evidence/zoo.json):

    .venv/bin/python demo/explore_activations.py

Every model of the evidence zoo and the base read the same 48 generic sentences
(demo/probe_sentences.txt: written for this, from none of the zoo's datasets); a model's activation
delta is, per layer and sentence, the mean over tokens of its hidden state minus the base's. A LoRA
adapter is merged into the base first (W + (alpha/r)·B·A, the adapter's own scaling); no head is
used (the zoo's heads differ by task, the encoders are what the weight vectors compare). Printed for
the vectors as they are and with each layer scaled to unit norm, per half of the zoo's fixed split
(`modelvec evaluate`'s `--selection`): the kNN dataset score among full fine-tunes, among adapters,
over both, and the share of adapters whose nearest full fine-tune has their dataset; then the weight
sketch (`--pooling concat`) with the activation vector appended at a weight chosen on the selection
half, and where each model's nearest neighbour goes wrong.
"""

import collections
import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as transformers_logging

import modelvec
from modelvec.analyse.evidence import mixed_scores

SELECTION = ("tweet-sentiment", "tweet-simcse", "chat-qa", "chat-topic")  # as in `make evidence`
torch.manual_seed(0)
transformers_logging.set_verbosity_error()  # each head-carrying checkpoint would report its unused head
torch.set_num_threads(2)
zoo = json.loads(Path(".cache/evidence/zoo.json").read_text())
base, entries = zoo["base"], zoo["models"]
probes = [line.strip() for line in (Path(__file__).parent / "probe_sentences.txt").read_text().splitlines() if line]
tokenizer = AutoTokenizer.from_pretrained(base)
batch = tokenizer(probes, padding=True, truncation=True, max_length=48, return_tensors="pt")
mask = batch["attention_mask"].unsqueeze(-1).float()


def hidden(model: torch.nn.Module) -> np.ndarray:
    """(layers, sentences, width): each layer's output, averaged over each sentence's tokens."""
    with torch.no_grad():
        states = torch.stack(model(**batch, output_hidden_states=True).hidden_states[1:])
    return ((states * mask).sum(2) / mask.sum(1)).numpy()


def merged(adapter: Path) -> torch.nn.Module:
    """The base with a PEFT LoRA adapter merged in; every adapted matrix must be one of the base's."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    model = AutoModel.from_pretrained(base).eval()
    state = model.state_dict()
    merged_keys = 0
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.").removeprefix("bert.")
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        state[module + ".weight"] += (config["lora_alpha"] / config["r"]) * (b.float() @ a.float())
        merged_keys += 1
    if not merged_keys:
        raise ValueError(f"{adapter}: no LoRA matrices found")
    model.load_state_dict(state)
    return model


start = time.perf_counter()
reference = hidden(AutoModel.from_pretrained(base).eval())
deltas = []
for m in entries:
    path = Path(m["path"])
    model = merged(path) if m["kind"] == "lora" else AutoModel.from_pretrained(path).eval()
    deltas.append(hidden(model) - reference)
D = np.stack(deltas)  # models, layers, sentences, width
print(f"activation deltas of {len(entries)} models: {time.perf_counter() - start:.1f} s", flush=True)

labels = [[m["dataset"]] for m in entries]
adapter = np.array([m["kind"] == "lora" for m in entries])
halves = {
    "selection": np.array([m["dataset"] in SELECTION for m in entries]),
    "report": np.array([m["dataset"] not in SELECTION for m in entries]),
}


def unit(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return x / np.maximum(np.sqrt((x**2).sum(axis=axes, keepdims=True)), 1e-30)


def scores(X: np.ndarray, half: str) -> str:
    keep = halves[half]
    s = mixed_scores(X[keep], [labels[i] for i in np.flatnonzero(keep)], adapter[keep])
    return (
        f"full {s.knn_full:.3f} adapters {s.knn_adapters:.3f} mixed {s.knn_mixed:.3f} a->full {s.adapter_to_full:.3f}"
    )


n = len(entries)
act = {
    "activations": D.reshape(n, -1),
    "activations, layers unit": unit(D, (2, 3)).reshape(n, -1),
}
weights = modelvec.DeltaEmbedder(pooling="concat").fit(base)
W = unit(np.stack([weights.embed_one(m["path"]) for m in entries]).astype(np.float64), (1,))
A = unit(act["activations, layers unit"], (1,))
for name, X in {"weights (sketch, concat)": W, **act}.items():
    for half in halves:
        print(f"{name:>34} {half:>9}: {scores(X, half)}")

# the weight of the activations beside the weights, chosen by the selection half's mixed score
alphas = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
chosen = max(
    alphas,
    key=lambda a: (
        mixed_scores(
            np.hstack([W, a * A])[halves["selection"]],
            [labels[i] for i in np.flatnonzero(halves["selection"])],
            adapter[halves["selection"]],
        ).knn_mixed
    ),
)
for half in halves:
    print(f"{'weights + ' + str(chosen) + ' x activations':>34} {half:>9}: {scores(np.hstack([W, chosen * A]), half)}")

kind = ["lora" if a else "full" for a in adapter]
for name, X in (("weights", W), ("activations, layers unit", A)):
    S = X @ X.T
    np.fill_diagonal(S, -np.inf)
    wrong = collections.Counter()
    for i in range(n):
        j = int(np.argmax(S[i]))
        if labels[j] != labels[i]:
            wrong[f"{labels[i][0]}/{kind[i]} -> {labels[j][0]}/{kind[j]}"] += 1
    print(f"{name}: {sum(wrong.values())} of {n} nearest neighbours on another dataset:", dict(wrong.most_common()))

